"""Main vs auxiliary decoders (thesis Sec. 4.5.2, Table 4.7): the BLEU of every decoder of a multi-level supervision
model, each decoding alone (``decode_from``: the main decoder, or the auxiliary decoder on encoder layer l), with
paired-bootstrap significance against the main decoder.

    python -m fairseq_ext.analysis.decoders --checkpoint ms13/checkpoint_best.pt --data data-bin/iwslt15.en-vi \\
        --out analysis/decoders --generate-args "--beam 6 --lenpen 1.1"

Writes decoders.{md,csv,json} (model, decoder, reads encoder layer, BLEU, delta, p, mark) and
decoders.png (BLEU per decoder); decodings in OUT/<model>/<decoder>.
"""
import sys
from typing import Optional

from fairseq_ext.analysis import AnalysisError
from fairseq_ext.analysis.decoding import comparison_command
from fairseq_ext.analysis.figures import (FigureContext, add_caption, add_title, flavour_of, marks_note, pyplot,
                                         save_figure, system_colours)
from fairseq_ext.analysis.registry import Analysis
from fairseq_ext.common import checkpoints

ANALYSIS = Analysis("decoders", "Main and auxiliary decoders", "thesis Table 4.7", order=40,
                    needs=lambda options: bool(options.aux_layers),
                    lacks="it has no auxiliary decoder (--aux-decoder-layers)")


def decoder_runs(name, checkpoint):
    options = checkpoints.options(checkpoint)
    if not options.aux_layers:
        raise AnalysisError(f"{checkpoint}: no auxiliary decoder (--aux-decoder-layers is empty)")
    n_layers = options.encoder_self_attention and len(options.encoder_self_attention)
    return {"main": ({"decode_from": "main"}, {"model": name, "decoder": "main", "reads encoder layer": n_layers}),
            **{f"aux{l}": ({"decode_from": f"aux{l}"}, {"model": name, "decoder": f"aux{l}", "reads encoder layer": l})
               for l in options.aux_layers}}


def plot(rows, path, context: Optional[FigureContext] = None, marks: str = "thesis"):
    """BLEU per decoder (auxiliary ones hatched, with their difference to the main one and its mark)."""
    colours = system_colours(list(dict.fromkeys(r["model"] for r in rows)))
    fig, ax = pyplot().subplots(figsize=(max(6.5, 1.2 * len(rows) + 2), 3.6))
    labels = [f"{r['model']}:{r['decoder']}" for r in rows]
    bars = ax.bar(range(len(rows)), [r["BLEU"] for r in rows], color=[colours[r["model"]] for r in rows],
                  edgecolor="black", linewidth=0.6)
    for bar, r in zip(bars, rows):
        if r["decoder"] != "main":
            bar.set_hatch("//")
    ax.bar_label(bars, [f"{r['BLEU']:.2f}" + ("" if r["decoder"] == "main" else f"\n{r['delta']:+.2f}{r['mark']}")
                        for r in rows], fontsize=8, padding=2)
    ax.margins(y=0.2)
    many = len(rows) > 4
    ax.set_xticks(range(len(rows)), labels, rotation=30 if many else 0, ha="right" if many else "center")
    ax.set_ylabel(f"BLEU ({flavour_of(rows)})")
    add_title(fig, "BLEU of the main and every auxiliary decoder, each decoding alone")
    add_caption(fig, f"BLEU ({flavour_of(rows)}) of each decoder of a model translating alone (decode_from): main, "
                     "or auxl, the auxiliary decoder on encoder layer l (hatched). Under an auxiliary decoder's "
                     "BLEU: its difference to the main decoder and sacreBLEU's paired-bootstrap mark against it, "
                     f"{marks_note(marks)}; no mark: not significant.")
    return save_figure(fig, path, context)


build_parser, main = comparison_command(__doc__, decoder_runs, "decoders", "BLEU of every decoder", plot)


if __name__ == "__main__":
    sys.exit(main())
