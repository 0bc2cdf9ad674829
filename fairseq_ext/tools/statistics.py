"""Every statistic of the commands and tables, computed from per-sentence sufficient statistics
(:func:`sentence_stats`, computed once; a resample or a shuffle only sums rows of them, as
sacreBLEU's ``sacrebleu/significance.py`` does), and the papers' significance marks (:func:`mark`).

sacreBLEU's paired bootstrap (Koehn 2004) and approximate randomization with its random draws
(:func:`paired_bs`, :func:`paired_ar`); compare-mt 0.2.10's paired bootstrap, which the thesis
ran (:func:`subsample_bootstrap`); MultEval's stratified approximate randomization over runs
(Riezler & Maxwell 2005; Clark et al. 2011; :func:`stratified_ar`) and s_sel; Holm, the paired
t-test and the intersection-union mark over seeds (:func:`across_seeds`).
"""
import math
import statistics
import warnings
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from fairseq_ext.errors import FairseqExtError

# BLEU flavours: name -> sacreBLEU settings. detok: detokenized text, 13a tokenization; tok:
# Moses-tokenized text scored as is (multi-bleu.perl style); lc: lower-cased
FLAVOURS = {f"{level}-{case}": {"tokenize": "13a" if level == "detok" else "none", "lowercase": case == "lc",
                                "force": level == "tok"} for level in ("detok", "tok") for case in ("cased", "lc")}

# The papers' marks, strongest first: (p below, mark); the word-translation paper (Table 6)
# reverses † and ‡
MARKS = {"thesis": ((0.01, "‡"), (0.05, "†")), "mlmha": ((0.01, "‡"), (0.05, "†")),
         "mma": ((0.01, "††"), (0.05, "†")), "wt": ((0.01, "†"), (0.05, "‡"))}

ORDER = 4  # BLEU's n-gram orders
ROW = ("hyp_len", "ref_len", *(f"correct[{o}]" for o in range(ORDER)), *(f"total[{o}]" for o in range(ORDER)))
BLOCK = 4_000_000  # random doubles drawn at once (32 MB): the shuffles go in blocks of this size
STATISTICS = ("concatenated", "mean")
Score = Callable[[np.ndarray], np.ndarray]  # summed statistics (k, d) -> k scores


class StatisticsError(FairseqExtError, ValueError):
    """Statistics a test cannot use (no run of both systems, runs of other sentences, a NaN); the message names the run."""


def mark(p_value: Optional[float], marks: str = "thesis") -> str:
    """The paper's mark of ``p_value`` in the convention ``marks`` (see MARKS); "" for None."""
    if marks not in MARKS:
        raise ValueError(f"--marks: {marks!r} is not one of {', '.join(MARKS)}")
    return "" if p_value is None else next((m for bound, m in MARKS[marks] if p_value < bound), "")


def bleu_metric(flavour: str):
    from sacrebleu.metrics import BLEU

    if flavour not in FLAVOURS:
        raise ValueError(f"--flavour: {flavour!r} is not one of {', '.join(FLAVOURS)}")
    return BLEU(**FLAVOURS[flavour])


def sentence_stats(refs: Sequence[str], hyps: Sequence[str], flavour) -> np.ndarray:
    """The sufficient statistics of every sentence: an array of n rows. ``flavour``: a key of
    FLAVOURS (BLEU: 2 + 2 * 4 numbers a row), or a sacreBLEU metric (chrF, TER: its own)."""
    if len(refs) != len(hyps):
        raise ValueError(f"{len(hyps)} hypotheses for {len(refs)} references")
    metric = bleu_metric(flavour) if isinstance(flavour, str) else flavour
    return np.asarray(metric._extract_corpus_statistics(list(hyps), [list(refs)]), dtype=np.float64)


def corpus_bleu(sums: np.ndarray) -> np.ndarray:
    """sacreBLEU's corpus BLEU (exp smoothing, 4-grams) of summed statistics ``sums`` (..., 10), for every leading index
    at once: the brevity penalty times the geometric mean of the precisions, a precision with no match replaced by 100 /
    (2^k total) for its k-th such order, 0 when nothing matches or an order has no n-gram.

    The arithmetic is sacreBLEU's, to the last bit: the precisions in the type of ``sums`` (float32 in sacreBLEU's
    bootstrap resamples, else float64), then ``math.log`` and ``math.exp`` in float64 (numpy's vectorised exp and log
    differ from them in the last bit)."""
    sums = np.asarray(sums)
    kind = np.float32 if sums.dtype == np.float32 else np.float64
    sums = sums.astype(kind, copy=False)
    correct, total = sums[..., 2:2 + ORDER], sums[..., 2 + ORDER:2 + 2 * ORDER]
    with np.errstate(divide="ignore", invalid="ignore"):
        halvings = np.cumsum(correct == 0, axis=-1)
        precision = np.where(correct == 0, kind(100.0) / (np.exp2(halvings).astype(kind) * total),
                             kind(100.0) * correct / total)
    dead = ~correct.any(axis=-1) | (total == 0).any(axis=-1)
    rows = zip(sums[..., 0].ravel().tolist(), sums[..., 1].ravel().tolist(),
               precision.reshape(-1, ORDER).tolist(), dead.ravel().tolist())
    scores = [0.0 if no else _brevity(int(hyp), int(ref)) * math.exp(sum(math.log(p) for p in ps) / ORDER)
              for hyp, ref, ps, no in rows]
    return np.asarray(scores, dtype=np.float64).reshape(sums.shape[:-1])


def _brevity(hyp_len: int, ref_len: int) -> float:
    return 1.0 if hyp_len >= ref_len else math.exp(1 - ref_len / hyp_len) if hyp_len > 0 else 0.0


def scorer(metric) -> Score:
    """The score of summed statistics for a sacreBLEU metric: :func:`corpus_bleu` for the BLEU of
    FLAVOURS, the metric's own ``_compute_score_from_stats`` row by row for any other."""
    if type(metric).__name__ == "BLEU" and metric.smooth_method == "exp" and not metric.effective_order:
        return corpus_bleu
    return lambda sums: np.array([metric._compute_score_from_stats(row).score for row in sums])


def _confidence(scores: np.ndarray) -> Tuple[float, float]:
    """sacreBLEU's ``estimate_ci``: the mean of resampled scores and the half-width of their
    central 95% (the n // 40-th from each end of the sorted scores)."""
    scores = np.sort(scores)
    low = len(scores) // 40
    return scores.mean(), 0.5 * (scores[len(scores) - low - 1] - scores[low])


def _resampled(stats: np.ndarray, idxs: np.ndarray, score: Score) -> np.ndarray:
    """The score of each resample (a row of ``idxs``), summed in float32 as sacreBLEU sums them."""
    stats = np.asarray(stats, dtype=np.float32)
    return score(np.stack([stats[ids].sum(0) for ids in idxs]))


def _draw(n: int, samples: int, seed: Optional[int]) -> np.ndarray:
    return np.random.default_rng(seed).choice(n, size=(samples, n), replace=True)


def bootstrap_ci(stats: np.ndarray, score: Score = corpus_bleu, samples: int = 1000,
                 seed: Optional[int] = 12345) -> dict:
    """sacreBLEU's confidence of one system (its baseline's ``mean`` and ``ci``): ``samples``
    resamples of the n sentences with replacement."""
    return dict(zip(("mean", "ci"), _confidence(_resampled(stats, _draw(len(stats), samples, seed), score))))


def _p_value(samples: np.ndarray, observed: float) -> float:
    # MultEval's: only samples strictly above the observed statistic count
    return (np.sum(samples > observed).item() + 1) / (len(samples) + 1)


def _total(stats: np.ndarray, score: Score) -> float:
    return float(score(np.asarray(stats).sum(0)[None])[0])


def paired_bs(baseline: np.ndarray, system: np.ndarray, score: Score = corpus_bleu, samples: int = 1000,
              seed: Optional[int] = 12345) -> dict:
    """sacreBLEU's paired bootstrap (``--paired-bs``) of ``system`` against ``baseline`` (:func:`sentence_stats` of
    each): ``samples`` resamples of the n sentences, the same for both (``default_rng(seed).choice(n, (samples, n))``).
    With d_i the |score difference| of resample i and d the observed one, p = (#{i: d_i - mean(d) > d} + 1) / (samples +
    1). Returns ``score``, ``p_value`` and the system's bootstrap ``mean`` and 95% ``ci``."""
    idxs = _draw(len(baseline), samples, seed)
    scores_base, scores_sys = _resampled(baseline, idxs, score), _resampled(system, idxs, score)
    system_score = _total(system, score)
    diffs = np.abs(scores_sys - scores_base)
    mean, ci = _confidence(scores_sys)
    observed = abs(_total(baseline, score) - system_score)
    return {"score": system_score, "p_value": _p_value(diffs - diffs.mean(), observed), "mean": mean, "ci": ci}


def paired_ar(baseline: np.ndarray, system: np.ndarray, score: Score = corpus_bleu, samples: int = 10000,
              seed: Optional[int] = 12345, confidence: int = 1000) -> dict:
    """sacreBLEU's approximate randomization (``--paired-ar``): each of ``samples`` trials swaps
    every sentence between the two systems with probability 0.5
    (``default_rng(seed).integers(2, size=(samples, n), dtype=bool)``), and p = (#{trials whose
    |score difference| > the observed one} + 1) / (samples + 1), two-sided. The system's
    ``mean`` and ``ci`` come from ``confidence`` bootstrap resamples drawn next from the same
    generator (none for 0)."""
    rng = np.random.default_rng(seed)
    keep = rng.integers(2, size=(samples, len(baseline)), dtype=bool)
    shuffled_a = keep @ baseline + ~keep @ system
    shuffled_b = ~keep @ baseline + keep @ system
    system_score = _total(system, score)
    out = {"score": system_score, "p_value": _p_value(np.abs(score(shuffled_a) - score(shuffled_b)),
                                                      abs(_total(baseline, score) - system_score))}
    if confidence > 0:
        idxs = rng.choice(len(system), size=(confidence, len(system)), replace=True)
        out["mean"], out["ci"] = _confidence(_resampled(system, idxs, score))
    return out


def _paired(reference: Dict[int, np.ndarray], system: Dict[int, np.ndarray]) -> List[int]:
    """The runs of both systems (by seed), with finite statistics of the same sentences; else an error naming the run."""
    runs = sorted(set(reference) & set(system))
    if not runs:
        raise StatisticsError("no run of both systems (runs are paired by their seed)")
    first = np.shape(reference[runs[0]])
    for k in runs:
        for who, stats in (("reference", reference[k]), ("system", system[k])):
            stats = np.asarray(stats, dtype=np.float64)
            if stats.ndim != 2 or not len(stats):
                raise StatisticsError(f"run {k} of the {who} has no sentence statistics (shape {stats.shape})")
            if stats.shape != first:
                raise StatisticsError(f"run {k} of the {who} and run {runs[0]} of the reference differ in shape "
                                      f"({stats.shape} and {first}): every run must score the same sentences")
            for i, j in np.argwhere(~np.isfinite(stats))[:1]:
                raise StatisticsError(f"run {k} of the {who}: the statistic {ROW[j] if j < len(ROW) else j} of "
                                      f"sentence {i + 1} is {stats[i, j]}, not a count")
    return runs


def stratified_ar(reference: Dict[int, np.ndarray], system: Dict[int, np.ndarray], shuffles: int = 10000,
                  seed: int = 12345, statistic: str = "concatenated") -> dict:
    """Stratified approximate randomization of ``system`` (B) against ``reference`` (A) over the K runs both have
    (run -> :func:`sentence_stats`), as MultEval implements it (``StratifiedApproximateRandomizationTest``; the
    test, ``statistic="mean"`` and where it differs: docs/reproduction.md, "The stratified approximate randomization
    over seeds"). Shuffle by shuffle, ``default_rng(seed)`` draws K x n doubles (run, sentence; below 0.5: swap)
    and, with K > 1, K x n more: sentence i's permutation takes run r to the rank of its double among the K
    doubles of sentence i (0 = the smallest; :func:`_shuffled`'s perm).
    ``count``: the shuffles whose |Δ| exceeds the observed one by over 1e-9 (MultEval's strict rule); all if Δ = 0."""
    if shuffles < 1:
        raise ValueError(f"--shuffles must be at least 1, not {shuffles}")
    if statistic not in STATISTICS:
        raise ValueError(f"statistic must be one of {', '.join(STATISTICS)}, not {statistic!r}")
    runs = _paired(reference, system)
    # A's and B's statistics, 2 x K x n x 10
    ref, sys_ = both = np.stack([[np.asarray(d[k], dtype=np.float64) for k in runs] for d in (reference, system)])
    (ref_bleu, sys_bleu), (ref_all, sys_all) = corpus_bleu(both.sum(2)), corpus_bleu(both.sum((1, 2))).tolist()
    score = (lambda s: corpus_bleu(s.sum(1))) if statistic == "concatenated" else lambda s: corpus_bleu(s).mean(1)
    observed = float(np.diff(score(both.sum(2)))[0])  # B - A
    rng, (n_runs, n), count, done = np.random.default_rng(seed), ref.shape[:2], 0, 0
    block = max(1, BLOCK // (2 * n_runs * n))  # shuffles drawn at once
    while done < shuffles:
        draws = rng.random((min(block, shuffles - done), n_runs * (1 + (n_runs > 1)), n))
        keys = draws[:, -n_runs:]  # one run: its swaps' doubles, rank 0
        x, y = _shuffled(ref, sys_, draws[:, :n_runs] < 0.5, (keys[:, :, None] > keys[:, None]).sum(2))
        count += int(np.sum(np.abs(score(y) - score(x)) > abs(observed) + 1e-9))  # a tie in floats is no more
        done += len(draws)
    count = count if abs(observed) > 1e-9 else shuffles  # no difference is never significant
    sd_ref, sd_sys = (float(np.std(b, ddof=1)) if len(runs) > 1 else None for b in (ref_bleu, sys_bleu))
    return {"test": "ar", "statistic": statistic, "runs": runs, "shuffles": shuffles, "seed": seed,
            "reference_bleu": dict(zip(runs, ref_bleu.tolist())), "system_bleu": dict(zip(runs, sys_bleu.tolist())),
            "reference_mean": float(ref_bleu.mean()), "system_mean": float(sys_bleu.mean()),
            "reference_concatenated": ref_all, "system_concatenated": sys_all, "s_dev_reference": sd_ref,
            "s_dev_system": sd_sys, "delta": observed, "count": count, "p_value": (count + 1) / (shuffles + 1)}


def _shuffled(ref: np.ndarray, sys_: np.ndarray, swap: np.ndarray, perm: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """MultEval's X and Y (``Shuffling.at``) of A = ``ref``, B = ``sys_`` (runs x n x 10), per run: R x runs x 10.
    ``swap``, ``perm``: R x runs x n; X's run r takes sentence i from run perm[., r, i] (optRunPermutation), of B
    where swap[., r, i], else of A; Y's from the inverse permutation's run, of A where swap, else of B."""
    inv, both = np.empty_like(perm), np.concatenate([ref, sys_])  # run k of B is both[K + k]
    np.put_along_axis(inv, perm, np.arange(len(ref))[:, None], 1)
    return tuple(sum((c == k) @ both[k] for k in range(len(both)))
                 for c in (perm + len(ref) * swap, inv + len(ref) * ~swap))


def subsample_bootstrap(reference: np.ndarray, system: np.ndarray, samples: int = 1000, ratio: float = 0.5,
                        seed: int = 12345) -> dict:
    """compare-mt's paired bootstrap of one run of each system, as the thesis ran it: ``samples``
    subsamples of ``int(ratio * n)`` sentence indices drawn with replacement
    (``default_rng(seed).integers(0, n, size)``, one subsample after another), and p = 1 - γ, γ
    the share of subsamples in which the more often winning system is strictly better (one-sided).
    ``better``: the system on a tie of shares; ``better_in``: γ, compare-mt's "better in γ of samples"."""
    if samples < 1:
        raise ValueError(f"--samples must be at least 1, not {samples}")
    reference, system = np.asarray(reference, dtype=np.float64), np.asarray(system, dtype=np.float64)
    _paired({0: reference}, {0: system})
    n, rng = len(reference), np.random.default_rng(seed)
    idxs = [rng.integers(0, n, max(1, int(n * ratio))) for _ in range(samples)]
    a, b = (corpus_bleu(np.stack([stats[ids].sum(0) for ids in idxs])) for stats in (reference, system))
    wins_sys, wins_ref = int(np.sum(b > a)), int(np.sum(a > b))
    better = "system" if wins_sys >= wins_ref else "reference"
    share = max(wins_sys, wins_ref) / samples
    return {"test": "thesis", "samples": samples, "ratio": ratio, "seed": seed,
            "system_wins": wins_sys / samples, "reference_wins": wins_ref / samples, "better": better,
            "better_in": share, "p_value": 1.0 - share}


def holm(p_values: Sequence[float]) -> List[float]:
    """Holm's step-down adjusted p-values, in the order given: sorted ascending, the i-th
    smallest (from 1) multiplied by m - i + 1, made non-decreasing, capped at 1."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    adjusted, running = [0.0] * len(p_values), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(p_values) - rank) * float(p_values[i])))
        adjusted[i] = running
    return adjusted


def selection_sd(runs: Dict[int, np.ndarray], samples: int = 1000, seed: int = 12345):
    """MultEval's s_sel: per run the sample sd of corpus BLEU over ``samples`` bootstrap
    resamples of the test set (n sentences with replacement), averaged over the runs."""
    rng = np.random.default_rng(seed)
    spreads = []
    for k in sorted(runs):
        stats = np.asarray(runs[k], dtype=np.float64)
        sums = np.stack([stats[rng.integers(0, len(stats), len(stats))].sum(0) for _ in range(samples)])
        spreads.append(float(np.std(corpus_bleu(sums), ddof=1)))
    return float(np.mean(spreads)) if spreads else None


def mean_sd(values: Sequence[float]) -> Tuple[float, Optional[float]]:
    """The mean and the sample standard deviation (n - 1 in the denominator) of ``values``;
    the sd is None for a single value."""
    values = [float(v) for v in values]
    if not values:
        raise ValueError("mean_sd needs at least one value")
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else None)


# a speed or time over seeds with a larger sd / mean measured the machine's load, not the model
TIMING_NOISE = 0.25


def variation(values: Sequence[float]) -> Optional[float]:
    """The coefficient of variation, sample sd / |mean|; None for fewer than 2 values or a mean of 0."""
    if len(values) < 2:
        return None
    mean, sd = mean_sd(values)
    return sd / abs(mean) if mean else None


def format_mean_sd(mean: Optional[float], sd: Optional[float], digits: int = 2) -> str:
    """``"34.12 ± 0.31"``; ``"34.12"`` when sd is None (one seed); ``"–"`` when there is no mean."""
    if mean is None:
        return "–"
    return f"{mean:.{digits}f}" + ("" if sd is None else f" ± {sd:.{digits}f}")


def paired_t(reference: Sequence[float], system: Sequence[float]) -> Optional[float]:
    """Two-sided p of the paired t-test of ``system`` against ``reference`` (scipy's
    ``ttest_rel``); None for fewer than 2 pairs or when the differences do not vary
    (t is then undefined or infinite, and 2 equal BLEU deltas are no evidence of p = 0)."""
    if len(reference) < 2:
        return None
    deltas = [s - r for s, r in zip(system, reference)]
    if statistics.stdev(deltas) == 0:
        return None
    from scipy.stats import ttest_rel

    with warnings.catch_warnings():  # scipy warns about precision for nearly equal differences
        warnings.simplefilter("ignore", RuntimeWarning)
        p = float(ttest_rel(system, reference).pvalue)
    return None if math.isnan(p) else p


def across_seeds(reference: Dict[int, float], system: Dict[int, float], per_seed: Dict[int, dict],
                 marks: str = "thesis") -> dict:
    """One row against the reference row over seeds, by the intersection-union rule (Berger 1982, Berger & Hsu 1996) of
    ``--test bootstrap`` and ``--test thesis``: marked at level alpha only when the paired bootstrap gives p < alpha at
    every seed both rows ran and Δ has the same sign at every such seed (docs/reproduction.md, "Several seeds": the rule
    and why).

    ``reference``, ``system``: seed -> BLEU. ``per_seed``: seed -> this system's paired bootstrap entry against the
    reference system of the same seed, as :func:`fairseq_ext.tools.significance.paired_significance` returns it
    (``p_value``, ``mark`` in the convention ``marks``), for every seed of both. Every mean and sd returned is over
    those paired seeds; ``left_out``: seeds of only one of the two; ``p_max``: the largest per-seed p (the IUT's
    p-value); ``p_t``: :func:`paired_t`; ``rule``: one sentence saying why the mark."""
    mark(None, marks)  # refuses unknown marks
    reference = {int(k): float(v) for k, v in reference.items()}
    system = {int(k): float(v) for k, v in system.items()}
    per_seed = {int(k): v for k, v in per_seed.items()}
    paired = sorted(set(reference) & set(system))
    left_out = sorted(set(reference) ^ set(system))
    pairing = _pairing(paired, left_out, reference)
    if not paired:
        return {"seeds": 0, "paired_seeds": [], "left_out": left_out, "mean": None, "sd": None,
                "reference_mean": None, "reference_sd": None, "delta_mean": None, "delta_sd": None,
                "same_sign": False, "p_max": None, "p_t": None, "mark": "",
                "rule": f"no mark: no seed has a run of both this row and the reference row{pairing}."}
    missing = [s for s in paired if s not in per_seed]
    if missing:
        raise ValueError(f"no paired bootstrap entry for {seeds_text(missing)}, "
                         "which both this row and the reference row ran")
    strength = {m: i for i, (_, m) in enumerate(MARKS[marks])}  # 0 = the strongest mark
    p_values, reached = {}, {}
    for s in paired:
        entry = per_seed[s]
        if entry.get("p_value") is None:
            raise ValueError(f"the paired bootstrap entry of seed {s} has no p_value "
                             "(is it the reference row's own?)")
        p_values[s] = float(entry["p_value"])
        # the level a seed reaches comes from its own mark, set from the unrounded p
        # (a p of 0.04995 is stored as 0.05 with its †)
        level = entry["mark"] if "mark" in entry else mark(p_values[s], marks)
        if level and level not in strength:
            raise ValueError(f"seed {s}'s mark {level!r} is not one of the {marks!r} marks "
                             f"({', '.join(strength)}); pass the marks= the bootstrap used")
        reached[s] = strength[level] if level else None
    sys_mean, sys_sd = mean_sd([system[s] for s in paired])
    ref_mean, ref_sd = mean_sd([reference[s] for s in paired])
    deltas = {s: system[s] - reference[s] for s in paired}
    delta_mean, delta_sd = mean_sd(list(deltas.values()))
    same_sign = all(d > 0 for d in deltas.values()) or all(d < 0 for d in deltas.values())
    p_max = max(p_values.values())

    weakest = MARKS[marks][-1][0]
    not_significant, chosen = [s for s in paired if reached[s] is None], ""
    if not_significant:
        shown = ", ".join(f"{s} (p = {p_values[s]:.4g})" for s in not_significant)
        noun = "seed" if len(not_significant) == 1 else "seeds"
        why = f"no mark: the paired bootstrap is not significant (p < {weakest}) at {noun} {shown}"
    elif not same_sign:
        signs = {"up": [s for s, d in deltas.items() if d > 0], "down": [s for s, d in deltas.items() if d < 0],
                 "equal": [s for s, d in deltas.items() if d == 0]}
        why = "no mark: Δ is not of one sign across seeds (" + "; ".join(
            f"{name} at {seeds_text(group)}" for name, group in signs.items() if group) + ")"
    else:
        bound, chosen = MARKS[marks][max(reached.values())]
        direction = "above" if delta_mean > 0 else "below"
        if len(paired) == 1:
            why = f"{chosen}: the paired bootstrap gives p < {bound} (p = {p_max:.4g}) at the one seed, {paired[0]}"
        else:
            why = (f"{chosen}: the paired bootstrap gives p < {bound} at each of the {len(paired)} seeds "
                   f"(largest p = {p_max:.4g}) and the row is {direction} the reference at each")
    return {"seeds": len(paired), "paired_seeds": paired, "left_out": left_out, "mean": sys_mean, "sd": sys_sd,
            "reference_mean": ref_mean, "reference_sd": ref_sd, "delta_mean": delta_mean, "delta_sd": delta_sd,
            "same_sign": same_sign, "p_max": p_max,
            "p_t": paired_t([reference[s] for s in paired], [system[s] for s in paired]),
            "mark": chosen, "rule": why + pairing + "."}


def seeds_text(seeds: List[int]) -> str:
    """"seed 4", "seeds 1 and 3", "seeds 1, 2 and 3"."""
    if len(seeds) == 1:
        return f"seed {seeds[0]}"
    return "seeds " + ", ".join(str(s) for s in seeds[:-1]) + f" and {seeds[-1]}"


def _pairing(paired: List[int], left_out: List[int], reference: Dict[int, float]) -> str:
    """How the seeds were paired, as the end of the rule's sentence."""
    if not left_out:
        return "" if len(paired) < 2 else f"; {seeds_text(paired)}, paired by number"
    only_ref = [s for s in left_out if s in reference]
    only_sys = [s for s in left_out if s not in reference]
    parts = [f"{seeds_text(seeds)} {why}" for seeds, why in ((only_sys, "without a reference run"),
                                                            (only_ref, "without a run of this row")) if seeds]
    counted = seeds_text(paired) if paired else "no seed"
    return f"; seeds paired by number: {counted} counted, {' and '.join(parts)} left out"
