"""Multi-Layer Multi-Head Attention, MLMHA (thesis 3.2.2, Eq. 3.6-3.11; Ampomah et al.,
PBML 2020 "Every Layer Counts").

Replaces the decoder's encoder-decoder attention. With sources f^1..f^n (the top n encoder
layers) and query S (the output of the decoder's self-attention sublayer):

    a^i_h = (S W^{q,i}_h)(f^i W^{k,i}_h)^T / sqrt(d_k)            per source i, head h
    U0 = 0:  w_h = softmax(sum_i a^i_h);  c^i_h = w_h (f^i W^{v,i}_h)    (joint attention)
    U0 = 1:  c^i_h = softmax(a^i_h) (f^i W^{v,i}_h)                     (layer-specific)
    c^i = concat_h c^i_h
    U1 = 0:  C = concat(c^1..c^n)  (Z x n d)                            (concatenation)
    U1 = 1:  C = sum_i c^i         (Z x d)                              (summation)
    O = C W_o

M-00, M-01, M-10, M-11 are (U0, U1). With n = 1 every configuration is the standard
cross-attention.
"""
import math
from typing import Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from fairseq_ext.modules.attention_utils import (
    QKV_GAIN,
    attention_weights_for_output,
    merge_heads,
    softmax_float,
    xavier_linear,
)
from fairseq_ext.modules.stacked_source_attention import StackedSourceAttention

# name -> (U0, U1)
MLMHA_CONFIGS = {"m-00": (0, 0), "m-01": (0, 1), "m-10": (1, 0), "m-11": (1, 1)}


def mlmha(queries: Tensor, keys: Tensor, values: Tensor, key_padding_mask: Optional[Tensor], layer_specific: bool,
          sum_contexts: bool, dropout=None) -> Tuple[Tensor, Tensor]:
    """The attention core of Eq. 3.7-3.10 on projected, head-split tensors, all n sources
    in one batched matmul each.

    queries: B x n x H x Z x D; keys: B x n x H x J x D; values: B x n x H x J x D, or, for
    U0 = 0 and U1 = 1 only, already summed over the sources (B x H x J x D: sum_i w V^i =
    w sum_i V^i, so M-01 decodes against one value tensor); key_padding_mask: B x J (the
    layers of one sentence) or B x n x J (one row per source sentence).
    Returns the contexts, B x n x H x Z x D (U1 = 0) or their sum over the sources
    B x H x Z x D (U1 = 1), and the attention weights B x H x Z x J (for U0 = 1 their mean
    over the sources, for inspection only).
    """
    logits = torch.matmul(queries, keys.transpose(-1, -2)) / math.sqrt(queries.size(-1))  # B x n x H x Z x J
    if key_padding_mask is not None:
        mask = key_padding_mask.to(torch.bool)
        mask = mask[:, None, None, None, :] if mask.dim() == 2 else mask[:, :, None, None, :]
        logits = logits.masked_fill(mask, float("-inf"))
    drop = dropout if dropout is not None else (lambda w: w)
    if layer_specific:  # U0 = 1: one softmax per source
        weights = softmax_float(logits)
        contexts = torch.matmul(drop(weights), values)
        return (contexts.sum(dim=1) if sum_contexts else contexts), weights.mean(dim=1)
    joint = softmax_float(logits.sum(dim=1))  # U0 = 0: one joint softmax
    dropped = drop(joint)
    if sum_contexts:
        return torch.matmul(dropped, values if values.dim() == 4 else values.sum(dim=1)), joint
    return torch.matmul(dropped.unsqueeze(1), values), joint


class MultiLayerMultiheadAttention(StackedSourceAttention):
    """MLMHA cross-attention over n stacked encoder layers (thesis Eq. 3.6-3.11).

    Called like fairseq's encoder-decoder MultiheadAttention, with ``key`` the stacked
    sources (J x B x n x C). Per source i: its own W^{q,i}, W^{k,i}, W^{v,i} (the parameter
    counts of thesis Tables 3.2/3.4 require them); one W_o of (n d or d) x d.
    """

    def __init__(self, embed_dim: int, num_heads: int, num_sources: int, layer_specific: bool,
                 sum_contexts: bool, dropout: float = 0.0, kdim: Optional[int] = None,
                 removed_source: Optional[int] = None):
        super().__init__(embed_dim, num_heads, num_sources, dropout, kdim)
        self.layer_specific, self.sum_contexts = layer_specific, sum_contexts
        # layer masking (thesis Table 3.5): source i leaves the logits' sum (U0 = 0), and its
        # context is zero in the concatenation (U1 = 0) or leaves the sum (U1 = 1)
        self.removed_source = removed_source
        self.q_proj = nn.ModuleList(
            xavier_linear(embed_dim, embed_dim, gain=QKV_GAIN) for _ in range(num_sources)
        )
        context_dim = embed_dim if sum_contexts else num_sources * embed_dim
        self.out_proj = xavier_linear(context_dim, embed_dim)

    def forward(
        self,
        query: Tensor,  # Z x B x C
        key: Optional[Tensor],  # J x B x n x C (None once the keys/values are cached)
        value: Optional[Tensor] = None,
        key_padding_mask: Optional[Tensor] = None,  # B x J, or B x n x J per source
        incremental_state=None,
        need_weights: bool = False,
        need_head_weights: bool = False,
        **unused,
    ):
        # M-01 reads only sum_i V^i: that is what it caches (a masked layer needs every V^i)
        summed = self.sum_contexts and not self.layer_specific and self.removed_source is None
        k, v = self.static_keys_values(key, incremental_state,
                                       value_layout=(lambda t: t.sum(dim=1)) if summed else None)
        tgt_len, bsz, _ = query.shape
        # every source's query projection in one matmul: Z x B x (n C) -> B x n x H x Z x D
        q = F.linear(query, torch.cat([p.weight for p in self.q_proj]), torch.cat([p.bias for p in self.q_proj]))
        q = q.view(tgt_len, bsz, self.num_sources, self.num_heads, self.head_dim).permute(1, 2, 3, 0, 4)
        if self.removed_source is not None:  # layer masking: only the kept sources take part
            keep = torch.tensor([i for i in range(self.num_sources) if i != self.removed_source], device=q.device)
            q, k, v = q.index_select(1, keep), k.index_select(1, keep), v.index_select(1, keep)
            if key_padding_mask is not None and key_padding_mask.dim() == 3:
                key_padding_mask = key_padding_mask.index_select(1, keep)
        contexts, weights = mlmha(q, k, v, key_padding_mask, self.layer_specific, self.sum_contexts,
                                  self.dropout_module)
        if self.sum_contexts:
            combined = merge_heads(contexts)  # Z x B x C
        else:
            if self.removed_source is not None:  # the removed source's context is zero in the concatenation
                full = contexts.new_zeros(bsz, self.num_sources, *contexts.shape[2:])
                contexts = full.index_copy(1, keep, contexts)
            # B x n x H x Z x D -> Z x B x (n C), source-major as concat(c^1 .. c^n)
            combined = contexts.permute(3, 0, 1, 2, 4).reshape(tgt_len, bsz, self.num_sources * self.embed_dim)
        return self.out_proj(combined), attention_weights_for_output(weights, need_weights, need_head_weights)
