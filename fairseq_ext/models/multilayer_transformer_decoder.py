"""The decoder of ``multilayer_transformer``: fairseq's Transformer decoder reading the
encoder's joint memory, with auxiliary decoders, AIF and a pre-classifier projection."""
from typing import Optional

import torch.nn as nn
from fairseq.models.transformer import TransformerDecoderBase
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase

from fairseq_ext import keys
from fairseq_ext.models.joint_attention_strategies import CrossAttentionSpec
from fairseq_ext.models.multilayer_transformer_config import MultilayerOptions
from fairseq_ext.models.multilayer_transformer_encoder import build_self_attention_variant, wrap_layer
from fairseq_ext.modules.attention_utils import RecordingMultiheadAttention, reporting_weights, xavier_linear
from fairseq_ext.modules.auxiliary_information_fusion import AuxiliaryInformationFusion
from fairseq_ext.modules.multi_source_attention import SerialCrossAttentionStack
from fairseq_ext.modules.post_self_attention import DecoderStepContext, SublayersAfterSelfAttention
from fairseq_ext.modules.stacked_source_attention import SentenceCachedAttention


class MultilayerTransformerDecoderLayer(SublayersAfterSelfAttention, TransformerDecoderLayerBase):
    """fairseq's decoder layer with a choice of self-attention (standard | DC | MMA), the
    cross-attention of the joint attention strategy, and the sublayers that run right after
    self-attention (AIF, the lower serial cross-attentions; see
    ``fairseq_ext/modules/post_self_attention.py``)."""

    def __init__(self, cfg, options: MultilayerOptions, no_encoder_attn: bool, layer_number: int,
                 context: DecoderStepContext, num_aux: int = 0):
        # read by the build_* hooks, which fairseq calls inside super().__init__
        self.options, self.layer_number = options, layer_number
        super().__init__(cfg, no_encoder_attn)
        n = options.num_joint_layers
        self.serial_stack = (
            SerialCrossAttentionStack(self.embed_dim, cfg.decoder.attention_heads, n, cfg.attention_dropout,
                                      cfg.dropout, cfg.decoder.normalize_before,
                                      removed_source=options.removed_source)
            if options.serial_sublayers and not no_encoder_attn else None
        )
        self.aif = AuxiliaryInformationFusion(self.embed_dim, num_aux) if options.aux_fusion else None
        if self.serial_stack is not None or self.aif is not None:
            self.init_spot(context, num_aux_arguments=num_aux if self.aif is not None else 0)

    def build_self_attention(self, embed_dim, cfg, add_bias_kv=False, add_zero_attn=False):
        kind = self.options.decoder_self_attention[self.layer_number - 1]
        variant = build_self_attention_variant(kind, embed_dim, cfg.decoder.attention_heads, self.options,
                                               cfg.attention_dropout, causal=True)
        if variant is not None:
            return variant
        return self._decoding(super().build_self_attention(embed_dim, cfg, add_bias_kv, add_zero_attn))

    def _decoding(self, attention):
        """fairseq's attention, reporting its weights; an auxiliary decoder's decodes per sentence."""
        attention = reporting_weights(attention)
        if self.options.auxiliary and type(attention) is RecordingMultiheadAttention:
            attention.__class__ = SentenceCachedAttention
        return attention

    def build_encoder_attention(self, embed_dim, cfg):
        build = self.options.strategy.build_cross_attention
        if build is None:
            return self._decoding(super().build_encoder_attention(embed_dim, cfg))
        return build(CrossAttentionSpec(
            embed_dim=embed_dim, num_heads=cfg.decoder.attention_heads, num_sources=self.options.num_joint_layers,
            dropout=cfg.attention_dropout, layer_number=self.layer_number, kdim=cfg.encoder.embed_dim,
            q_noise=self.quant_noise, qn_block_size=self.quant_noise_block_size,
            removed_source=self.options.removed_source,
        ))

    def after_self_attention(self, x, spot):
        """AIF (Eq. 4.3), then the serial sublayers over f^1..f^{n-1}: Z x B x C. ``x`` is the
        self-attention sublayer's output: LN(x + SelfAttn(x)) post-norm, x + SelfAttn(LN(x))
        pre-norm."""
        if self.aif is not None:
            x = self.aif(x, spot.aux_features)
        if self.serial_stack is not None and spot.encoder_out is not None:
            x = self.serial_stack(x, spot.encoder_out, spot.encoder_padding_mask, spot.incremental_state)
        return x


class MultilayerTransformerDecoder(TransformerDecoderBase):
    """fairseq's Transformer decoder reading the encoder's joint memory, with optional
    auxiliary decoders (thesis Ch. 4) and a pre-classifier projection (word-translation
    paper, Table 6).

    The main decoder owns its auxiliary decoders (``aux_decoders``): they share its target
    embedding, output projection and pre-classifier projection, read the encoder layer
    given by ``--aux-decoder-layers``, and run
    - in every teacher-forced forward (their logits are in ``extra["aux_out"]`` for the
      multi-output loss),
    - in lock-step with the main decoder during incremental decoding when AIF is on (their
      incremental states live in the same dictionary and are reordered with it; only their
      features are computed there, not their logits),
    - alone when ``--decode-from aux<l>`` is set.
    """

    def __init__(self, cfg, options: MultilayerOptions, dictionary, embed_tokens, no_encoder_attn=False,
                 output_projection=None, pre_classifier: Optional[nn.Module] = None):
        self.options = options
        self.aux_layers = list(options.aux_layers)
        self.step_context = DecoderStepContext()
        self._layers_built = 0
        super().__init__(cfg, dictionary, embed_tokens, no_encoder_attn=no_encoder_attn,
                         output_projection=output_projection)
        if options.pre_classifier_projection:
            pre_classifier = xavier_linear(self.output_embed_dim, self.output_embed_dim, bias=False)
        self.pre_classifier = pre_classifier
        aux_options = options.for_auxiliary_decoder()
        self.aux_decoders = nn.ModuleList(
            MultilayerTransformerDecoder(cfg, aux_options, dictionary, embed_tokens, no_encoder_attn,
                                         output_projection=self.output_projection,
                                         pre_classifier=self.pre_classifier)
            for _ in self.aux_layers
        ) if self.aux_layers else None
        self.aux_fusion = options.aux_fusion
        self.decode_from = options.decode_from

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        self._layers_built += 1
        layer = MultilayerTransformerDecoderLayer(cfg, self.options, no_encoder_attn, self._layers_built,
                                                  self.step_context, num_aux=len(self.aux_layers))
        if layer.has_sublayers_after_self_attention and cfg.checkpoint_activations:
            # the checkpointed function must take the auxiliary states as arguments
            # (fairseq_ext/modules/post_self_attention.py), so it is spot_forward, not forward
            layer.checkpoint_spot_forward(cfg.offload_activations)
            return wrap_layer(layer, cfg, checkpointed=True)
        return wrap_layer(layer, cfg)

    def forward(self, prev_output_tokens, encoder_out=None, incremental_state=None, features_only=False,
                full_context_alignment=False, alignment_layer=None, alignment_heads=None, src_lengths=None,
                return_all_hiddens=False):
        x, extra = super().forward(prev_output_tokens, encoder_out=encoder_out, incremental_state=incremental_state,
                                   features_only=features_only, full_context_alignment=full_context_alignment,
                                   alignment_layer=alignment_layer, alignment_heads=alignment_heads)
        # the auxiliary logits feed the multi-output loss of a teacher-forced forward; in an
        # incremental step only their features are fused (AIF), and a vocabulary projection
        # per auxiliary decoder and step would be paid for nothing
        if not features_only and incremental_state is None and extra.get(keys.AUX_FEATURES):
            extra[keys.AUX_OUT] = [self.output_layer(f) for f in extra[keys.AUX_FEATURES]]
        return x, extra

    def extract_features(self, prev_output_tokens, encoder_out, incremental_state=None,
                         full_context_alignment=False, alignment_layer=None, alignment_heads=None):
        if self.decode_from is not None:
            aux_index = self.decode_from
            return self.aux_decoders[aux_index].extract_features(
                prev_output_tokens, self.aux_encoder_out(encoder_out, aux_index), incremental_state,
                full_context_alignment, alignment_layer, alignment_heads,
            )
        aux_features = []
        if self.aux_decoders is not None and (incremental_state is None or self.aux_fusion):
            for aux_index, aux in enumerate(self.aux_decoders):
                features, _ = aux.extract_features(
                    prev_output_tokens, self.aux_encoder_out(encoder_out, aux_index), incremental_state,
                    full_context_alignment,
                )
                aux_features.append(features)  # B x Z x C
        memory_out = self.memory_encoder_out(encoder_out)
        with self.step_context.step([f.transpose(0, 1) for f in aux_features]):
            x, extra = super().extract_features(prev_output_tokens, memory_out, incremental_state,
                                                full_context_alignment, alignment_layer, alignment_heads)
        extra[keys.AUX_FEATURES] = aux_features
        return x, extra

    @staticmethod
    def memory_encoder_out(encoder_out):
        """The encoder output with ``encoder_out`` replaced by the joint memory, if any."""
        if encoder_out is None or keys.JOINT_MEMORY not in encoder_out:
            return encoder_out
        memory_out = {**encoder_out, "encoder_out": encoder_out[keys.JOINT_MEMORY]}
        if keys.JOINT_PADDING_MASK in encoder_out:  # multi-source: one mask row per source
            memory_out["encoder_padding_mask"] = encoder_out[keys.JOINT_PADDING_MASK]
        return memory_out

    def aux_encoder_out(self, encoder_out, aux_index: int):
        """What auxiliary decoder ``aux_index`` reads: H^l_e of its encoder layer l."""
        layer = self.aux_layers[aux_index]
        return {
            "encoder_out": [encoder_out[keys.ENCODER_STATES][layer]],
            "encoder_padding_mask": encoder_out["encoder_padding_mask"],
        }

    def output_layer(self, features):
        if self.pre_classifier is not None:
            features = self.pre_classifier(features)
        return super().output_layer(features)
