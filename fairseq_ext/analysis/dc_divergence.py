"""Dual Contextual layers: how far the local and the global Feature Interaction units attend differently (thesis Sec.
5.6.2, Fig. 5.4). Per encoder layer l with DC:

    dv_l = JS(alpha_g || alpha_l) = 0.5 KL(alpha_g || m) + 0.5 KL(alpha_l || m),  m = (alpha_g + alpha_l) / 2
    Ed   = (1 / L) sum_l dv_l

with alpha_g / alpha_l the attention distributions of each query token over the sentence in the global unit (keys r) and
the local unit (keys = the local context l_c of each position), averaged over the query tokens of the split (natural
log). The thesis takes "the head with the maximum weight distribution among all the heads"; ``--heads max`` (default)
reads that as the element-wise maximum over heads, renormalized to a distribution; ``mean`` averages the heads; ``each``
computes JS per head and averages. Several checkpoints (e.g. kernel sizes f = 2..8) give Fig. 5.4a (dv_l per layer, one
series each) and 5.4b (Ed per model).

    python -m fairseq_ext.analysis.dc_divergence --checkpoint dc-f2/checkpoint_best.pt dc-f3/checkpoint_best.pt \\
        --names f=2 f=3 --data data-bin/wmt14.en-de --out analysis/dc --max-sentences 1500
"""
import os
import sys
from typing import Optional

import torch

from fairseq_ext.analysis import AnalysisError, command
from fairseq_ext.analysis.capture import encoder_self_attention
from fairseq_ext.analysis.figures import (FIGURE_WIDTH, FigureContext, add_caption, add_title, data_description,
                                         integer_ticks, label_points, legend_outside, names_for, pyplot,
                                         save_figure, system_colours)
from fairseq_ext.analysis.registry import Analysis
from fairseq_ext.common import checkpoints

ANALYSIS = Analysis("dc_divergence", "DC divergence", "thesis 5.6.2 (Fig. 5.4)", order=60,
                    needs=lambda options: "dc" in options.encoder_self_attention,
                    lacks="its encoder has no Dual Contextual layer (--encoder-self-attention dc)")


def js_divergence(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """JS(p || q) over the last dimension (natural log; 0 log 0 = 0)."""
    m = 0.5 * (p + q)

    def kl(a, b):
        return torch.where(a > 0, a * (torch.log(a.clamp(min=1e-30)) - torch.log(b.clamp(min=1e-30))),
                           torch.zeros_like(a)).sum(-1)

    return 0.5 * kl(p, m) + 0.5 * kl(q, m)


def combine_heads(weights: torch.Tensor, how: str) -> torch.Tensor:
    """B x H x T x S -> B x T x S (``max``: element-wise max, renormalized; ``mean``)."""
    if how == "max":
        top = weights.max(dim=1).values
        return top / top.sum(-1, keepdim=True).clamp(min=1e-30)
    if how == "mean":
        return weights.mean(dim=1)
    raise ValueError(f"--heads: {how!r}")


def layer_divergences(model, task, split, heads="max", max_sentences=None, cpu=False):
    """{layer (1-based): mean JS over the query tokens of the split} for the DC layers."""
    sums, counts = {}, {}
    for pad, layers in encoder_self_attention(model, task, split, max_sentences, cpu):
        queries = ~pad  # B x T
        for index, layer in layers.items():
            g, l = layer["global"], layer["local"]
            if l is None:
                continue
            if heads == "each":
                js = js_divergence(g, l).mean(1)  # B x T
            else:
                js = js_divergence(combine_heads(g, heads), combine_heads(l, heads))
            sums[index + 1] = sums.get(index + 1, 0.0) + js[queries].sum().item()
            counts[index + 1] = counts.get(index + 1, 0) + int(queries.sum())
    if not sums:
        raise AnalysisError("the encoder has no Dual Contextual layer (--encoder-self-attention dc)")
    return {layer: sums[layer] / counts[layer] for layer in sorted(sums)}


def build_parser():
    ap = command.parser(__doc__, max_sentences=True)
    ap.add_argument("--heads", default="max", choices=["max", "mean", "each"])
    return ap


HEADS_READING = {"max": "the element-wise maximum over the heads, renormalized (--heads max)",
                 "mean": "the mean over the heads (--heads mean)",
                 "each": "each head's JS, averaged over the heads (--heads each)"}


def plot(rows, summary, names, path: str, context: Optional[FigureContext] = None, heads: str = "max", data: str = ""):
    """Fig. 5.4: (a) JS per DC layer and model; (b) Ed per model; in nats, one y-axis from 0."""
    colours = system_colours(names)
    fig, (a, b) = pyplot().subplots(1, 2, figsize=(FIGURE_WIDTH, 3.6), sharey=True,
                               gridspec_kw={"width_ratios": [3, max(1, len(summary))]})
    for name in names:
        sel = [r for r in rows if r["model"] == name]
        xs, ys = [r["layer"] for r in sel], [r["JS"] for r in sel]
        a.plot(xs, ys, marker="o", color=colours[name], label=name)
        if len(names) == 1:  # several models' labels would cross where their lines do (the table has them)
            label_points(a, xs, ys, [f"{y:.3f}" for y in ys], colours[name])
    a.set(xlabel="encoder layer l (Dual Contextual)", ylabel="JS divergence (nats)")
    integer_ticks(a.xaxis)
    a.set_title("(a) dv_l per layer", fontsize=10)
    bars = b.bar(range(len(summary)), [s["Ed"] for s in summary], 0.6,
                 color=[colours.get(s["model"], "grey") for s in summary])
    b.bar_label(bars, [f"{s['Ed']:.3f}" for s in summary], fontsize=8, padding=2)
    b.set_xticks(range(len(summary)), [s["model"] for s in summary])
    b.set_title("(b) Ed = mean over layers", fontsize=10)
    top = max([r["JS"] for r in rows] + [s["Ed"] for s in summary] + [1e-3])
    a.set_ylim(0, top * 1.2)  # from 0: the divergences compare by their size, not their differences alone
    if len(names) > 1:
        legend_outside(b, handles=a.get_legend_handles_labels()[0])
    add_title(fig, "Jensen-Shannon divergence between the global and the local FI unit" + (f": {data}" if data else ""))
    add_caption(fig, "(a) dv_l = JS(α_g || α_l) of each Dual Contextual encoder layer l, in nats (natural log; at most "
                     "ln 2 = 0.693): α_g and α_l are a query token's attention over the sentence in the global and the "
                     f"local FI unit, {HEADS_READING[heads]}, averaged over the query tokens of the split. (b) Ed, the "
                     "mean of dv_l over the DC layers (thesis Fig. 5.4). The y-axis starts at 0.")
    return save_figure(fig, path, context)


def execute(args, figures: FigureContext):
    names = names_for(args.checkpoint, args.names)
    rows, summary = [], []
    for name, ckpt in zip(names, args.checkpoint):
        model, task = checkpoints.load_model(ckpt, args.data, split=args.split, cpu=args.cpu)
        dv = layer_divergences(model, task, args.split, args.heads, args.max_sentences, args.cpu)
        rows += [{"model": name, "layer": layer, "JS": round(v, 5)} for layer, v in dv.items()]
        summary.append({"model": name, "Ed": round(sum(dv.values()) / len(dv), 5), "DC layers": len(dv)})
    command.write_table(rows, args.out, "per_layer", f"JS(global || local) per DC layer (heads: {args.heads})", ".5f")
    command.write_table(summary, args.out, "summary", "Ed: mean over the DC layers", ".5f")
    plot(rows, summary, names, os.path.join(args.out, "dc_divergence.png"), figures, args.heads,
         data_description(args.data, args.split))


main = command.main(build_parser, execute)

if __name__ == "__main__":
    sys.exit(main())
