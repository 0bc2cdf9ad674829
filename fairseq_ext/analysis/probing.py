"""Linguistic probing of the encoder (thesis Sec. 4.5.4 / 5.6.1, Tables 4.8 and 5.5; the ten
probing tasks of Conneau et al. 2018, SentEval).

The model is frozen. Each sentence is encoded with the model's own pipeline (the recipe's
Moses tokenization and BPE / SentencePiece model from DATA/prep.env, then the model's
dictionary); its representation is the mean over its positions (every source token and the
end-of-sentence token the encoder always sees, padding excluded) of one encoder layer
(``--layer``: 0 = embeddings, L = top, -1 = top; the top layer is the encoder's output, and in
a pre-norm model every layer goes through the encoder's final LayerNorm as the top one does).
A two-layer MLP (SentEval's: Linear, dropout, sigmoid, Linear; L2 ``--l2`` on the hidden
layer, as the thesis) is trained on the task's ``tr`` split with RMSprop, early-stopped on
``va`` accuracy; the table gives the accuracy on ``te`` (``--split valid``: on ``va``).

Tasks come from two places:

- SentEval probing files (``--senteval DIR``, the ``data/probing`` directory of SentEval, or
  ``--task NAME=FILE``): ``partition <TAB> label <TAB> sentence`` per line, partition
  tr/va/te; every one of the ten files found in DIR is used;
- generated from any raw corpus (``--corpus FILE``, plain or .gz) by the rules SentEval's
  README gives, for the tasks that need only text:

  SentLen  the number of (Moses) tokens, binned 0: 5-8, 1: 9-12, 2: 13-16, 3: 17-20,
           4: 21-25, 5: 26-28 (other lengths left out);
  WC       1000 target words: the lower-cased corpus words of at least 4 characters taken
           in frequency-rank order from rank 2001 on (``--wc-rank-start``, ``--wc-words``);
           a sentence qualifies when it contains exactly one target word, exactly once;
           the label is the word;
  BShift   two adjacent tokens swapped (label I) or the sentence as is (label O), half
           each; never the first token or a punctuation token, never two equal tokens,
           and sentences with double quotes are left out.

  The other seven tasks need a constituency parser (TreeDepth, TopConst, Tense, SubjNum,
  ObjNum, CoordInv: depth, top constituents, the main verb's tense, the main clause's
  subject / object and its top-level coordination) or a language model and POS tagger
  (SOMO's frequency-matched noun/verb replacements); no rule on raw text reproduces them, so
  they are only read from SentEval's files. Generated tasks are balanced over their labels
  (every label cut to the rarest one's count, labels with fewer than ``--min-per-class``
  sentences dropped), split 10:1:1 per label (``--sizes``, SentEval: 100k/10k/10k), and
  written in SentEval's format to OUT/tasks/ so that they can be inspected and reused.

    python -m fairseq_ext.analysis.probing --checkpoint base/checkpoint_best.pt ms1/checkpoint_best.pt \\
        --names Transformer MS-1 --data data-bin/wmt14.en-de --senteval SentEval/data/probing --out analysis/probing
    python -m fairseq_ext.analysis.probing --checkpoint base/checkpoint_best.pt --data data-bin/multi30k.en-de \\
        --corpus /data/mt/multi30k/train.en.gz --wc-rank-start 500 --wc-words 300 --out analysis/probing

Writes probing.{md,csv,json} (category, task, labels, train/test sizes, the majority-label
accuracy, one column per model and layer; #AVG rows per category as the thesis' tables) and
probing.png (accuracy per task and model; per layer when several layers are probed; every
accuracy with its 95% Wilson score interval over the task's test sentences, whose number is
the table's "test" column).
"""
import os
import sys
from typing import Dict, List, Optional, Tuple

from fairseq_ext.analysis import AnalysisError, command
from fairseq_ext.analysis.encoder_features import pooled_features, primary_encoder, resolve_layer
from fairseq_ext.analysis.figures import (FigureContext, add_caption, add_title, legend_outside, names_for, pyplot,
                                         save_figure, system_colours, wilson_interval)
from fairseq_ext.analysis.probing_classifier import probe_task
from fairseq_ext.analysis.probing_tasks import CATEGORY, GENERATED, PARTITIONS, Split, load_tasks
from fairseq_ext.analysis.registry import Analysis
from fairseq_ext.analysis.table_files import write_table
from fairseq_ext.common import checkpoints
from fairseq_ext.common.data_text import TextPipeline

ANALYSIS = Analysis("probing", "Linguistic probing", "thesis Tables 4.8, 5.5", order=70)


def summary_rows(results: Dict[str, Dict[str, dict]], tasks: Dict[str, Split], columns: List[str],
                 report: str) -> List[dict]:
    """One row per task, grouped by category (thesis layout), each category of more than one
    task followed by its #AVG row."""
    task_rows = []
    for name, data in tasks.items():
        first = results[columns[0]][name]
        row = {"category": CATEGORY.get(name, "other"), "task": name, "labels": first["labels"],
               "train": len(data["tr"]), "test": len(data[report]), "majority": round(100 * first["majority"], 2)}
        for c in columns:
            row[c] = round(100 * results[c][name]["accuracy"], 2)
        task_rows.append(row)
    rows = []
    for cat in ("Surface", "Syntactic", "Semantic", "other"):
        sel = [r for r in task_rows if r["category"] == cat]
        rows += sel
        if len(sel) > 1 and cat != "other":
            avg = {"category": cat, "task": "#AVG", "labels": None, "train": None, "test": None,
                   "majority": round(sum(r["majority"] for r in sel) / len(sel), 2)}
            for c in columns:
                avg[c] = round(sum(r[c] for r in sel) / len(sel), 2)
            rows.append(avg)
    return rows


def accuracy_interval(accuracy: float, n: int) -> Tuple[float, float]:
    """The 95% Wilson score interval (%, low and high) of an accuracy (%) over ``n`` test
    sentences (the accuracy read back as a whole number of correct sentences)."""
    low, high = wilson_interval(round(accuracy * n / 100), n)
    return 100 * low, 100 * high


def error_bars(task_rows: List[dict], column: str) -> List[List[float]]:
    """matplotlib's yerr (below, above) of ``column``'s accuracies: their Wilson intervals."""
    spans = [accuracy_interval(r[column], r["test"]) for r in task_rows]
    return [[r[column] - lo for r, (lo, _) in zip(task_rows, spans)],
            [hi - r[column] for r, (_, hi) in zip(task_rows, spans)]]


def plot(rows: List[dict], columns: List[str], layer_columns: Dict[str, List[Tuple[int, str]]], path: str,
         context: Optional[FigureContext] = None):
    """Accuracy per task and model (bars in each model's colour, the majority label marked), or
    per layer, one panel per model, when several layers are probed; every accuracy with its 95%
    Wilson interval over the task's test sentences."""
    plt = pyplot()
    task_rows = [r for r in rows if r["task"] != "#AVG"]
    several_layers = any(len(v) > 1 for v in layer_columns.values())
    if several_layers:
        fig, axes = plt.subplots(1, len(layer_columns), figsize=(5 * len(layer_columns), 3.5), squeeze=False)
        for ax, (model, cols) in zip(axes[0], layer_columns.items()):
            for r in task_rows:
                acc = [r[c] for _, c in cols]
                spans = [accuracy_interval(a, r["test"]) for a in acc]
                ax.errorbar([l for l, _ in cols], acc, yerr=[[a - lo for a, (lo, _) in zip(acc, spans)],
                                                             [hi - a for a, (_, hi) in zip(acc, spans)]],
                            marker="o", capsize=3, label=f"{r['task']} (n = {r['test']})")
            ax.set_xlabel("encoder layer")
            ax.set_ylabel("probing accuracy (%)")
            ax.set_title(model)
        legend_outside(axes[0][-1], fontsize=7)
    else:
        fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(task_rows) * max(1, len(columns)) / 2 + 1.5), 3.8))
        colours = system_colours(columns)
        width = 0.8 / len(columns)
        for k, c in enumerate(columns):
            ax.bar([i + k * width for i in range(len(task_rows))], [r[c] for r in task_rows], width, label=c,
                   color=colours[c], yerr=error_bars(task_rows, c), capsize=2, error_kw={"linewidth": 0.8})
        ax.scatter([i + 0.4 - width / 2 for i in range(len(task_rows))], [r["majority"] for r in task_rows],
                   marker="_", s=300, color="black", label="majority label", zorder=3)
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(task_rows))],
                      [f"{r['task']}\n(n = {r['test']})" for r in task_rows])
        ax.set_ylabel("probing accuracy (%)")
        ax.set_ylim(0, 100)
        legend_outside(ax, fontsize=7)
    add_title(fig, "Probing accuracy of the frozen encoder per task")
    sizes = ", ".join(f"{r['task']} {r['test']}" for r in task_rows)
    add_caption(fig, "Accuracy (%) of an MLP on the mean-pooled encoder layer, on each task's test sentences "
                     f"(n: {sizes}). Error bars: 95% Wilson score intervals of each accuracy over its task's n "
                     "sentences. Black dash: the accuracy of always answering the majority label.",
                width=max(fig.get_figwidth(), 6.5))
    save_figure(fig, path, context)
    return fig


def build_parser():
    """This command's options (the report reads them to give it only what it takes)."""
    ap = command.parser(__doc__)
    g = ap.add_argument_group("tasks")
    g.add_argument("--senteval", help="SentEval's data/probing directory (any of its ten files)")
    g.add_argument("--task", nargs="+", help="NAME=FILE, a file in SentEval's format")
    g.add_argument("--corpus", help="raw text (one sentence a line, .gz allowed) to generate SentLen, WC, BShift from")
    g.add_argument("--corpus-tokenized", action="store_true", help="the corpus is Moses-tokenized already")
    g.add_argument("--corpus-lines", type=int, help="read only the first N lines of --corpus")
    g.add_argument("--generate", nargs="+", default=list(GENERATED), choices=list(GENERATED))
    g.add_argument("--sizes", nargs=3, type=int, default=[100000, 10000, 10000], metavar=("TRAIN", "VALID", "TEST"))
    g.add_argument("--wc-words", type=int, default=1000)
    g.add_argument("--wc-rank-start", type=int, default=2000)
    g.add_argument("--min-per-class", type=int, default=10)
    g.add_argument("--seed", type=int, default=1)
    g = ap.add_argument_group("representation and classifier")
    g.add_argument("--layer", type=int, nargs="+", default=[-1],
                   help="encoder layer(s): 0 = embeddings, L = top, negative from the top (default -1)")
    g.add_argument("--hidden", type=int, default=200, help="hidden units of the MLP (0: logistic regression)")
    g.add_argument("--dropout", type=float, default=0.0)
    g.add_argument("--l2", type=float, default=1e-4, help="L2 on the hidden layer (thesis: 1e-4)")
    g.add_argument("--lr", type=float, default=1e-3, help="RMSprop learning rate (thesis Ch. 4: 1e-3, Ch. 5: 2.5e-4)")
    g.add_argument("--batch-size", type=int, default=512, help="thesis Ch. 4: 512, Ch. 5: 64")
    g.add_argument("--max-epoch", type=int, default=100)
    g.add_argument("--patience", type=int, help="stop after N epochs without a better validation accuracy "
                   "(default: all --max-epoch epochs; the best validation epoch is kept either way)")
    return ap


def execute(args, figures: FigureContext):
    report = {"test": "te", "te": "te", "valid": "va", "va": "va"}.get(args.split)
    if report is None:
        raise AnalysisError(f"--split {args.split}: probing reports on the tasks' test (te) or valid (va) sentences")
    tasks = load_tasks(args, args.out)
    # its figures name the tasks, not the split of --data
    figures = FigureContext.of(args, "the probing tasks " + ", ".join(
        f"{t} ({len(d['tr']):,}/{len(d['va']):,}/{len(d['te']):,})" for t, d in tasks.items())
        + f", reported on their {'test' if report == 'te' else 'validation'} sentences ({report})")
    names = names_for(args.checkpoint, args.names)
    results: Dict[str, Dict[str, dict]] = {}
    layer_columns: Dict[str, List[Tuple[int, str]]] = {}
    train_args = dict(hidden=args.hidden, dropout=args.dropout, l2=args.l2, lr=args.lr, batch_size=args.batch_size,
                      max_epochs=args.max_epoch, patience=args.patience, seed=args.seed)
    for name, ckpt in zip(names, args.checkpoint):
        model, task = checkpoints.load_model(ckpt, args.data, cpu=args.cpu)
        encoder = primary_encoder(model)
        pipeline = TextPipeline(args.data, task.source_dictionary, encoder.max_positions())
        layers = sorted({resolve_layer(l, len(encoder.layers)) for l in args.layer})
        cols = [(l, name if len(layers) == 1 else f"{name} L{l}") for l in layers]
        layer_columns[name] = cols
        print(f"{name}: encoding with {pipeline.description}, layers {layers}", file=sys.stderr)
        for task_name, data in tasks.items():
            feats = {p: pooled_features(model, pipeline, [s for _, s in data[p]], layers) for p in PARTITIONS}
            for l, col in cols:
                res = probe_task({p: feats[p][l] for p in PARTITIONS}, data, report, **train_args)
                results.setdefault(col, {})[task_name] = res
                print(f"  {col} {task_name}: {100 * res['accuracy']:.2f} (valid {100 * res['valid']:.2f}, "
                      f"{res['epochs']} epochs)", file=sys.stderr)
    columns = [c for cols in layer_columns.values() for _, c in cols]
    rows = summary_rows(results, tasks, columns, report)
    write_table(rows, args.out, "probing", f"Probing accuracy (%) on {report}")
    plot(rows, columns, layer_columns, os.path.join(args.out, "probing.png"), figures)
    print(f"written: {args.out}/probing.{{md,csv,json,png}}" + (", tasks/" if args.corpus else ""))


def main(argv=None):
    return command.run(build_parser, execute, argv)


if __name__ == "__main__":
    sys.exit(main())
