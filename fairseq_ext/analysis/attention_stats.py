"""Encoder self-attention: mean attention distance and entropy per head and layer (thesis 3.5.3, MLMHA paper Sec. 7.3,
Eq. 13-16; Figs. 3.8-3.12 / 5-9).

For head h of encoder layer l, with w^h_ij the weight of token i on token j of a sentence x (padding excluded), over the
sentences X of the split:

    D^l_h = sum_x sum_i sum_j w^h_ij d(i, j) / sum_x sum_i sum_j w^h_ij        (Eq. 13)
    D^l   = mean_h D^l_h                                                        (Eq. 14)
    E^l_h(x_i) = - sum_j w^h_ij log w^h_ij,  averaged over the tokens of X      (Eq. 15)
    E^l   = mean_h E^l_h                                                        (Eq. 16)

``--span all`` (default) sums over every key with d = |i - j|: the encoder attends both ways, and a head's distance is
then how far its weight lies from the query, whichever side. ``--span left`` sums over j <= i with d = i - j, the
equations as printed (they come from Vig & Belinkov's analysis of a left-to-right model); it ignores the weight on later
tokens, so a head that reads only them (MMA's forward head) has distance 0 and nearly no weight by construction, and
heads compare by how much weight they put on the left. The span applies to the entropy too (as printed: the sum over j
<= i). Distances are in tokens of the binarized source (subword units, end of sentence included), entropies in nats.

Dual Contextual layers report their global FI unit and, as ``local``, the local FI unit (keys = the local context of
each position); MMA layers report each head as it is masked, and the tables and figures give each head's type (G, L, F,
B) from the model's own ``--mma-heads`` assignment.

    python -m fairseq_ext.analysis.attention_stats --checkpoint base/checkpoint_best.pt m10/checkpoint_best.pt \\
        --names baseline M-10 --data data-bin/wmt14.en-de --split test --max-sentences 1500 --out analysis/attn

Writes per_head.{md,csv,json} (model, unit, layer, head, type, span, distance, entropy),
per_layer.*, heatmaps_<model>.png (distance and entropy, layer x head, one colour scale per
quantity for every model and unit) and layers.png (per-layer means of every model, as
Figs. 3.11-3.12).
"""
import os
import sys
from typing import Dict, List, Optional

import torch

from fairseq_ext.analysis import AnalysisError, command
from fairseq_ext.analysis.capture import encoder_head_types, encoder_self_attention, mma_legend
from fairseq_ext.analysis.figures import (FIGURE_WIDTH, FigureContext, add_caption, add_title, data_description,
                                          file_stem, layer_axes, names_for, pyplot, save_figure, system_colours)
from fairseq_ext.analysis.registry import Analysis
from fairseq_ext.common import checkpoints

ANALYSIS = Analysis("attention_stats", "Encoder self-attention distance and entropy",
                    "thesis 3.5.3, MLMHA 7.3 (Eq. 13-16)", order=20)
SPANS = ("all", "left")
READING = {"all": "over all keys j, d = |i - j|", "left": "over the keys j <= i, d = i - j (as printed)"}
UNITS = {"distance": "tokens", "entropy": "nats"}


def head_statistics(weights: torch.Tensor, pad: torch.Tensor, span: str = "all") -> Dict[str, torch.Tensor]:
    """Per head, the sums of Eq. 13 and 15 over one batch (``weights`` B x H x T x T, ``pad`` B x T
    excluded as query and key): weighted distance, weight, entropy and query tokens."""
    bsz, heads, tgt, src = weights.shape
    # positions counted from each sentence's first real token (sources are left-padded)
    offset = (pad.sum(1))[:, None]
    pos_q = torch.arange(tgt)[None, :] - offset  # B x T
    pos_k = torch.arange(src)[None, :] - offset
    diff = pos_q[:, :, None] - pos_k[:, None, :]  # B x T x S: i - j
    valid = (~pad)[:, :, None] & (~pad)[:, None, :]
    if span == "left":
        keys = valid & (diff >= 0)
        dist = diff.clamp(min=0).float()
    elif span == "all":
        keys = valid
        dist = diff.abs().float()
    else:
        raise ValueError(f"--span: {span!r} is not one of {', '.join(SPANS)}")
    w = weights * keys[:, None].float()
    ent = -(w * torch.log(w.clamp(min=1e-30))).sum(-1)  # B x H x T
    queries = (~pad)[:, None, :].float()
    return {"distance": (w * dist[:, None]).sum((0, 2, 3)), "weight": w.sum((0, 2, 3)),
            "entropy": (ent * queries).sum((0, 2)), "tokens": queries.sum((0, 2)).expand(heads).clone()}


def collect(model, task, split: str, max_sentences=None, span: str = "all", cpu: bool = False):
    totals: Dict[str, Dict[int, Dict[str, torch.Tensor]]] = {}
    for pad, layers in encoder_self_attention(model, task, split, max_sentences, cpu):
        for index, layer in layers.items():
            for unit, weights in layer.items():
                if weights is None:
                    continue
                slot = totals.setdefault(unit, {}).setdefault(index, {})
                for k, v in head_statistics(weights, pad, span).items():
                    slot[k] = slot.get(k, 0) + v
    return totals


def summarise(name: str, totals, span: str = "all", types: Optional[Dict[int, Optional[List[str]]]] = None
              ) -> List[dict]:
    """A row per unit, layer and head: its MMA type (or None), the span, D^l_h and E^l_h."""
    rows = []
    for unit, layers in totals.items():
        for layer, s in sorted(layers.items()):
            distance = (s["distance"] / s["weight"].clamp(min=1e-30)).tolist()
            entropy = (s["entropy"] / s["tokens"].clamp(min=1)).tolist()
            letters = (types or {}).get(layer)
            for h, (d, e) in enumerate(zip(distance, entropy), start=1):
                rows.append({"model": name, "unit": unit, "layer": layer + 1, "head": h,
                             "type": letters[h - 1] if letters else None, "span": span,
                             "distance": round(d, 4), "entropy": round(e, 4)})
    return rows


def per_layer(rows: List[dict]) -> List[dict]:
    out = {}
    for r in rows:
        key = (r["model"], r["unit"], r["layer"], r.get("span", "all"))
        out.setdefault(key, []).append(r)
    return [{"model": m, "unit": u, "layer": l, "span": s,
             "distance": round(sum(x["distance"] for x in v) / len(v), 4),
             "entropy": round(sum(x["entropy"] for x in v) / len(v), 4)} for (m, u, l, s), v in out.items()]


def span_of(rows: List[dict]) -> str:
    spans = {r.get("span", "all") for r in rows}
    if len(spans) != 1:
        raise AnalysisError(f"rows of several spans ({', '.join(sorted(spans))}) in one figure")
    return spans.pop()


def heatmaps(rows: List[dict], name: str, path: str, data: str = "", context: Optional[FigureContext] = None):
    """Distance and entropy of every head of ``name``, layer x head, per unit; each quantity on one
    colour scale shared by every model and unit of ``rows``, so the models' files compare."""
    span = span_of(rows)
    units = sorted({r["unit"] for r in rows if r["model"] == name})
    limits = {m: (min(r[m] for r in rows), max(r[m] for r in rows)) for m in ("distance", "entropy")}
    fig, axes = pyplot().subplots(len(units), 2, figsize=(FIGURE_WIDTH, 3.4 * len(units) + 0.4), squeeze=False)
    for u, unit in enumerate(units):
        sel = [r for r in rows if r["model"] == name and r["unit"] == unit]
        layers, heads = max(r["layer"] for r in sel), max(r["head"] for r in sel)
        letters = {r["head"]: r.get("type") for r in sel}
        for c, metric in enumerate(("distance", "entropy")):
            grid = torch.zeros(layers, heads)
            for r in sel:
                grid[r["layer"] - 1, r["head"] - 1] = r[metric]
            ax = axes[u][c]
            im = ax.imshow(grid.numpy(), aspect="auto", origin="lower", cmap="viridis", vmin=limits[metric][0],
                           vmax=limits[metric][1])
            ax.set_xticks(range(heads), [f"{h}\n{letters[h]}" if letters.get(h) else str(h)
                                         for h in range(1, heads + 1)], fontsize=8)
            ax.set_yticks(range(layers), [str(l) for l in range(1, layers + 1)], fontsize=8)
            ax.set(xlabel="head" + (" (number, type)" if any(letters.values()) else ""), ylabel="encoder layer")
            unit_name = f"{unit} FI unit: " if len(units) > 1 else ""  # a Dual Contextual encoder's two units
            ax.set_title(f"{unit_name}mean attention {metric}", fontsize=10)
            fig.colorbar(im, ax=ax).set_label(UNITS[metric])
    add_title(fig, f"{name}: encoder self-attention per head" + (f", {data}" if data else ""))
    legend = mma_legend({r["type"] for r in rows if r["model"] == name and r.get("type")})
    add_caption(fig, f"Mean attention distance (Eq. 13, in source tokens) and entropy (Eq. 15, in nats) of "
                     f"every head, {READING[span]} (--span {span}); one colour scale per quantity for every "
                     f"model compared. {legend}".strip())
    return save_figure(fig, path, context)


def layer_plot(layer_rows: List[dict], path: str, data: str = "", context: Optional[FigureContext] = None):
    span = span_of(layer_rows)
    fig, axes = pyplot().subplots(1, 2, figsize=(FIGURE_WIDTH, 3.6))
    pairs = sorted({(r["model"], r["unit"]) for r in layer_rows})
    colours = system_colours(list(dict.fromkeys(r["model"] for r in layer_rows)))
    for (model, unit) in pairs:
        sel = sorted((r for r in layer_rows if r["model"] == model and r["unit"] == unit), key=lambda r: r["layer"])
        dual = (model, "local") in pairs  # a Dual Contextual encoder: name both units
        label = f"{model} ({unit} FI)" if dual else model
        for ax, metric in zip(axes, ("distance", "entropy")):
            ax.plot([r["layer"] for r in sel], [r[metric] for r in sel], marker="o", label=label,
                    color=colours[model], linestyle="--" if unit == "local" else "-")
    for ax, metric in zip(axes, ("distance", "entropy")):
        layer_axes(ax, "encoder layer", f"mean attention {metric} ({UNITS[metric]})", legend=8)
    add_title(fig, "Encoder self-attention per layer" + (f", {data}" if data else ""))
    add_caption(fig, f"Mean over the heads of each layer (Eq. 14, 16) of the attention distance (in source "
                     f"tokens) and entropy (in nats), {READING[span]} (--span {span}).")
    return save_figure(fig, path, context)


def build_parser():
    ap = command.parser(__doc__, max_sentences=True)
    ap.add_argument("--span", default="all", choices=SPANS,
                    help="the keys of the sums: all (default, d = |i - j|) or left (j <= i, d = i - j, the "
                         "equations as printed)")
    return ap


def execute(args, figures: FigureContext):
    names = names_for(args.checkpoint, args.names)
    rows, sentences = [], 0
    for name, ckpt in zip(names, args.checkpoint):
        model, task = checkpoints.load_model(ckpt, args.data, split=args.split, cpu=args.cpu)
        rows += summarise(name, collect(model, task, args.split, args.max_sentences, args.span, args.cpu), args.span,
                          encoder_head_types(model))
        sentences = len(task.dataset(args.split))
    if args.max_sentences is not None:
        sentences = min(sentences, args.max_sentences)
    data = f"{data_description(args.data, args.split)} ({sentences} sentences)"
    reading = READING[args.span]
    command.write_table(rows, args.out, "per_head", f"Encoder self-attention per head, {reading}: {data}", ".4f")
    layers = per_layer(rows)
    command.write_table(layers, args.out, "per_layer", f"Per encoder layer (mean over heads), {reading}: {data}", ".4f")
    for name in names:
        heatmaps(rows, name, os.path.join(args.out, f"heatmaps_{file_stem(name)}.png"), data, figures)
    layer_plot(layers, os.path.join(args.out, "layers.png"), data, figures)
    print(f"written: {args.out}/per_head.*, per_layer.*, heatmaps_*.png, layers.png ({reading})")


main = command.main(build_parser, execute)

if __name__ == "__main__":
    sys.exit(main())
