"""Redraw docs/figures/ from the analyses' stored tables in docs/benchmarks/report-cpu-multi30k/
(read back by fairseq_ext.analysis.command.read_table: the JSON, or the Markdown where only that
was kept), with each analysis' own plot function: the figures change when the figure code does,
the numbers never (no model is loaded, nothing is decoded).

    python scripts/redraw_report_figures.py [--out docs/figures]

The models' checkpoints are not kept, so each figure's note (models, data, decoding), which an
analysis reads from its checkpoints and data, is written here as the figures made by the
commands in each folder's command.txt had it. The DC divergence of the 12-row CPU table's Enc-DC
model was kept only as the three-decimal values of docs/analysis.md, stored in
report-cpu-multi30k/dc_divergence/.
"""
import argparse
import os
import sys

from fairseq_ext.analysis import (aif_dependency, attention_stats, dc_divergence, decoders, layer_dependency,
                                  length_buckets, probing, translate_from_layer, word_order)
from fairseq_ext.analysis.command import read_table

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs", "benchmarks", "report-cpu-multi30k")
SIZE = "3+3 layers, d_model 128, FFN 512, 4 heads, 800 updates"
TEST = "data: multi30k-en-de, test (test_2016_flickr, 1,000 sentences)"
HALF = "data: multi30k-en-de, test (test_2016_flickr, 500 of its 1,000 sentences)"
DECODING = "decoding: --beam 5 --max-len-a 1.2 --max-len-b 10"


class Note:
    """What a FigureContext gives save_figure, written out: the note at the end of a caption."""

    def __init__(self, names, *parts):
        models = "; ".join(f"{n} ({SIZE})" for n in names)
        self.text = ". ".join([("Model: " if len(names) == 1 else "Models: ") + models, *parts]) + "."

    def note(self) -> str:
        return self.text


def stored(*path):
    return os.path.join(ROOT, *path)


def redraw(out: str) -> list:
    drawn = []

    def to(name):
        drawn.append(os.path.join(out, name))
        return drawn[-1]

    rows = read_table(stored("length_buckets"), "buckets")
    systems = [c for c in rows[0] if c not in ("bucket", "sentences", "note")]
    length_buckets.plot(rows, systems, "detok-cased", to("length_buckets_benchmark.png"), unit="subword tokens",
                        data="multi30k-en-de, test", context=Note(systems, TEST, DECODING))

    rows = read_table(stored("attention_stats"), "per_layer")
    models = list(dict.fromkeys(r["model"] for r in rows))
    attention_stats.layer_plot(rows, to("attention_layers_benchmark.png"), "multi30k-en-de, test (500 sentences)",
                               Note(models, HALF))

    rows = read_table(stored("layer_dependency"), "masking")
    layer_dependency.plot(rows, to("layer_dependency_benchmark.png"), Note(["M-00"], TEST, DECODING))

    rows = read_table(stored("decoders"), "decoders")
    decoders.plot(rows, to("decoders_benchmark.png"), Note(["MS-1+AIF"], TEST, DECODING))

    rows = read_table(stored("dc_divergence"), "per_layer")
    summary = read_table(stored("dc_divergence"), "summary")
    dc_divergence.plot(rows, summary, [s["model"] for s in summary], to("dc_divergence_benchmark.png"),
                       Note(["Enc-DC"], TEST), "max", "multi30k-en-de, test")

    rows = read_table(stored("probing"), "probing")
    columns = [c for c in rows[0] if c not in ("category", "task", "labels", "train", "test", "majority")]
    tasks = ", ".join(f"{r['task']} ({r['train']:,} train, {r['test']:,} test)" for r in rows if r["task"] != "#AVG")
    probing.plot(rows, columns, {c: [(3, c)] for c in columns}, to("probing_benchmark.png"),
                 Note(columns, f"data: the probing tasks {tasks}, reported on their test sentences (te)"))

    models = {name: read_table(stored("translate_from_layer", name), "translate_from_layer")
              for name in ("baseline", "MMA")}
    translate_from_layer.plot(models, to("translate_from_layer_benchmark.png"), Note(list(models), HALF))

    rows = read_table(stored("word_order"), "word_order")
    word_order.plot(rows, to("word_order_benchmark.png"),
                    Note(["baseline", "M-00", "MS-1+AIF", "MMA", "baseline-nopos", "MMA-nopos"], TEST, DECODING))

    aif = stored("aif_dependency", "MS-1+AIF")
    note = Note(["MS-1+AIF"], TEST)
    aif_dependency.plot_dependency(read_table(aif, "summary"), read_table(aif, "per_sentence"),
                                   read_table(aif, "per_head"), to("aif_dependency_benchmark.png"), note)
    aif_dependency.plot_tokens(read_table(aif, "tokens"), to("aif_tokens_benchmark.png"), note)
    return drawn


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(ROOT, "..", "..", "figures"))
    args = ap.parse_args(argv)
    for path in redraw(args.out):
        print(os.path.normpath(path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
