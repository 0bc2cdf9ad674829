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
import argparse
import os
import shlex
import sys

from fairseq_ext.common import checkpoints, data_text
from fairseq_ext.common.cli import setup_cli
from fairseq_ext.analysis import common


def model_options(checkpoint: str, data: str):
    model, _ = checkpoints.load_model(checkpoint, data, cpu=True)
    return model.decoder.options


def masking_rows(name: str, checkpoint: str, data: str, split: str, out: str, generate_args, flavour, samples,
                 cpu=False, marks="thesis", src=None, tgt=None):
    from fairseq_ext.tools.significance import paired_significance

    options = model_options(checkpoint, data)
    n = options.num_joint_layers
    if options.strategy.name == "none" or n < 2:
        raise common.AnalysisError(f"{checkpoint}: the decoder reads one encoder layer (--joint-attention "
                                   f"{options.strategy.name}, n = {n}): there is no layer to mask")
    full = common.evaluate(checkpoint, data, split, os.path.join(out, name, "full"), generate_args=generate_args,
                           cpu=cpu, src=src, tgt=tgt)
    flavour = flavour or full["headline"]
    masked = {i: common.evaluate(checkpoint, data, split, os.path.join(out, name, f"mask{i}"),
                                 overrides={"mask_source_layer": i}, generate_args=generate_args, cpu=cpu,
                                 src=src, tgt=tgt)
              for i in range(1, n + 1)}
    level = "tok" if flavour.startswith("tok") else "detok"
    refs = data_text.read_lines(os.path.join(full["dir"], f"ref.{level}"))
    systems = {f"mask{i}": data_text.read_lines(os.path.join(r["dir"], f"hyp.{level}")) for i, r in masked.items()}
    sig = paired_significance(refs, data_text.read_lines(os.path.join(full["dir"], f"hyp.{level}")), systems,
                              flavour=flavour, n_samples=samples, marks=marks)
    rows = [{"model": name, "masked layer": "none", "BLEU": sig["baseline"]["bleu"], "delta": None, "p": None,
             "mark": "", "flavour": flavour}]
    for i in range(1, n + 1):
        s = sig[f"mask{i}"]
        rows.append({"model": name, "masked layer": f"f^{i}", "BLEU": s["bleu"],
                     "delta": round(s["bleu"] - sig["baseline"]["bleu"], 2), "p": s["p_value"], "mark": s["mark"],
                     "flavour": flavour})
    return rows


def plot(rows, path):
    plt = common.pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for model in dict.fromkeys(r["model"] for r in rows):
        sel = [r for r in rows if r["model"] == model and r["delta"] is not None]
        ax.plot([int(r["masked layer"][2:]) for r in sel], [r["delta"] for r in sel], marker="o", label=model)
    ax.axhline(0, color="grey", linewidth=0.8)
    ax.set_xlabel("masked encoder layer f^i (i = 1: lowest collected)")
    common.integer_ticks(ax.xaxis)
    ax.set_ylabel("ΔBLEU")
    ax.legend()
    common.save_figure(fig, path)
    return fig


def build_parser() -> argparse.ArgumentParser:
    """This command's options (the report reads them to give it only what it takes)."""
    ap = common.analysis_parser(__doc__)
    ap.add_argument("--generate-args", default="", help="fairseq-generate flags, e.g. '--beam 4 --lenpen 0.6'")
    ap.add_argument("--flavour", help="BLEU flavour (default: the one evaluate.sh reports for the data)")
    ap.add_argument("--samples", type=int, default=1000, help="paired bootstrap samples")
    ap.add_argument("--marks", default="thesis", help="significance marks: thesis, mma or wt")
    common.language_arguments(ap)
    return ap


def main(argv=None):
    setup_cli()
    ap = build_parser()
    args = ap.parse_args(argv)
    rows = []
    for name, ckpt in zip(common.names_for(args.checkpoint, args.names), args.checkpoint):
        rows += masking_rows(name, ckpt, args.data, args.split, args.out, shlex.split(args.generate_args),
                             args.flavour, args.samples, args.cpu, args.marks, args.src, args.tgt)
    common.write_table(rows, args.out, "masking", "BLEU with one collected encoder layer masked")
    plot(rows, os.path.join(args.out, "masking.png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
