"""The encoder of ``multilayer_transformer``: fairseq's Transformer encoder that exposes
every layer and builds the decoder's joint source memory once per sentence."""
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn as nn
from fairseq.distributed import fsdp_wrap
from fairseq.models.transformer import TransformerEncoderBase
from fairseq.modules import LayerNorm
from fairseq.modules.checkpoint_activations import checkpoint_wrapper
from fairseq.modules.transformer_layer import TransformerEncoderLayerBase
from torch import Tensor

from fairseq_ext import keys
from fairseq_ext.models.joint_attention_strategies import Memory, MemorySpec
from fairseq_ext.models.multilayer_transformer_config import MultilayerOptions
from fairseq_ext.modules.dual_contextual_attention import DualContextualAttention
from fairseq_ext.modules.attention_utils import reporting_weights
from fairseq_ext.modules.mixed_multihead_attention import MixedMultiheadAttention
from fairseq_ext.modules.source_feature_collector import collect_source_features, encoder_layer_outputs


def wrap_layer(layer: nn.Module, cfg, checkpointed: bool = False) -> nn.Module:
    """Activation checkpointing and FSDP wrapping, as fairseq's build_*_layer do
    (``checkpointed``: the layer checkpoints a part of its forward itself)."""
    checkpoint = cfg.checkpoint_activations
    if checkpoint and not checkpointed:
        layer = checkpoint_wrapper(layer, offload_to_cpu=cfg.offload_activations)
    return fsdp_wrap(layer, min_num_params=cfg.min_params_to_wrap if not checkpoint else 0)


def build_self_attention_variant(kind: str, embed_dim: int, num_heads: int, options: MultilayerOptions,
                                 attention_dropout: float, causal: bool) -> Optional[nn.Module]:
    """The DC or MMA replacement of a layer's self-attention sublayer (None: standard)."""
    if kind == "dc":
        return DualContextualAttention(embed_dim, num_heads, kernel_size=options.dc_kernel_size,
                                       attention_dropout=attention_dropout, causal=causal)
    if kind == "mma":
        heads = options.decoder_mma_heads if causal else options.encoder_mma_heads
        return MixedMultiheadAttention(embed_dim, num_heads, dropout=attention_dropout, self_attention=True,
                                       head_spec=heads, window=options.mma_window, causal=causal)
    return None


class MultilayerTransformerEncoderLayer(TransformerEncoderLayerBase):
    """fairseq's encoder layer with a choice of self-attention (standard | DC | MMA)."""

    def __init__(self, cfg, options: MultilayerOptions, layer_number: int, return_fc: bool = False):
        # read by build_self_attention, which fairseq calls inside super().__init__
        self.self_attention_kind = options.encoder_self_attention[layer_number - 1]
        self.options = options
        super().__init__(cfg, return_fc=return_fc)

    def build_self_attention(self, embed_dim, cfg):
        variant = build_self_attention_variant(self.self_attention_kind, embed_dim, cfg.encoder.attention_heads,
                                               self.options, cfg.attention_dropout, causal=False)
        return variant if variant is not None else reporting_weights(super().build_self_attention(embed_dim, cfg))


class MultilayerTransformerEncoder(TransformerEncoderBase):
    """fairseq's Transformer encoder that always returns every layer's output
    (``encoder_states``: embeddings, layer 1..L) and, when a joint attention strategy is
    set, the decoder's source memory ``joint_memory``, built once per sentence in the form
    the strategy's table entry names (``joint_attention_strategies.py``):

    - aggregated (layer aggregation): H^a, J x B x C (thesis 3.2.1);
    - per_decoder_layer (transparent attention): one memory per decoder layer, J x B x M x C;
    - stacked (MLMHA and multi-source combination): f^1..f^n stacked, J x B x n x C.
    """

    def __init__(self, cfg, options: MultilayerOptions, dictionary, embed_tokens, return_fc: bool = False,
                 joint_memory: bool = True):
        self.options = options
        self._layers_built = 0
        super().__init__(cfg, dictionary, embed_tokens, return_fc=return_fc)
        if not options.encoder_positions:
            # MMA paper Table 3: the encoder sees its tokens without positions (fairseq's own
            # --no-token-positional-embeddings drops the decoder's as well)
            self.embed_positions = None
        # an encoder of one source among several builds no memory of its own: the
        # MultiSourceEncoder stacks the sources' top layers instead
        self.strategy = options.strategy if joint_memory else options.for_auxiliary_decoder().strategy
        build = self.strategy.build_memory
        if build is not None:
            spec = MemorySpec(cfg.encoder.embed_dim, cfg.encoder.ffn_embed_dim,
                              options.num_joint_layers, cfg.activation_dropout, cfg.encoder.layers,
                              cfg.decoder.layers, options.merger_dropout)
            # registered under the strategy's own name (layer_aggregation, transparent),
            # which is part of the checkpoint's parameter names
            setattr(self, self.strategy.memory_attribute, build(spec))
        # --collected-layer-norm (pre-norm): the states read below the top are residual streams,
        # each gets a LayerNorm of its own (the top one is the encoder's final LayerNorm); as DLCL's
        # default, transparent attention leaves the embedding state H^0 as it is
        below_top = options.num_joint_layers - 1 if self.strategy.collects_layers else cfg.encoder.layers - 1
        self.collected_layer_norms = nn.ModuleList(
            LayerNorm(cfg.encoder.embed_dim) for _ in range(below_top)
        ) if options.collected_layer_norm and self.strategy.memory is not Memory.NONE else None

    @property
    def memory_module(self) -> Optional[nn.Module]:
        """The strategy's encoder-side module (layer aggregation, transparent mixing)."""
        name = self.strategy.memory_attribute
        return getattr(self, name) if name is not None else None

    def build_encoder_layer(self, cfg):
        self._layers_built += 1
        return wrap_layer(MultilayerTransformerEncoderLayer(cfg, self.options, self._layers_built, self.return_fc),
                          cfg)

    def forward(self, src_tokens, src_lengths: Optional[Tensor] = None,
                return_all_hiddens: bool = True, token_embeddings: Optional[Tensor] = None):
        # every layer is exposed to the decoder (and its auxiliary decoders), always
        encoder_out = self.forward_scriptable(src_tokens, src_lengths, True, token_embeddings)
        memory = self.joint_memory(encoder_out)
        if memory is not None:
            encoder_out[keys.JOINT_MEMORY] = [memory]
        return encoder_out

    def joint_memory(self, encoder_out: Dict[str, List[Tensor]]) -> Optional[Tensor]:
        if self.strategy.memory is Memory.NONE:
            return None
        states = encoder_layer_outputs(encoder_out)
        if self.collected_layer_norms is not None:  # the states read below the top, each normalised
            first = len(states) - 1 - len(self.collected_layer_norms)
            states = states[:first] + [norm(state) for norm, state in zip(self.collected_layer_norms, states[first:-1])] \
                + states[-1:]
        if not self.strategy.collects_layers:  # transparent: every state, embeddings included
            return self.memory_module(states)
        features = collect_source_features(states, self.options.num_joint_layers, self.options.mask_source_layer)
        if self.memory_module is not None:
            return self.memory_module(features)
        return torch.stack(features, dim=2)

    @property
    def layers_read_when_decoding(self) -> Tuple[int, ...]:
        """The encoder layers (indices into ``encoder_states``) that incremental decoding
        reads: those of the auxiliary decoders that run there (all of them with AIF, the
        chosen one with --decode-from aux<l>). The joint attention strategies read
        ``joint_memory``, built once per sentence, and the main decoder ``encoder_out``."""
        aux_layers = self.options.aux_layers
        if self.options.decode_from is not None:
            return (aux_layers[self.options.decode_from],)
        return tuple(aux_layers) if self.options.aux_fusion else ()

    def reorder_encoder_out(self, encoder_out: Dict[str, List[Tensor]], new_order):
        states = encoder_out.get(keys.ENCODER_STATES)
        if states:
            # fairseq's beam search reorders every tensor of encoder_out at every step: of the
            # L + 1 layer outputs only those decoding reads are carried (the others are None
            # after a reorder); copying all of them made the no-option model's beam search 7%
            # slower than stock (docs/performance.md)
            read = self.layers_read_when_decoding
            encoder_out = dict(encoder_out)
            encoder_out[keys.ENCODER_STATES] = []
        reordered = super().reorder_encoder_out(encoder_out, new_order)
        if states and read:
            reordered[keys.ENCODER_STATES] = [
                state.index_select(1, new_order) if i in read and state is not None else None
                for i, state in enumerate(states)
            ]
        if keys.JOINT_MEMORY in encoder_out:  # fairseq's version drops unknown keys
            reordered[keys.JOINT_MEMORY] = [m.index_select(1, new_order) for m in encoder_out[keys.JOINT_MEMORY]]
        return reordered
