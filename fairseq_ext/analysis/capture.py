"""What the analyses read of a model's own forward (attention weights through
:func:`fairseq_ext.modules.attention_utils.record_attention_weights`: nothing recomputed, no
output changed), its layer outputs, its MMA head types, and its own translation."""
import contextlib
from typing import Dict, Iterator, List, Optional, Tuple

import torch
from fairseq.modules import MultiheadAttention
from fairseq.sequence_generator import SequenceGenerator

from fairseq_ext.analysis import AnalysisError
from fairseq_ext.analysis.command import batches
from fairseq_ext.common import checkpoints
from fairseq_ext.modules.attention_utils import record_attention_weights, reporting_weights
from fairseq_ext.modules.mixed_multihead_attention import MixedMultiheadAttention

MMA_NAMES = {"G": "global", "L": "local", "F": "forward", "B": "backward"}


def _reporting(modules) -> List[torch.nn.Module]:
    # a model fairseq built alone has its plain MultiheadAttention, which reports nothing;
    # the plugin's reporting subclass adds no state and changes no output
    return [reporting_weights(m) if type(m) is MultiheadAttention else m for m in modules]


def translate(model, sample, beam: int = 1, max_len_a: float = 0.0, max_len_b: int = 200) -> List[torch.Tensor]:
    """SequenceGenerator's best hypothesis of each sentence of ``sample`` (token ids ending with
    EOS, on the CPU; beam 1: greedy), at most ``max_len_a * |x| + max_len_b`` tokens."""
    generator = SequenceGenerator([model], model.decoder.dictionary, beam_size=beam, max_len_a=max_len_a,
                                  max_len_b=max_len_b)
    with torch.no_grad():
        return [h[0]["tokens"].cpu() for h in generator.generate([model], sample)]


def primary_encoder(model):
    """The encoder of the (first) source sentence, whose layers the analyses read."""
    encoder = model.encoder
    return encoder.encoder_for(0) if hasattr(encoder, "encoder_for") else encoder


def layer_outputs(encoder, encoder_out) -> List[torch.Tensor]:
    """[H^0 (embeddings), ..., H^L], T x B x C, each through the encoder's final LayerNorm when it
    has one (pre-norm), as the top layer is handed on."""
    states = list(encoder_out.get("encoder_states") or [])
    if not states:
        raise AnalysisError("the encoder did not return its layer outputs (encoder_states)")
    norm = getattr(encoder, "layer_norm", None)
    return [norm(s) if norm is not None else s for s in states]


def head_types(layer_module) -> Optional[List[str]]:
    """The type letter (G, L, F, B) of each head of an MMA layer (its ``--mma-heads``), else None."""
    attn = layer_module.self_attn
    return list(attn.head_types) if isinstance(attn, MixedMultiheadAttention) else None


def encoder_head_types(model) -> Dict[int, Optional[List[str]]]:
    return {i: head_types(layer) for i, layer in enumerate(primary_encoder(model).layers)}


def mma_legend(letters, window: Optional[int] = None) -> str:
    """A caption's key to the MMA head-type letters ``letters`` (MMA paper Eq. 8-11); "" for none."""
    what = {"G": "every key", "L": f"|i - j| <= {'w' if window is None else window}", "F": "keys j >= i",
            "B": "keys j <= i"}
    found = [t for t in MMA_NAMES if t in set(letters)]
    return ("MMA head types (the model's --mma-heads): " +
            "; ".join(f"{t} = {MMA_NAMES[t]} ({what[t]})" for t in found) + ".") if found else ""


@contextlib.contextmanager
def capture_self_attention(model):
    """``records[l]["global"]`` (and, for Dual Contextual layers, ``["local"]``) gets each forward
    call's self-attention weights of encoder layer l, B x H x T x T, float, on the CPU."""
    layers = primary_encoder(model).layers
    records: Dict[int, Dict[str, List[torch.Tensor]]] = {i: {"global": [], "local": []} for i in range(len(layers))}
    index = {id(layer.self_attn): i for i, layer in enumerate(layers)}

    def on_report(module, report):
        record = records[index[id(module)]]
        record["global"].append(report["attention"].float().cpu())
        if report.get("local") is not None:
            record["local"].append(report["local"].float().cpu())

    with record_attention_weights(_reporting([layer.self_attn for layer in layers]), on_report):
        yield records


def encoder_self_attention(model, task, split: str, max_sentences: Optional[int] = None,
                           cpu: bool = False) -> Iterator[Tuple[torch.Tensor, Dict[int, Dict[str, torch.Tensor]]]]:
    """Per batch of ``split``: its source padding (B x T, True = padding, on the CPU) and
    ``{layer index: {"global": B x H x T x T, "local": the same or None}}``."""
    pad = task.source_dictionary.pad()
    with capture_self_attention(model) as records:
        for sample in batches(task, split, max_sentences=max_sentences, device=checkpoints.device(cpu)):
            net = sample["net_input"]
            for layer in records.values():
                layer["global"].clear()
                layer["local"].clear()
            with torch.no_grad():
                model.encoder(net["src_tokens"], src_lengths=net["src_lengths"])
            yield net["src_tokens"].eq(pad).cpu(), {
                i: {"global": r["global"][0], "local": r["local"][0] if r["local"] else None}
                for i, r in records.items()}


@contextlib.contextmanager
def capture_cross_attention(model, missing: Optional[str] = None):
    """Every main-decoder layer's attention over the source in its last forward call, filled in
    ``records[l]`` when the block ends: ``attention`` (B x H x Z x J), ``per_source`` ({i: B x H x
    Z x J} where the layer reads n sources; serial sublayers included) and ``beta`` (B x H' x Z x
    n, hierarchical). ``missing``: the error raised for a layer without cross-attention."""
    layers = model.decoder.layers
    if missing is not None and any(getattr(layer, "encoder_attn", None) is None for layer in layers):
        raise AnalysisError(missing)
    records = {i: {"attention": None, "per_source": {}, "beta": None} for i in range(len(layers))}
    parts = {i: _reporting(m for m in (getattr(layer, "serial_stack", None), getattr(layer, "encoder_attn", None))
                           if m is not None)
             for i, layer in enumerate(layers)}
    with record_attention_weights([m for modules in parts.values() for m in modules]) as recorder:
        try:
            yield records
        finally:
            for index, modules in parts.items():
                record = records[index]
                for module in modules:
                    report = recorder.last(module) or {}
                    record["per_source"].update(report.get("per_source", {}))
                    if report.get("beta") is not None:
                        record["beta"] = report["beta"]
                top = getattr(layers[index], "encoder_attn", None)
                record["attention"] = ((recorder.last(top) if top is not None else None) or {}).get("attention")
                record["per_source"] = dict(sorted(record["per_source"].items()))
