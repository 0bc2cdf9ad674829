"""Layer Aggregation (thesis 3.2.1): one joint source memory H^a from the collected encoder
layers f^1..f^n, fed to every decoder layer's cross-attention.

    WS(r_1..r_b)  = sum_i W_i r_i,  W_i in R^{d x d}
    AGG(r_1..r_b) = LayerNorm(FFN([r_1; ..; r_b]) + sum_i r_i),
                    FFN = Linear(b d, d_ff) -> ReLU -> Linear(d_ff, d)
    S-Agg:      H^a = WS(f^1..f^n)
    Iter-S-Agg: H_1 = f^1; H_i = WS(f^i, H_{i-1}); H^a = H_n
    C-Agg:      H^a = AGG(f^1..f^n)
    Iter-C-Agg: H_1 = f^1; H_i = AGG(f^i, H_{i-1}); H^a = H_n
"""
from typing import List

import torch
import torch.nn as nn
from fairseq.modules import LayerNorm
from fairseq.modules.fairseq_dropout import FairseqDropout
from torch import Tensor

from fairseq_ext.modules.attention_utils import xavier_linear


class WeightedSum(nn.Module):
    """WS(r_1..r_b) = sum_i W_i r_i (thesis Eq. 3.2), no bias."""

    def __init__(self, embed_dim: int, num_inputs: int):
        super().__init__()
        self.weights = nn.ModuleList(
            xavier_linear(embed_dim, embed_dim, bias=False) for _ in range(num_inputs)
        )

    def forward(self, inputs: List[Tensor]) -> Tensor:  # each T x B x C
        return torch.stack([w(r) for w, r in zip(self.weights, inputs)]).sum(dim=0)


class AggregationUnit(nn.Module):
    """AGG(r_1..r_b) = LayerNorm(FFN(concat(r_1..r_b)) + sum_i r_i) (thesis Eq. 3.4)."""

    def __init__(self, embed_dim: int, ffn_dim: int, num_inputs: int, activation_dropout: float = 0.0):
        super().__init__()
        self.fc1 = xavier_linear(num_inputs * embed_dim, ffn_dim)
        self.fc2 = xavier_linear(ffn_dim, embed_dim)
        # fairseq's dropout module, so that --retain-dropout reaches it
        self.activation_dropout = FairseqDropout(activation_dropout, module_name=self.__class__.__name__)
        self.layer_norm = LayerNorm(embed_dim)

    def forward(self, inputs: List[Tensor]) -> Tensor:  # each T x B x C
        hidden = self.fc2(self.activation_dropout(torch.relu(self.fc1(torch.cat(inputs, dim=-1)))))
        return self.layer_norm(hidden + torch.stack(inputs).sum(dim=0))


class LayerAggregation(nn.Module):
    """S-Agg, Iter-S-Agg, C-Agg or Iter-C-Agg over n collected layers -> H^a (T x B x C).

    ``concatenation``: the unit is AGG (C-Agg, Eq. 3.4) rather than WS (S-Agg, Eq. 3.2);
    ``iterative``: one two-input unit per step, bottom to top (Eq. 3.3 / 3.5), rather than
    one unit over all n layers."""

    def __init__(self, embed_dim: int, ffn_dim: int, num_sources: int, concatenation: bool, iterative: bool,
                 activation_dropout: float = 0.0):
        super().__init__()
        self.concatenation, self.iterative = concatenation, iterative

        def unit(num_inputs):
            if concatenation:
                return AggregationUnit(embed_dim, ffn_dim, num_inputs, activation_dropout)
            return WeightedSum(embed_dim, num_inputs)

        if self.iterative:
            self.units = nn.ModuleList(unit(2) for _ in range(num_sources - 1))
        else:
            self.units = nn.ModuleList([unit(num_sources)])

    def forward(self, features: List[Tensor]) -> Tensor:
        if not self.iterative:
            return self.units[0](features)
        state = features[0]
        for unit, feature in zip(self.units, features[1:]):
            state = unit([feature, state])
        return state
