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
from typing import List, Optional, Tuple

import torch
import torch.nn as nn
from torch import Tensor

from fairseq_ext.modules.attention_utils import (
    QKV_GAIN,
    attention_weights_for_output,
    merge_heads,
    scaled_logits,
    softmax_float,
    source_mask,
    split_heads,
    xavier_linear,
)
from fairseq_ext.modules.stacked_source_attention import StackedSourceAttention

# name -> (U0, U1)
MLMHA_CONFIGS = {"m-00": (0, 0), "m-01": (0, 1), "m-10": (1, 0), "m-11": (1, 1)}


def mlmha(queries, keys, values, key_padding_mask, layer_specific: bool, dropout=None
          ) -> Tuple[List[Tensor], Tensor]:
    """The attention core of Eq. 3.7-3.9 on projected, head-split tensors.

    queries/keys/values: sequences over sources i of B x H x Z x D / B x H x J x D.
    Returns the contexts c^i (B x H x Z x D each) and the attention weights B x H x Z x J
    (for U0 = 1 their mean over the sources, for inspection only).
    """
    logits = [scaled_logits(q, k, source_mask(key_padding_mask, i)) for i, (q, k) in enumerate(zip(queries, keys))]
    drop = dropout if dropout is not None else (lambda w: w)
    if layer_specific:  # U0 = 1: one softmax per source
        weights = [softmax_float(a) for a in logits]
        contexts = [torch.matmul(drop(w), v) for w, v in zip(weights, values)]
        return contexts, torch.stack(weights).mean(dim=0)
    joint = softmax_float(torch.stack(logits).sum(dim=0))  # U0 = 0: one joint softmax
    dropped = drop(joint)
    return [torch.matmul(dropped, v) for v in values], joint


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
        k, v = self.static_keys_values(key, incremental_state)
        keep = [i for i in range(self.num_sources) if i != self.removed_source]
        queries = [split_heads(self.q_proj[i](query), self.num_heads) for i in keep]
        keys, values = k.unbind(1), v.unbind(1)
        if key_padding_mask is not None and key_padding_mask.dim() == 3:
            key_padding_mask = key_padding_mask[:, keep]
        kept, weights = mlmha(queries, [keys[i] for i in keep], [values[i] for i in keep], key_padding_mask,
                              self.layer_specific, self.dropout_module)
        kept = [merge_heads(c) for c in kept]  # Z x B x C each
        contexts = [torch.zeros_like(kept[0])] * self.num_sources
        for i, c in zip(keep, kept):
            contexts[i] = c
        combined = torch.stack(contexts).sum(dim=0) if self.sum_contexts else torch.cat(contexts, dim=-1)
        return self.out_proj(combined), attention_weights_for_output(weights, need_weights, need_head_weights)
