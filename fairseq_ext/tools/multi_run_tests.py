"""Paired tests of two systems' BLEU from per-sentence sufficient statistics, for one run or
several runs (training seeds) of each system, and the Holm correction of a family of tests.

Every test here works on sacreBLEU's BLEU sufficient statistics of each sentence
(:func:`sentence_stats`: hypothesis length, reference length, matching and total n-grams of
orders 1-4), computed once; a resample or a shuffle only sums rows of them, as sacreBLEU's own
``sacrebleu/significance.py`` does, and :func:`corpus_bleu` turns the sums into BLEU exactly as
sacreBLEU does (``smooth_method='exp'``, the papers' flavours).

- :func:`stratified_ar`: stratified approximate randomization over runs (Riezler & Maxwell
  2005; Clark et al. 2011, "Better hypothesis testing for statistical machine translation:
  controlling for optimizer instability"), as MultEval implements it
  (``multeval.significance.StratifiedApproximateRandomizationTest.getTwoSidedP``). Run ``k`` of
  system A is paired with run ``k`` of system B (the same seed), and each system's runs are
  concatenated: a data point is one sentence of one run. The statistic is the BLEU of B's
  concatenated runs (the sum of the statistics of all its runs' sentences) minus the BLEU of
  A's. Each of R shuffles swaps every data point between the two systems independently with
  probability 0.5 (a sentence of run ``k`` is only ever exchanged with the same sentence of
  run ``k`` of the other system: the stratification) and recomputes the statistic. With c the
  shuffles whose |statistic| is at least the observed |statistic|, p = (c + 1) / (R + 1)
  (two-sided). With one run it is the plain approximate randomization test.
  ``statistic="mean"`` tests the difference of the mean over runs of per-run BLEU instead (the
  same shuffles); it is not MultEval's.
- :func:`subsample_bootstrap`: compare-mt 0.2.10's paired bootstrap
  (``compare_mt/sign_utils.py``, ``eval_with_paired_bootstrap``), which the thesis ran: 1000
  subsamples of ``int(0.5 n)`` sentences drawn with replacement, and p = 1 - the share of
  subsamples in which the more often winning system is strictly better (one-sided, in the
  direction the samples favour).
- :func:`holm`: Holm's step-down adjustment of the p-values of a family of tests.
- :func:`selection_sd`: MultEval's s_sel, the spread of a run's BLEU over bootstrap
  resamples of the test set, averaged over runs.
"""
from typing import Dict, List, Sequence

import numpy as np

ORDER = 4  # BLEU's n-gram orders; a row of statistics: hyp_len, ref_len, correct[4], total[4]
BLOCK = 4_000_000  # random doubles drawn at once (32 MB): the shuffles go in blocks of this size


def sentence_stats(refs: Sequence[str], hyps: Sequence[str], flavour: str) -> np.ndarray:
    """sacreBLEU's BLEU statistics of every sentence in the ``flavour`` of
    :data:`fairseq_ext.tools.significance.FLAVOURS`: an array of n rows of 2 + 2 * 4 numbers."""
    from fairseq_ext.tools.significance import bleu_metric

    if len(refs) != len(hyps):
        raise ValueError(f"{len(hyps)} hypotheses for {len(refs)} references")
    metric = bleu_metric(flavour)
    if metric.smooth_method != "exp" or metric.effective_order:
        raise ValueError("corpus_bleu reproduces sacreBLEU's BLEU with exp smoothing only")
    return np.asarray(metric._extract_corpus_statistics(list(hyps), [list(refs)]), dtype=np.float64)


def corpus_bleu(sums: np.ndarray) -> np.ndarray:
    """sacreBLEU's corpus BLEU (exp smoothing, 4-grams) of summed statistics ``sums`` (..., 10),
    for every leading index at once: the brevity penalty times the geometric mean of the
    precisions, a precision with no match replaced by 100 / (2^k total) for its k-th such order,
    0 when nothing matches or an order has no n-gram."""
    sums = np.asarray(sums, dtype=np.float64)
    sys_len, ref_len = sums[..., 0], sums[..., 1]
    correct, total = sums[..., 2:2 + ORDER], sums[..., 2 + ORDER:2 + 2 * ORDER]
    with np.errstate(divide="ignore", invalid="ignore"):
        bp = np.where(sys_len < ref_len, np.where(sys_len > 0, np.exp(1 - ref_len / sys_len), 0.0), 1.0)
        unmatched = correct == 0
        halvings = np.cumsum(unmatched, axis=-1)
        precision = np.where(unmatched, 100.0 / (2.0 ** halvings * total), 100.0 * correct / total)
        score = bp * np.exp(np.log(precision).mean(axis=-1))
    dead = ~correct.any(axis=-1) | (total == 0).any(axis=-1)
    return np.where(dead, 0.0, score)


def _paired(reference: Dict[int, np.ndarray], system: Dict[int, np.ndarray]) -> List[int]:
    runs = sorted(set(reference) & set(system))
    if not runs:
        raise ValueError("no run of both systems (runs are paired by their seed)")
    for k in runs:
        if np.shape(reference[k]) != np.shape(system[k]):
            raise ValueError(f"run {k}: the systems' statistics differ in shape "
                             f"({np.shape(reference[k])} and {np.shape(system[k])})")
    return runs


STATISTICS = ("concatenated", "mean")


def stratified_ar(reference: Dict[int, np.ndarray], system: Dict[int, np.ndarray], shuffles: int = 10000,
                  seed: int = 12345, statistic: str = "concatenated") -> dict:
    """Stratified approximate randomization of ``system`` against ``reference`` over the runs
    both have (run -> :func:`sentence_stats`; see the module docstring).

    ``statistic``: "concatenated" (MultEval's: BLEU of each system's runs concatenated) or
    "mean" (the mean over runs of per-run BLEU). The shuffles are drawn from
    ``numpy.random.default_rng(seed)``: shuffle r swaps sentence i of run pair k when the
    generator's next double is below 0.5, the doubles taken in the order (shuffle, run pair in
    increasing run number, sentence). Returns ``runs``, ``shuffles``, ``seed``, ``statistic``,
    the per-run BLEU of both (``reference_bleu``, ``system_bleu``), their means, the BLEU of
    the concatenated runs (``reference_concatenated``, ``system_concatenated``),
    ``s_dev_reference`` / ``s_dev_system`` (the sample sd of BLEU over runs, MultEval's s_dev;
    None for one run), ``delta`` (the statistic: system - reference), ``count`` (c) and
    ``p_value``."""
    if shuffles < 1:
        raise ValueError(f"--shuffles must be at least 1, not {shuffles}")
    if statistic not in STATISTICS:
        raise ValueError(f"statistic must be one of {', '.join(STATISTICS)}, not {statistic!r}")
    runs = _paired(reference, system)
    ref = np.stack([np.asarray(reference[k], dtype=np.float64) for k in runs])  # runs x n x 10
    sys_ = np.stack([np.asarray(system[k], dtype=np.float64) for k in runs])
    ref_sum, sys_sum, gain = ref.sum(1), sys_.sum(1), sys_ - ref
    ref_bleu, sys_bleu = corpus_bleu(ref_sum), corpus_bleu(sys_sum)
    ref_all, sys_all = float(corpus_bleu(ref_sum.sum(0))), float(corpus_bleu(sys_sum.sum(0)))
    observed = sys_all - ref_all if statistic == "concatenated" else sys_bleu.mean() - ref_bleu.mean()
    rng = np.random.default_rng(seed)
    n_runs, n = ref.shape[:2]
    block = max(1, BLOCK // max(1, n_runs * n))
    count, done = 0, 0
    while done < shuffles:
        size = min(block, shuffles - done)
        swap = rng.random((size, n_runs, n)) < 0.5  # shuffles x run pairs x sentences
        # A with B's translations of the swapped sentences, per run pair
        shuffled_ref = ref_sum[None] + np.stack([swap[:, k].astype(np.float64) @ gain[k] for k in range(n_runs)], 1)
        shuffled_sys = (ref_sum + sys_sum)[None] - shuffled_ref
        if statistic == "concatenated":
            delta = corpus_bleu(shuffled_sys.sum(1)) - corpus_bleu(shuffled_ref.sum(1))
        else:
            delta = corpus_bleu(shuffled_sys).mean(1) - corpus_bleu(shuffled_ref).mean(1)
        count += int(np.sum(np.abs(delta) >= abs(observed) - 1e-9))  # float sums: a tie stays a tie
        done += size
    return {"test": "ar", "statistic": statistic, "runs": runs, "shuffles": shuffles, "seed": seed,
            "reference_bleu": {k: float(b) for k, b in zip(runs, ref_bleu)},
            "system_bleu": {k: float(b) for k, b in zip(runs, sys_bleu)},
            "reference_mean": float(ref_bleu.mean()), "system_mean": float(sys_bleu.mean()),
            "reference_concatenated": ref_all, "system_concatenated": sys_all,
            "s_dev_reference": _sd(ref_bleu), "s_dev_system": _sd(sys_bleu),
            "delta": float(observed), "count": count, "p_value": (count + 1) / (shuffles + 1)}


def _sd(values: np.ndarray):
    return float(np.std(values, ddof=1)) if len(values) > 1 else None


def subsample_bootstrap(reference: np.ndarray, system: np.ndarray, samples: int = 1000, ratio: float = 0.5,
                        seed: int = 12345) -> dict:
    """compare-mt's paired bootstrap (see the module docstring) of one run of each system:
    ``samples`` subsamples of ``int(ratio * n)`` sentence indices drawn with replacement
    (``numpy.random.default_rng(seed).integers(0, n, size)``, one subsample after another).
    Returns ``system_wins`` and ``reference_wins`` (the shares of subsamples in which each is
    strictly better), ``better`` (``"system"``, ``"reference"``; the system on a tie of shares),
    ``better_in`` (its share, compare-mt's "better in γ of samples") and ``p_value`` (1 - γ)."""
    if samples < 1:
        raise ValueError(f"--samples must be at least 1, not {samples}")
    reference, system = np.asarray(reference, dtype=np.float64), np.asarray(system, dtype=np.float64)
    _paired({0: reference}, {0: system})
    n = len(reference)
    size = max(1, int(n * ratio))
    rng = np.random.default_rng(seed)
    wins_sys = wins_ref = 0
    for _ in range(samples):
        ids = rng.integers(0, n, size)
        a, b = corpus_bleu(reference[ids].sum(0)), corpus_bleu(system[ids].sum(0))
        wins_sys += int(b > a)
        wins_ref += int(a > b)
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
