"""Small pieces shared by the cross-attention variants over several encoder layers."""
import math
from typing import Dict, Optional, Tuple

import torch
import torch.nn as nn
from fairseq.incremental_decoding_utils import with_incremental_state
from fairseq.modules.fairseq_dropout import FairseqDropout
from torch import Tensor


QKV_GAIN = 2 ** -0.5  # fairseq's scaled initialisation of the q/k/v projections


def xavier_linear(in_features: int, out_features: int, bias: bool = True, gain: float = 1.0):
    """A Linear initialised as fairseq's MultiheadAttention initialises its projections."""
    m = nn.Linear(in_features, out_features, bias=bias)
    nn.init.xavier_uniform_(m.weight, gain=gain)
    if bias:
        nn.init.constant_(m.bias, 0.0)
    return m


def split_heads(x: Tensor, num_heads: int) -> Tensor:
    """T x B x C -> B x H x T x (C / H)."""
    length, bsz, dim = x.shape
    return x.contiguous().view(length, bsz, num_heads, dim // num_heads).permute(1, 2, 0, 3)


def merge_heads(x: Tensor) -> Tensor:
    """B x H x T x D -> T x B x (H * D)."""
    bsz, heads, length, head_dim = x.shape
    return x.permute(2, 0, 1, 3).reshape(length, bsz, heads * head_dim)


def scaled_logits(q: Tensor, k: Tensor, key_padding_mask: Optional[Tensor]) -> Tensor:
    """(B x H x Z x D, B x H x J x D) -> B x H x Z x J logits, padded keys at -inf."""
    logits = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.size(-1))
    if key_padding_mask is not None:
        logits = logits.masked_fill(key_padding_mask[:, None, None, :].to(torch.bool), float("-inf"))
    return logits


def source_mask(key_padding_mask: Optional[Tensor], index: int) -> Optional[Tensor]:
    """The padding mask of source ``index``: one B x J mask shared by every source (encoder
    layers of one sentence) or a B x n x J mask with one row per source (different source
    sentences, multi-source translation)."""
    if key_padding_mask is None or key_padding_mask.dim() == 2:
        return key_padding_mask
    return key_padding_mask[:, index]


def softmax_float(logits: Tensor) -> Tensor:
    """Softmax in fp32 (as fairseq does under fp16/bf16), returned in the input dtype."""
    return torch.softmax(logits.float(), dim=-1).type_as(logits)


def attention_weights_for_output(
    weights: Tensor, need_weights: bool, need_head_weights: bool
) -> Optional[Tensor]:
    """B x H x Z x J -> fairseq's layout: H x B x Z x J per head, or B x Z x J averaged."""
    if not (need_weights or need_head_weights):
        return None
    if need_head_weights:
        return weights.transpose(0, 1)
    return weights.mean(dim=1)


def reorder_buffer(buffer: Dict[str, Optional[Tensor]], new_order: Tensor) -> Dict[str, Optional[Tensor]]:
    """Reorder every batch-first cached tensor (beam search also shrinks the batch)."""
    return {k: (v.index_select(0, new_order) if v is not None else None) for k, v in buffer.items()}


@with_incremental_state
class StackedSourceAttention(nn.Module):
    """Base of the cross-attentions that read n stacked sources (J x B x n x C).

    Holds one key and one value projection per source (or, with ``shared_kv``, one pair
    applied to every source). The projected keys/values are static per sentence: computed
    on the first decoding step, cached batch-first under this module's incremental-state
    key and reordered with the beam.
    """

    def __init__(self, embed_dim: int, num_heads: int, num_sources: int, dropout: float = 0.0,
                 kdim: Optional[int] = None, shared_kv: bool = False):
        super().__init__()
        if embed_dim % num_heads != 0:
            raise ValueError(
                f"--decoder-embed-dim ({embed_dim}) is not divisible by "
                f"--decoder-attention-heads ({num_heads})"
            )
        kdim = kdim or embed_dim
        self.embed_dim, self.num_heads, self.num_sources = embed_dim, num_heads, num_sources
        self.head_dim = embed_dim // num_heads
        self.shared_kv = shared_kv
        num_projections = 1 if shared_kv else num_sources
        self.k_proj = nn.ModuleList(xavier_linear(kdim, embed_dim, gain=QKV_GAIN) for _ in range(num_projections))
        self.v_proj = nn.ModuleList(xavier_linear(kdim, embed_dim, gain=QKV_GAIN) for _ in range(num_projections))
        self.dropout_module = FairseqDropout(dropout, module_name=self.__class__.__name__)

    def static_keys_values(self, memory: Optional[Tensor], incremental_state) -> Tuple[Tensor, Tensor]:
        """Projected keys and values of every source: B x n x H x J x D each."""
        if incremental_state is not None:
            cached = self._get_input_buffer(incremental_state)
            if "static_k" in cached:
                return cached["static_k"], cached["static_v"]
        if memory is None or memory.dim() != 4:
            raise ValueError(f"{self.__class__.__name__} expects stacked sources J x B x n x C")
        sources = memory.unbind(dim=2)
        k_proj, v_proj = (
            ([self.k_proj[0]] * len(sources), [self.v_proj[0]] * len(sources)) if self.shared_kv
            else (self.k_proj, self.v_proj)
        )
        k = torch.stack([split_heads(p(f), self.num_heads) for p, f in zip(k_proj, sources)], dim=1)
        v = torch.stack([split_heads(p(f), self.num_heads) for p, f in zip(v_proj, sources)], dim=1)
        if incremental_state is not None:
            self._set_input_buffer(incremental_state, {"static_k": k, "static_v": v})
        return k, v

    def reorder_incremental_state(self, incremental_state, new_order: Tensor):
        buffer = self._get_input_buffer(incremental_state)
        if buffer:
            self._set_input_buffer(incremental_state, reorder_buffer(buffer, new_order))

    def _get_input_buffer(self, incremental_state) -> Dict[str, Optional[Tensor]]:
        return self.get_incremental_state(incremental_state, "attn_state") or {}

    def _set_input_buffer(self, incremental_state, buffer: Dict[str, Optional[Tensor]]):
        return self.set_incremental_state(incremental_state, "attn_state", buffer)
