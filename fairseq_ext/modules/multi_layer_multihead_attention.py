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
    ReportsAttentionWeights,
    attend_by_sentence,
    attention_weights_for_output,
    made_while_unchanged,
    merge_heads,
    softmax_float,
    xavier_linear,
)
from fairseq_ext.modules.stacked_source_attention import StackedSourceAttention


def joint_mlmha(queries: Tensor, keys: Tensor, values: Tensor, key_padding_mask: Optional[Tensor], head_dim: int,
                dropout=None) -> Tuple[Tensor, Tensor]:
    """U0 = 0 (Eq. 3.7-3.8) with the n sources side by side on the feature axis: since
    sum_i q^i . k^i = [q^1 .. q^n] . [k^1 .. k^n], one matmul of inner size n D gives the
    summed logits, and one matmul gives every source's context under the joint weights.

    queries: B x H x Z x (n D); keys: B x H x J x (n D); values: B x H x J x (n D), or
    sum_i V^i (B x H x J x D) for U1 = 1 (sum_i w V^i = w sum_i V^i); key_padding_mask: B x J,
    or B x n x J (a position padded in any source is out of the sum). Returns the contexts
    (B x H x Z x (n D), source-major per head, or B x H x Z x D) and the weights B x H x Z x J.
    """
    logits = torch.matmul(queries, keys.transpose(-1, -2)) / math.sqrt(head_dim)
    if key_padding_mask is not None:
        mask = key_padding_mask.to(torch.bool)
        mask = mask.any(dim=1) if mask.dim() == 3 else mask
        logits = logits.masked_fill(mask[:, None, None, :], float("-inf"))
    joint = softmax_float(logits)
    dropped = dropout(joint) if dropout is not None else joint
    return torch.matmul(dropped, values), joint


def layer_specific_mlmha(queries: Tensor, keys: Tensor, values: Tensor, key_padding_mask: Optional[Tensor],
                         dropout=None) -> Tuple[Tensor, Tensor]:
    """U0 = 1 (Eq. 3.9): one softmax per source, all n in one batched matmul each.

    queries: B x n x H x Z x D; keys/values: B x n x H x J x D; key_padding_mask: B x J (the
    layers of one sentence) or B x n x J (one row per source sentence). Returns the contexts
    B x n x H x Z x D and the weights B x n x H x Z x J.
    """
    logits = torch.matmul(queries, keys.transpose(-1, -2)) / math.sqrt(queries.size(-1))  # B x n x H x Z x J
    if key_padding_mask is not None:
        mask = key_padding_mask.to(torch.bool)
        mask = mask[:, None, None, None, :] if mask.dim() == 2 else mask[:, :, None, None, :]
        logits = logits.masked_fill(mask, float("-inf"))
    weights = softmax_float(logits)
    contexts = torch.matmul(dropout(weights) if dropout is not None else weights, values)
    return contexts, weights


class MultiLayerMultiheadAttention(StackedSourceAttention, ReportsAttentionWeights):
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

    def _stacked_query_projection(self) -> Tuple[Tensor, Tensor]:
        """W^{q,1..n} and their biases as one (n C) x C projection. Without autograd
        (decoding) the concatenation is kept until a weight changes (in-place updates bump
        a tensor's version), so it is not rebuilt at every step."""
        params = [t for p in self.q_proj for t in (p.weight, p.bias)]
        return made_while_unchanged(self, "_q_stacked", params, lambda ts: (torch.cat(ts[0::2]), torch.cat(ts[1::2])))

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
        tgt_len, bsz, _ = query.shape
        # every source's query projection in one matmul: Z x B x (n C) -> Z x B x n x H x D
        q = F.linear(query, *self._stacked_query_projection())
        q = q.view(tgt_len, bsz, self.num_sources, self.num_heads, self.head_dim)
        attend = self._layer_specific if self.layer_specific else self._joint
        combined, weights = attend(q, key, key_padding_mask, incremental_state)
        return self.out_proj(combined), attention_weights_for_output(weights, need_weights, need_head_weights)

    def _layer_specific(self, q: Tensor, key: Optional[Tensor], key_padding_mask: Optional[Tensor],
                        incremental_state) -> Tuple[Tensor, Tensor]:
        """U0 = 1. q: Z x B x n x H x D. Returns the combined contexts (Z x B x C for U1 = 1,
        Z x B x n C for U1 = 0) and the weights."""
        tgt_len, bsz, n = q.shape[:3]
        k, v = self.static_keys_values(key, incremental_state)  # R x n x H x J x D, R rows (see the base)
        q = q.permute(1, 2, 3, 0, 4)  # B x n x H x Z x D
        kept = None
        if self.removed_source is not None:  # layer masking: source i takes no part
            kept = torch.tensor([i for i in range(n) if i != self.removed_source], device=q.device)
            q, k, v = q.index_select(1, kept), k.index_select(1, kept), v.index_select(1, kept)
            if key_padding_mask is not None and key_padding_mask.dim() == 3:
                key_padding_mask = key_padding_mask.index_select(1, kept)
        contexts, per_source = attend_by_sentence(
            lambda queries, mask: layer_specific_mlmha(queries, k, v, mask, self.dropout_module),
            q, k.size(0), key_padding_mask)
        weights = per_source.mean(dim=1)  # returned for inspection: the mean over the sources
        if self.recording_weights:
            sources = range(n) if kept is None else kept.tolist()
            self.report_weights(attention=weights, per_source=dict(zip(sources, per_source.unbind(1))))
        if self.sum_contexts:
            return merge_heads(contexts.sum(dim=1)), weights  # Z x B x C
        if kept is not None:  # its context is zero in the concatenation
            contexts = contexts.new_zeros(bsz, n, *contexts.shape[2:]).index_copy(1, kept, contexts)
        # B x n x H x Z x D -> Z x B x (n C), source-major as concat(c^1 .. c^n)
        return contexts.permute(3, 0, 1, 2, 4).reshape(tgt_len, bsz, n * self.embed_dim), weights

    def _joint(self, q: Tensor, key: Optional[Tensor], key_padding_mask: Optional[Tensor],
               incremental_state) -> Tuple[Tensor, Tensor]:
        """U0 = 0, the sources side by side on each head's feature axis (B x H x J x (n D));
        that layout is what is cached per sentence (and, for M-01, only sum_i V^i).
        q: Z x B x n x H x D. Returns the combined contexts and the weights."""
        tgt_len, bsz, n = q.shape[:3]
        side_by_side = lambda t: t.permute(0, 2, 3, 1, 4).flatten(3)  # noqa: E731
        summed = self.sum_contexts and self.removed_source is None
        k, v = self.static_keys_values(key, incremental_state, side_by_side,
                                       (lambda t: t.sum(dim=1)) if summed else side_by_side)
        keep = None
        if self.removed_source is not None:  # layer masking: q^i = 0 takes source i out of the logits' sum
            keep = torch.ones(n, 1, device=q.device, dtype=q.dtype)  # against the (n, D) axes
            keep[self.removed_source] = 0
            q = q * keep[:, :, None]
        q = q.permute(1, 3, 0, 2, 4).flatten(3)  # B x H x Z x (n D)
        contexts, weights = attend_by_sentence(  # k: R x H x J x (n D), R rows (see the base)
            lambda queries, mask: joint_mlmha(queries, k, v, mask, self.head_dim, self.dropout_module),
            q, k.size(0), key_padding_mask)
        self.report_weights(attention=weights)
        if summed:
            return merge_heads(contexts), weights  # Z x B x C
        contexts = contexts.unflatten(-1, (n, self.head_dim))  # B x H x Z x n x D
        if keep is not None:  # and its context leaves the concatenation / the sum
            contexts = contexts * keep
        if self.sum_contexts:
            return merge_heads(contexts.sum(dim=3)), weights
        # -> Z x B x n x H x D -> Z x B x (n C), source-major
        return contexts.permute(2, 0, 3, 1, 4).reshape(tgt_len, bsz, n * self.embed_dim), weights
