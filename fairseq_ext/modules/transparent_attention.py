"""Transparent attention (Bapna et al. 2018, "Training Deeper Neural Machine Translation
Models with Transparent Attention"; a baseline in the MLMHA paper, Tables 2-4).

Decoder layer j reads its own memory sum_{i=0..L} softmax(w_{:, j})_i H^i_e with
w in R^{(L+1) x M}; the embedding output H^0_e is included. In training, ``merger_dropout``
p drops the mixing weights before their softmax, softmax(Dropout_p(w_{:, j} + 1 / (L+1))) (each
zeroed with probability p, the others scaled by 1 / (1 - p)), as Lingvo's ``WeightedSumLayer``
(``transparent_merger_dropout_prob``) does: the constant cancels in the softmax, so without
dropout it changes nothing; at initialisation a dropped state gets e^0, a kept one e^(1/((L+1)(1-p))).
A fairseq ``FairseqDropout``, so ``--retain-dropout`` reaches it.
"""
from typing import List

import torch
import torch.nn as nn
from fairseq.modules.fairseq_dropout import FairseqDropout
from torch import Tensor


class TransparentCombination(nn.Module):
    """-> J x B x M x C: the memory of every decoder layer (the layer selects its slice)."""

    def __init__(self, num_encoder_states: int, num_decoder_layers: int, merger_dropout: float = 0.0):
        super().__init__()
        self.merger_dropout = FairseqDropout(merger_dropout, module_name=self.__class__.__name__)
        # zeros: every layer starts from the uniform average of the encoder states
        self.weight = nn.Parameter(torch.zeros(num_encoder_states, num_decoder_layers))

    def forward(self, encoder_states: List[Tensor]) -> Tensor:  # L+1 tensors J x B x C
        stacked = torch.stack(encoder_states, dim=2)  # J x B x (L+1) x C
        weight = self.merger_dropout(self.weight + 1.0 / len(self.weight)) if self.merger_dropout.p else self.weight
        mix = torch.softmax(weight.float(), dim=0).type_as(stacked)  # (L+1) x M
        return torch.einsum("jbic,im->jbmc", stacked, mix)
