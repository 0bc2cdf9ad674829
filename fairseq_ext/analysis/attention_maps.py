"""Attention maps of one sentence (MMA paper Sec. 5.4, Fig. 3; multi-source paper Fig. 2 and
App. A): what the model's own forward computes, captured by forward hooks.

(a) Encoder self-attention: every head of every layer (the primary source's encoder in
    multi-source translation), titled with its type: G/L/F/B (global, local, forward,
    backward) for Mixed Multi-Head layers, global/local FI unit for Dual Contextual layers
    (both units are drawn).
(b) Decoder attention over the source, per decoder layer, for a translation of the
    sentence (fairseq's SequenceGenerator, beam ``--beam``; or ``--hypothesis``/``--reference``
    teacher-forced); the rows are the target tokens the decoder predicts. With a joint
    attention strategy also the attention over the collected encoder layers / the sources:

    - ``attention``: what the cross-attention returns (fairseq's layout, per head): the
      standard, transparent and layer-aggregation models attend one memory; MLMHA U0 = 0
      its joint softmax; U0 = 1 and parallel the mean of the per-source maps; flat the
      weights summed over the sources per position; hierarchical the first-level maps
      scaled by beta and summed (multi-source paper App. A);
    - ``per_source`` (i = 1..n): each source's own map: the serial sublayers, the parallel
      attentions, MLMHA U0 = 1's per-layer softmaxes and the hierarchical first level each
      sum to 1 per row; flat's one softmax split per source (the n maps together sum to 1);
    - ``beta`` (hierarchical, both forms): the second-level weights over the n contexts,
      Z x n (per head for hierarchical-shared, head-averaged for hierarchical, as the
      module computes it), multi-source paper Fig. 2;
    - ``layer_mix`` (transparent): softmax(w)_{:, j}, decoder layer j's weights over the
      embeddings and the L encoder layers.

    python -m fairseq_ext.analysis.attention_maps --checkpoint mma/checkpoint_best.pt \\
        --data data-bin/iwslt14.de-en --split test --sentence 17 --out analysis/maps/mma

Figures, named after the checkpoint (``--names NAME``, default: the checkpoint's file stem,
or its directory's name for fairseq's checkpoint_best.pt and the like), each sized to be
read at the HTML report's width (about 1100 px: token labels of 6.5 to 9 points, as many
panels a row as keep them so), every map on one colour scale (0 to 1, ``--scale max``: 0 to
the largest weight drawn) with a colour bar, a title naming the model, the data and the
layer, and a caption saying what the rows, columns and colours are:

- ``NAME_encoder_self_attention_L<l>.png``: one per encoder layer, every head of it;
  MMA heads titled with their type from the model's own ``--mma-heads`` (G global, L
  local, F forward, B backward, the caption says what each sees);
- ``NAME_decoder_attention_L<l>.png``: one per decoder layer, its attention over the
  source (head-averaged), then each source's own map;
- ``NAME_context_weights.png`` (hierarchical): beta per decoder layer;
- ``attention_maps.json``: the tokens and every matrix, per head, uncut.

``--max-tokens N`` (default 32) draws the first N source and target tokens, and the
caption says so. ``--source TEXT`` (already tokenized/BPE'd like the data) replaces the
sentence of the split (single-source models). Without ``--sentence`` and ``--source`` the
sentence is picked: the lowest id whose source has 12-20 tokens (end of sentence not
counted), else the lowest id of those closest to that length; the output says which.
"""
import argparse
import contextlib
import json
import os
import re
import sys
from typing import Dict, List, Optional, Sequence

import torch

from fairseq_ext.common import checkpoints
from fairseq_ext.common.cli import setup_cli
from fairseq_ext.analysis import common

MMA_NAMES = {"G": "global", "L": "local", "F": "forward", "B": "backward"}
# source tokens of the sentence picked when none is named: enough for a pattern, few enough to read
READABLE_LENGTH = (12, 20)
# tokens drawn at most: up to 32, two panels a row keep their labels at LEGIBLE_FONT or more
DEFAULT_MAX_TOKENS = 32


# ---- what each layer is ------------------------------------------------------------------------

def encoder_layers(model):
    """The encoder layers whose self-attention is drawn (the primary source's encoder)."""
    encoders = getattr(model.encoder, "encoders", None) or [model.encoder]
    return encoders[0].layers


def head_types(layer_module) -> Optional[List[str]]:
    """The type letter (G, L, F, B) of each head of an MMA layer's self-attention, as the
    model assigned them (its ``--mma-heads``); None for any other layer."""
    from fairseq_ext.modules.mixed_multihead_attention import MixedMultiheadAttention

    attn = layer_module.self_attn
    return list(attn.head_types) if isinstance(attn, MixedMultiheadAttention) else None


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
    from fairseq_ext.modules.dual_contextual_attention import DualContextualAttention

    attn = layer_module.self_attn
    types = head_types(layer_module)
    if types is not None:
        return {"global": [f"h{h + 1} {t} ({MMA_NAMES[t]})" for h, t in enumerate(types)]}
    if isinstance(attn, DualContextualAttention):
        return {unit: [f"h{h + 1} {unit} FI" for h in range(attn.num_heads)] for unit in ("global", "local")}
    return {"global": [f"h{h + 1}" for h in range(attn.num_heads)]}


def layer_kind(layer_module) -> str:
    from fairseq_ext.modules.dual_contextual_attention import DualContextualAttention
    from fairseq_ext.modules.mixed_multihead_attention import MixedMultiheadAttention

    attn = layer_module.self_attn
    return "mma" if isinstance(attn, MixedMultiheadAttention) else "dc" if isinstance(
        attn, DualContextualAttention) else "standard"


def source_names(model, task) -> List[str]:
    """A name per source the cross-attention combines: the source languages in
    multi-source translation, else f^i (encoder layer l) for the collected layers."""
    from fairseq_ext.models.joint_attention_strategies import Memory

    options = model.decoder.options
    n = options.num_joint_layers
    if hasattr(model.encoder, "encoders"):
        return [task.cfg.source_lang] + list(task.extra_source_langs)
    if options.strategy.memory is not Memory.STACKED:
        return []
    num_layers = len(encoder_layers(model))
    return [f"f^{i} (enc L{num_layers - n + i})" for i in range(1, n + 1)]


# ---- capture -------------------------------------------------------------------------------------

@contextlib.contextmanager
def capture_cross_attention(model):
    """Record, during the model's own forward, every main-decoder layer's attention over the
    source: ``records[l]`` (l = 0..M-1) gets ``attention`` (B x H x Z x J, what the layer's
    cross-attention returns with need_head_weights), ``per_source`` {i: B x H x Z x J} and
    ``beta`` (B x H x Z x n, or B x 1 x Z x n when the module averages its heads); see the
    module docstring for what each strategy gives. The last forward call wins; the records
    are filled when the block ends.

    The layer's cross-attention part (the serial sublayers, if any, and its cross-attention)
    reports its weights through the attention modules' contract
    (``fairseq_ext.modules.attention_utils.record_attention_weights``)."""
    from fairseq_ext.modules.attention_utils import record_attention_weights

    layers = model.decoder.layers
    records = {i: {"attention": None, "per_source": {}, "beta": None} for i in range(len(layers))}
    parts = {i: [m for m in (getattr(layer, "serial_stack", None), layer.encoder_attn) if m is not None]
             for i, layer in enumerate(layers)}

    def cpu(weights):
        return None if weights is None else weights.float().cpu()

    with record_attention_weights([m for modules in parts.values() for m in modules]) as recorder:
        try:
            yield records
        finally:
            for index, modules in parts.items():
                rec = records[index]
                for module in modules:
                    report = recorder.last(module) or {}
                    rec["per_source"].update({i: cpu(w) for i, w in report.get("per_source", {}).items()})
                    if report.get("beta") is not None:
                        rec["beta"] = cpu(report["beta"])
                top = recorder.last(layers[index].encoder_attn) if layers[index].encoder_attn is not None else None
                rec["attention"] = cpu((top or {}).get("attention"))
                rec["per_source"] = dict(sorted(rec["per_source"].items()))


# ---- one sentence ----------------------------------------------------------------------------------

def default_sentence(task, split: str, readable=READABLE_LENGTH) -> int:
    """The sentence of ``split`` drawn when none is named: the lowest id whose (primary)
    source has ``readable`` tokens (inclusive, end of sentence not counted), else the lowest
    id of those closest to that length."""
    dataset = task.dataset(split)
    pair = getattr(dataset, "dataset", dataset)  # a multi-source dataset wraps its primary pair
    if len(pair) == 0:
        raise common.AnalysisError(f"--split {split}: no sentence")
    low, high = readable
    lengths = [int(n) - 1 for n in pair.src_sizes]
    return min(range(len(lengths)), key=lambda i: (max(low - lengths[i], lengths[i] - high, 0), i))


def sentence_sample(task, split: Optional[str], sentence: Optional[int], source: Optional[str]):
    """A batch of one sentence: sentence ``sentence`` of ``split`` (every source and the
    reference, as fairseq's collater builds it), or the tokenized text ``source``."""
    if source is not None:
        if hasattr(task, "extra_source_langs"):
            raise common.AnalysisError("--source: a multi-source model needs every source; use --sentence")
        src_dict = task.source_dictionary
        tokens = src_dict.encode_line(source, add_if_not_exist=False, append_eos=True).long()
        if tokens.size(0) > 1 and tokens[:-1].eq(src_dict.unk()).all():
            raise common.AnalysisError(f"--source {source!r}: every token is unknown to the source dictionary")
        return {"id": torch.tensor([0]), "net_input": {"src_tokens": tokens[None],
                                                       "src_lengths": torch.tensor([tokens.size(0)])}}
    dataset = task.dataset(split)
    if sentence is None or not 0 <= sentence < len(dataset):
        raise common.AnalysisError(f"--sentence {sentence}: {split} has sentences 0..{len(dataset) - 1}")
    return dataset.collater([dataset[sentence]])


def translate(model, task, sample, beam: int, max_len_a: float, max_len_b: int) -> torch.Tensor:
    """The best hypothesis of fairseq's SequenceGenerator (tokens, ending with EOS)."""
    from fairseq.sequence_generator import SequenceGenerator

    generator = SequenceGenerator([model], task.target_dictionary, beam_size=beam, max_len_a=max_len_a,
                                  max_len_b=max_len_b)
    with torch.no_grad():
        hypos = generator.forward(sample)
    return hypos[0][0]["tokens"]


def attention_maps(model, task, sample, target: torch.Tensor) -> dict:
    """Teacher-force ``target`` (ends with EOS) through the model on ``sample`` (one
    sentence) and return every map, batch dimension dropped, as tensors:
    {"encoder": [per layer {"kind", "titles", "global": H x T x T[, "local"]}],
     "decoder": [per layer {"attention": H x Z x J, "per_source": {i: H x Z x J}, "beta"}],
     "layer_mix": (L+1) x M or None}."""
    net = sample["net_input"]
    eos = task.target_dictionary.eos()
    prev = torch.cat([target.new_tensor([eos]), target[:-1]])[None]
    extra = {k: v for k, v in net.items() if k not in ("src_tokens", "src_lengths", "prev_output_tokens")}
    with torch.no_grad(), common.capture_self_attention(model) as enc, capture_cross_attention(model) as dec:
        model(net["src_tokens"], net["src_lengths"], prev, **extra)
    encoder = []
    for index, layer in enumerate(encoder_layers(model)):
        entry = {"layer": index + 1, "kind": layer_kind(layer), "titles": head_titles(layer),
                 "types": head_types(layer), "window": getattr(layer.self_attn, "window", None),
                 "global": enc[index]["global"][-1][0]}
        if enc[index]["local"]:
            entry["local"] = enc[index]["local"][-1][0]
        encoder.append(entry)
    decoder = []
    for index in sorted(dec):
        rec = dec[index]
        decoder.append({"layer": index + 1,
                        "attention": None if rec["attention"] is None else rec["attention"][0],
                        "per_source": {i: w[0] for i, w in sorted(rec["per_source"].items())},
                        "beta": None if rec["beta"] is None else rec["beta"][0]})
    mix = None
    memory = getattr(model.encoder, "memory_module", None)
    if model.decoder.options.strategy.name == "transparent" and memory is not None:
        mix = torch.softmax(memory.weight.detach().float(), dim=0).cpu()
    return {"encoder": encoder, "decoder": decoder, "layer_mix": mix, "strategy": model.decoder.options.strategy.name}


def token_labels(dictionary, tokens) -> List[str]:
    return ["" if t == dictionary.pad() else dictionary[t] for t in tokens.tolist()]


def memory_labels(model, task, sample) -> List[List[str]]:
    """The source tokens along the cross-attention's key axis J, per source (the sources of
    multi-source translation are left-padded to one length; the layers share the tokens)."""
    net = sample["net_input"]
    src = [net["src_tokens"][0]]
    if "extra_src_tokens" in net:
        src += list(net["extra_src_tokens"][0])
    width = max(s.size(0) for s in src)
    d = task.source_dictionary
    return [[""] * (width - s.size(0)) + token_labels(d, s) for s in src]


# ---- figures ----------------------------------------------------------------------------------------
# A figure is sized for the HTML report (common.FIGURE_WIDTH, shown 1:1 at about 1100 px):
# its panels share one grid of token cells, as many side by side as keep the token labels
# at 6.5 points or more (11-15 px on screen); longer sentences get fewer panels a row, and
# --max-tokens cuts what is drawn (up to 32 tokens, two panels a row fit).

LABEL_FONT = 9.0  # the token labels' largest size, points
LEGIBLE_FONT = 6.5  # the smallest label size a layout chooses more panels a row for (11 px on screen)
CELL_LIMIT = 16.0  # the largest token cell, points (short sentences do not draw huge squares)
COLOURBAR = 0.9  # inches at the right for the colour bar and its label
MAX_COLUMNS = 4


class Panel:
    """One heatmap: ``matrix`` (rows x columns, numpy), its column and row token labels."""

    def __init__(self, title: str, matrix, xlabels: List[str], ylabels: List[str]):
        self.title, self.matrix, self.xlabels, self.ylabels = title, matrix, xlabels, ylabels


def _label_inches(labels, font: float) -> float:
    return max([len(l) for l in labels] + [1]) * 0.6 * font / 72 + 0.2


def grid_layout(panels: List[Panel]) -> dict:
    """Columns, rows, label font (points) and token cell (points) of a figure of ``panels``
    at common.FIGURE_WIDTH: the most columns (at most MAX_COLUMNS) whose token labels stay
    at LEGIBLE_FONT or more, else one column (labels down to common.MIN_FONT_SIZE)."""
    n_x = max(len(p.xlabels) for p in panels)
    ylabels = [l for p in panels for l in p.ylabels]

    def fit(cols):
        font = LABEL_FONT
        for _ in range(3):  # the y labels' width depends on the font, the font on the room left
            room = common.FIGURE_WIDTH - COLOURBAR - _label_inches(ylabels, font) - 0.25 * (cols - 1)
            cell = min(CELL_LIMIT, room * 72 / (cols * n_x))
            font = min(LABEL_FONT, cell / 1.2)  # a label's line is 1.2 of its size
        return {"cols": cols, "font": font, "cell": cell}

    fits = [fit(c) for c in range(min(len(panels), MAX_COLUMNS), 0, -1)]
    choice = next((f for f in fits if f["font"] >= LEGIBLE_FONT), fits[-1])
    rows = -(-len(panels) // choice["cols"])
    choice = fit(-(-len(panels) // rows))  # balanced: 4 panels at 3 a row become 2 x 2
    choice["font"] = max(common.MIN_FONT_SIZE, choice["font"])
    choice["rows"] = rows
    return choice


def map_figure(panels: List[Panel], title: str, caption: str, vmax: float = 1.0, xlabel: str = "", ylabel: str = "",
               quantity: str = "attention weight"):
    """The panels on one colour scale (0 to ``vmax``, one colour bar of ``quantity``), laid
    out by :func:`grid_layout`, titled ``title`` and captioned ``caption``; returns the figure."""
    plt = common.pyplot()
    layout = grid_layout(panels)
    cols, rows, font, cell = layout["cols"], layout["rows"], layout["font"], layout["cell"]
    n_x = max(len(p.xlabels) for p in panels)
    n_y = max(len(p.ylabels) for p in panels)
    x_room = _label_inches([l for p in panels for l in p.xlabels], font) + 0.1  # rotated labels
    panel_h = n_y * cell / 72
    height = rows * (panel_h + x_room + 0.3) + 0.5  # each row: its titles; the bottom: the axis label
    width = (_label_inches([l for p in panels for l in p.ylabels], font) + 0.35 + cols * n_x * cell / 72
             + 0.25 * (cols - 1) + COLOURBAR)
    fig = plt.figure(figsize=(min(common.FIGURE_WIDTH, width), height))
    grid = fig.add_gridspec(rows, cols + 1, width_ratios=[n_x * cell / 72] * cols + [0.15])
    image = None
    for k, panel in enumerate(panels):
        ax = fig.add_subplot(grid[k // cols, k % cols])
        image = ax.imshow(panel.matrix, cmap="Blues", vmin=0.0, vmax=vmax, aspect="equal", interpolation="nearest")
        ax.set_title(panel.title, fontsize=font + 1)
        ax.set_xticks(range(len(panel.xlabels)), panel.xlabels, rotation=90, fontsize=font)
        first = k % cols == 0
        ax.set_yticks(range(len(panel.ylabels)), panel.ylabels if first else [], fontsize=font)
        if first and ylabel:
            ax.set_ylabel(ylabel, fontsize=font + 1)
        if xlabel and k + cols >= len(panels):
            ax.set_xlabel(xlabel, fontsize=font + 1)
    bar = fig.colorbar(image, cax=fig.add_subplot(grid[:, -1]))
    bar.set_label(f"{quantity} (one scale, 0 to {vmax:.2g})", fontsize=9)
    bar.ax.tick_params(labelsize=8)
    common.add_title(fig, title)
    # a narrow figure's caption may run wider than its panels rather than be a tall column
    common.add_caption(fig, caption, width=max(fig.get_figwidth(), 6.5))
    return fig


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
                    scale: str = "unit") -> Dict[str, object]:
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
        common.save_figure(fig, path)
        figures[path] = fig
    return figures


def decoder_figures(maps: dict, target: List[str], sources: List[List[str]], names: List[str], about: dict,
                    out: str, limit: Optional[int] = None, scale: str = "unit") -> Dict[str, object]:
    """One figure per decoder layer: the layer's attention over the source, then each
    source's own map, on one colour scale shared by all the layers: {path: figure}, written
    as ``OUT/<name>_decoder_attention_L<l>.png``."""
    layers = [d for d in maps["decoder"] if d["attention"] is not None or d["per_source"]]
    if not layers:
        raise common.AnalysisError("the decoder has no attention over the source")
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
        common.save_figure(fig, path)
        figures[path] = fig
    return figures


def context_figure(maps: dict, target: List[str], names: List[str], about: dict, path: str,
                   limit: Optional[int] = None, scale: str = "unit"):
    """Hierarchical combination: beta (head-averaged) per decoder layer, target tokens x
    sources (multi-source paper Fig. 2), on one colour scale."""
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
    common.save_figure(fig, path)
    return fig


def to_json(maps: dict, source: List[List[str]], target: List[str], names: List[str], meta: dict) -> dict:
    def lst(t):
        return None if t is None else [[[round(float(v), 6) for v in row] for row in m] for m in t] \
            if t.dim() == 3 else t.tolist()

    return {
        **meta,
        "source_tokens": source,
        "target_tokens": target,
        "source_names": names,
        "encoder": [{"layer": e["layer"], "kind": e["kind"], "head_titles": e["titles"],
                     **{unit: lst(e[unit]) for unit in ("global", "local") if unit in e}} for e in maps["encoder"]],
        "decoder": [{"layer": d["layer"], "attention": lst(d["attention"]),
                     "per_source": {str(i + 1): lst(w) for i, w in d["per_source"].items()},
                     "beta": lst(d["beta"])} for d in maps["decoder"]],
        "layer_mix": None if maps["layer_mix"] is None else maps["layer_mix"].tolist(),
    }


# fairseq's own checkpoint names, which say nothing of the model: its directory names it instead
FAIRSEQ_CHECKPOINT_NAME = re.compile(r"checkpoint(_best|_last|_avg\d*|\d+|_\d+_\d+)?")


def display_name(checkpoint: str, names: Optional[Sequence[str]] = None) -> str:
    """The name figures and file names give the checkpoint: ``--names NAME``, else the
    checkpoint's file stem (``mma.pt``: mma), else, for fairseq's own names
    (checkpoint_best.pt, checkpoint_last.pt, checkpoint12.pt, ...), its directory's."""
    if isinstance(names, str):
        names = [names]
    if names:
        if len(names) != 1:
            raise common.AnalysisError(f"--names: {len(names)} names for one checkpoint")
        return names[0]
    stem = os.path.splitext(os.path.basename(checkpoint))[0]
    if FAIRSEQ_CHECKPOINT_NAME.fullmatch(stem):
        return common.names_for([checkpoint], None)[0]
    return stem


def run(args) -> dict:
    name = display_name(args.checkpoint, getattr(args, "names", None))
    limit = getattr(args, "max_tokens", DEFAULT_MAX_TOKENS)
    scale = getattr(args, "scale", "unit")
    model, task = checkpoints.load_model(args.checkpoint, args.data, split=None if args.source else args.split,
                                    cpu=args.cpu)
    sentence = args.sentence
    if args.source is None and sentence is None:
        sentence = default_sentence(task, args.split)
        low, high = READABLE_LENGTH
        print(f"sentence {sentence} of '{args.split}' (no --sentence or --source: the first one with {low}-{high} "
              f"source tokens, or the closest length)")
    sample = sentence_sample(task, args.split, sentence, args.source)
    sample = common.to_device(sample, checkpoints.device(args.cpu))
    tgt_dict = task.target_dictionary
    if args.hypothesis is not None:
        target = tgt_dict.encode_line(args.hypothesis, add_if_not_exist=False, append_eos=True).long()
        how = "teacher-forced --hypothesis"
    elif args.reference:
        if sample.get("target") is None:
            raise common.AnalysisError("--reference: the split has no target side")
        target = sample["target"][0]
        target = target[target.ne(tgt_dict.pad())]
        how = "teacher-forced reference"
    else:
        target = translate(model, task, sample, args.beam, args.max_len_a, args.max_len_b)
        how = f"beam {args.beam}"
    target = target.to(sample["net_input"]["src_tokens"].device)
    maps = attention_maps(model, task, sample, target)
    sources = memory_labels(model, task, sample)
    target_labels = token_labels(tgt_dict, target)
    names = source_names(model, task)
    about = {"name": name, "stem": common.file_stem(name),
             "data": common.data_description(args.data, None if args.source else args.split),
             "sentence": "the given --source sentence" if args.source is not None else
             f"sentence {sentence} of '{args.split}'",
             "translation": {"beam": f"its beam-{args.beam} translation",
                             "teacher-forced": f"the {how}"}[how.split()[0]]}
    if args.source is not None:
        about["data"] = f"--source, dictionaries of {about['data']}"
    os.makedirs(args.out, exist_ok=True)
    encoder_tokens = sources[0][-sample["net_input"]["src_tokens"].size(1):]
    figures = {"encoder": encoder_figures(maps, encoder_tokens, about, args.out, limit, scale),
               "decoder": decoder_figures(maps, target_labels, sources, names, about, args.out, limit, scale)}
    if any(d["beta"] is not None for d in maps["decoder"]):
        figures["context"] = context_figure(maps, target_labels, names, about,
                                            os.path.join(args.out, f"{about['stem']}_context_weights.png"),
                                            limit, scale)
    meta = {"name": name, "checkpoint": args.checkpoint, "split": None if args.source else args.split,
            "sentence": None if args.source else sentence,
            "sentence_picked": args.source is None and args.sentence is None, "translation": how,
            "strategy": model.decoder.options.strategy.name,
            "translation_text": tgt_dict.string(target[:-1] if target[-1] == tgt_dict.eos() else target)}
    with open(os.path.join(args.out, "attention_maps.json"), "w", encoding="utf-8") as f:
        json.dump(to_json(maps, sources, target_labels, names, meta), f, ensure_ascii=False)
    print(f"{how}: {meta['translation_text']}")
    print(f"wrote {', '.join(sorted(os.listdir(args.out)))} to {args.out}")
    return {"maps": maps, "figures": figures, "source": sources, "target": target_labels, "names": names,
            "name": name}


def build_parser() -> argparse.ArgumentParser:
    """This command's options (the report reads them to give it only what it takes)."""
    ap = common.AnalysisParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                               formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", required=True, help="model checkpoint")
    ap.add_argument("--names", metavar="NAME",
                    help="the checkpoint's name in figure titles and file names (default: its file stem; for "
                         "fairseq's checkpoint_best.pt and the like, its directory's name)")
    ap.add_argument("--data", required=True, help="binarized data directory (its dictionaries, and the split)")
    ap.add_argument("--split", default="test")
    which = ap.add_mutually_exclusive_group()
    which.add_argument("--sentence", type=int, help="sentence id in --split (0-based, as fairseq numbers them; "
                       f"default: the first of {READABLE_LENGTH[0]}-{READABLE_LENGTH[1]} source tokens)")
    which.add_argument("--source", help="a source sentence, tokenized and BPE'd like the data")
    target = ap.add_mutually_exclusive_group()
    target.add_argument("--hypothesis", help="teacher-force this target (tokenized/BPE'd) instead of decoding")
    target.add_argument("--reference", action="store_true", help="teacher-force the split's reference")
    ap.add_argument("--beam", type=int, default=5)
    ap.add_argument("--max-len-a", type=float, default=1.2)
    ap.add_argument("--max-len-b", type=int, default=10)
    ap.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS, metavar="N",
                    help=f"draw the first N source and target tokens (default {DEFAULT_MAX_TOKENS}: their labels "
                         "stay legible at the report's width); the JSON keeps every token")
    ap.add_argument("--scale", choices=["unit", "max"], default="unit",
                    help="the colour scale: unit (default) 0 to 1 in every figure and model, so figures compare; "
                         "max 0 to the largest weight drawn (shared by the figures of one kind)")
    ap.add_argument("--out", required=True, help="output directory (PNG, JSON)")
    ap.add_argument("--cpu", action="store_true", help="run on the CPU even when a GPU is there")
    return ap


def main(argv=None):
    setup_cli()
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.max_tokens < 1:
        raise common.AnalysisError(f"--max-tokens: expected 1 or more, not {args.max_tokens}")
    run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
