"""The ``--arch`` presets of ``multilayer_transformer``.

One naming scheme: ``multilayer_transformer[_<technique>]_<size>``, where size is ``iwslt``
(the thesis' small configuration: d 256, FFN 1024, 4 heads, 4+4 layers) or ``wmt_en_de``
(Transformer base: d 512, FFN 2048, 8 heads, 6+6 layers), and technique is ``mlmha``
(Multi-Layer Multi-Head Attention), ``ms`` (multi-level supervision), ``dc`` (Dual
Contextual encoder) or ``mma`` (Mixed Multi-Head encoder). Each preset sets only what
differs, then calls its parent; command-line values win.
"""
from fairseq.models import register_model_architecture

from fairseq_ext.models.multilayer_transformer import MultilayerTransformerModel  # noqa: F401  (registers)
from fairseq_ext.models.multilayer_transformer_config import apply_defaults, parse_options

MODEL = "multilayer_transformer"
PRESETS = {}


def preset(name):
    """Register an --arch preset."""
    def register(fn):
        PRESETS[name] = fn
        register_model_architecture(MODEL, name)(fn)
        return fn
    return register


def _default(args, name, value):
    if getattr(args, name, None) is None:
        setattr(args, name, value)


@preset("multilayer_transformer")
def multilayer_transformer(args):
    apply_defaults(args)
    # fairseq's option parsing calls the arch function: refuse bad options there, before
    # fairseq-train logs its configuration (build_model checks again, with the task)
    parse_options(args)


@preset("multilayer_transformer_iwslt")
def multilayer_transformer_iwslt(args):
    """The thesis' small configuration (IWSLT): d 256, FFN 1024, 4 heads, 4+4 layers."""
    for side in ("encoder", "decoder"):
        _default(args, f"{side}_embed_dim", 256)
        _default(args, f"{side}_ffn_embed_dim", 1024)
        _default(args, f"{side}_attention_heads", 4)
        _default(args, f"{side}_layers", 4)
    multilayer_transformer(args)


@preset("multilayer_transformer_wmt_en_de")
def multilayer_transformer_wmt_en_de(args):
    """Transformer base: d 512, FFN 2048, 8 heads, 6+6 layers."""
    multilayer_transformer(args)


# technique presets: (name, parent size preset, the options they set, what they are)
TECHNIQUE_PRESETS = [
    ("multilayer_transformer_mlmha_iwslt", multilayer_transformer_iwslt,
     {"joint_attention": "m-00", "joint_attention_layers": 4},
     "MLMHA paper's recommendation for the small config: M-00 over all 4 layers."),
    ("multilayer_transformer_mlmha_wmt_en_de", multilayer_transformer_wmt_en_de,
     {"joint_attention": "m-10", "joint_attention_layers": 6},
     "MLMHA paper's recommendation for the base config: M-10 over all 6 layers."),
    ("multilayer_transformer_ms_iwslt", multilayer_transformer_iwslt, {"aux_decoder_layers": "1"},
     "MS-1 (an auxiliary decoder on encoder layer 1), no AIF, small config."),
    ("multilayer_transformer_ms_wmt_en_de", multilayer_transformer_wmt_en_de, {"aux_decoder_layers": "1"},
     "MS-1, no AIF, base config."),
    ("multilayer_transformer_dc_iwslt", multilayer_transformer_iwslt,
     {"encoder_self_attention": "dc", "encoder_ffn_embed_dim": 512, "decoder_ffn_embed_dim": 512},
     "Enc-DC (Dual Contextual encoder self-attention), the thesis' Ch. 5 IWSLT config (Table 5.1: the small "
     "config with d_ff 512)."),
    ("multilayer_transformer_dc_wmt_en_de", multilayer_transformer_wmt_en_de, {"encoder_self_attention": "dc"},
     "Enc-DC, base config."),
    ("multilayer_transformer_mma_iwslt", multilayer_transformer_wmt_en_de,
     {"encoder_self_attention": "mma", "encoder_ffn_embed_dim": 1024, "decoder_ffn_embed_dim": 1024,
      "encoder_attention_heads": 4, "decoder_attention_heads": 4, "dropout": 0.3},
     "Mixed Multi-Head encoder self-attention in the MMA paper's IWSLT setup: 6+6 layers, d 512, FFN 1024, "
     "4 heads (one per head function), dropout 0.3."),
    ("multilayer_transformer_mma_wmt_en_de", multilayer_transformer_wmt_en_de, {"encoder_self_attention": "mma"},
     "Mixed Multi-Head encoder self-attention in the MMA paper's base setup (its WAT runs): 6+6 layers, d 512, "
     "FFN 2048, 8 heads (each head function twice), dropout 0.1."),
    ("multilayer_transformer_deep_enc_shallow_dec", multilayer_transformer_wmt_en_de,
     {"encoder_layers": 10, "decoder_layers": 2},
     "Word-translation paper, Table 4: 10 encoder and 2 decoder layers, base dims."),
] + [
    # every encoder / decoder split of the word-translation paper's Table 4 (base dims, 12 layers)
    (f"multilayer_transformer_enc{e}_dec{d}", multilayer_transformer_wmt_en_de,
     {"encoder_layers": e, "decoder_layers": d},
     f"Word-translation paper, Table 4: {e} encoder and {d} decoder layers, base dims.")
    for e, d in ((6, 6), (7, 5), (8, 4), (9, 3), (10, 2), (11, 1))
]


def _technique_preset(name, parent, options, doc):
    def technique_preset(args):
        for option, value in options.items():
            _default(args, option, value)
        parent(args)

    technique_preset.__name__ = technique_preset.__qualname__ = name
    technique_preset.__doc__ = doc
    return preset(name)(technique_preset)


for _entry in TECHNIQUE_PRESETS:
    _technique_preset(*_entry)
