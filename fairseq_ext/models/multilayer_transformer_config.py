"""The options of ``multilayer_transformer``, each defined once, and their typed form.

- :class:`MultilayerTransformerConfig`: every option with its help and default, turned into
  command-line flags by fairseq's ``gen_parser_from_dataclass`` (the way fairseq defines
  its own Transformer's options). Presets fill the defaults from it.
- :func:`parse_options`: reads the flags once, at model build, checks every combination
  (errors name the flag), and returns :class:`MultilayerOptions`: typed values (layer lists,
  per-layer self-attention kinds, MMA head letters, the strategy's table entry) that the
  encoder, the decoder and their layers use as they are, without parsing strings again.
"""
import re
from dataclasses import dataclass, field, fields, replace
from typing import List, Optional, Tuple

from fairseq.dataclass import ChoiceEnum, FairseqDataclass

from fairseq_ext.errors import OptionError
from fairseq_ext.models.joint_attention_strategies import (
    MULTI_SOURCE_STRATEGY_NAMES,
    STRATEGIES,
    STRATEGY_NAMES,
    JointAttentionStrategy,
    Memory,
)
from fairseq_ext.modules.mixed_multihead_attention import parse_mma_heads

SELF_ATTENTION_VARIANTS = ["standard", "dc", "mma"]


@dataclass
class MultilayerTransformerConfig(FairseqDataclass):
    # joint attention over encoder layers (thesis Ch. 3)
    joint_attention: ChoiceEnum(STRATEGY_NAMES) = field(
        default="none", metadata={"help": "how the decoder reads the encoder layers (default: none = top layer "
                                          "only); see fairseq_ext/models/joint_attention_strategies.py"})
    joint_attention_layers: Optional[int] = field(
        default=None, metadata={"help": "n: the top n encoder layers collected (default: all when a strategy "
                                        "is set)"})
    mask_source_layer: Optional[int] = field(
        default=None, metadata={"help": "analysis (thesis Table 3.5): mask collected layer f^I (1..n), as "
                                        "--mask-source-mode says"})
    merger_dropout: float = field(
        default=0.0, metadata={"help": "--joint-attention transparent: dropout on the mixing weights before "
                                       "their softmax, in training (Lingvo's transparent_merger_dropout_prob; "
                                       "default 0)"})
    collected_layer_norm: bool = field(
        default=False, metadata={"help": "pre-norm encoder (--encoder-normalize-before): a LayerNorm of its own "
                                         "for each collected layer below the top (the top is the encoder's final "
                                         "LayerNorm), so that joint attention mixes layers at one scale (DLCL's "
                                         "way; default off)"})
    mask_source_mode: ChoiceEnum(["zero", "remove"]) = field(
        default="zero", metadata={"help": "--mask-source-layer: zero (default, the thesis' masking) feeds "
                                          "zeros in place of f^I to what the decoder reads, so its biased "
                                          "projections still add a constant; remove takes f^I out of the "
                                          "combination, as the model built without it"})
    multi_source_shared_encoder: bool = field(
        default=False, metadata={"help": "--task multi_source_translation: one encoder for every source "
                                         "(default: one each)"})
    # multi-level supervision (thesis Ch. 4)
    aux_decoder_layers: str = field(
        default="", metadata={"help": "encoder layers (1-based, < L) that get an auxiliary decoder, e.g. 1 or "
                                      "1,3"})
    aux_fusion: bool = field(
        default=False, metadata={"help": "Auxiliary Information Fusion in every main-decoder layer "
                                         "(Eq. 4.2-4.3)"})
    decode_from: str = field(
        default="main", metadata={"help": "decode with the main decoder (main) or the auxiliary decoder on "
                                          "encoder layer l (aux<l>)"})
    # self-attention variants (thesis Ch. 5, MMA paper) and the pre-classifier projection
    encoder_self_attention: ChoiceEnum(SELF_ATTENTION_VARIANTS) = field(
        default="standard", metadata={"help": "encoder self-attention: standard, dc (Dual Contextual) or mma "
                                              "(Mixed Multi-Head)"})
    decoder_self_attention: ChoiceEnum(SELF_ATTENTION_VARIANTS) = field(
        default="standard", metadata={"help": "decoder self-attention: standard, dc (causal Dual Contextual) or "
                                              "mma (causal heads)"})
    dc_kernel_size: int = field(
        default=2, metadata={"help": "DC local context kernel size f (default 2: the f that gives thesis "
                                     "Table 5.2's 73.9M parameters)"})
    dc_encoder_layers: str = field(
        default="", metadata={"help": "encoder layers with DC, e.g. 1-3 or 1,4-6 (default all)"})
    dc_decoder_layers: str = field(
        default="", metadata={"help": "decoder layers with DC, e.g. 1-3 (default all)"})
    mma_heads: str = field(
        default="", metadata={"help": "encoder MMA head functions, a comma list of G,L,F,B (default: the four "
                                      "split evenly over the heads)"})
    decoder_mma_heads: str = field(
        default="", metadata={"help": "decoder MMA head functions: only L (local) and B (backward) "
                                      "(default L,B)"})
    mma_window: int = field(default=1, metadata={"help": "window w of MMA local heads, |i-j| <= w"})
    pre_classifier_projection: bool = field(
        default=False, metadata={"help": "d x d linear map (no bias) before the output classifier "
                                         "(word-translation paper, Table 6)"})
    no_encoder_positional_embeddings: bool = field(
        default=False, metadata={"help": "no positional embedding on the encoder side (MMA paper, Table 3: "
                                         "word-order sensitivity); the decoder keeps its own"})


OPTION_NAMES = tuple(f.name for f in fields(MultilayerTransformerConfig))


def add_options(parser) -> None:
    """The flags of :class:`MultilayerTransformerConfig`, without argparse defaults (presets
    fill them, so that command-line values win over preset values)."""
    from fairseq.dataclass.utils import gen_parser_from_dataclass

    group = parser.add_argument_group("fairseq_ext: multi-layer Transformer options")
    gen_parser_from_dataclass(group, MultilayerTransformerConfig(), delete_default=True, with_prefix="")
    # store_true flags default to False in argparse; None lets a preset set them
    group.set_defaults(**{f.name: None for f in fields(MultilayerTransformerConfig) if f.type is bool})


def sync_nested_sizes(args) -> None:
    """A config that writes the sizes nested (``encoder: {layers: 3}``, as fairseq's hydra
    docs do) is built by fairseq from those groups alone: ``TransformerConfig.from_namespace``
    takes each group's fields and the group's own defaults for the rest, and ignores the flat
    ``encoder_layers`` & co. that the presets set. Every option derived from a size (n, the
    auxiliary layers, DC and MMA per layer, the default MMA heads) reads the flat fields, so
    they are set here to what fairseq will build."""
    from fairseq.models.transformer import TransformerConfig
    from fairseq.utils import safe_hasattr

    nested = [side for side in ("encoder", "decoder") if safe_hasattr(args, side) and getattr(args, side) is not None]
    if not nested:
        return
    built = TransformerConfig.from_namespace(args)
    for side in nested:
        group = getattr(built, side)
        for f in fields(group):
            setattr(args, f"{side}_{f.name}", getattr(group, f.name))


def apply_defaults(args) -> None:
    """The base preset: fairseq's Transformer defaults, then every option of this plugin the
    command line and the presets left unset, from :class:`MultilayerTransformerConfig`."""
    from fairseq.models.transformer import base_architecture

    base_architecture(args)
    sync_nested_sizes(args)
    for f in fields(MultilayerTransformerConfig):
        if getattr(args, f.name, None) is None and f.name != "joint_attention_layers":
            default = f.default
            setattr(args, f.name, getattr(default, "value", default))
    if getattr(args, "joint_attention_layers", None) is None:
        args.joint_attention_layers = 1 if args.joint_attention == "none" else args.encoder_layers


# ----------------------------------------------------------------------------------------
# the typed options
# ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MultilayerOptions:
    """The options as the modules use them; built once by :func:`parse_options`."""

    strategy: JointAttentionStrategy
    num_joint_layers: int  # n
    mask_source_layer: Optional[int]
    num_source_sentences: int  # > 1: multi-source translation
    shared_source_encoder: bool
    aux_layers: Tuple[int, ...]  # encoder layers with an auxiliary decoder
    aux_fusion: bool
    decode_from: Optional[int]  # index into aux_layers, None: the main decoder
    encoder_self_attention: Tuple[str, ...]  # standard | dc | mma, per encoder layer
    decoder_self_attention: Tuple[str, ...]  # per decoder layer
    dc_kernel_size: int
    encoder_mma_heads: Tuple[str, ...]  # one letter per head; () without MMA
    decoder_mma_heads: Tuple[str, ...]
    mma_window: int
    pre_classifier_projection: bool
    encoder_positions: bool = True  # False: --no-encoder-positional-embeddings
    mask_source_mode: str = "zero"  # zero: f^I replaced by zeros; remove: f^I taken out of the combination
    collected_layer_norm: bool = False  # a LayerNorm per collected layer below the top (pre-norm encoders)
    merger_dropout: float = 0.0  # transparent attention's mixing weights, before their softmax
    auxiliary: bool = False  # an auxiliary decoder's: it decodes with SentenceCachedAttention

    @property
    def removed_source(self) -> Optional[int]:
        """The 0-based source the cross-attentions leave out (``--mask-source-mode remove``);
        with ``zero`` they read the zeros the collector put in place of f^I."""
        if self.mask_source_layer is None or self.mask_source_mode != "remove":
            return None
        return self.mask_source_layer - 1

    @property
    def serial_sublayers(self) -> bool:
        """Main-decoder layers run n-1 serial cross-attentions after self-attention."""
        return self.strategy.serial_sublayers and self.num_joint_layers > 1

    def for_auxiliary_decoder(self) -> "MultilayerOptions":
        """An auxiliary decoder reads one encoder layer with the standard cross-attention and
        has no decoders of its own; its self-attention is the main decoder's."""
        return replace(self, strategy=STRATEGIES["none"], num_joint_layers=1, mask_source_layer=None,
                       aux_layers=(), aux_fusion=False, decode_from=None, pre_classifier_projection=False,
                       auxiliary=True)


def parse_layer_list(value: Optional[str], flag: str) -> List[int]:
    """'1,3' -> [1, 3]; '' or None -> []."""
    if value is None or str(value).strip() == "":
        return []
    try:
        return [int(v) for v in str(value).split(",") if v.strip() != ""]
    except ValueError:
        raise OptionError(f"{flag}: expected a comma list of layer numbers, got {value!r}") from None


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


def _joint_attention(args, num_source_sentences: int) -> Tuple[JointAttentionStrategy, int, Optional[int]]:
    num_enc = args.encoder_layers
    if args.joint_attention not in STRATEGIES:
        raise OptionError(f"--joint-attention: unknown strategy {args.joint_attention!r} "
                          f"(choices: {', '.join(STRATEGY_NAMES)})")
    strategy = STRATEGIES[args.joint_attention]
    if num_source_sentences > 1:
        if not strategy.multi_source:
            raise OptionError(
                f"--task multi_source_translation needs --joint-attention in "
                f"{', '.join(MULTI_SOURCE_STRATEGY_NAMES)}, not {strategy.name!r}"
            )
        if args.mask_source_layer is not None:
            raise OptionError("--mask-source-layer does not apply to --task multi_source_translation")
        if args.encoder_embed_dim != args.decoder_embed_dim:
            raise OptionError("--task multi_source_translation needs --encoder-embed-dim equal to "
                              "--decoder-embed-dim")
    if num_source_sentences > 1:
        # the n sources of the combination are the task's sentences, not encoder layers:
        # --joint-attention-layers does not apply
        return strategy, num_source_sentences, None
    n = args.joint_attention_layers
    if n < 1:
        raise OptionError(f"--joint-attention-layers ({n}) must be at least 1")
    if n > num_enc:
        raise OptionError(f"--joint-attention-layers ({n}) exceeds --encoder-layers ({num_enc})")
    if strategy.memory is Memory.NONE and n != 1:
        raise OptionError(f"--joint-attention-layers ({n}) needs a --joint-attention strategy")
    if strategy.memory is Memory.PER_DECODER_LAYER and n != num_enc:
        raise OptionError(
            f"--joint-attention-layers ({n}) does not apply to --joint-attention {strategy.name}, which mixes "
            f"all {num_enc + 1} encoder states (embeddings included)"
        )
    mask = args.mask_source_layer
    if mask is not None:
        if not strategy.collects_layers:
            raise OptionError(f"--mask-source-layer needs a --joint-attention strategy that collects layers, "
                              f"not {strategy.name!r}")
        if not 1 <= mask <= n:
            raise OptionError(f"--mask-source-layer ({mask}) must be within 1..--joint-attention-layers ({n})")
    if strategy.memory is not Memory.NONE and args.encoder_embed_dim != args.decoder_embed_dim:
        raise OptionError("--joint-attention needs --encoder-embed-dim equal to --decoder-embed-dim")
    return strategy, n, mask


def _self_attention(args, side: str, num_layers: int) -> Tuple[Tuple[str, ...], Tuple[str, ...]]:
    """Per-layer kinds and, with MMA, the head letters of one side."""
    kind = getattr(args, f"{side}_self_attention")
    if kind not in SELF_ATTENTION_VARIANTS:
        raise OptionError(f"--{side}-self-attention: unknown variant {kind!r}")
    dc_flag = f"--dc-{side}-layers"
    dc_layers = parse_layer_range(getattr(args, f"dc_{side}_layers"), num_layers, dc_flag)
    kinds = tuple(kind if kind != "dc" or layer in dc_layers else "standard" for layer in range(1, num_layers + 1))
    heads_name = "mma_heads" if side == "encoder" else "decoder_mma_heads"
    heads_flag = "--" + heads_name.replace("_", "-")
    spec = getattr(args, heads_name)
    if kind == "mma":
        heads = tuple(parse_mma_heads(spec, getattr(args, f"{side}_attention_heads"), causal=side == "decoder",
                                      flag=heads_flag))
    elif spec:
        raise OptionError(f"{heads_flag} {spec!r} needs --{side}-self-attention mma (it is {kind!r})")
    else:
        heads = ()
    return kinds, heads


def _fairseq_features(args, strategy: JointAttentionStrategy, aux_layers: List[int]) -> None:
    """fairseq features that would silently change which encoder layer the plugin reads,
    or that bypass the cross-attention the plugin replaces: refused, naming both flags."""
    reads_layers = []
    if strategy.memory is not Memory.NONE:
        reads_layers.append(f"--joint-attention {strategy.name}")
    if aux_layers:
        reads_layers.append("--aux-decoder-layers")
    if reads_layers:
        uses = " and ".join(reads_layers)
        if getattr(args, "encoder_layerdrop", 0) > 0:
            raise OptionError(f"--encoder-layerdrop cannot be combined with {uses}: a dropped layer would shift "
                              f"which encoder layer is read as f^i")
        if getattr(args, "encoder_layers_to_keep", None):
            raise OptionError(f"--encoder-layers-to-keep cannot be combined with {uses}: the kept layers would be "
                              f"read in place of the ones the model was trained on")
        if getattr(args, "no_cross_attention", False):
            raise OptionError(f"--no-cross-attention cannot be combined with {uses}: they read the encoder through "
                              f"the decoder's cross-attention")
        if getattr(args, "cross_self_attention", False):
            raise OptionError(f"--cross-self-attention cannot be combined with {uses}")
    if strategy.memory is Memory.PER_DECODER_LAYER and getattr(args, "decoder_layers_to_keep", None):
        raise OptionError(f"--decoder-layers-to-keep cannot be combined with --joint-attention {strategy.name}, "
                          f"which mixes one memory per decoder layer")
    if getattr(args, "cross_self_attention", False) and args.decoder_self_attention != "standard":
        raise OptionError(f"--cross-self-attention cannot be combined with --decoder-self-attention "
                          f"{args.decoder_self_attention}")


def parse_options(args, num_source_sentences: int = 1) -> MultilayerOptions:
    """Check every option and combination (errors name the flag) and return them typed."""
    num_enc, num_dec = args.encoder_layers, args.decoder_layers
    for side in ("encoder", "decoder"):
        dim, heads = getattr(args, f"{side}_embed_dim"), getattr(args, f"{side}_attention_heads")
        if dim % heads != 0:
            raise OptionError(f"--{side}-embed-dim ({dim}) is not divisible by --{side}-attention-heads ({heads})")
    strategy, n, mask = _joint_attention(args, num_source_sentences)

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
    decode_from = parse_decode_from(args.decode_from, aux_layers)
    if aux_layers and args.decoder_layers_to_keep:
        raise OptionError("--aux-decoder-layers cannot be combined with --decoder-layers-to-keep")

    _fairseq_features(args, strategy, aux_layers)
    merger = float(getattr(args, "merger_dropout", 0.0) or 0.0)
    if not 0.0 <= merger < 1.0:
        raise OptionError(f"--merger-dropout ({merger}) must be in [0, 1)")
    if merger and strategy.name != "transparent":
        raise OptionError(f"--merger-dropout applies to --joint-attention transparent (its mixing weights before their "
                          f"softmax), not {strategy.name}: the layer aggregations mix with matrices, without such weights")
    if getattr(args, "collected_layer_norm", False):
        if not getattr(args, "encoder_normalize_before", False):
            raise OptionError("--collected-layer-norm needs --encoder-normalize-before: a post-norm encoder's "
                              "layers are normalised already")
        if strategy.memory is Memory.NONE or (strategy.collects_layers and n < 2):
            raise OptionError("--collected-layer-norm needs a --joint-attention strategy over several encoder layers")

    if args.dc_kernel_size < 1:
        raise OptionError(f"--dc-kernel-size ({args.dc_kernel_size}) must be at least 1")
    if args.mma_window < 0:
        raise OptionError(f"--mma-window ({args.mma_window}) must be >= 0")
    encoder_kinds, encoder_heads = _self_attention(args, "encoder", num_enc)
    decoder_kinds, decoder_heads = _self_attention(args, "decoder", num_dec)

    return MultilayerOptions(
        strategy=strategy, num_joint_layers=n, mask_source_layer=mask,
        num_source_sentences=num_source_sentences, shared_source_encoder=bool(args.multi_source_shared_encoder),
        aux_layers=tuple(aux_layers), aux_fusion=bool(args.aux_fusion), decode_from=decode_from,
        encoder_self_attention=encoder_kinds, decoder_self_attention=decoder_kinds,
        dc_kernel_size=args.dc_kernel_size, encoder_mma_heads=encoder_heads, decoder_mma_heads=decoder_heads,
        mma_window=args.mma_window, pre_classifier_projection=bool(args.pre_classifier_projection),
        encoder_positions=not getattr(args, "no_encoder_positional_embeddings", False),
        mask_source_mode=str(getattr(args, "mask_source_mode", None) or "zero"),
        collected_layer_norm=bool(getattr(args, "collected_layer_norm", False)),
        merger_dropout=float(getattr(args, "merger_dropout", 0.0) or 0.0),
    )
