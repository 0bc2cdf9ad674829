"""The encoder of multi-source translation (task ``multi_source_translation``; Libovicky et
al. 2018): several source sentences, each with its own encoder or one shared encoder."""
from typing import Dict, List, Optional

import torch
import torch.nn as nn
from fairseq.models import FairseqEncoder
from torch import Tensor

from fairseq_ext import keys
from fairseq_ext.errors import OptionError
from fairseq_ext.models.multilayer_transformer_encoder import MultilayerTransformerEncoder


class MultiSourceEncoder(FairseqEncoder):
    """Encodes the primary source (``src_tokens``) and every extra source
    (``extra_src_tokens``, B x (n-1) x J') with its own encoder (or one shared encoder with
    ``--multi-source-shared-encoder``) and stacks their top-layer outputs, left-padded to
    one length, as the decoder's memory (J x B x n x C) with one padding-mask row per source
    (``joint_padding_mask``, B x n x J). The rest of the output is the primary source's, so
    auxiliary decoders read the primary source's layers.
    """

    def __init__(self, encoders: List[MultilayerTransformerEncoder], num_sources: int):
        super().__init__(encoders[0].dictionary)
        self.encoders = nn.ModuleList(encoders)
        self.num_sources = num_sources

    def encoder_for(self, source_index: int) -> MultilayerTransformerEncoder:
        return self.encoders[source_index if len(self.encoders) > 1 else 0]

    def forward(self, src_tokens, src_lengths: Optional[Tensor] = None, extra_src_tokens: Optional[Tensor] = None,
                return_all_hiddens: bool = True, token_embeddings: Optional[Tensor] = None):
        if extra_src_tokens is None or extra_src_tokens.size(1) != self.num_sources - 1:
            raise OptionError(f"the model encodes {self.num_sources} sources: train and decode it with "
                              f"--task multi_source_translation and {self.num_sources - 1} --extra-source-langs")
        encoder_out = self.encoder_for(0)(src_tokens, src_lengths, token_embeddings=token_embeddings)
        outputs = [encoder_out] + [
            self.encoder_for(k + 1)(extra_src_tokens[:, k]) for k in range(self.num_sources - 1)
        ]
        length = max(out["encoder_out"][0].size(0) for out in outputs)
        memories, masks = [], []
        for out in outputs:
            states, mask = out["encoder_out"][0], out["encoder_padding_mask"][0]
            missing = length - states.size(0)  # sources are left-padded: pad on the left
            memories.append(nn.functional.pad(states, (0, 0, 0, 0, missing, 0)))
            masks.append(nn.functional.pad(mask, (missing, 0), value=True))
        encoder_out[keys.JOINT_MEMORY] = [torch.stack(memories, dim=2)]  # J x B x n x C
        encoder_out[keys.JOINT_PADDING_MASK] = [torch.stack(masks, dim=1)]  # B x n x J
        return encoder_out

    def reorder_encoder_out(self, encoder_out: Dict[str, List[Tensor]], new_order):
        reordered = self.encoders[0].reorder_encoder_out(encoder_out, new_order)
        reordered[keys.JOINT_PADDING_MASK] = [
            m.index_select(0, new_order) for m in encoder_out[keys.JOINT_PADDING_MASK]
        ]
        return reordered

    def max_positions(self):
        return self.encoders[0].max_positions()
