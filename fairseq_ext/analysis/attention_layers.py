"""What each attention layer of a model is, as figures and tables name it: an encoder
layer's self-attention kind (standard, MMA, Dual Contextual), its heads' titles and MMA type
letters with their key, and the sources a decoder layer's cross-attention combines."""
from typing import Dict, List, Optional

from fairseq_ext.analysis.capture import encoder_layers
from fairseq_ext.models.joint_attention_strategies import Memory
from fairseq_ext.modules.dual_contextual_attention import DualContextualAttention
from fairseq_ext.modules.mixed_multihead_attention import MixedMultiheadAttention

MMA_NAMES = {"G": "global", "L": "local", "F": "forward", "B": "backward"}


def head_types(layer_module) -> Optional[List[str]]:
    """The type letter (G, L, F, B) of each head of an MMA layer's self-attention, as the
    model assigned them (its ``--mma-heads``); None for any other layer."""
    attn = layer_module.self_attn
    return list(attn.head_types) if isinstance(attn, MixedMultiheadAttention) else None


def encoder_head_types(model) -> Dict[int, Optional[List[str]]]:
    """{layer index: the MMA type letter of each head, or None} of the model's encoder."""
    return {i: head_types(layer) for i, layer in enumerate(encoder_layers(model))}


def mma_legend(letters, window: Optional[int] = None) -> str:
    """A caption's key to the MMA head-type letters ``letters`` (MMA paper Eq. 8-11); "" for none."""
    what = {"G": "every key", "L": f"|i - j| <= {'w' if window is None else window}", "F": "keys j >= i",
            "B": "keys j <= i"}
    found = [t for t in MMA_NAMES if t in set(letters)]
    if not found:
        return ""
    return ("MMA head types (the model's --mma-heads): " +
            "; ".join(f"{t} = {MMA_NAMES[t]} ({what[t]})" for t in found) + ".")


def head_titles(layer_module) -> Dict[str, List[str]]:
    """{unit: a title per head} of an encoder layer's self-attention: one unit (``global``)
    for standard and MMA layers, two (``global``, ``local``) for Dual Contextual layers."""
    attn = layer_module.self_attn
    types = head_types(layer_module)
    if types is not None:
        return {"global": [f"h{h + 1} {t} ({MMA_NAMES[t]})" for h, t in enumerate(types)]}
    if isinstance(attn, DualContextualAttention):
        return {unit: [f"h{h + 1} {unit} FI" for h in range(attn.num_heads)] for unit in ("global", "local")}
    return {"global": [f"h{h + 1}" for h in range(attn.num_heads)]}


def layer_kind(layer_module) -> str:
    attn = layer_module.self_attn
    return "mma" if isinstance(attn, MixedMultiheadAttention) else "dc" if isinstance(
        attn, DualContextualAttention) else "standard"


def source_names(model, task) -> List[str]:
    """A name per source the cross-attention combines: the source languages in
    multi-source translation, else f^i (encoder layer l) for the collected layers."""
    options = model.decoder.options
    n = options.num_joint_layers
    if hasattr(model.encoder, "encoders"):
        return [task.cfg.source_lang] + list(task.extra_source_langs)
    if options.strategy.memory is not Memory.STACKED:
        return []
    num_layers = len(encoder_layers(model))
    return [f"f^{i} (enc L{num_layers - n + i})" for i in range(1, n + 1)]
