"""Encoder-layer dependency (thesis Sec. 3.5.4, Table 3.5; MLMHA paper Sec. 7.4, Table 7):
BLEU with each collected encoder layer f^i removed from what the decoder reads
(``--mask-source-layer i``: docs/analysis.md "Layer masking" says how for each strategy), the
difference to the full model, and its paired-bootstrap significance (sacreBLEU, same
flavour), for one or several models.

    python -m fairseq_ext.analysis.layer_dependency --checkpoint m00/checkpoint_best.pt m10/checkpoint_best.pt \\
        --names M-00 M-10 --data data-bin/wmt14.en-de --out analysis/masking --generate-args "--beam 4 --lenpen 0.6"

Writes masking.{md,csv,json} (model, layer, BLEU, delta, p, mark; one row per masked layer)
and masking.png (delta per masked layer, one series per model); the decodings stay in
OUT/<model>/full and OUT/<model>/mask<i> (evaluate.sh directories).
"""
import os
import sys
from typing import Optional

from fairseq_ext.analysis import AnalysisError
from fairseq_ext.analysis.decoding import compare_decodings, comparison_command, significance_rows
from fairseq_ext.analysis.figures import FigureContext, layer_axes, pyplot, save_figure
from fairseq_ext.analysis.registry import Analysis
from fairseq_ext.common import checkpoints

ANALYSIS = Analysis(
    "layer_dependency", "Encoder-layer dependency (layer masking)", "thesis Table 3.5, MLMHA Table 7", order=30,
    needs=lambda options: options.strategy.name != "none" and (
        options.strategy.name == "transparent" or options.num_joint_layers > 1),
    lacks="its decoder reads one encoder layer (no --joint-attention over several layers)")


def masking_rows(name: str, checkpoint: str, data: str, split: str, out: str, generate_args, flavour, samples,
                 cpu=False, marks="thesis", src=None, tgt=None):
    options = checkpoints.options(checkpoint)
    n = options.num_joint_layers
    if options.strategy.name == "none" or n < 2:
        raise AnalysisError(f"{checkpoint}: the decoder reads one encoder layer (--joint-attention "
                            f"{options.strategy.name}, n = {n}): there is no layer to mask")
    runs = {"full": None, **{f"mask{i}": {"mask_source_layer": i} for i in range(1, n + 1)}}
    flavour, sig = compare_decodings(checkpoint, data, split, os.path.join(out, name), runs, generate_args, flavour,
                                     samples, cpu, marks, src, tgt)
    return significance_rows(sig, flavour, {"full": {"model": name, "masked layer": "none"},
                                            **{f"mask{i}": {"model": name, "masked layer": f"f^{i}"}
                                               for i in range(1, n + 1)}})


def plot(rows, path, context: Optional[FigureContext] = None):
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for model in dict.fromkeys(r["model"] for r in rows):
        sel = [r for r in rows if r["model"] == model and r["delta"] is not None]
        ax.plot([int(r["masked layer"][2:]) for r in sel], [r["delta"] for r in sel], marker="o", label=model)
    ax.axhline(0, color="grey", linewidth=0.8)
    layer_axes(ax, "masked encoder layer f^i (i = 1: lowest collected)", "ΔBLEU")
    save_figure(fig, path, context)
    return fig


build_parser, main = comparison_command(__doc__, masking_rows, "masking", "BLEU with one collected encoder layer masked",
                                        plot)


if __name__ == "__main__":
    sys.exit(main())
