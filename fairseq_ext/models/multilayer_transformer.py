"""``multilayer_transformer``: one composable Transformer for the multi-layer NMT
architectures of Ampomah's thesis and papers (see SPEC.md and README.md).

Composable parts, every one off by default (then the model is fairseq's ``transformer``):
- how the decoder reads the encoder layers (``--joint-attention``): layer aggregation,
  transparent attention, MLMHA (M-00/01/10/11), multi-source combination;
- auxiliary decoders on lower encoder layers (``--aux-decoder-layers``), with optional
  Auxiliary Information Fusion (``--aux-fusion``);
- the encoder / decoder self-attention (``--encoder-self-attention``,
  ``--decoder-self-attention``): standard, Dual Contextual (DC) or Mixed Multi-Head (MMA);
- a pre-classifier projection (``--pre-classifier-projection``).

Where the code lives: the encoder builds the joint source memory once per sentence
(`MultilayerTransformerEncoder.joint_memory`), every decoder layer picks its
cross-attention in `MultilayerTransformerDecoderLayer.build_encoder_attention`, the
self-attention variants in ``build_self_attention``; the math of each technique is in
``fairseq_ext/modules/``.
"""
import re
from typing import Dict, List, Optional

import torch
import torch.nn as nn
from fairseq.distributed import fsdp_wrap
from fairseq.models import ARCH_MODEL_REGISTRY, FairseqEncoder, register_model, register_model_architecture
from fairseq.models.transformer import (
    TransformerDecoderBase,
    TransformerEncoderBase,
    TransformerModel,
    base_architecture,
)
from fairseq.modules.checkpoint_activations import checkpoint_wrapper
from fairseq.modules.transformer_layer import (
    TransformerDecoderLayerBase,
    TransformerEncoderLayerBase,
)
from torch import Tensor

from fairseq_ext.checkpoint_safety import register_config_upgrade
from fairseq_ext.errors import OptionError
from fairseq_ext.modules.attention_utils import xavier_linear
from fairseq_ext.modules.auxiliary_information_fusion import AuxiliaryInformationFusion
from fairseq_ext.modules.dual_contextual_attention import DualContextualAttention
from fairseq_ext.modules.layer_aggregation import LAYER_AGGREGATION_STRATEGIES, LayerAggregation
from fairseq_ext.modules.mixed_multihead_attention import (
    DECODER_DEFAULT_MMA_HEADS,
    MixedMultiheadAttention,
    parse_mma_heads,
)
from fairseq_ext.modules.multi_layer_multihead_attention import (
    MLMHA_CONFIGS,
    MultiLayerMultiheadAttention,
)
from fairseq_ext.modules.multi_source_attention import (
    MULTI_SOURCE_STRATEGIES,
    FlatOrHierarchicalCrossAttention,
    ParallelCrossAttention,
    SerialCrossAttentionStack,
    SourceSelectAttention,
)
from fairseq_ext.modules.source_feature_collector import (
    collect_source_features,
    encoder_layer_outputs,
)
from fairseq_ext.modules.transparent_attention import TransparentCombination

JOINT_ATTENTION_CHOICES = (
    ("none",) + LAYER_AGGREGATION_STRATEGIES + ("transparent",) + tuple(MLMHA_CONFIGS)
    + MULTI_SOURCE_STRATEGIES
)
ENCODER_SELF_ATTENTION_CHOICES = ("standard", "dc", "mma")
DECODER_SELF_ATTENTION_CHOICES = ("standard", "dc", "mma")
# strategies whose decoder layers read the n collected layers stacked (J x B x n x C)
STACKED_MEMORY_STRATEGIES = tuple(MLMHA_CONFIGS) + MULTI_SOURCE_STRATEGIES


# ----------------------------------------------------------------------------------------
# options: parsing and build-time validation (errors name the flag)
# ----------------------------------------------------------------------------------------
def parse_layer_list(value: Optional[str], flag: str) -> List[int]:
    """'1,3' -> [1, 3]; '' or None -> []."""
    if value is None or str(value).strip() == "":
        return []
    try:
        return [int(v) for v in str(value).split(",") if v.strip() != ""]
    except ValueError:
        raise OptionError(f"{flag}: expected a comma list of layer numbers, got {value!r}")


def parse_layer_range(value: Optional[str], num_layers: int, flag: str) -> List[int]:
    """'1-3' -> [1, 2, 3]; '2,4-5' -> [2, 4, 5]; None/'' -> all layers 1..num_layers."""
    if value is None or str(value).strip() == "":
        return list(range(1, num_layers + 1))
    layers = []
    for part in str(value).split(","):
        match = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part)
        if match is None:
            raise OptionError(f"{flag}: expected a range such as 1-6 or 1-3, got {value!r}")
        start, end = int(match.group(1)), int(match.group(2) or match.group(1))
        if not 1 <= start <= end <= num_layers:
            raise OptionError(f"{flag}: range {part.strip()} is outside layers 1-{num_layers}")
        layers.extend(range(start, end + 1))
    return sorted(set(layers))


def parse_decode_from(value: Optional[str], aux_layers: List[int]) -> Optional[int]:
    """'main' -> None; 'aux<l>' -> the position of the aux decoder on encoder layer l."""
    if value is None or value == "main":
        return None
    match = re.fullmatch(r"aux(\d+)", str(value))
    if match is None:
        raise OptionError(f"--decode-from: expected 'main' or 'aux<layer>', got {value!r}")
    layer = int(match.group(1))
    if layer not in aux_layers:
        raise OptionError(
            f"--decode-from {value}: no auxiliary decoder on encoder layer {layer} "
            f"(--aux-decoder-layers is {','.join(map(str, aux_layers)) or 'empty'})"
        )
    return aux_layers.index(layer)


def validate_multilayer_args(args) -> None:
    """Reject invalid combinations at model build, naming the option."""
    num_enc, num_dec = args.encoder_layers, args.decoder_layers
    strategy = args.joint_attention
    if strategy not in JOINT_ATTENTION_CHOICES:
        raise OptionError(
            f"--joint-attention: unknown strategy {strategy!r} (choices: {', '.join(JOINT_ATTENTION_CHOICES)})"
        )
    n = args.joint_attention_layers
    if not 1 <= n <= num_enc:
        if n > num_enc:
            raise OptionError(f"--joint-attention-layers ({n}) exceeds --encoder-layers ({num_enc})")
        raise OptionError(f"--joint-attention-layers ({n}) must be at least 1")
    if strategy == "none" and n != 1:
        raise OptionError(f"--joint-attention-layers ({n}) needs a --joint-attention strategy")
    if strategy == "transparent" and n != num_enc:
        raise OptionError(
            f"--joint-attention-layers ({n}) does not apply to --joint-attention transparent, which mixes "
            f"all {num_enc + 1} encoder states (embeddings included)"
        )
    mask = args.mask_source_layer
    if mask is not None:
        if strategy in ("none", "transparent"):
            raise OptionError(f"--mask-source-layer needs a --joint-attention strategy that collects layers, not {strategy!r}")
        if not 1 <= mask <= n:
            raise OptionError(f"--mask-source-layer ({mask}) must be within 1..--joint-attention-layers ({n})")

    aux_layers = parse_layer_list(args.aux_decoder_layers, "--aux-decoder-layers")
    for layer in aux_layers:
        if not 1 <= layer < num_enc:
            raise OptionError(
                f"--aux-decoder-layers: layer {layer} must be within 1..{num_enc - 1} "
                f"(below --encoder-layers {num_enc}; the main decoder reads layer {num_enc})"
            )
    if len(set(aux_layers)) != len(aux_layers):
        raise OptionError(f"--aux-decoder-layers: duplicate layers in {args.aux_decoder_layers!r}")
    if args.aux_fusion and not aux_layers:
        raise OptionError("--aux-fusion needs auxiliary decoders (--aux-decoder-layers)")
    parse_decode_from(args.decode_from, aux_layers)
    if aux_layers and args.decoder_layers_to_keep:
        raise OptionError("--aux-decoder-layers cannot be combined with --decoder-layers-to-keep")

    post_self_attention_hook = args.aux_fusion or (strategy == "serial" and n > 1)
    if post_self_attention_hook:
        what = "--aux-fusion" if args.aux_fusion else "--joint-attention serial"
        if args.decoder_normalize_before:
            raise OptionError(f"{what} is implemented for post-norm decoder layers: unset --decoder-normalize-before")
        if getattr(args, "checkpoint_activations", False):
            raise OptionError(f"{what} cannot be combined with --checkpoint-activations")

    if args.encoder_self_attention not in ENCODER_SELF_ATTENTION_CHOICES:
        raise OptionError(f"--encoder-self-attention: unknown variant {args.encoder_self_attention!r}")
    if args.decoder_self_attention not in DECODER_SELF_ATTENTION_CHOICES:
        raise OptionError(f"--decoder-self-attention: unknown variant {args.decoder_self_attention!r}")
    if args.dc_kernel_size < 1:
        raise OptionError(f"--dc-kernel-size ({args.dc_kernel_size}) must be at least 1")
    parse_layer_range(args.dc_encoder_layers, num_enc, "--dc-encoder-layers")
    parse_layer_range(args.dc_decoder_layers, num_dec, "--dc-decoder-layers")
    if args.mma_window < 0:
        raise OptionError(f"--mma-window ({args.mma_window}) must be >= 0")
    if args.encoder_self_attention == "mma":
        parse_mma_heads(args.mma_heads, args.encoder_attention_heads, causal=False, flag="--mma-heads")
    elif args.mma_heads:
        raise OptionError(f"--mma-heads {args.mma_heads!r} needs --encoder-self-attention mma "
                          f"(it is {args.encoder_self_attention!r})")
    if args.decoder_self_attention == "mma":
        parse_mma_heads(args.decoder_mma_heads, args.decoder_attention_heads, causal=True, flag="--decoder-mma-heads")
    elif args.decoder_mma_heads:
        raise OptionError(f"--decoder-mma-heads {args.decoder_mma_heads!r} needs --decoder-self-attention mma "
                          f"(it is {args.decoder_self_attention!r})")
    for side in ("encoder", "decoder"):
        dim, heads = getattr(args, f"{side}_embed_dim"), getattr(args, f"{side}_attention_heads")
        if dim % heads != 0:
            raise OptionError(f"--{side}-embed-dim ({dim}) is not divisible by --{side}-attention-heads ({heads})")
    if args.encoder_embed_dim != args.decoder_embed_dim and strategy != "none":
        raise OptionError("--joint-attention needs --encoder-embed-dim equal to --decoder-embed-dim")


MULTI_SOURCE_SENTENCE_STRATEGIES = MULTI_SOURCE_STRATEGIES + ("m-10", "m-11")


def validate_multi_source_args(args) -> None:
    """Multi-source translation combines different sentences: only the strategies that
    attend each source separately apply (M-x0/M-x1 with U0 = 0 add logits position by
    position, which needs the sources to be layers of one sentence)."""
    if args.joint_attention not in MULTI_SOURCE_SENTENCE_STRATEGIES:
        raise OptionError(
            f"--task multi_source_translation needs --joint-attention in {', '.join(MULTI_SOURCE_SENTENCE_STRATEGIES)}, "
            f"not {args.joint_attention!r}"
        )
    if args.mask_source_layer is not None:
        raise OptionError("--mask-source-layer does not apply to --task multi_source_translation")
    if args.encoder_embed_dim != args.decoder_embed_dim:
        raise OptionError("--task multi_source_translation needs --encoder-embed-dim equal to --decoder-embed-dim")


def wrap_layer(layer: nn.Module, cfg) -> nn.Module:
    """Activation checkpointing and FSDP wrapping, as fairseq's build_*_layer do."""
    checkpoint = cfg.checkpoint_activations
    if checkpoint:
        layer = checkpoint_wrapper(layer, offload_to_cpu=cfg.offload_activations)
    return fsdp_wrap(layer, min_num_params=cfg.min_params_to_wrap if not checkpoint else 0)


def build_self_attention_variant(kind: str, embed_dim: int, num_heads: int, cfg, causal: bool):
    """The DC or MMA replacement of a layer's self-attention sublayer (None: standard)."""
    if kind == "dc":
        return DualContextualAttention(
            embed_dim, num_heads, kernel_size=cfg.dc_kernel_size,
            attention_dropout=cfg.attention_dropout, causal=causal,
        )
    if kind == "mma":
        spec = cfg.decoder_mma_heads if causal else cfg.mma_heads
        return MixedMultiheadAttention(
            embed_dim, num_heads, dropout=cfg.attention_dropout, self_attention=True,
            head_spec=parse_mma_heads(spec, num_heads, causal=causal), window=cfg.mma_window, causal=causal,
        )
    return None


def self_attention_kind(cfg, side: str, layer_number: int) -> str:
    """The self-attention variant of encoder/decoder layer ``layer_number`` (1-based)."""
    kind = getattr(cfg, f"{side}_self_attention")
    if kind == "dc":
        num_layers = cfg.encoder.layers if side == "encoder" else cfg.decoder.layers
        if layer_number not in parse_layer_range(getattr(cfg, f"dc_{side}_layers"), num_layers, f"--dc-{side}-layers"):
            return "standard"
    return kind


# ----------------------------------------------------------------------------------------
# encoder
# ----------------------------------------------------------------------------------------
class MultilayerTransformerEncoderLayer(TransformerEncoderLayerBase):
    """fairseq's encoder layer with a choice of self-attention (standard | DC | MMA)."""

    def __init__(self, cfg, layer_number: int, return_fc: bool = False):
        self.layer_number = layer_number  # read by build_self_attention during super().__init__
        super().__init__(cfg, return_fc=return_fc)

    def build_self_attention(self, embed_dim, cfg):
        kind = self_attention_kind(cfg, "encoder", self.layer_number)
        variant = build_self_attention_variant(kind, embed_dim, cfg.encoder.attention_heads, cfg, causal=False)
        return variant if variant is not None else super().build_self_attention(embed_dim, cfg)


class MultilayerTransformerEncoder(TransformerEncoderBase):
    """fairseq's Transformer encoder that always returns every layer's output
    (``encoder_states``: embeddings, layer 1..L) and, when a joint attention strategy is
    set, the decoder's source memory ``joint_memory``, built once per sentence:

    - layer aggregation: H^a, J x B x C (thesis 3.2.1);
    - transparent attention: one memory per decoder layer, J x B x M x C;
    - MLMHA and multi-source combination: f^1..f^n stacked, J x B x n x C.
    """

    def __init__(self, cfg, dictionary, embed_tokens, return_fc: bool = False, joint_memory: bool = True):
        self._layers_built = 0
        super().__init__(cfg, dictionary, embed_tokens, return_fc=return_fc)
        # an encoder of one source among several builds no memory of its own: the
        # MultiSourceEncoder stacks the sources' top layers instead
        self.joint_attention = cfg.joint_attention if joint_memory else "none"
        self.num_sources = cfg.joint_attention_layers
        self.mask_source_layer = cfg.mask_source_layer
        embed_dim = cfg.encoder.embed_dim
        strategy = self.joint_attention
        self.layer_aggregation = (
            LayerAggregation(self.joint_attention, embed_dim, cfg.encoder.ffn_embed_dim,
                             self.num_sources, activation_dropout=cfg.activation_dropout)
            if strategy in LAYER_AGGREGATION_STRATEGIES else None
        )
        self.transparent = (
            TransparentCombination(cfg.encoder.layers + 1, cfg.decoder.layers) if strategy == "transparent" else None
        )

    def build_encoder_layer(self, cfg):
        self._layers_built += 1
        return wrap_layer(MultilayerTransformerEncoderLayer(cfg, self._layers_built, self.return_fc), cfg)

    def forward(self, src_tokens, src_lengths: Optional[Tensor] = None,
                return_all_hiddens: bool = True, token_embeddings: Optional[Tensor] = None):
        # every layer is exposed to the decoder (and its auxiliary decoders), always
        encoder_out = self.forward_scriptable(src_tokens, src_lengths, True, token_embeddings)
        memory = self.joint_memory(encoder_out)
        if memory is not None:
            encoder_out["joint_memory"] = [memory]
        return encoder_out

    def joint_memory(self, encoder_out: Dict[str, List[Tensor]]) -> Optional[Tensor]:
        if self.joint_attention == "none":
            return None
        states = encoder_layer_outputs(encoder_out)
        if self.transparent is not None:
            return self.transparent(states)
        features = collect_source_features(states, self.num_sources, self.mask_source_layer)
        if self.layer_aggregation is not None:
            return self.layer_aggregation(features)
        return torch.stack(features, dim=2)

    def reorder_encoder_out(self, encoder_out: Dict[str, List[Tensor]], new_order):
        reordered = super().reorder_encoder_out(encoder_out, new_order)
        if "joint_memory" in encoder_out:  # fairseq's version drops unknown keys
            reordered["joint_memory"] = [m.index_select(1, new_order) for m in encoder_out["joint_memory"]]
        return reordered


class MultiSourceEncoder(FairseqEncoder):
    """Encoder of multi-source translation (task ``multi_source_translation``; Libovický et
    al. 2018): encodes the primary source (``src_tokens``) and every extra source
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
        encoder_out["joint_memory"] = [torch.stack(memories, dim=2)]  # J x B x n x C
        encoder_out["joint_padding_mask"] = [torch.stack(masks, dim=1)]  # B x n x J
        return encoder_out

    def reorder_encoder_out(self, encoder_out: Dict[str, List[Tensor]], new_order):
        reordered = self.encoders[0].reorder_encoder_out(encoder_out, new_order)
        reordered["joint_padding_mask"] = [m.index_select(0, new_order) for m in encoder_out["joint_padding_mask"]]
        return reordered

    def max_positions(self):
        return self.encoders[0].max_positions()


# ----------------------------------------------------------------------------------------
# decoder
# ----------------------------------------------------------------------------------------
class DecoderStepContext:
    """What the decoder hands its layers for the step after each self-attention sublayer
    (AIF and the lower serial cross-attentions), set by the decoder around one call of
    its layers. Not a module: it holds no parameters and is not saved."""

    def __init__(self):
        self.clear()

    def clear(self):
        self.aux_features: List[Tensor] = []  # Z x B x C each
        self.memory: Optional[Tensor] = None
        self.padding_mask: Optional[Tensor] = None
        self.incremental_state = None


class MultilayerTransformerDecoderLayer(TransformerDecoderLayerBase):
    """fairseq's decoder layer with a choice of self-attention (standard | DC | MMA), a
    cross-attention that reads several encoder layers, and AIF.

    AIF (thesis Eq. 4.3) and the serial strategy's lower cross-attention sublayers act
    "right after the masked self-attention sublayer": in a post-norm layer that is the
    output of ``self_attn_layer_norm``, so they run in a forward hook on it and the stock
    forward stays untouched.
    """

    def __init__(self, cfg, no_encoder_attn: bool, layer_number: int, role: str,
                 context: DecoderStepContext, num_aux: int = 0):
        self.layer_number, self.role = layer_number, role  # read by the build_* hooks
        super().__init__(cfg, no_encoder_attn)
        self.step_context = context
        strategy, n = self.strategy(cfg), cfg.joint_attention_layers
        self.serial_stack = (
            SerialCrossAttentionStack(self.embed_dim, cfg.decoder.attention_heads, n, cfg.attention_dropout,
                                      cfg.dropout, cfg.decoder.normalize_before)
            if strategy == "serial" and n > 1 and not no_encoder_attn else None
        )
        self.aif = (
            AuxiliaryInformationFusion(self.embed_dim, num_aux) if role == "main" and cfg.aux_fusion else None
        )
        if self.serial_stack is not None or self.aif is not None:
            self.self_attn_layer_norm.register_forward_hook(self._after_self_attention)

    def strategy(self, cfg) -> str:
        # auxiliary decoders read one encoder layer with the standard cross-attention
        return cfg.joint_attention if self.role == "main" else "none"

    def build_self_attention(self, embed_dim, cfg, add_bias_kv=False, add_zero_attn=False):
        kind = self_attention_kind(cfg, "decoder", self.layer_number)
        variant = build_self_attention_variant(kind, embed_dim, cfg.decoder.attention_heads, cfg, causal=True)
        if variant is not None:
            return variant
        return super().build_self_attention(embed_dim, cfg, add_bias_kv, add_zero_attn)

    def build_encoder_attention(self, embed_dim, cfg):
        strategy, n = self.strategy(cfg), cfg.joint_attention_layers
        heads, dropout = cfg.decoder.attention_heads, cfg.attention_dropout
        if strategy in MLMHA_CONFIGS:
            u0, u1 = MLMHA_CONFIGS[strategy]
            return MultiLayerMultiheadAttention(embed_dim, heads, n, layer_specific=bool(u0),
                                                sum_contexts=bool(u1), dropout=dropout)
        if strategy == "parallel":
            return ParallelCrossAttention(embed_dim, heads, n, dropout)
        if strategy in ("flat", "hierarchical"):
            return FlatOrHierarchicalCrossAttention(embed_dim, heads, n, strategy, dropout)
        if strategy in ("serial", "transparent"):
            # serial: this sublayer attends f^n; transparent: this layer's own memory
            index = n - 1 if strategy == "serial" else self.layer_number - 1
            return SourceSelectAttention(
                embed_dim, heads, kdim=cfg.encoder.embed_dim, vdim=cfg.encoder.embed_dim, dropout=dropout,
                encoder_decoder_attention=True, q_noise=self.quant_noise,
                qn_block_size=self.quant_noise_block_size, source_index=index,
            )
        return super().build_encoder_attention(embed_dim, cfg)

    def _after_self_attention(self, module, inputs, output):
        context = self.step_context
        if self.aif is not None:
            output = self.aif(output, context.aux_features)
        if self.serial_stack is not None and context.memory is not None:
            output = self.serial_stack(output, context.memory, context.padding_mask, context.incremental_state)
        return output


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
      incremental states live in the same dictionary and are reordered with it),
    - alone when ``--decode-from aux<l>`` is set.
    """

    def __init__(self, cfg, dictionary, embed_tokens, no_encoder_attn=False, output_projection=None,
                 role: str = "main", pre_classifier: Optional[nn.Module] = None):
        self.role = role
        self.aux_layers = parse_layer_list(cfg.aux_decoder_layers, "--aux-decoder-layers") if role == "main" else []
        self.step_context = DecoderStepContext()
        self._layers_built = 0
        super().__init__(cfg, dictionary, embed_tokens, no_encoder_attn=no_encoder_attn,
                         output_projection=output_projection)
        if role == "main" and cfg.pre_classifier_projection:
            pre_classifier = xavier_linear(self.output_embed_dim, self.output_embed_dim, bias=False)
        self.pre_classifier = pre_classifier
        self.aux_decoders = nn.ModuleList(
            MultilayerTransformerDecoder(cfg, dictionary, embed_tokens, no_encoder_attn,
                                         output_projection=self.output_projection, role="aux",
                                         pre_classifier=self.pre_classifier)
            for _ in self.aux_layers
        ) if self.aux_layers else None
        self.aux_fusion = role == "main" and bool(cfg.aux_fusion)
        self.decode_from = parse_decode_from(cfg.decode_from, self.aux_layers) if role == "main" else None

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        self._layers_built += 1
        layer = MultilayerTransformerDecoderLayer(cfg, no_encoder_attn, self._layers_built, self.role,
                                                  self.step_context, num_aux=len(self.aux_layers))
        return wrap_layer(layer, cfg)

    def forward(self, prev_output_tokens, encoder_out=None, incremental_state=None, features_only=False,
                full_context_alignment=False, alignment_layer=None, alignment_heads=None, src_lengths=None,
                return_all_hiddens=False):
        x, extra = super().forward(prev_output_tokens, encoder_out=encoder_out, incremental_state=incremental_state,
                                   features_only=features_only, full_context_alignment=full_context_alignment,
                                   alignment_layer=alignment_layer, alignment_heads=alignment_heads)
        if not features_only and extra.get("aux_features"):
            extra["aux_out"] = [self.output_layer(f) for f in extra["aux_features"]]
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
        context = self.step_context
        context.aux_features = [f.transpose(0, 1) for f in aux_features]
        if memory_out is not None:
            context.memory = memory_out["encoder_out"][0]
            context.padding_mask = (memory_out["encoder_padding_mask"] or [None])[0]
        context.incremental_state = incremental_state
        try:
            x, extra = super().extract_features(prev_output_tokens, memory_out, incremental_state,
                                                full_context_alignment, alignment_layer, alignment_heads)
        finally:
            context.clear()
        extra["aux_features"] = aux_features
        return x, extra

    @staticmethod
    def memory_encoder_out(encoder_out):
        """The encoder output with ``encoder_out`` replaced by the joint memory, if any."""
        if encoder_out is None or "joint_memory" not in encoder_out:
            return encoder_out
        memory_out = {**encoder_out, "encoder_out": encoder_out["joint_memory"]}
        if "joint_padding_mask" in encoder_out:  # multi-source: one mask row per source
            memory_out["encoder_padding_mask"] = encoder_out["joint_padding_mask"]
        return memory_out

    def aux_encoder_out(self, encoder_out, aux_index: int):
        """What auxiliary decoder ``aux_index`` reads: H^l_e of its encoder layer l."""
        layer = self.aux_layers[aux_index]
        return {
            "encoder_out": [encoder_out["encoder_states"][layer]],
            "encoder_padding_mask": encoder_out["encoder_padding_mask"],
        }

    def output_layer(self, features):
        if self.pre_classifier is not None:
            features = self.pre_classifier(features)
        return super().output_layer(features)


# ----------------------------------------------------------------------------------------
# model
# ----------------------------------------------------------------------------------------
@register_model("multilayer_transformer")
class MultilayerTransformerModel(TransformerModel):
    """fairseq's Transformer with the multi-layer architectures of Ampomah's thesis as
    options; with every option off it is numerically the stock ``transformer``."""

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        group = parser.add_argument_group("fairseq_ext: joint attention over encoder layers (thesis Ch. 3)")
        group.add_argument("--joint-attention", choices=JOINT_ATTENTION_CHOICES,
                           help="how the decoder reads the encoder layers (default: none = top layer only)")
        group.add_argument("--joint-attention-layers", type=int, metavar="N",
                           help="n: the top n encoder layers collected (default: all when a strategy is set)")
        group.add_argument("--mask-source-layer", type=int, metavar="I",
                           help="analysis (thesis Table 3.5): replace collected layer f^I (1..n) by zeros")
        group.add_argument("--multi-source-shared-encoder", action="store_true", default=None,
                           help="--task multi_source_translation: one encoder for every source (default: one each)")
        group = parser.add_argument_group("fairseq_ext: multi-level supervision (thesis Ch. 4)")
        group.add_argument("--aux-decoder-layers", type=str, metavar="L1,L2",
                           help="encoder layers (1-based, < L) that get an auxiliary decoder, e.g. 1 or 1,3")
        group.add_argument("--aux-fusion", action="store_true", default=None,
                           help="Auxiliary Information Fusion in every main-decoder layer (Eq. 4.2-4.3)")
        group.add_argument("--decode-from", type=str, metavar="main|aux<l>",
                           help="decode with the main decoder (default) or the auxiliary decoder on layer l")
        group = parser.add_argument_group("fairseq_ext: self-attention variants (thesis Ch. 5, MMA paper)")
        group.add_argument("--encoder-self-attention", choices=ENCODER_SELF_ATTENTION_CHOICES,
                           help="encoder self-attention: standard, dc (Dual Contextual) or mma (Mixed Multi-Head)")
        group.add_argument("--decoder-self-attention", choices=DECODER_SELF_ATTENTION_CHOICES,
                           help="decoder self-attention: standard, dc (causal Dual Contextual) or mma (causal heads)")
        group.add_argument("--dc-kernel-size", type=int, metavar="F", help="DC local context kernel size f (default 3)")
        group.add_argument("--dc-encoder-layers", type=str, metavar="I-J", help="encoder layers with DC (default all)")
        group.add_argument("--dc-decoder-layers", type=str, metavar="I-J", help="decoder layers with DC (default all)")
        group.add_argument("--mma-heads", type=str, metavar="G,L,F,B",
                           help="encoder MMA head functions (default: the four split evenly over the heads)")
        group.add_argument("--decoder-mma-heads", type=str, metavar="L,B",
                           help="decoder MMA head functions: only L (local) and B (backward) (default L,B)")
        group.add_argument("--mma-window", type=int, metavar="W", help="window w of MMA local heads (default 1)")
        group.add_argument("--pre-classifier-projection", action="store_true", default=None,
                           help="d x d linear map (no bias) before the output classifier (word-translation paper, Table 6)")

    @classmethod
    def build_model(cls, args, task):
        multilayer_transformer(args)
        # multi-source translation: the n sources of the combination are the task's sentences
        args.num_source_sentences = getattr(task, "num_source_sentences", 1)
        if args.num_source_sentences > 1:
            validate_multi_source_args(args)
            args.joint_attention_layers = args.num_source_sentences
        validate_multilayer_args(args)
        return super().build_model(args, task)

    def forward(self, src_tokens, src_lengths, prev_output_tokens, return_all_hiddens: bool = True,
                features_only: bool = False, alignment_layer: Optional[int] = None,
                alignment_heads: Optional[int] = None, extra_src_tokens: Optional[Tensor] = None):
        """fairseq's forward, plus the extra sources of multi-source translation."""
        extra = {} if extra_src_tokens is None else {"extra_src_tokens": extra_src_tokens}
        encoder_out = self.encoder(src_tokens, src_lengths=src_lengths, return_all_hiddens=return_all_hiddens, **extra)
        return self.decoder(prev_output_tokens, encoder_out=encoder_out, features_only=features_only,
                            alignment_layer=alignment_layer, alignment_heads=alignment_heads,
                            src_lengths=src_lengths, return_all_hiddens=return_all_hiddens)

    @classmethod
    def build_encoder(cls, cfg, src_dict, embed_tokens):
        num_sources = getattr(cfg, "num_source_sentences", 1)
        if num_sources > 1:
            num_encoders = 1 if cfg.multi_source_shared_encoder else num_sources
            return MultiSourceEncoder(
                [MultilayerTransformerEncoder(cfg, src_dict, embed_tokens, joint_memory=False)
                 for _ in range(num_encoders)], num_sources,
            )
        return MultilayerTransformerEncoder(cfg, src_dict, embed_tokens)

    @classmethod
    def build_decoder(cls, cfg, tgt_dict, embed_tokens):
        return MultilayerTransformerDecoder(cfg, tgt_dict, embed_tokens, no_encoder_attn=cfg.no_cross_attention)


# ----------------------------------------------------------------------------------------
# presets: each sets only what differs, then calls its parent; command-line values win
# ----------------------------------------------------------------------------------------
def upgrade_checkpoint_args(model_args) -> None:
    """Bring the model configuration of an older checkpoint of this plugin up to date
    (run on every checkpoint load, see checkpoint_safety.register_config_upgrade).

    - Before 0.2, ``--decoder-mma-heads`` defaulted to ``L,B`` in every model, MMA or not;
      now a head spec without MMA is refused, and the default is empty (meaning L,B).
    """
    if getattr(model_args, "arch", None) not in ARCH_NAMES:
        return
    if getattr(model_args, "decoder_self_attention", "standard") != "mma" \
            and getattr(model_args, "decoder_mma_heads", "") == DECODER_DEFAULT_MMA_HEADS:
        model_args.decoder_mma_heads = ""


def _default(args, name, value):
    if getattr(args, name, None) is None:
        setattr(args, name, value)


@register_model_architecture("multilayer_transformer", "multilayer_transformer")
def multilayer_transformer(args):
    base_architecture(args)
    _default(args, "joint_attention", "none")
    _default(args, "joint_attention_layers", 1 if args.joint_attention == "none" else args.encoder_layers)
    _default(args, "mask_source_layer", None)
    _default(args, "multi_source_shared_encoder", False)
    _default(args, "aux_decoder_layers", "")
    _default(args, "aux_fusion", False)
    _default(args, "decode_from", "main")
    _default(args, "encoder_self_attention", "standard")
    _default(args, "decoder_self_attention", "standard")
    _default(args, "dc_kernel_size", 3)
    _default(args, "dc_encoder_layers", "")
    _default(args, "dc_decoder_layers", "")
    _default(args, "mma_heads", "")
    _default(args, "decoder_mma_heads", "")  # empty: L,B
    _default(args, "mma_window", 1)
    _default(args, "pre_classifier_projection", False)
    # fairseq's option parsing calls the arch function: refuse bad options there, before
    # fairseq-train logs its configuration (build_model validates again, with the task)
    validate_multilayer_args(args)


@register_model_architecture("multilayer_transformer", "multilayer_transformer_iwslt")
def multilayer_transformer_iwslt(args):
    """The thesis' small configuration (IWSLT): d 256, FFN 1024, 4 heads, 4+4 layers."""
    _default(args, "encoder_embed_dim", 256)
    _default(args, "encoder_ffn_embed_dim", 1024)
    _default(args, "encoder_attention_heads", 4)
    _default(args, "encoder_layers", 4)
    _default(args, "decoder_embed_dim", 256)
    _default(args, "decoder_ffn_embed_dim", 1024)
    _default(args, "decoder_attention_heads", 4)
    _default(args, "decoder_layers", 4)
    multilayer_transformer(args)


@register_model_architecture("multilayer_transformer", "multilayer_transformer_wmt_en_de")
def multilayer_transformer_wmt_en_de(args):
    """Transformer base: d 512, FFN 2048, 8 heads, 6+6 layers."""
    multilayer_transformer(args)


@register_model_architecture("multilayer_transformer", "transformer_jas_iwslt")
def transformer_jas_iwslt(args):
    """MLMHA paper's recommendation for the small config: M-00 over all 4 layers."""
    _default(args, "joint_attention", "m-00")
    _default(args, "joint_attention_layers", 4)
    multilayer_transformer_iwslt(args)


@register_model_architecture("multilayer_transformer", "transformer_jas_wmt_en_de")
def transformer_jas_wmt_en_de(args):
    """MLMHA paper's recommendation for the base config: M-10 over all 6 layers."""
    _default(args, "joint_attention", "m-10")
    _default(args, "joint_attention_layers", 6)
    multilayer_transformer_wmt_en_de(args)


@register_model_architecture("multilayer_transformer", "transformer_ms_iwslt")
def transformer_ms_iwslt(args):
    """MS-1 (an auxiliary decoder on encoder layer 1), no AIF, small config."""
    _default(args, "aux_decoder_layers", "1")
    multilayer_transformer_iwslt(args)


@register_model_architecture("multilayer_transformer", "transformer_ms_wmt_en_de")
def transformer_ms_wmt_en_de(args):
    """MS-1, no AIF, base config."""
    _default(args, "aux_decoder_layers", "1")
    multilayer_transformer_wmt_en_de(args)


@register_model_architecture("multilayer_transformer", "transformer_dc_iwslt")
def transformer_dc_iwslt(args):
    """Enc-DC (Dual Contextual encoder self-attention), small config."""
    _default(args, "encoder_self_attention", "dc")
    multilayer_transformer_iwslt(args)


@register_model_architecture("multilayer_transformer", "transformer_dc_wmt_en_de")
def transformer_dc_wmt_en_de(args):
    """Enc-DC, base config."""
    _default(args, "encoder_self_attention", "dc")
    multilayer_transformer_wmt_en_de(args)


@register_model_architecture("multilayer_transformer", "transformer_mma_iwslt")
def transformer_mma_iwslt(args):
    """Mixed Multi-Head encoder self-attention, small config."""
    _default(args, "encoder_self_attention", "mma")
    multilayer_transformer_iwslt(args)


@register_model_architecture("multilayer_transformer", "transformer_mma_wmt_en_de")
def transformer_mma_wmt_en_de(args):
    """Mixed Multi-Head encoder self-attention, base config."""
    _default(args, "encoder_self_attention", "mma")
    multilayer_transformer_wmt_en_de(args)


@register_model_architecture("multilayer_transformer", "transformer_deep_enc_shallow_dec")
def transformer_deep_enc_shallow_dec(args):
    """Word-translation paper, Table 4: 10 encoder and 2 decoder layers, base dims."""
    _default(args, "encoder_layers", 10)
    _default(args, "decoder_layers", 2)
    multilayer_transformer_wmt_en_de(args)


ARCH_NAMES = frozenset(name for name, model in ARCH_MODEL_REGISTRY.items() if model is MultilayerTransformerModel)
register_config_upgrade(upgrade_checkpoint_args)
