"""Encoder-layer dependency (thesis Sec. 3.5.4, Table 3.5; MLMHA paper Sec. 7.4, Table 7): BLEU with each collected
encoder layer f^i masked in what the decoder reads (``--mask-source-layer i``), the difference to the full model, and
its paired-bootstrap significance (sacreBLEU, same flavour), for one or several models. ``--mask-mode zero`` (the
default) is the thesis' masking, "replacing the corresponding f^i with zeros" (Table 3.5's caption): the zeros still
pass through the biased key/value projections; ``--mask-mode remove`` takes f^i out of the combination
(docs/architectures.md, "Layer masking").

    python -m fairseq_ext.analysis.layer_dependency --checkpoint m00/checkpoint_best.pt m10/checkpoint_best.pt \\
        --names M-00 M-10 --data data-bin/wmt14.en-de --out analysis/masking --generate-args "--beam 4 --lenpen 0.6"

Writes masking.{md,csv,json} (model, layer, BLEU, delta, p, mark; one row per masked layer)
and masking.png (delta per masked layer, one series per model); the decodings stay in
OUT/<model>/full and OUT/<model>/mask<i> (fairseq-ext evaluate directories).
"""
import sys
from typing import Optional

from fairseq_ext.analysis import AnalysisError
from fairseq_ext.analysis.decoding import comparison_command
from fairseq_ext.analysis.figures import (FigureContext, add_caption, add_title, flavour_of,
                                         label_points, layer_axes, marks_note, pyplot, save_figure, system_colours)
from fairseq_ext.analysis.registry import Analysis
from fairseq_ext.common import checkpoints

ANALYSIS = Analysis(
    "layer_dependency", "Encoder-layer dependency (layer masking)", "thesis Table 3.5, MLMHA Table 7", order=30,
    needs=lambda options: options.strategy.name != "none" and (
        options.strategy.name == "transparent" or options.num_joint_layers > 1),
    lacks="its decoder reads one encoder layer (no --joint-attention over several layers)")


MASK_MODES = {"zero": "replaced by zeros in", "remove": "removed from"}


def masking_runs(name: str, checkpoint: str, mask_mode: str = "zero"):
    options = checkpoints.options(checkpoint)
    n = options.num_joint_layers
    if options.strategy.name == "none" or n < 2:
        raise AnalysisError(f"{checkpoint}: the decoder reads one encoder layer (--joint-attention "
                            f"{options.strategy.name}, n = {n}): there is no layer to mask")
    return {"full": (None, {"model": name, "masked layer": "none", "masking": "–"}),
            **{f"mask{i}": ({"mask_source_layer": i, "mask_source_mode": mask_mode},
                            {"model": name, "masked layer": f"f^{i}", "masking": mask_mode}) for i in range(1, n + 1)}}


def plot(rows, path, context: Optional[FigureContext] = None, marks: str = "thesis", mask_mode: str = "zero"):
    """ΔBLEU per masked layer, a series per model, each point with its mark (one model: its value)."""
    models = list(dict.fromkeys(r["model"] for r in rows))
    colours = system_colours(models)
    fig, ax = pyplot().subplots(figsize=(7.5, 3.6))
    for model in models:
        sel = [r for r in rows if r["model"] == model and r["delta"] is not None]
        xs, ys = [int(r["masked layer"][2:]) for r in sel], [r["delta"] for r in sel]
        ax.plot(xs, ys, marker="o", color=colours[model], label=model)
        # several models: the marks alone, so that labels of close points stay apart
        labels = [f"{r['delta']:+.2f}{r['mark']}" if len(models) == 1 else r["mark"] for r in sel]
        label_points(ax, xs, ys, labels, colours[model], above=False)
    ax.axhline(0, color="grey", linewidth=0.8)
    ax.margins(y=0.15)
    layer_axes(ax, "masked encoder layer f^i (i = 1: lowest collected)", f"ΔBLEU ({flavour_of(rows)})", legend=8)
    full = "; ".join(f"{r['model']} {r['BLEU']:.2f}" for r in rows if r["delta"] is None)
    add_title(fig, "BLEU lost with one collected encoder layer masked")
    add_caption(fig, f"ΔBLEU = the BLEU ({flavour_of(rows)}) of the model with the collected encoder layer f^i "
                     f"{MASK_MODES[mask_mode]} what its decoder reads (mask_source_layer i, mask_source_mode "
                     f"{mask_mode}), minus the full model's BLEU (full: {full}). Marks: sacreBLEU's paired bootstrap "
                     f"against the full model, {marks_note(marks)}; no mark: not significant.")
    return save_figure(fig, path, context)


def add_arguments(ap):
    ap.add_argument("--mask-mode", choices=sorted(MASK_MODES), default="zero",
                    help="zero (default, the thesis' masking): f^i replaced by zeros, which still pass through "
                         "the biased key/value projections; remove: f^i taken out of the combination")


build_parser, main = comparison_command(__doc__, masking_runs, "masking",
                                        "BLEU with one collected encoder layer masked", plot, add_arguments,
                                        lambda args: {"mask_mode": args.mask_mode})


if __name__ == "__main__":
    sys.exit(main())
