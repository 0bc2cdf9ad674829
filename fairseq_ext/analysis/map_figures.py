"""The attention-map figures of one sentence: one figure per encoder layer (every head), one
per decoder layer (its attention over the source, then each source's own), the hierarchical
weights over the sources; every map of a kind on one colour scale, the token labels legible
at the report's width, and a caption saying what the rows, columns and colours are and what
--max-tokens left out."""
import os
from typing import Dict, List, Optional

from fairseq_ext.analysis import AnalysisError
from fairseq_ext.analysis.attention_layers import mma_legend
from fairseq_ext.analysis.figures import FigureContext, Panel, map_figure, save_figure


def _cut(labels: List[str], limit: Optional[int]) -> List[str]:
    return labels if limit is None else labels[:limit]


def cut_note(source: int, target: Optional[int], limit: Optional[int]) -> str:
    """The caption's note on what --max-tokens left out ("" when nothing)."""
    parts = [f"{n} {side} tokens" for n, side in ((source, "source"), (target, "target"))
             if n is not None and limit is not None and n > limit]
    if not parts:
        return ""
    # the columns are source tokens: cutting them leaves part of each row's weight undrawn
    rest = "; the rows drawn then sum to less than 1" if limit is not None and source > limit else ""
    return f" Only the first {limit} of the {' and '.join(parts)} are drawn (--max-tokens {limit}){rest}."


def scale_of(matrices, scale: str) -> float:
    """The top of the colour scale: 1 (``unit``: a weight's range, the same in every figure
    and model) or the largest weight drawn (``max``)."""
    if scale == "unit":
        return 1.0
    return max([float(m.max()) for m in matrices] + [1e-6])


def encoder_panels(entry: dict, tokens: List[str], limit: Optional[int] = None) -> List[Panel]:
    """The panels of one encoder layer: each head (titled with its type), a Dual Contextual
    layer's global FI heads then its local FI heads."""
    shown = _cut(tokens, limit)
    n = len(shown)
    return [Panel(title, entry[unit][h][:n, :n].numpy(), shown, shown)
            for unit, titles in entry["titles"].items() if unit in entry for h, title in enumerate(titles)]


def decoder_panels(entry: dict, strategy: str, target: List[str], sources: List[List[str]], names: List[str],
                   limit: Optional[int] = None) -> List[Panel]:
    """The panels of one decoder layer (head-averaged, as the multi-source paper's App. A
    draws them): the layer's combined attention over the source, then each source's own map."""
    rows = _cut(target, limit)
    panels = []
    if entry["attention"] is not None and strategy != "serial":  # serial: the top one is f^n's map
        labels = sources[0] if len(sources) == 1 or not entry["per_source"] else [""] * len(sources[0])
        labels = _cut(labels, limit)
        title = "attention" + (" (combined)" if entry["per_source"] else "")
        panels.append(Panel(title, entry["attention"].mean(0)[:len(rows), :len(labels)].numpy(), labels, rows))
    for i, w in entry["per_source"].items():
        labels = _cut(sources[i] if i < len(sources) else sources[0], limit)
        panels.append(Panel(names[i] if i < len(names) else f"source {i + 1}",
                            w.mean(0)[:len(rows), :len(labels)].numpy(), labels, rows))
    return panels


def layer_file(out: str, stem: str, part: str, layer: int, layers: int) -> str:
    return os.path.join(out, f"{stem}_{part}_L{layer:0{len(str(layers))}d}.png")


def encoder_figures(maps: dict, tokens: List[str], about: dict, out: str, limit: Optional[int] = None,
                    scale: str = "unit", context: Optional[FigureContext] = None) -> Dict[str, object]:
    """One figure per encoder layer, every head of it on one colour scale shared by all the
    layers: {path: figure}, written as ``OUT/<name>_encoder_self_attention_L<l>.png``."""
    encoder = maps["encoder"]
    per_layer = [encoder_panels(e, tokens, limit) for e in encoder]
    vmax = scale_of([p.matrix for panels in per_layer for p in panels], scale)
    letters = [t for e in encoder if e["kind"] == "mma" for t in e.get("types") or []]
    window = next((e.get("window") for e in encoder if e["kind"] == "mma"), None)
    kinds = {e["kind"] for e in encoder}
    units = (" Dual Contextual layers: the global FI unit's heads, then the local FI unit's (keys: the local "
             "context of each position)." if "dc" in kinds else "")
    figures = {}
    for entry, panels in zip(encoder, per_layer):
        path = layer_file(out, about["stem"], "encoder_self_attention", entry["layer"], len(encoder))
        caption = (f"Encoder self-attention weights of layer {entry['layer']} of {len(encoder)}, per head, for "
                   f"{about['sentence']}: row i = query token, column j = key token (tokens of the binarized source). "
                   f"Colour: the attention weight, on one scale for every head and layer (0 to {vmax:.2g}, "
                   f"--scale {scale})." + (" " + mma_legend(letters, window) if letters else "") + units
                   + cut_note(len(tokens), None, limit))
        fig = map_figure(panels, f"{about['name']}: encoder self-attention, layer {entry['layer']} "
                                 f"({about['data']})", caption, vmax, "key token j", "query token i")
        save_figure(fig, path, context)
        figures[path] = fig
    return figures


def decoder_figures(maps: dict, target: List[str], sources: List[List[str]], names: List[str], about: dict,
                    out: str, limit: Optional[int] = None, scale: str = "unit",
                    context: Optional[FigureContext] = None) -> Dict[str, object]:
    """One figure per decoder layer: the layer's attention over the source, then each
    source's own map, on one colour scale shared by all the layers: {path: figure}, written
    as ``OUT/<name>_decoder_attention_L<l>.png``."""
    layers = [d for d in maps["decoder"] if d["attention"] is not None or d["per_source"]]
    if not layers:
        raise AnalysisError("the decoder has no attention over the source")
    per_layer = [decoder_panels(d, maps["strategy"], target, sources, names, limit) for d in layers]
    vmax = scale_of([p.matrix for panels in per_layer for p in panels], scale)
    several = any(d["per_source"] for d in layers)
    figures = {}
    for entry, panels in zip(layers, per_layer):
        path = layer_file(out, about["stem"], "decoder_attention", entry["layer"], len(maps["decoder"]))
        caption = (f"Attention of decoder layer {entry['layer']} of {len(maps['decoder'])} over the source, averaged "
                   f"over its heads, for {about['sentence']} and {about['translation']}: row = the "
                   f"target token the decoder predicts, column = source token (tokens of the binarized source)."
                   + (" First the attention the layer's cross-attention returns, then each source's own map "
                      f"({maps['strategy']})." if several else "")
                   + f" Colour: the attention weight, on one scale for every panel and layer (0 to {vmax:.2g}, "
                     f"--scale {scale}).{cut_note(len(sources[0]), len(target), limit)}")
        fig = map_figure(panels, f"{about['name']}: decoder attention over the source, layer {entry['layer']} "
                                 f"({about['data']})", caption, vmax, "source token", "target token")
        save_figure(fig, path, context)
        figures[path] = fig
    return figures


def context_figure(maps: dict, target: List[str], names: List[str], about: dict, path: str,
                   limit: Optional[int] = None, scale: str = "unit", context: Optional[FigureContext] = None):
    """Hierarchical combination: beta (head-averaged) per decoder layer, target tokens x
    sources (multi-source paper Fig. 2), on one colour scale; the figure, written to ``path``."""
    rows = _cut(target, limit)
    # short titles: a panel is only as wide as the n contexts
    panels = [Panel(f"layer {d['layer']}", d["beta"].mean(0)[:len(rows)].numpy(), names, rows)
              for d in maps["decoder"] if d["beta"] is not None]
    vmax = scale_of([p.matrix for p in panels], scale)
    caption = (f"Second-level weights beta of the hierarchical combination (multi-source paper Fig. 2) over the "
               f"{len(names)} contexts, per decoder layer (head-averaged), for {about['sentence']} and "
               f"{about['translation']}: row = the target token the decoder predicts. Colour: the weight, on one "
               f"scale (0 to {vmax:.2g}, --scale {scale}).{cut_note(0, len(target), limit)}")
    fig = map_figure(panels, f"{about['name']}: weights over the contexts per decoder layer ({about['data']})",
                     caption, vmax, "context", "target token", quantity="weight beta")
    save_figure(fig, path, context)
    return fig
