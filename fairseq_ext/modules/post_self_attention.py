"""Running sublayers right after a decoder layer's self-attention, inside fairseq's layer.

Auxiliary Information Fusion (thesis Eq. 4.3) and the serial strategy's lower
cross-attention sublayers (Libovicky et al. 2018, Fig. 1a) act "right after the masked
self-attention sublayer". fairseq's ``TransformerDecoderLayerBase.forward`` runs
self-attention, the cross-attention and the FFN in one method with no hook in between, and
copying that method to add one call is what this plugin does not do. Instead,
:class:`SublayersAfterSelfAttention`, mixed into the decoder layer, finds the spot:

* post-norm (the papers' setting): the self-attention sublayer ends with
  ``self_attn_layer_norm``, so a forward hook on that LayerNorm sees exactly the sublayer's
  output, ``LN(x + SelfAttn(x))``, and replaces it;
* pre-norm: the sublayer's output is the residual stream ``x + SelfAttn(LN(x))``, the
  result of the layer's first ``residual_connection`` (fairseq's forward calls it once per
  sublayer, self-attention first), which the mixin overrides to run the sublayers there.

Either way the rest of fairseq's forward continues from the replaced value: the
cross-attention's residual and input are the sublayers' output.

The inputs: the serial sublayers read the layer's own arguments (the joint memory, its
padding mask and the incremental state). AIF also reads the auxiliary decoders' states,
which the decoder puts in a :class:`DecoderStepContext` for one call of its layers; the
layer's ``forward`` takes them from there and hands them to ``spot_forward`` as explicit
tensor arguments. That is what makes ``--checkpoint-activations`` work: fairseq's
checkpointing (``checkpoint_wrapper``) wraps ``spot_forward``, saves its tensor arguments
and recomputes it from them in the backward pass, when the decoder's context is long gone,
and the gradients of the auxiliary states reach the auxiliary decoders through those
arguments. The context holds no parameters and is never saved.

Parameters keep their places (``layers.i.aif.*``, ``layers.i.serial_stack.*``), so a
checkpoint's parameter names do not depend on this mechanism.
"""
import functools
from contextlib import contextmanager
from types import SimpleNamespace
from typing import List, Optional

import torch.nn as nn
from fairseq.modules.checkpoint_activations import checkpoint_wrapper
from torch import Tensor

AUX_ARGUMENT = "aux_feature_{}"  # spot_forward's keyword for auxiliary decoder i's states


class DecoderStepContext:
    """The auxiliary decoders' states (Z x B x C each) for one call of the decoder's layers."""

    def __init__(self):
        self.aux_features: List[Tensor] = []

    @contextmanager
    def step(self, aux_features: List[Tensor]):
        self.aux_features = aux_features
        try:
            yield self
        finally:
            self.aux_features = []


class SublayersAfterSelfAttention:
    """Mixed into a subclass of fairseq's ``TransformerDecoderLayerBase`` (before it in the
    bases) whose ``after_self_attention(x, spot)`` (Z x B x C -> Z x B x C) runs right after
    the self-attention sublayer. ``spot`` holds ``aux_features``, ``encoder_out``,
    ``encoder_padding_mask`` and ``incremental_state`` of the current call. The subclass
    calls :meth:`init_spot` at the end of ``__init__`` when it has such sublayers."""

    _spot = None  # the current call's inputs, while spot_forward runs
    _spot_pending = False  # the spot of the current call is still ahead
    _num_aux_arguments = 0
    has_sublayers_after_self_attention = False

    def init_spot(self, context: DecoderStepContext, num_aux_arguments: int) -> None:
        self.step_context = context
        self._num_aux_arguments = num_aux_arguments
        self.has_sublayers_after_self_attention = True
        if not self.normalize_before:
            # a partial over a module-level function, not a lambda: copy.deepcopy (fairseq's EMA,
            # model averaging tools) copies a partial's arguments, so a copied layer's hook
            # runs the copied layer
            self.self_attn_layer_norm.register_forward_hook(functools.partial(_at_post_norm_spot, self))

    def checkpoint_spot_forward(self, offload_to_cpu: bool) -> None:
        """fairseq's activation checkpointing around ``spot_forward`` (the layer's whole
        computation, with the auxiliary states as its arguments)."""
        self.spot_forward = checkpoint_wrapper(SimpleNamespace(forward=self.spot_forward), offload_to_cpu).forward

    def forward(self, x, encoder_out=None, encoder_padding_mask=None, incremental_state=None, *args, **kwargs):
        if not self.has_sublayers_after_self_attention:
            return super().forward(x, encoder_out, encoder_padding_mask, incremental_state, *args, **kwargs)
        aux = self.step_context.aux_features
        if len(aux) != self._num_aux_arguments:
            raise ValueError(f"the decoder layer expects {self._num_aux_arguments} auxiliary decoder states, "
                             f"got {len(aux)}")
        aux_arguments = {AUX_ARGUMENT.format(i): f for i, f in enumerate(aux)}
        return self.spot_forward(x, encoder_out, encoder_padding_mask, incremental_state, *args, **kwargs,
                                 **aux_arguments)

    def spot_forward(self, x, encoder_out=None, encoder_padding_mask=None, incremental_state=None, *args,
                     **kwargs):
        aux = [kwargs.pop(AUX_ARGUMENT.format(i)) for i in range(self._num_aux_arguments)]
        self._spot = SimpleNamespace(aux_features=aux, encoder_out=encoder_out,
                                     encoder_padding_mask=encoder_padding_mask, incremental_state=incremental_state)
        self._spot_pending = True
        try:
            return super().forward(x, encoder_out, encoder_padding_mask, incremental_state, *args, **kwargs)
        finally:
            self._spot, self._spot_pending = None, False

    def residual_connection(self, x, residual):
        x = super().residual_connection(x, residual)
        if self._spot_pending and self.normalize_before:  # pre-norm: the first residual is self-attention's
            x = self._run_spot(x)
        return x

    def _run_spot(self, x: Tensor) -> Tensor:
        self._spot_pending = False
        return self.after_self_attention(x, self._spot)


def _at_post_norm_spot(layer, module: nn.Module, inputs, output: Tensor) -> Optional[Tensor]:
    if layer._spot_pending:  # outside spot_forward (a direct call of the LayerNorm), nothing to run
        return layer._run_spot(output)
    return None
