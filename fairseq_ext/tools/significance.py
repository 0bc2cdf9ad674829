"""Significance of BLEU differences with sacreBLEU's own paired tests, in the BLEU flavours
the papers report, and the papers' significance marks.

The mark qualifying a BLEU score comes from the same scorer and flavour as that score:
sacreBLEU's paired bootstrap resampling (Koehn 2004; ``sacrebleu --paired-bs``, 1000
samples, what the papers ran through compare-mt) or approximate randomization
(``--paired-ar``). compare-mt stays for its analyses (``fairseq-ext significance``, :mod:`fairseq_ext.tools.compare`).

    python -m fairseq_ext.tools.significance --ref REF --baseline HYP_A --system B=HYP_B [--system C=HYP_C] \\
        [--flavour detok-cased] [--method bs|ar] [--samples 1000] [--seed 12345] [--marks thesis] [--json OUT]
"""
import json
import sys
from typing import Dict, List, Sequence

from fairseq_ext.common.command_line import CommandParser
from fairseq_ext.common.data_text import read_lines
from fairseq_ext.errors import DataError, OptionError
from fairseq_ext.standalone.bleu import metric as more_metric
from fairseq_ext.tools import statistics
from fairseq_ext.tools.statistics import FLAVOURS, MARKS


def paired_significance(refs: Sequence[str], baseline: Sequence[str], systems: Dict[str, Sequence[str]], *,
                        flavour: str = "detok-cased", method: str = "bs", n_samples: int = 1000,
                        seed: int = 12345, marks: str = "thesis", metrics: Sequence[str] = ("BLEU",)) -> dict:
    """sacreBLEU's paired test (:func:`~fairseq_ext.tools.statistics.paired_bs`, ``paired_ar``) of each system against
    the baseline: {"baseline": {...}, name: {...}}, each with ``bleu``, ``mean`` and ``ci`` (bootstrap mean and 95%
    half-width; for ``ar`` from 1000 resamples), ``p_value`` (None for the baseline), ``mark`` and ``signature``.
    ``metrics`` beyond BLEU (``chrF2``, ``chrF2++``, ``TER``) are tested on the same resamples, under ``metrics``."""
    if n_samples < 1:  # sacreBLEU would draw no sample and report p = 1 with a bs:1000 signature
        raise OptionError(f"--samples must be at least 1, not {n_samples}")
    if method not in ("bs", "ar"):
        raise OptionError(f"--method: {method!r} is not bs (paired bootstrap) or ar (approximate randomization)")
    statistics.mark(None, marks)  # refuses unknown marks
    n = len(refs)
    for name, hyps in [("baseline", baseline), *systems.items()]:
        if len(hyps) != n:
            raise ValueError(f"{name} has {len(hyps)} lines but the reference has {n}")
    if "baseline" in systems:
        raise ValueError("a system may not be called 'baseline'")
    scorers = {"BLEU": statistics.bleu_metric(flavour)}
    scorers.update({name: more_metric(name, flavour.endswith("-lc")) for name in metrics if name != "BLEU"})
    confidence = 1000 if method == "ar" else n_samples  # sacreBLEU's CI of an ar test: 1000 resamples
    per_metric = {}
    for metric_name, metric in scorers.items():
        score = statistics.scorer(metric)
        base = statistics.sentence_stats(refs, baseline, metric)
        found = {"baseline": {"score": float(score(base.sum(0)[None])[0]),
                              **statistics.bootstrap_ci(base, score, confidence, seed)}}
        for name, hyps in systems.items():
            stats = statistics.sentence_stats(refs, hyps, metric)
            found[name] = (statistics.paired_bs(base, stats, score, n_samples, seed) if method == "bs" else
                           statistics.paired_ar(base, stats, score, n_samples, seed, confidence))
        signature = metric.get_signature()
        signature.update("seed", str(seed).lower())
        signature.update(method, n_samples)
        if method == "ar":
            signature.update("bs", confidence)
        per_metric[metric_name] = _tested(found, str(signature), marks)
    out = {}
    for name, bleu in per_metric["BLEU"].items():
        out[name] = {"bleu": bleu["score"], **{k: v for k, v in bleu.items() if k != "score"}}
        if len(scorers) > 1:
            out[name]["metrics"] = {metric: per_metric[metric][name] for metric in scorers if metric != "BLEU"}
    return out


def _tested(found: Dict[str, dict], signature: str, marks: str) -> Dict[str, dict]:
    """One metric's results by system: score, mean, ci, p_value, mark, signature."""
    out, base_score = {}, found["baseline"]["score"]
    for name, result in found.items():
        p = result.get("p_value")
        if name != "baseline" and result["score"] == base_score:
            # sacreBLEU counts only sample differences *above* the observed one, so identical
            # output would get the smallest p-value, 1/(n+1): no difference is never significant here
            p = 1.0
        out[name] = {"score": round(float(result["score"]), 2), "mean": _opt(result.get("mean")),
                     "ci": _opt(result.get("ci")), "p_value": None if p is None else round(float(p), 4),
                     "mark": statistics.mark(p, marks), "signature": signature}
    return out


def table_lines(result: dict, *, method: str, n_samples: int, flavour: str,
                baseline_name: str = "baseline") -> List[str]:
    """paired_significance's result as the printed table (significance.txt): BLEU, then a block
    for each other metric tested (TER: lower is better)."""
    title = "paired bootstrap" if method == "bs" else "approximate randomization"
    blocks = [("BLEU", {name: {**r, "score": r["bleu"]} for name, r in result.items()})]
    for metric in next(iter(result.values())).get("metrics", {}):
        blocks.append((metric, {name: r["metrics"][metric] for name, r in result.items()}))
    lines = []
    for metric, rows in blocks:
        better = " (lower is better)" if metric == "TER" else ""
        lines += ([""] if lines else []) + [
            f"sacreBLEU {title}, {n_samples} samples, {metric} {flavour}{better}, p against {baseline_name}",
            f"{'system':<20} {metric:>6} {'mean ± 95% CI':>16} {'p':>8}  mark"]
        for name, r in rows.items():
            ci = f"{r['mean']} ± {r['ci']}" if r["mean"] is not None else ""
            p = "" if r["p_value"] is None else f"{r['p_value']:.4f}"
            shown = baseline_name if name == "baseline" else name
            lines.append(f"{shown:<20} {r['score']:>6.2f} {ci:>16} {p:>8}  {r['mark']}")
        lines.append(f"signature: {next(iter(rows.values()))['signature']}")
    return lines


def _opt(value):
    return None if value is None else round(float(value), 2)


def main(argv=None):
    ap = CommandParser(prog="python -m fairseq_ext.tools.significance", description=__doc__.split("\n\n")[0],
                       epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--ref", required=True)
    ap.add_argument("--baseline", required=True, help="the baseline system's output")
    ap.add_argument("--baseline-name", default="baseline", help="its name in the printed table")
    ap.add_argument("--system", action="append", required=True, metavar="NAME=FILE")
    ap.add_argument("--flavour", default="detok-cased", choices=sorted(FLAVOURS))
    ap.add_argument("--method", default="bs", choices=["bs", "ar"])
    ap.add_argument("--samples", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=12345)
    ap.add_argument("--marks", default="thesis", choices=sorted(MARKS))
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    refs, baseline = read_lines(args.ref), read_lines(args.baseline)
    systems, read = {}, [(f"--ref {args.ref}", refs), (f"--baseline {args.baseline}", baseline)]
    for spec in args.system:
        name, sep, path = spec.partition("=")
        if not sep:
            ap.error(f"--system: expected NAME=FILE, not {spec!r}")
        systems[name] = read_lines(path)
        read.append((f"--system {spec}", systems[name]))
    if len({len(lines) for _, lines in read}) > 1 or not refs:
        raise DataError("the files must have as many lines as the reference, at least one: "
                        + ", ".join(f"{option} has {len(lines)}" for option, lines in read))
    result = paired_significance(refs, baseline, systems, flavour=args.flavour,
                                 method=args.method, n_samples=args.samples, seed=args.seed, marks=args.marks)
    for line in table_lines(result, method=args.method, n_samples=args.samples, flavour=args.flavour,
                            baseline_name=args.baseline_name):
        print(line)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1, ensure_ascii=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
