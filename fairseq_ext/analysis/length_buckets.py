"""BLEU by source sentence length (thesis Sec. 3.5.1 / 4.5.1 / 5.6.4, Figs. 3.5-3.6; MLMHA
paper Sec. 7.1; MMA paper Sec. 5.2, Fig. 2): the test sentences grouped by the length of
their source in words (tokenized, before subwords) into buckets <10, 10-20, ..., 40-50,
>=50 (``--edges`` changes them), corpus BLEU per bucket and system (sacreBLEU, one flavour
for all), and how many sentences each bucket holds.

    python -m fairseq_ext.analysis.length_buckets --eval results/base-test results/m10-test --names base M-10 --out analysis/len
    python -m fairseq_ext.analysis.length_buckets --checkpoint base/checkpoint_best.pt m10/checkpoint_best.pt \\
        --data data-bin/wmt14.en-de --out analysis/len --generate-args "--beam 4 --lenpen 0.6"

``--eval`` reads evaluate.sh directories (src.tok, hyp.*, ref.*) of the same data and split;
``--checkpoint`` runs evaluate.sh first. Writes buckets.{md,csv,json} (bucket, sentences, BLEU of
each system) and buckets.png (BLEU per bucket and system, and the bucket histogram).
"""
import argparse
import os
import shlex
import sys
from typing import Dict, List, Sequence

from fairseq_ext.analysis import common

DEFAULT_EDGES = (10, 20, 30, 40, 50)


def bucket_names(edges: Sequence[int]) -> List[str]:
    names = [f"<{edges[0]}"] + [f"{a}-{b}" for a, b in zip(edges, edges[1:])] + [f">={edges[-1]}"]
    return names


def bucket_of(length: int, edges: Sequence[int]) -> int:
    for i, edge in enumerate(edges):
        if length < edge:
            return i
    return len(edges)


def bucket_bleu(sources: List[str], refs: List[str], systems: Dict[str, List[str]], flavour: str,
                edges: Sequence[int] = DEFAULT_EDGES) -> List[dict]:
    from fairseq_ext.tools.significance import bleu_metric

    groups: Dict[int, List[int]] = {}
    for i, src in enumerate(sources):
        groups.setdefault(bucket_of(len(src.split()), edges), []).append(i)
    rows = []
    for b, name in enumerate(bucket_names(edges)):
        idx = groups.get(b, [])
        row = {"bucket": name, "sentences": len(idx)}
        for system, hyps in systems.items():
            row[system] = (round(bleu_metric(flavour).corpus_score([hyps[i] for i in idx],
                                                                  [[refs[i] for i in idx]]).score, 2)
                           if idx else None)
        rows.append(row)
    return rows


def plot(rows: List[dict], systems: Sequence[str], flavour: str, path: str):
    plt = common.pyplot()
    fig, (ax, hist) = plt.subplots(2, 1, figsize=(7, 6), sharex=True, gridspec_kw={"height_ratios": [2, 1]})
    x = list(range(len(rows)))
    width = 0.8 / max(1, len(systems))
    for k, system in enumerate(systems):
        ax.bar([i + (k - (len(systems) - 1) / 2) * width for i in x], [r[system] or 0 for r in rows], width,
               label=system)
    ax.set_ylabel(f"BLEU ({flavour})")
    ax.legend()
    hist.bar(x, [r["sentences"] for r in rows], color="grey")
    hist.set_ylabel("sentences")
    hist.set_xticks(x, [r["bucket"] for r in rows])
    hist.set_xlabel("source length (words)")
    common.save_figure(fig, path)
    return fig


def main(argv=None):
    common.setup_cli()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--eval", nargs="+", help="evaluate.sh output directories")
    src.add_argument("--checkpoint", nargs="+")
    ap.add_argument("--names", nargs="+")
    ap.add_argument("--data")
    ap.add_argument("--split", default="test")
    ap.add_argument("--out", required=True)
    ap.add_argument("--cpu", action="store_true")
    ap.add_argument("--generate-args", default="")
    ap.add_argument("--flavour", help="BLEU flavour (default: the one evaluate.sh reported)")
    common.language_arguments(ap)
    ap.add_argument("--edges", default=",".join(map(str, DEFAULT_EDGES)), help="bucket edges (default 10,20,30,40,50)")
    args = ap.parse_args(argv)
    try:
        edges = [int(e) for e in args.edges.split(",")]
    except ValueError:
        raise common.AnalysisError(f"--edges: expected increasing integers such as 10,20,30, not {args.edges!r}")
    if edges != sorted(set(edges)):
        raise common.AnalysisError(f"--edges: expected increasing integers such as 10,20,30, not {args.edges!r}")
    if args.checkpoint:
        if not args.data:
            raise common.AnalysisError("--checkpoint needs --data")
        names = common.names_for(args.checkpoint, args.names)
        dirs = [common.evaluate(c, args.data, args.split, os.path.join(args.out, n), cpu=args.cpu,
                                generate_args=shlex.split(args.generate_args), src=args.src, tgt=args.tgt)["dir"]
                for n, c in zip(names, args.checkpoint)]
    else:
        names, dirs = common.names_for(args.eval, args.names), args.eval
        for d in dirs:
            if not os.path.exists(os.path.join(d, ".evaluation-complete")):
                raise common.AnalysisError(f"--eval {d}: not a complete evaluate.sh output")
    import json

    with open(os.path.join(dirs[0], "bleu.json"), encoding="utf-8") as f:
        flavour = args.flavour or json.load(f).get("headline", "detok-cased")
    level = "tok" if flavour.startswith("tok") else "detok"
    sources = common.read_lines(os.path.join(dirs[0], "src.tok"))
    refs = common.read_lines(os.path.join(dirs[0], f"ref.{level}"))
    systems = {}
    for name, d in zip(names, dirs):
        if common.read_lines(os.path.join(d, f"ref.{level}")) != refs:
            raise common.AnalysisError(f"{d} was scored against another reference than {dirs[0]}")
        systems[name] = common.read_lines(os.path.join(d, f"hyp.{level}"))
    rows = bucket_bleu(sources, refs, systems, flavour, edges)
    common.write_table(rows, args.out, "buckets", f"BLEU ({flavour}) by source length")
    plot(rows, names, flavour, os.path.join(args.out, "buckets.png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
