"""Base of the cross-attentions that read n stacked sources (J x B x n x C): MLMHA
(``multi_layer_multihead_attention.py``) and the flat / hierarchical combinations
(``multi_source_attention.py``)."""
from typing import Callable, Dict, Optional, Tuple

import torch
import torch.nn as nn
from fairseq.incremental_decoding_utils import with_incremental_state
from fairseq.modules.fairseq_dropout import FairseqDropout
from torch import Tensor

from fairseq_ext.modules.attention_utils import (QKV_GAIN, RecordingMultiheadAttention, attend_by_sentence,
                                                attention_weights_for_output, defer_reorder, extend_cached_steps,
                                                identical_row_groups, merge_heads, scaled_logits, softmax_float,
                                                split_heads, xavier_linear)


@with_incremental_state
class StackedSourceAttention(nn.Module):
    """Base of the cross-attentions that read n stacked sources (J x B x n x C).

    Holds one key and one value projection per source (or, with ``shared_kv``, one pair
    applied to every source). The projected keys/values are static per sentence: computed
    on the first decoding step, cached batch-first under this module's incremental-state
    key and reordered with the beam. In decoding they are projected and cached once per
    sentence, not per hypothesis (the beam's copies of a sentence share one row, see
    ``identical_row_groups``); the subclasses attend with ``group_queries``, so that a
    step reads each sentence's n J d keys and values once for all its hypotheses.
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

    def static_keys_values(self, memory: Optional[Tensor], incremental_state,
                           key_layout: Optional[Callable[[Tensor], Tensor]] = None,
                           value_layout: Optional[Callable[[Tensor], Tensor]] = None) -> Tuple[Tensor, Tensor]:
        """Projected keys and values of every source: R x n x H x J x D each, or what
        ``key_layout``/``value_layout`` make of them (e.g. the sources side by side, or the
        values summed over the sources): the form every decoding step reads is the one
        cached, once per sentence, and nothing else. R is the batch in a full forward and,
        in decoding, one row per group of hypotheses with identical encoder states (a
        sentence's beam): the caller attends with ``group_queries(q, R)``."""

        def project(rows: Tensor) -> Tuple[Tensor, Tensor]:  # contiguous: each step's matmul reads them as they are
            k, v = self._project_sources(rows, self.k_proj), self._project_sources(rows, self.v_proj)
            return tuple((t if f is None else f(t)).contiguous() for t, f in ((k, key_layout), (v, value_layout)))

        return static_per_sentence(self, memory, incremental_state, project)

    def _project_sources(self, memory: Tensor, projections: nn.ModuleList) -> Tensor:
        """J x B x n x C -> B x n x H x J x D (a view, copied once into the layout that is cached):
        source i through ``projections[i]`` (or the one shared projection), all in one batched matmul."""
        length, bsz, n, _ = memory.shape
        if len(projections) == 1:
            out = projections[0](memory)  # J x B x n x C
        else:
            weight = torch.stack([p.weight for p in projections])  # n x C_out x C_in
            bias = torch.stack([p.bias for p in projections])  # n x C_out
            out = torch.einsum("jbni,noi->jbno", memory, weight) + bias
        return out.reshape(length, bsz, n, self.num_heads, self.head_dim).permute(1, 2, 3, 0, 4)

    def reorder_incremental_state(self, incremental_state, new_order: Tensor):
        reorder_static(self, incremental_state, new_order)

    def _get_input_buffer(self, incremental_state) -> Dict[str, Optional[Tensor]]:
        return self.get_incremental_state(incremental_state, "attn_state") or {}

    def _set_input_buffer(self, incremental_state, buffer: Dict[str, Optional[Tensor]]):
        return self.set_incremental_state(incremental_state, "attn_state", buffer)


def static_per_sentence(module, memory: Optional[Tensor], incremental_state,
                        project: Callable[[Tensor], Tuple[Tensor, Tensor]]) -> Tuple[Tensor, Tensor]:
    """The static keys and values ``project(memory)`` makes of the stacked sources (J x B x n
    x C), for a module with fairseq's incremental state: in a full forward, projected from
    every row; in decoding, projected on the first step from one row per group of identical
    rows (a sentence's beam, ``identical_row_groups``), cached batch-first under the module's
    ``attn_state`` with ``static_rows`` (the cached row each hypothesis reads) and returned
    from the cache on every later step."""
    if incremental_state is not None:
        cached = module.get_incremental_state(incremental_state, "attn_state") or {}
        if "static_k" in cached:
            return cached["static_k"], cached["static_v"]
    if memory is None or memory.dim() != 4:
        raise ValueError(f"{module.__class__.__name__} expects stacked sources J x B x n x C")
    group = identical_row_groups(memory) if incremental_state is not None else 1
    if group > 1:
        memory = memory[:, ::group]
    k, v = project(memory)
    if incremental_state is not None:
        rows = torch.arange(memory.size(1), device=k.device).repeat_interleave(group)
        module.set_incremental_state(incremental_state, "attn_state", {"static_k": k, "static_v": v,
                                                                       "static_rows": rows})
    return k, v


def reorder_static(module, incremental_state, new_order: Tensor) -> None:
    """Beam search's reorder of what :func:`static_per_sentence` cached."""
    buffer = module.get_incremental_state(incremental_state, "attn_state") or {}
    if "static_k" not in buffer:
        return
    rows = buffer["static_rows"]
    # Every hypothesis of a sentence has the same static keys/values, and beam search
    # reorders within sentences unless the batch shrinks: then nothing needs copying.
    # fairseq's own encoder-decoder attention skips this copy the same way
    # (MultiheadAttention.reorder_incremental_state).
    if rows.size(0) == new_order.size(0):
        return
    k, v = buffer["static_k"], buffer["static_v"]
    group = rows.size(0) // k.size(0)  # hypotheses per cached row, in consecutive blocks
    rows = rows.index_select(0, new_order)
    blocks = rows.view(-1, group) if group > 1 and rows.numel() % group == 0 else None
    if blocks is not None and bool((blocks == blocks[:, :1]).all()):
        keep = blocks[:, 0]  # the sentences left, each still a block of `group` hypotheses
        rows = torch.arange(keep.numel(), device=rows.device).repeat_interleave(group)
    else:  # any other reorder: one row per hypothesis from here on
        keep, rows = rows, torch.arange(rows.numel(), device=rows.device)
    module.set_incremental_state(incremental_state, "attn_state", {"static_k": k.index_select(0, keep),
                                                                   "static_v": v.index_select(0, keep),
                                                                   "static_rows": rows})


class SentenceCachedAttention(RecordingMultiheadAttention):
    """fairseq's MultiheadAttention (the same parameters and outputs) decoding as the plugin's
    attentions do: as a cross-attention it caches the static keys and values once per sentence
    (:func:`static_per_sentence`), as a self-attention it joins beam search's reorder to the next
    step's keys and values in one copy (``defer_reorder``). The auxiliary decoders use it; a full
    forward, and a step while the analyses record weights, are fairseq's own."""

    def forward(self, query, key, value, key_padding_mask=None, incremental_state=None, need_weights=True,
                static_kv=False, attn_mask=None, before_softmax=False, need_head_weights=False):
        if incremental_state is None or self.recording_weights or before_softmax or attn_mask is not None:
            return super().forward(query, key, value, key_padding_mask, incremental_state, need_weights, static_kv,
                                   attn_mask, before_softmax, need_head_weights)
        heads, q = self.num_heads, split_heads(self.q_proj(query), self.num_heads)
        if self.encoder_decoder_attention:  # J x B x C memory, as one stacked source
            k, v = static_per_sentence(self, None if key is None else key.unsqueeze(2), incremental_state,
                                       lambda rows: (split_heads(self.k_proj(rows[:, :, 0]), heads),
                                                     split_heads(self.v_proj(rows[:, :, 0]), heads)))
        else:
            saved = self._get_input_buffer(incremental_state)
            (k, v), key_padding_mask = extend_cached_steps(
                saved, {"prev_key": split_heads(self.k_proj(query), heads),
                        "prev_value": split_heads(self.v_proj(query), heads)},
                key_padding_mask, saved.pop("new_order", None))
            self._set_input_buffer(incremental_state, saved)

        def attend(queries, mask):  # the weights per hypothesis only when asked for
            weights = softmax_float(scaled_logits(queries, k, mask))
            context = torch.matmul(self.dropout_module(weights), v)
            return (context, weights) if need_weights or need_head_weights else (context,)

        context, *weights = attend_by_sentence(attend, q, k.size(0), key_padding_mask)
        return self.out_proj(merge_heads(context)), attention_weights_for_output(
            weights[0] if weights else None, need_weights, need_head_weights)

    def reorder_incremental_state(self, incremental_state, new_order: Tensor):
        if self.recording_weights:  # fairseq's own steps (an analysis records the whole decoding)
            return super().reorder_incremental_state(incremental_state, new_order)
        if self.encoder_decoder_attention:
            reorder_static(self, incremental_state, new_order)
        elif buffer := self._get_input_buffer(incremental_state):
            defer_reorder(buffer, new_order)  # in place: the dict incremental_state holds
        return incremental_state
