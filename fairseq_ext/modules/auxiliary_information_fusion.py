"""Auxiliary Information Fusion, AIF (thesis 4.2, Eq. 4.2-4.3).

In main-decoder layer l, right after the masked self-attention sublayer:

    z_f = sum_i W^{a,i}_l f^i        f^i: top-layer output of auxiliary decoder i (Z x d)
    h_l <- h_l + z_f                 W^{a,i}_l in R^{d x d}

With every W^{a,i}_l zero the main decoder is the MS model's main decoder ("ind-decoder",
thesis Eq. 4.4-4.7).
"""
from typing import List

import torch.nn as nn
from torch import Tensor

from fairseq_ext.modules.attention_utils import xavier_linear


class AuxiliaryInformationFusion(nn.Module):
    def __init__(self, embed_dim: int, num_auxiliary: int):
        super().__init__()
        self.projections = nn.ModuleList(
            xavier_linear(embed_dim, embed_dim, bias=False) for _ in range(num_auxiliary)
        )

    def forward(self, hidden: Tensor, aux_features: List[Tensor]) -> Tensor:
        """hidden: Z x B x C; aux_features: one Z x B x C tensor per auxiliary decoder."""
        if len(aux_features) != len(self.projections):
            raise ValueError(
                f"AIF expects {len(self.projections)} auxiliary features, got {len(aux_features)}"
            )
        return hidden + sum(w(f) for w, f in zip(self.projections, aux_features))
