"""Statistics of a table trained with several seeds: mean ± sd of each row, and a
significance mark against the reference row that holds across seeds.

The papers report one training run per row, with sacreBLEU's paired bootstrap against the
baseline (:mod:`fairseq_ext.tools.significance`). That test measures only the sampling of
the test set; a second seed can move a row by as much as the effects in a table. With
several seeds, each row is trained once per seed and each seed's run is tested against the
reference row of the same seed. Seeds are paired by their number: only seeds for which both
the row and the reference row have a run count, for the mark and for every mean and sd here.

The default mark of a table of several seeds is the stratified approximate randomization
over the seeds (:func:`fairseq_ext.tools.multi_run_tests.stratified_ar`, ``--test ar``).
The rule here is the stricter option (``--test bootstrap``, ``--test thesis``): an
intersection-union test (IUT; Berger 1982, Berger & Hsu 1996) over seeds. A difference is
marked at level alpha only when

- the paired bootstrap gives p < alpha at every paired seed, and
- the BLEU difference Δ has the same sign at every paired seed.

Why this rule:

- It claims what "holds across seeds" means: the row differs from the reference, in one
  direction, at each seed. That claim is an intersection of per-seed claims, and an IUT
  rejects the union of the per-seed nulls only when every per-seed test rejects its own.
  Its level is that of the per-seed tests, with no correction for the number of seeds
  (no per-seed null can be wrongly rejected more often than alpha), and its p-value is the
  largest per-seed p (``p_max``). With one seed it is the single run's mark.
- sacreBLEU's bootstrap is two-sided (it compares |Δ|), so the sign condition is what makes
  the claim directional: to mark a row "better at every seed" wrongly, a seed at which it
  is not better would have to come out significant with a positive Δ, which a two-sided
  level-alpha test does with probability below alpha.
- The more seeds, the harder the mark, never the easier: a mark is not bought by running
  more seeds. Combining the per-seed p-values (Fisher, Stouffer) instead would test only
  "the row differs at some seed", which one lucky seed can carry.
- What it does not claim: that another seed would differ too. The per-seed tests are
  conditional on the trained models. That question is the paired t-test over seeds
  (``p_t``, scipy's ``ttest_rel`` of the per-seed BLEU), reported beside the mark and not
  as it: with 3 seeds it has 2 degrees of freedom and rests on the per-seed Δ being normal.
  A sign test over seeds needs no such assumption but cannot help at these counts: with
  every Δ of one sign its two-sided p is 2 · 0.5^n, 0.25 at 3 seeds, and it first goes
  below 0.05 at 6 seeds.
"""
import math
import statistics
import warnings
from typing import Dict, List, Optional, Sequence, Tuple

from fairseq_ext.tools.significance import MARKS, mark_for


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
    if sd is None:
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ± {sd:.{digits}f}"


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
    """One row against the reference row over seeds (see the module docstring for the rule).

    ``reference``, ``system``: seed -> BLEU. ``per_seed``: seed -> the paired bootstrap entry of
    this system against the reference system of the same seed, as
    :func:`fairseq_ext.tools.significance.paired_significance` returns it (``p_value`` and
    ``mark``, in the convention ``marks``). Only seeds in both ``reference`` and ``system`` are
    paired and counted; each needs its ``per_seed`` entry.

    Returns ``seeds`` (the number paired), ``paired_seeds``, ``left_out`` (seeds with a run of
    only one of the two), ``mean``/``sd`` of the system and ``reference_mean``/``reference_sd``
    over the paired seeds, ``delta_mean``/``delta_sd`` of the per-seed differences, ``same_sign``,
    ``p_max`` (the largest per-seed p: the IUT's p-value), ``p_t`` (paired t-test over seeds,
    None for fewer than 2 or when Δ is the same at every seed), ``mark`` (the paper's mark of
    the level every seed reaches, or "") and ``rule`` (one sentence saying why).
    """
    if marks not in MARKS:
        raise ValueError(f"--marks: {marks!r} is not one of {', '.join(MARKS)}")
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
        raise ValueError(f"no paired bootstrap entry for {_seeds(missing)}, "
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
        mark = entry["mark"] if "mark" in entry else mark_for(p_values[s], marks)
        if mark and mark not in strength:
            raise ValueError(f"seed {s}'s mark {mark!r} is not one of the {marks!r} marks "
                             f"({', '.join(strength)}); pass the marks= the bootstrap used")
        reached[s] = strength[mark] if mark else None
    sys_mean, sys_sd = mean_sd([system[s] for s in paired])
    ref_mean, ref_sd = mean_sd([reference[s] for s in paired])
    deltas = {s: system[s] - reference[s] for s in paired}
    delta_mean, delta_sd = mean_sd(list(deltas.values()))
    same_sign = all(d > 0 for d in deltas.values()) or all(d < 0 for d in deltas.values())
    p_max = max(p_values.values())

    weakest = MARKS[marks][-1][0]
    not_significant = [s for s in paired if reached[s] is None]
    if not_significant:
        mark = ""
        shown = ", ".join(f"{s} (p = {p_values[s]:.4g})" for s in not_significant)
        noun = "seed" if len(not_significant) == 1 else "seeds"
        why = f"no mark: the paired bootstrap is not significant (p < {weakest}) at {noun} {shown}"
    elif not same_sign:
        mark = ""
        signs = {"up": [s for s, d in deltas.items() if d > 0], "down": [s for s, d in deltas.items() if d < 0],
                 "equal": [s for s, d in deltas.items() if d == 0]}
        why = "no mark: Δ is not of one sign across seeds (" + "; ".join(
            f"{name} at {_seeds(group)}" for name, group in signs.items() if group) + ")"
    else:
        bound, mark = MARKS[marks][max(reached.values())]
        direction = "above" if delta_mean > 0 else "below"
        if len(paired) == 1:
            why = f"{mark}: the paired bootstrap gives p < {bound} (p = {p_max:.4g}) at the one seed, {paired[0]}"
        else:
            why = (f"{mark}: the paired bootstrap gives p < {bound} at each of the {len(paired)} seeds "
                   f"(largest p = {p_max:.4g}) and the row is {direction} the reference at each")
    return {"seeds": len(paired), "paired_seeds": paired, "left_out": left_out, "mean": sys_mean, "sd": sys_sd,
            "reference_mean": ref_mean, "reference_sd": ref_sd, "delta_mean": delta_mean, "delta_sd": delta_sd,
            "same_sign": same_sign, "p_max": p_max,
            "p_t": paired_t([reference[s] for s in paired], [system[s] for s in paired]),
            "mark": mark, "rule": why + pairing + "."}


def _seeds(seeds: List[int]) -> str:
    """"seed 4", "seeds 1 and 3", "seeds 1, 2 and 3"."""
    if len(seeds) == 1:
        return f"seed {seeds[0]}"
    return "seeds " + ", ".join(str(s) for s in seeds[:-1]) + f" and {seeds[-1]}"


def _pairing(paired: List[int], left_out: List[int], reference: Dict[int, float]) -> str:
    """How the seeds were paired, as the end of the rule's sentence."""
    if not left_out:
        return "" if len(paired) < 2 else f"; {_seeds(paired)}, paired by number"
    only_ref = [s for s in left_out if s in reference]
    only_sys = [s for s in left_out if s not in reference]
    parts = []
    if only_sys:
        parts.append(f"{_seeds(only_sys)} without a reference run")
    if only_ref:
        parts.append(f"{_seeds(only_ref)} without a run of this row")
    counted = _seeds(paired) if paired else "no seed"
    return f"; seeds paired by number: {counted} counted, {' and '.join(parts)} left out"
