"""Main vs auxiliary decoders (thesis Sec. 4.5.2, Table 4.7): the BLEU of every decoder of a
multi-level supervision model, each decoding alone (``decode_from``: the main decoder, or
the auxiliary decoder on encoder layer l), with paired-bootstrap significance against the
main decoder.

    python -m fairseq_ext.analysis.decoders --checkpoint ms13/checkpoint_best.pt --data data-bin/iwslt15.en-vi \\
        --out analysis/decoders --generate-args "--beam 6 --lenpen 1.1"

Writes decoders.{md,csv,json} (model, decoder, reads encoder layer, BLEU, delta, p, mark) and
decoders.png (BLEU per decoder); decodings in OUT/<model>/<decoder>.
"""
import argparse
import os
import shlex
import sys

from fairseq_ext.common import data_text
from fairseq_ext.common.cli import setup_cli
from fairseq_ext.analysis import common
from fairseq_ext.analysis.layer_dependency import model_options


def decoder_rows(name, checkpoint, data, split, out, generate_args, flavour, samples, cpu=False, marks="thesis",
                 src=None, tgt=None):
    from fairseq_ext.tools.significance import paired_significance

    options = model_options(checkpoint, data)
    if not options.aux_layers:
        raise common.AnalysisError(f"{checkpoint}: no auxiliary decoder (--aux-decoder-layers is empty)")
    main = common.evaluate(checkpoint, data, split, os.path.join(out, name, "main"), generate_args=generate_args,
                           overrides={"decode_from": "main"}, cpu=cpu, src=src, tgt=tgt)
    flavour = flavour or main["headline"]
    aux = {layer: common.evaluate(checkpoint, data, split, os.path.join(out, name, f"aux{layer}"),
                                  overrides={"decode_from": f"aux{layer}"}, generate_args=generate_args, cpu=cpu,
                                  src=src, tgt=tgt)
           for layer in options.aux_layers}
    level = "tok" if flavour.startswith("tok") else "detok"
    refs = data_text.read_lines(os.path.join(main["dir"], f"ref.{level}"))
    sig = paired_significance(refs, data_text.read_lines(os.path.join(main["dir"], f"hyp.{level}")),
                              {f"aux{l}": data_text.read_lines(os.path.join(r["dir"], f"hyp.{level}"))
                               for l, r in aux.items()}, flavour=flavour, n_samples=samples, marks=marks)
    n_layers = options.encoder_self_attention and len(options.encoder_self_attention)
    rows = [{"model": name, "decoder": "main", "reads encoder layer": n_layers, "BLEU": sig["baseline"]["bleu"],
             "delta": None, "p": None, "mark": "", "flavour": flavour}]
    for layer in options.aux_layers:
        s = sig[f"aux{layer}"]
        rows.append({"model": name, "decoder": f"aux{layer}", "reads encoder layer": layer, "BLEU": s["bleu"],
                     "delta": round(s["bleu"] - sig["baseline"]["bleu"], 2), "p": s["p_value"], "mark": s["mark"],
                     "flavour": flavour})
    return rows


def plot(rows, path):
    plt = common.pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    labels = [f"{r['model']}:{r['decoder']}" for r in rows]
    bars = ax.bar(range(len(rows)), [r["BLEU"] for r in rows],
                  color=["C0" if r["decoder"] == "main" else "C1" for r in rows])
    # the BLEU on each bar, with the auxiliary decoders' delta to the main one and its mark
    ax.bar_label(bars, [f"{r['BLEU']:.2f}" + ("" if r["decoder"] == "main" else f"\n{r['delta']:+.2f}{r['mark']}")
                        for r in rows], fontsize=8)
    ax.margins(y=0.15)
    ax.set_xticks(range(len(rows)), labels, rotation=30, ha="right")
    ax.set_ylabel(f"BLEU ({rows[0]['flavour']})")
    common.save_figure(fig, path)
    return fig


def build_parser() -> argparse.ArgumentParser:
    """This command's options (the report reads them to give it only what it takes)."""
    ap = common.analysis_parser(__doc__)
    ap.add_argument("--generate-args", default="")
    ap.add_argument("--flavour")
    ap.add_argument("--samples", type=int, default=1000)
    ap.add_argument("--marks", default="thesis")
    common.language_arguments(ap)
    return ap


def main(argv=None):
    setup_cli()
    ap = build_parser()
    args = ap.parse_args(argv)
    rows = []
    for name, ckpt in zip(common.names_for(args.checkpoint, args.names), args.checkpoint):
        rows += decoder_rows(name, ckpt, args.data, args.split, args.out, shlex.split(args.generate_args),
                             args.flavour, args.samples, args.cpu, args.marks, args.src, args.tgt)
    common.write_table(rows, args.out, "decoders", "BLEU of every decoder")
    plot(rows, os.path.join(args.out, "decoders.png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
