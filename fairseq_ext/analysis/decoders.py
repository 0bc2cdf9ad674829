"""Main vs auxiliary decoders (thesis Sec. 4.5.2, Table 4.7): the BLEU of every decoder of a
multi-level supervision model, each decoding alone (``decode_from``: the main decoder, or
the auxiliary decoder on encoder layer l), with paired-bootstrap significance against the
main decoder.

    python -m fairseq_ext.analysis.decoders --checkpoint ms13/checkpoint_best.pt --data data-bin/iwslt15.en-vi \\
        --out analysis/decoders --generate-args "--beam 6 --lenpen 1.1"

Writes decoders.{md,csv,json} (model, decoder, reads encoder layer, BLEU, delta, p, mark) and
decoders.png (BLEU per decoder); decodings in OUT/<model>/<decoder>.
"""
import os
import sys
from typing import Optional

from fairseq_ext.analysis import AnalysisError
from fairseq_ext.analysis.decoding import compare_decodings, comparison_command, significance_rows
from fairseq_ext.analysis.figures import FigureContext, pyplot, save_figure
from fairseq_ext.analysis.registry import Analysis
from fairseq_ext.common import checkpoints

ANALYSIS = Analysis("decoders", "Main and auxiliary decoders", "thesis Table 4.7", order=40,
                    needs=lambda options: bool(options.aux_layers),
                    lacks="it has no auxiliary decoder (--aux-decoder-layers)")


def decoder_rows(name, checkpoint, data, split, out, generate_args, flavour, samples, cpu=False, marks="thesis",
                 src=None, tgt=None):
    options = checkpoints.options(checkpoint)
    if not options.aux_layers:
        raise AnalysisError(f"{checkpoint}: no auxiliary decoder (--aux-decoder-layers is empty)")
    runs = {"main": {"decode_from": "main"}, **{f"aux{l}": {"decode_from": f"aux{l}"} for l in options.aux_layers}}
    flavour, sig = compare_decodings(checkpoint, data, split, os.path.join(out, name), runs, generate_args, flavour,
                                     samples, cpu, marks, src, tgt)
    n_layers = options.encoder_self_attention and len(options.encoder_self_attention)
    return significance_rows(sig, flavour, {
        "main": {"model": name, "decoder": "main", "reads encoder layer": n_layers},
        **{f"aux{l}": {"model": name, "decoder": f"aux{l}", "reads encoder layer": l} for l in options.aux_layers}})


def plot(rows, path, context: Optional[FigureContext] = None):
    plt = pyplot()
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
    save_figure(fig, path, context)
    return fig


build_parser, main = comparison_command(__doc__, decoder_rows, "decoders", "BLEU of every decoder", plot)


if __name__ == "__main__":
    sys.exit(main())
