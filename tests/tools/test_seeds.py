"""fairseq_ext.tools.statistics: mean ± sd over seeds and the intersection-union mark, checked against
numbers worked out by hand, a hand-computed paired t statistic, the single-run marks, and
sacreBLEU's real paired bootstrap over three seeds."""
import math
import random

import pytest
from scipy.stats import t as t_dist

from fairseq_ext.tools import statistics
from fairseq_ext.tools.significance import paired_significance
from fairseq_ext.tools.statistics import MARKS, mark


def entry(p, marks="thesis"):
    return {"p_value": p, "mark": mark(p, marks)}


def test_mean_sd_by_hand():
    # mean (34.1 + 34.5 + 33.9) / 3 = 34.1666...; deviations -1/15, 1/3, -4/15;
    # squares 1/225 + 25/225 + 16/225 = 42/225 over n - 1 = 2: sd = sqrt(21/225) = sqrt(21)/15
    mean, sd = statistics.mean_sd([34.1, 34.5, 33.9])
    assert mean == pytest.approx(102.5 / 3, abs=1e-12)
    assert sd == pytest.approx(math.sqrt(21) / 15, abs=1e-12)
    # n - 1, not n: two values 1 apart have sd sqrt(0.5), not 0.5
    assert statistics.mean_sd([27.0, 28.0]) == pytest.approx((27.5, math.sqrt(0.5)))
    assert statistics.mean_sd([28.15]) == (28.15, None)
    with pytest.raises(ValueError):
        statistics.mean_sd([])


def test_format_mean_sd():
    assert statistics.format_mean_sd(34.123, 0.314) == "34.12 ± 0.31"
    assert statistics.format_mean_sd(34.125001, None) == "34.13"
    assert statistics.format_mean_sd(34.1234, 0.3141, digits=3) == "34.123 ± 0.314"
    assert statistics.format_mean_sd(None, None) == "–"


def test_variation_flags_timings_that_measured_the_load():
    # decoding speeds of three seeds on a shared machine (the CPU benchmark's baseline): sd 84.05
    # around 62.72 is 134% of the mean, far above the 25% a timing is still shown at
    speeds = [159.7, 14.3, 14.2]
    assert statistics.variation(speeds) == pytest.approx(statistics.mean_sd(speeds)[1] / statistics.mean_sd(speeds)[0])
    assert statistics.variation(speeds) > 1.3 > statistics.TIMING_NOISE == 0.25
    assert statistics.variation([2.0, 2.2]) == pytest.approx(math.sqrt(0.02) / 2.1)  # sd 0.141, 7%
    assert statistics.variation([5.0]) is None and statistics.variation([0.0, 0.0]) is None


REF = {1: 28.15, 2: 27.79, 3: 28.02}


def test_mark_only_when_every_seed_is_significant_with_one_sign():
    up = {1: 28.90, 2: 28.31, 3: 28.77}
    result = statistics.across_seeds(REF, up, {1: entry(0.002), 2: entry(0.03), 3: entry(0.001)})
    # the weakest seed (p = 0.03) sets the level: †, not ‡
    assert result["mark"] == "†" and result["same_sign"] and result["p_max"] == 0.03
    assert result["seeds"] == 3 and result["delta_mean"] == pytest.approx((0.75 + 0.52 + 0.75) / 3)
    assert "each of the 3 seeds" in result["rule"] and "above" in result["rule"]
    strong = statistics.across_seeds(REF, up, {1: entry(0.002), 2: entry(0.009), 3: entry(0.001)})
    assert strong["mark"] == "‡"
    down = {1: 27.40, 2: 27.01, 3: 27.35}
    assert statistics.across_seeds(REF, down, {s: entry(0.004) for s in REF})["mark"] == "‡"

    # one seed not significant: no mark, although the other two are at p < 0.01
    one_not = statistics.across_seeds(REF, up, {1: entry(0.002), 2: entry(0.21), 3: entry(0.001)})
    assert one_not["mark"] == "" and one_not["p_max"] == 0.21 and one_not["same_sign"]
    assert "seed 2 (p = 0.21)" in one_not["rule"]

    # every seed significant, but seed 2 goes the other way
    mixed = {1: 28.90, 2: 27.20, 3: 28.77}
    opposite = statistics.across_seeds(REF, mixed, {s: entry(0.001) for s in REF})
    assert opposite["mark"] == "" and not opposite["same_sign"]
    assert "up at seeds 1 and 3" in opposite["rule"] and "down at seed 2" in opposite["rule"]


def test_paired_t_by_hand():
    system = {1: 28.61, 2: 28.02, 3: 28.95}
    result = statistics.across_seeds(REF, system, {s: entry(0.01) for s in REF})
    d = [system[s] - REF[s] for s in (1, 2, 3)]
    n = len(d)
    mean = sum(d) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1))
    t = mean / (sd / math.sqrt(n))
    assert result["delta_sd"] == pytest.approx(sd)
    assert result["p_t"] == pytest.approx(2 * t_dist.sf(abs(t), n - 1), rel=1e-9)
    assert result["sd"] == pytest.approx(math.sqrt(sum((system[s] - sum(system.values()) / 3) ** 2 for s in system) / 2))
    # the t-test is beside the mark, not the mark: here p_t > 0.05 but every seed is significant
    assert result["p_t"] > 0.05 and result["mark"] == "†"
    # undefined when the deltas do not vary or for a single pair
    assert statistics.across_seeds(REF, {s: v + 0.5 for s, v in REF.items()}, {s: entry(0.01) for s in REF})["p_t"] is None
    assert statistics.across_seeds({1: 28.0}, {1: 29.0}, {1: entry(0.01)})["p_t"] is None


@pytest.mark.parametrize("marks", sorted(MARKS))
@pytest.mark.parametrize("p", [0.0009, 0.0099, 0.012, 0.049, 0.3, 1.0])
def test_one_seed_is_the_single_run(marks, p):
    single = entry(p, marks)
    result = statistics.across_seeds({7: 28.15}, {7: 27.9}, {7: single}, marks=marks)
    assert result["mark"] == single["mark"] and result["p_max"] == p
    assert result["seeds"] == 1 and result["sd"] is None and result["reference_sd"] is None and result["p_t"] is None


def test_the_level_comes_from_the_seeds_mark():
    # the mark comes from the seed's own mark, set from the unrounded p: 0.04995 is stored as 0.05 with †
    edge = statistics.across_seeds({1: 28.15}, {1: 28.90}, {1: {"p_value": 0.05, "mark": "†"}})
    assert edge["mark"] == "†"


def test_seeds_are_paired_by_number():
    reference = {1: 28.15, 2: 27.79, 3: 28.02}
    system = {3: 28.80, 2: 28.40, 4: 30.00}  # seed 4 has no reference run, seed 1 no run of this row
    # seed 4's entry is significant and would lift the mark if it were counted with seed 2's
    per_seed = {2: entry(0.004), 3: entry(0.002), 4: entry(0.001)}
    result = statistics.across_seeds(reference, system, per_seed)
    assert result["seeds"] == 2 and result["paired_seeds"] == [2, 3] and result["left_out"] == [1, 4]
    assert result["mean"] == pytest.approx(28.60) and result["reference_mean"] == pytest.approx((27.79 + 28.02) / 2)
    assert result["delta_mean"] == pytest.approx(((28.40 - 27.79) + (28.80 - 28.02)) / 2)
    assert result["mark"] == "‡" and result["p_max"] == 0.004
    assert "seed 4 without a reference run" in result["rule"] and "seed 1 without a run of this row" in result["rule"]
    # string seed keys (as read back from JSON) pair with int ones
    assert statistics.across_seeds({"2": 27.79, "3": 28.02}, system, {"2": entry(0.004), "3": entry(0.002)})["mark"] == "‡"
    # a paired seed without its bootstrap entry is an error, not a silently dropped seed
    with pytest.raises(ValueError, match="seed 3"):
        statistics.across_seeds(reference, system, {2: entry(0.004)})
    # a mark of another convention is refused
    with pytest.raises(ValueError, match="marks"):
        statistics.across_seeds(reference, system, {2: entry(0.004, "mma"), 3: entry(0.002, "mma")})
    nothing = statistics.across_seeds({1: 28.0}, {2: 29.0}, {})
    assert nothing["seeds"] == 0 and nothing["mark"] == "" and nothing["mean"] is None


def synthetic(n, seed):
    """A reference translation and, for one training seed, a baseline and two systems: one
    much closer to the reference, one as far from it as the baseline."""
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(53)] + ["the", "a", "."]
    refs = [" ".join(rng.choice(words) for _ in range(rng.randint(5, 13))) for _ in range(n)]

    def noisy(p):
        return [" ".join(w if rng.random() > p else rng.choice(words) for w in line.split()) for line in refs]

    return refs, noisy(0.4), noisy(0.2), noisy(0.4)


def test_with_sacrebleu_paired_bootstrap_over_three_seeds():
    reference, better, same, per_better, per_same = {}, {}, {}, {}, {}
    refs = None
    for seed in (1, 2, 3):
        refs, base, good, alike = synthetic(117, seed=100 + seed)
        result = paired_significance(refs, base, {"good": good, "alike": alike}, n_samples=299, seed=12345)
        reference[seed] = result["baseline"]["bleu"]
        better[seed], per_better[seed] = result["good"]["bleu"], result["good"]
        same[seed], per_same[seed] = result["alike"]["bleu"], result["alike"]
    good = statistics.across_seeds(reference, better, per_better)
    assert all(per_better[s]["mark"] == "‡" for s in (1, 2, 3))
    assert good["mark"] == "‡" and good["same_sign"] and good["delta_mean"] > 0
    assert good["p_max"] == max(per_better[s]["p_value"] for s in (1, 2, 3))
    # the system as noisy as the baseline is significant at one seed by chance, not at the others
    marked = [s for s in (1, 2, 3) if per_same[s]["mark"]]
    assert 0 < len(marked) < 3
    alike = statistics.across_seeds(reference, same, per_same)
    assert alike["mark"] == "" and alike["p_max"] == max(per_same[s]["p_value"] for s in (1, 2, 3))
    # that seed alone gives what its single run gives
    s = marked[0]
    assert statistics.across_seeds({s: reference[s]}, {s: same[s]}, {s: per_same[s]})["mark"] == per_same[s]["mark"]
