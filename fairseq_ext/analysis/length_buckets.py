"""BLEU by source sentence length (thesis Sec. 3.5.1 / 4.5.1 / 5.6.4, Figs. 3.5-3.6; MLMHA paper Sec. 7.1; MMA paper
Sec. 5.2, Fig. 2): the test sentences grouped by the length of their source into buckets <10, 10-20, ..., 40-50, >=50
(``--edges`` changes them), corpus BLEU per bucket and system (sacreBLEU, one flavour for all), and how many sentences
each bucket holds. The length counts subword tokens, as the thesis and the MLMHA paper bucket ("source subword tokens"):
the tokens of the binarized source the model read, without its end-of-sentence token (``--length-unit word``: the
whitespace-separated units of ``fairseq-ext evaluate``'s src.tok, the tokenized source with subwords merged). A bucket
a-b holds lengths a to b-1 and the last one lengths of 50 and more, as compare-mt's cut-offs, which the thesis used,
make them; the papers print the last one as ">50".

    python -m fairseq_ext.analysis.length_buckets --eval results/base-test results/m10-test --names base M-10 --out analysis/len
    python -m fairseq_ext.analysis.length_buckets --checkpoint base/checkpoint_best.pt m10/checkpoint_best.pt \\
        --data data-bin/wmt14.en-de --out analysis/len --generate-args "--beam 4 --lenpen 0.6"

``--eval`` reads fairseq-ext evaluate directories (src.tok, hyp.*, ref.*) of the same data and split; ``--checkpoint``
runs fairseq-ext evaluate first. Writes buckets.{md,csv,json} (bucket, sentences, BLEU of each system, a note on buckets
with fewer than ``--min-bucket-sentences``) and buckets.png (BLEU per bucket and system above, the sentences per bucket
below, every count written).

A bucket with fewer than ``--min-bucket-sentences`` sentences (default 30) is kept, so the
buckets stay the papers', but noted in the table and drawn hatched and pale: the corpus BLEU
of a few sentences says little. On Multi30k test_2016_flickr (German side, 12 words a
sentence), scoring a degraded copy of the reference (15% of its words dropped, 20% replaced
at random: 36.7 BLEU on all 1,000 sentences) on random n-sentence subsets gives a standard
deviation of 22 BLEU at n = 1, 7 at n = 10, 4 at n = 30 and 2 at n = 100: below 30 sentences
the sample alone moves a bucket's BLEU by more than the 1-2 points that separate the systems
the papers compare. An empty bucket is written "0 sentences" in the figure and has no BLEU
("–") in the table.
"""
import bisect
import glob
import json
import os
import shlex
import sys
from typing import Dict, List, Optional, Sequence

from fairseq_ext.analysis import AnalysisError, command
from fairseq_ext.analysis.decoding import evaluate
from fairseq_ext.analysis.figures import (FIGURE_WIDTH, FigureContext, add_caption, data_description, names_for,
                                          pyplot, save_figure, system_colours)
from fairseq_ext.analysis.registry import Analysis
from fairseq_ext.common import data_text
from fairseq_ext.standalone.evaluations import read_evaluation_complete
from fairseq_ext.tools.statistics import bleu_metric

ANALYSIS = Analysis("length_buckets", "BLEU by source length", "thesis 3.5.1 / 4.5.1 / 5.6.4, MLMHA 7.1, MMA 5.2",
                    order=10)
DEFAULT_EDGES = (10, 20, 30, 40, 50)
DEFAULT_MIN_SENTENCES = 30


def bucket_bleu(lengths: Sequence[int], refs: List[str], systems: Dict[str, List[str]], flavour: str,
                edges: Sequence[int] = DEFAULT_EDGES, min_sentences: int = DEFAULT_MIN_SENTENCES) -> List[dict]:
    """A row per bucket of ``lengths`` (<e_1, e_1-e_2, ..., >=e_k; a-b holds a to b-1): its
    sentences, each system's corpus BLEU (None when empty) and a note when empty or small."""
    taken = {"bucket", "sentences", "note"} & set(systems)
    if taken:
        raise AnalysisError(f"--names: {', '.join(sorted(taken))} names a column of the table; choose another")
    names = [f"<{edges[0]}"] + [f"{a}-{b}" for a, b in zip(edges, edges[1:])] + [f">={edges[-1]}"]
    groups: List[List[int]] = [[] for _ in names]
    for i, length in enumerate(lengths):
        groups[bisect.bisect_right(edges, length)].append(i)
    rows = []
    for name, idx in zip(names, groups):
        row = {"bucket": name, "sentences": len(idx)}
        for system, hyps in systems.items():
            row[system] = (round(bleu_metric(flavour).corpus_score([hyps[i] for i in idx],
                                                                  [[refs[i] for i in idx]]).score, 2)
                           if idx else None)
        row["note"] = "0 sentences" if not idx else f"fewer than {min_sentences} sentences" \
            if len(idx) < min_sentences else None
        rows.append(row)
    return rows


def subword_lengths(eval_dir: str, sentences: int) -> List[int]:
    """Each evaluated sentence's source length in subword tokens (without EOS), from the
    binarized source the evaluation translated (its .evaluation-complete and prep.env)."""
    from fairseq.data import data_utils

    done = read_evaluation_complete(eval_dir)
    data, split = done.get("data", ""), done.get("split", "")
    prep = data_text.read_prep_env(data) if data and os.path.isdir(data) else {}
    src, tgt = done.get("src") or prep.get("src", ""), done.get("tgt") or prep.get("tgt", "")
    if not src and data:  # fairseq's own rule: the one language pair binarized for the split
        pairs = {os.path.basename(p).split(".")[1] for p in glob.glob(os.path.join(data, f"{split}.*-*.*.idx"))}
        if len(pairs) == 1:
            src, tgt = pairs.pop().split("-", 1)
    prefix = os.path.join(data, f"{split}.{src}-{tgt}.{src}")
    if not (data and src and tgt and os.path.exists(prefix + ".idx")):
        raise AnalysisError(f"--length-unit subword needs the binarized source the evaluation {eval_dir} translated "
                            f"({prefix or '?'}.idx, from its data={data or '?'}): not found; give --length-unit word "
                            "to count the merged words of its src.tok")
    dataset = data_utils.load_indexed_dataset(prefix, None)
    lengths = [int(size) - 1 for size in dataset.sizes]  # copied while the dataset keeps its memory map open
    if len(lengths) != sentences:
        raise AnalysisError(f"{prefix} holds {len(lengths)} sentences, the evaluation {eval_dir} {sentences}: not "
                            "the data it translated; give --length-unit word")
    return lengths


def length_unit(eval_dir: str) -> str:
    """What src.tok's units are, from the ``--remove-bpe`` of DIR/generate-SPLIT.cmd."""
    for path in sorted(glob.glob(os.path.join(eval_dir, "generate-*.cmd"))):
        with open(path, encoding="utf-8") as f:
            words = shlex.split(f.read())
        if "--remove-bpe" in words:
            after = words[words.index("--remove-bpe") + 1:][:1]
            return "words, SentencePiece merged" if after == ["sentencepiece"] else "tokens, BPE merged"
        return "tokens"
    return "tokens"


def plot(rows: List[dict], systems: Sequence[str], flavour: str, path: str, min_sentences: int = DEFAULT_MIN_SENTENCES,
         unit: str = "tokens", data: str = "", context: Optional[FigureContext] = None):
    """BLEU per bucket and system (small buckets hatched and pale), and below the sentences per bucket."""
    from matplotlib.patches import Patch

    fig, (ax, hist) = pyplot().subplots(2, 1, figsize=(FIGURE_WIDTH, 6.4), sharex=True,
                                   gridspec_kw={"height_ratios": [2.2, 1]})
    x = list(range(len(rows)))
    width = 0.8 / max(1, len(systems))
    small = [0 < r["sentences"] < min_sentences for r in rows]
    colours = system_colours(systems)  # each model's colour in every figure of the report
    label_size = 8 if len(systems) * len(rows) <= 24 else 6.5
    for k, system in enumerate(systems):
        colour = colours[system]
        bars = ax.bar([i + (k - (len(systems) - 1) / 2) * width for i in x], [r[system] or 0 for r in rows],
                      width, label=system, color=colour, edgecolor=colour)
        for bar, pale, r in zip(bars, small, rows):
            if r[system] is None:
                bar.set_linewidth(0)
            if pale:
                bar.set(facecolor=(*bar.get_facecolor()[:3], 0.25), hatch="///")
        # upright labels would overlap beside more than three bars a bucket
        ax.bar_label(bars, ["" if r[system] is None else f"{r[system]:.1f}" for r in rows], fontsize=label_size,
                     padding=1.5, rotation=90 if len(systems) > 3 else 0)
    top = max([r[s] for r in rows for s in systems if r[s] is not None] or [1.0])
    ax.set_ylim(0, top * (1.25 if len(systems) > 3 else 1.15))
    for i, r in enumerate(rows):
        if r["sentences"] == 0:
            ax.text(i, top * 0.04, "0 sentences", ha="center", va="bottom", color="grey", fontsize=8)
    ax.set_ylabel(f"BLEU ({flavour})")
    handles, _ = ax.get_legend_handles_labels()
    if any(small):
        handles.append(Patch(facecolor="white", edgecolor="grey", hatch="///",
                             label=f"fewer than {min_sentences} sentences"))
    ax.legend(handles=handles, fontsize=8, loc="best")
    ax.set_title(f"BLEU ({flavour}) by source length" + (f": {data}" if data else ""), fontsize=10)
    counts = hist.bar(x, [r["sentences"] for r in rows], color="grey")
    for bar, pale in zip(counts, small):
        if pale:
            bar.set(facecolor=(0.5, 0.5, 0.5, 0.25), edgecolor="grey", hatch="///")
    hist.bar_label(counts, [str(r["sentences"]) for r in rows], fontsize=8, padding=1.5)
    hist.set(ylim=(0, max(r["sentences"] for r in rows) * 1.25 + 1), ylabel="sentences",
             xlabel=f"source length ({unit})")
    hist.set_xticks(x, [r["bucket"] for r in rows])
    counted = ("the subword tokens of the binarized source the models read, without end of sentence"
               if unit == "subword tokens" else
               f"the whitespace-separated units of the evaluated source (src.tok: {unit})")
    add_caption(fig, f"Corpus BLEU (sacreBLEU, {flavour}) of the sentences of each source-length bucket, per system "
                     f"({', '.join(systems)}); below, the sentences in each bucket. Source length counts {counted}; "
                     f"a-b holds a to b-1. Hatched, pale: buckets with fewer than {min_sentences} sentences "
                     "(--min-bucket-sentences), too few for their BLEU to be compared.")
    return save_figure(fig, path, context)


def build_parser():
    ap = command.doc_parser(__doc__)
    systems = ap.add_mutually_exclusive_group(required=True)
    systems.add_argument("--eval", nargs="+", help="fairseq-ext evaluate output directories")
    command.common_arguments(ap, checkpoint_group=systems, overrides={
        "--checkpoint": dict(required=False, help="checkpoints to evaluate first"),
        "--data": dict(required=False, help="binarized data directory of --checkpoint")})
    command.evaluation_arguments(ap, significance=False)
    ap.add_argument("--edges", default=",".join(map(str, DEFAULT_EDGES)), help="bucket edges (default 10,20,30,40,50)")
    ap.add_argument("--length-unit", choices=("subword", "word"), default="subword",
                    help="count the source in subword tokens as the papers do (default; from the binarized data) "
                         "or in words (src.tok, subwords merged)")
    ap.add_argument("--min-bucket-sentences", type=int, default=DEFAULT_MIN_SENTENCES, metavar="N",
                    help="a bucket with fewer sentences is noted in the table and drawn hatched and pale "
                         f"(default {DEFAULT_MIN_SENTENCES}: below it the sample alone moves a bucket's BLEU by "
                         "more than 4 points)")
    return ap


def evaluated(args):
    """(names, evaluation directories): --eval, or --checkpoint evaluated first into OUT/NAME."""
    if args.checkpoint:
        if not args.data:
            raise AnalysisError("--checkpoint needs --data")
        names = names_for(args.checkpoint, args.names)
        return names, [evaluate(c, args.data, args.split, os.path.join(args.out, n), cpu=args.cpu,
                                generate_args=shlex.split(args.generate_args), src=args.src, tgt=args.tgt)["dir"]
                       for n, c in zip(names, args.checkpoint)]
    for d in args.eval:
        if not os.path.exists(os.path.join(d, ".evaluation-complete")):
            raise AnalysisError(f"--eval {d}: not a complete fairseq-ext evaluate output")
    return names_for(args.eval, args.names), args.eval


def execute(args, figures: FigureContext):
    if args.min_bucket_sentences < 1:
        raise AnalysisError(f"--min-bucket-sentences: expected 1 or more, not {args.min_bucket_sentences}")
    try:
        edges = [int(e) for e in args.edges.split(",")]
    except ValueError:
        edges = None
    if edges is None or edges != sorted(set(edges)):
        raise AnalysisError(f"--edges: expected increasing integers such as 10,20,30, not {args.edges!r}")
    names, dirs = evaluated(args)
    with open(os.path.join(dirs[0], "bleu.json"), encoding="utf-8") as f:
        flavour = args.flavour or json.load(f).get("headline", "detok-cased")
    level = "tok" if flavour.startswith("tok") else "detok"
    sources = data_text.read_lines(os.path.join(dirs[0], "src.tok"))
    refs = data_text.read_lines(os.path.join(dirs[0], f"ref.{level}"))
    systems = {}
    for name, d in zip(names, dirs):
        if data_text.read_lines(os.path.join(d, f"ref.{level}")) != refs:
            raise AnalysisError(f"{d} was scored against another reference than {dirs[0]}")
        systems[name] = data_text.read_lines(os.path.join(d, f"hyp.{level}"))
    done = read_evaluation_complete(dirs[0])
    data = data_description(done.get("data") or args.data, done.get("split") or args.split)
    if args.length_unit == "subword":
        lengths, unit = subword_lengths(dirs[0], len(sources)), "subword tokens"
    else:
        lengths, unit = [len(src.split()) for src in sources], length_unit(dirs[0])
    rows = bucket_bleu(lengths, refs, systems, flavour, edges, args.min_bucket_sentences)
    command.write_table(rows, args.out, "buckets", f"BLEU ({flavour}) by source length ({unit}): {data}")
    plot(rows, names, flavour, os.path.join(args.out, "buckets.png"), args.min_bucket_sentences, unit, data, figures)


main = command.main(build_parser, execute)

if __name__ == "__main__":
    sys.exit(main())
