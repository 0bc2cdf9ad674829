"""Running sublayers right after a decoder layer's self-attention, inside fairseq's layer.

Auxiliary Information Fusion (thesis Eq. 4.3) and the serial strategy's lower
cross-attention sublayers (Libovicky et al. 2018, Fig. 1a) act "right after the masked
self-attention sublayer". fairseq's ``TransformerDecoderLayerBase.forward`` runs
self-attention, the cross-attention and the FFN in one method with no hook in between, and
copying that method to add one call is what this plugin does not do. Instead:

1. the spot: in a post-norm layer (the papers' setting; pre-norm is refused at build) the
   self-attention sublayer ends with ``self_attn_layer_norm``, so a forward hook on that
   LayerNorm (:func:`run_after_self_attention`) sees exactly the sublayer's output and may
   replace it; the rest of fairseq's forward continues from the replaced value;
2. the inputs: a LayerNorm's forward gets only ``x``, but AIF needs the auxiliary
   decoders' states and the serial sublayers need the joint memory and the incremental
   state. The decoder puts them in a :class:`DecoderStepContext` for the duration of one
   call of its layers (``with context.step(...)``), and the hook reads them there. The
   context holds no parameters and is never saved.

Parameters keep their places (``layers.i.aif.*``, ``layers.i.serial_stack.*``), so a
checkpoint's parameter names do not depend on this mechanism.
"""
import functools
from contextlib import contextmanager
from typing import Callable, List, Optional

import torch.nn as nn
from torch import Tensor


class DecoderStepContext:
    """What the decoder hands its layers' post-self-attention sublayers for one call."""

    def __init__(self):
        self.clear()

    def clear(self):
        self.aux_features: List[Tensor] = []  # Z x B x C each
        self.memory: Optional[Tensor] = None  # the joint memory, J x B x n x C
        self.padding_mask: Optional[Tensor] = None
        self.incremental_state = None

    @contextmanager
    def step(self, aux_features: List[Tensor], memory: Optional[Tensor], padding_mask: Optional[Tensor],
             incremental_state):
        self.aux_features, self.memory, self.padding_mask = aux_features, memory, padding_mask
        self.incremental_state = incremental_state
        try:
            yield self
        finally:
            self.clear()


def run_after_self_attention(layer: nn.Module, sublayer: Callable[[Tensor], Tensor]) -> None:
    """Make ``sublayer(x)`` (Z x B x C -> Z x B x C) run on the output of ``layer``'s
    self-attention sublayer, inside fairseq's ``TransformerDecoderLayerBase.forward``."""
    if getattr(layer, "normalize_before", False):
        raise ValueError("sublayers after self-attention need a post-norm decoder layer")
    # a partial over a module-level function, not a lambda: copy.deepcopy (fairseq's EMA, model
    # averaging tools) copies a partial's arguments, so a copied layer's hook calls the copied
    # sublayer (a bound method of a copied module), where a lambda would keep the original's
    layer.self_attn_layer_norm.register_forward_hook(functools.partial(_replace_output, sublayer))


def _replace_output(sublayer: Callable[[Tensor], Tensor], module: nn.Module, inputs, output: Tensor) -> Tensor:
    return sublayer(output)
