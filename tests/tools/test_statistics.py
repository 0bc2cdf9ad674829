"""fairseq_ext.tools.statistics: corpus BLEU from summed statistics against sacreBLEU's
own; the stratified approximate randomization against a plain-Python transcription of MultEval's
code (Shuffling, sumStats, getTwoSidedP) fed the same draws (hand-made runs: 3 runs x 5 sentences,
and 2), against the same code with its own draws on the stored 3-seed CPU runs, and its
degenerate cases; compare-mt's subsample bootstrap recomputed the same way, Holm's adjustment by
hand, and the paired bootstrap and approximate randomization against sacreBLEU's own
(sacrebleu.significance), bit for bit."""
import math
import os
import random

import numpy as np
import pytest
from sacrebleu.metrics import BLEU

from fairseq_ext.common.data_text import read_lines
from fairseq_ext.errors import FairseqExtError
from fairseq_ext.tools import statistics

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def bleu_by_hand(stats):
    """sacreBLEU's corpus BLEU (exp smoothing) of one row of summed statistics, in plain Python."""
    sys_len, ref_len, correct, total = stats[0], stats[1], list(stats[2:6]), list(stats[6:10])
    if not any(correct) or 0 in total:
        return 0.0
    bp = 1.0 if sys_len >= ref_len else math.exp(1 - ref_len / sys_len)
    logs, halve = [], 1.0
    for c, t in zip(correct, total):
        if c == 0:
            halve *= 2
            logs.append(math.log(100.0 / (halve * t)))
        else:
            logs.append(math.log(100.0 * c / t))
    return bp * math.exp(sum(logs) / 4)


def add(rows):
    return [sum(column) for column in zip(*rows)]


def test_corpus_bleu_is_sacrebleus():
    metric = BLEU()
    rng = random.Random(3)
    for _ in range(300):
        sys_len, ref_len = rng.randint(0, 40), rng.randint(1, 40)
        total = [max(sys_len - i, 0) for i in range(4)]
        correct = [rng.choice([0, rng.randint(0, t)]) if t else 0 for t in total]
        stats = [sys_len, ref_len, *correct, *total]
        ours = float(statistics.corpus_bleu(np.array(stats, dtype=float)))
        assert ours == pytest.approx(metric._compute_score_from_stats(list(stats)).score, abs=1e-9), stats
        assert ours == pytest.approx(bleu_by_hand(stats), abs=1e-9)


def test_sentence_stats_sum_to_sacrebleus_corpus_score():
    refs = ["the cat sat on the mat .", "a dog runs in the park", "it is raining today", "hello world"]
    hyps = ["the cat sat on a mat .", "a dog runs in a park", "it rains today", "hello there world"]
    stats = statistics.sentence_stats(refs, hyps, "detok-cased")
    assert stats.shape == (4, 10)
    assert float(statistics.corpus_bleu(stats.sum(0))) == pytest.approx(BLEU().corpus_score(hyps, [refs]).score)


# two runs (seeds 1 and 2) of systems A and B on 5 sentences: hand-chosen statistics
# (hyp_len, ref_len, correct 1-4, total 1-4)
A = {1: [[8, 9, 6, 3, 1, 0, 8, 7, 6, 5], [5, 5, 4, 2, 1, 1, 5, 4, 3, 2], [12, 11, 9, 6, 4, 2, 12, 11, 10, 9],
         [7, 8, 5, 2, 0, 0, 7, 6, 5, 4], [10, 10, 7, 5, 3, 2, 10, 9, 8, 7]],
     2: [[9, 9, 6, 4, 2, 1, 9, 8, 7, 6], [4, 5, 3, 1, 0, 0, 4, 3, 2, 1], [11, 11, 8, 5, 3, 1, 11, 10, 9, 8],
         [8, 8, 6, 3, 1, 0, 8, 7, 6, 5], [10, 10, 6, 4, 2, 1, 10, 9, 8, 7]]}
B = {1: [[9, 9, 8, 6, 4, 2, 9, 8, 7, 6], [5, 5, 5, 3, 2, 1, 5, 4, 3, 2], [11, 11, 10, 7, 5, 3, 11, 10, 9, 8],
         [8, 8, 6, 4, 2, 1, 8, 7, 6, 5], [10, 10, 8, 6, 4, 3, 10, 9, 8, 7]],
     2: [[9, 9, 7, 5, 3, 1, 9, 8, 7, 6], [5, 5, 4, 2, 1, 0, 5, 4, 3, 2], [12, 11, 9, 7, 4, 2, 12, 11, 10, 9],
         [8, 8, 7, 4, 2, 1, 8, 7, 6, 5], [10, 10, 7, 5, 3, 2, 10, 9, 8, 7]]}
# a third run (seed 3) of each, where A is the better system: A3 and B3 are the case of 3 runs
A3 = {**A, 3: [[10, 10, 8, 5, 3, 2, 10, 9, 8, 7], [5, 5, 4, 3, 2, 1, 5, 4, 3, 2], [12, 12, 9, 7, 5, 3, 12, 11, 10, 9],
               [7, 7, 6, 4, 2, 1, 7, 6, 5, 4], [10, 10, 8, 5, 3, 2, 10, 9, 8, 7]]}
B3 = {**B, 3: [[9, 10, 7, 4, 2, 1, 9, 8, 7, 6], [6, 5, 4, 3, 1, 0, 6, 5, 4, 3], [11, 12, 8, 6, 3, 2, 11, 10, 9, 8],
               [7, 7, 5, 3, 2, 1, 7, 6, 5, 4], [9, 10, 6, 4, 3, 1, 9, 8, 7, 6]]}


# two runs of 4 sentences where the two statistics disagree in sign: B is better by the mean of
# per-run BLEU (+6.48) and worse by the BLEU of the concatenated runs (-2.25)
FLIP_A = {1: [[7, 5, 3, 3, 2, 2, 7, 6, 5, 4], [4, 4, 3, 2, 1, 0, 4, 3, 2, 1], [9, 9, 7, 6, 5, 4, 9, 8, 7, 6],
              [8, 6, 7, 6, 5, 4, 8, 7, 6, 5]],
          2: [[3, 5, 1, 1, 0, 0, 3, 2, 1, 0], [1, 4, 0, 0, 0, 0, 1, 0, 0, 0], [7, 9, 1, 1, 0, 0, 7, 6, 5, 4],
              [4, 6, 2, 2, 1, 0, 4, 3, 2, 1]]}
FLIP_B = {1: [[5, 5, 2, 2, 1, 1, 5, 4, 3, 2], [1, 4, 0, 0, 0, 0, 1, 0, 0, 0], [12, 9, 6, 6, 5, 4, 12, 11, 10, 9],
              [9, 6, 7, 6, 5, 5, 9, 8, 7, 6]],
          2: [[6, 5, 2, 1, 1, 1, 6, 5, 4, 3], [6, 4, 2, 1, 1, 1, 6, 5, 4, 3], [12, 9, 3, 3, 3, 2, 12, 11, 10, 9],
              [5, 6, 4, 3, 2, 1, 5, 4, 3, 2]]}


class Shuffling:
    """MultEval's StratifiedApproximateRandomizationTest.Shuffling, line by line (jhclark/multeval,
    src/multeval/significance/StratifiedApproximateRandomizationTest.java): row iRow = iHyp + hyps * iRun
    of the runs concatenated."""

    def __init__(self, hyps, opt_runs):
        self.swap = [False] * (hyps * opt_runs)
        self.opt_run_permutation = [0] * (hyps * opt_runs)
        self.opt_run_permutation_inv = [0] * (hyps * opt_runs)
        self.hyps, self.opt_runs = hyps, opt_runs

    def at(self, i_row, a, b, invert):
        if invert:
            idx, should_swap = self.opt_run_permutation_inv[i_row], not self.swap[i_row]
        else:
            idx, should_swap = self.opt_run_permutation[i_row], self.swap[i_row]
        return (b if should_swap else a)[idx]

    def shuffle(self, rnd):
        """``rnd``: a random.Random in place of Java's two Random objects (the swaps' nextBoolean, the
        permutations' nextInt(bound))."""
        for i in range(len(self.swap)):
            self.swap[i] = rnd.random() < 0.5
        for i in range(len(self.opt_run_permutation)):
            self.opt_run_permutation[i] = i
        for i_hyp in range(self.hyps):  # Collections.shuffle's Fisher-Yates over the hypothesis' rows
            for i_run in range(self.opt_runs, 1, -1):
                swap_run1, swap_run2 = i_run - 1, rnd.randrange(i_run)
                self.swap_rows(i_hyp + self.hyps * swap_run1, i_hyp + self.hyps * swap_run2)
        self.save_inverse()

    def swap_rows(self, i, j):
        arr = self.opt_run_permutation
        arr[i], arr[j] = arr[j], arr[i]

    def save_inverse(self):
        for orig_idx in range(len(self.opt_run_permutation)):
            self.opt_run_permutation_inv[self.opt_run_permutation[orig_idx]] = orig_idx

    def set(self, swap, perm):
        """Not MultEval's: one shuffle of statistics._shuffled's ``swap`` and ``perm`` (runs x n) in
        place of shuffle()'s own draws."""
        for r in range(self.opt_runs):
            for i in range(self.hyps):
                self.swap[i + self.hyps * r] = bool(swap[r][i])
                self.opt_run_permutation[i + self.hyps * r] = i + self.hyps * int(perm[r][i])
        self.save_inverse()


def sum_stats(shuffling, a, b, invert, rows):
    """MultEval's sumStats, over ``rows`` (every row: MultEval's; one run's rows: ours, statistic="mean")."""
    return [sum(column) for column in zip(*(shuffling.at(i_row, a, b, invert) for i_row in rows))]


def get_two_sided_p(a, b, runs, num_shuffles, shuffle, per_run=False):
    """MultEval's getTwoSidedP for BLEU on the rows ``a``, ``b`` of ``runs`` runs concatenated;
    ``shuffle(shuffling, i)`` makes shuffle i. ``per_run``: our statistic="mean" on the same
    shuffles, the mean of the BLEU of each run's rows. (diffsByChance, p, [(scoreX, scoreY)])."""
    hyps = len(a) // runs
    groups = [range(hyps * r, hyps * (r + 1)) for r in range(runs)] if per_run else [range(len(a))]
    overall_diff = abs(sum(bleu_by_hand(add([a[i] for i in g])) - bleu_by_hand(add([b[i] for i in g]))
                           for g in groups) / len(groups))
    shuffling, diffs_by_chance, scores = Shuffling(hyps, runs), 0, []
    for i in range(num_shuffles):
        shuffle(shuffling, i)
        score_x = sum(bleu_by_hand(sum_stats(shuffling, a, b, False, g)) for g in groups) / len(groups)
        score_y = sum(bleu_by_hand(sum_stats(shuffling, a, b, True, g)) for g in groups) / len(groups)
        if abs(score_x - score_y) > overall_diff:
            diffs_by_chance += 1
        scores.append((score_x, score_y))
    return diffs_by_chance, (diffs_by_chance + 1) / (num_shuffles + 1), scores


def our_draws(seed, shuffles, runs, n):
    """stratified_ar's draws as its docstring gives them: for each shuffle runs x n doubles of
    default_rng(seed) (run, sentence; below 0.5: swap), then with 2 runs or more runs x n more,
    sentence i's permutation taking run r to the rank of its double among sentence i's."""
    doubles = np.random.default_rng(seed).random((shuffles, runs * (2 if runs > 1 else 1), n)).tolist()
    swap = [[[d < 0.5 for d in row] for row in shuffle[:runs]] for shuffle in doubles]
    keys = [[[shuffle[-runs + r][i] for r in range(runs)] for i in range(n)] for shuffle in doubles]
    perm = [[[sorted(by_run[i]).index(by_run[i][r]) for i in range(n)] for r in range(runs)] for by_run in keys]
    return np.array(swap), np.array(perm)


def rows(runs):
    return [row for k in sorted(runs) for row in runs[k]]


def arrays(runs):
    return {k: np.array(v, dtype=float) for k, v in runs.items()}


def stacked(runs):
    return np.stack([np.array(runs[k], dtype=float) for k in sorted(runs)])


@pytest.mark.parametrize("statistic", ["concatenated", "mean"])
@pytest.mark.parametrize("case", ["3 runs", "2 runs"])
def test_stratified_ar_is_multevals_code_on_the_same_draws(case, statistic):
    """Each shuffle's X and Y and the count of a plain transcription of MultEval's code, fed the
    swaps and permutations that stratified_ar draws."""
    a, b = {"3 runs": (A3, B3), "2 runs": (FLIP_A, FLIP_B)}[case]
    swap, perm = our_draws(7, 400, len(a), len(a[1]))
    count, p, scores = get_two_sided_p(rows(a), rows(b), len(a), 400, lambda s, i: s.set(swap[i], perm[i]),
                                       per_run=statistic == "mean")
    found = statistics.stratified_ar(arrays(a), arrays(b), shuffles=400, seed=7, statistic=statistic)
    assert (found["count"], found["p_value"]) == (count, p) and 0 < count < 400
    x, y = statistics._shuffled(stacked(a), stacked(b), swap, perm)
    score = (lambda s: statistics.corpus_bleu(s.sum(1))) if statistic == "concatenated" else \
        (lambda s: statistics.corpus_bleu(s).mean(1))
    assert np.column_stack([score(x), score(y)]) == pytest.approx(np.array(scores), abs=1e-9)
    by_run = {k: bleu_by_hand(add(v)) for k, v in b.items()}
    assert found["system_bleu"] == pytest.approx(by_run) and found["runs"] == sorted(a)
    concatenated = bleu_by_hand(add(rows(b))) - bleu_by_hand(add(rows(a)))
    mean = found["system_mean"] - found["reference_mean"]
    assert found["delta"] == pytest.approx(concatenated if statistic == "concatenated" else mean)
    if case == "2 runs":  # B is better by the mean of per-run BLEU, worse by the BLEU of the concatenated runs
        assert found["delta"] == pytest.approx(-2.248 if statistic == "concatenated" else 6.484, abs=1e-3)


def plain_ar(a, b, swaps):
    """Approximate randomization of one run (Riezler & Maxwell 2005): each shuffle exchanges the
    two systems' translations of the sentences ``swaps`` names; c: #{|shuffled Δ| > |Δ|}."""
    observed, c = abs(bleu_by_hand(add(b)) - bleu_by_hand(add(a))), 0
    for swap in swaps:
        x = [rb if s else ra for s, ra, rb in zip(swap, a, b)]
        y = [ra if s else rb for s, ra, rb in zip(swap, a, b)]
        c += abs(bleu_by_hand(add(y)) - bleu_by_hand(add(x))) > observed
    return c


def test_one_run_is_plain_ar_and_two_runs_share_out_the_pooled_translations():
    counts = []
    for a, b in [(A3[k], B3[k]) for k in (1, 2, 3)] + [(FLIP_A[k], FLIP_B[k]) for k in (1, 2)]:
        found = statistics.stratified_ar({1: np.array(a, dtype=float)}, {1: np.array(b, dtype=float)}, 300, seed=2)
        counts.append(found["count"])
        assert counts[-1] == plain_ar(a, b, (np.random.default_rng(2).random((300, len(a))) < 0.5).tolist())
    assert any(0 < c < 300 for c in counts), counts
    # 2 runs: a permutation of 2 runs is its own inverse, so X and Y hold every translation of both once
    x, y = statistics._shuffled(stacked(A), stacked(B), *our_draws(3, 200, 2, 5))
    assert np.array_equal(x.sum(1) + y.sum(1), np.broadcast_to(stacked(A).sum((0, 1)) + stacked(B).sum((0, 1)),
                                                              (200, 10)))
    # 3 runs: not so (a sentence whose 3 runs' permutation is a cycle)
    x, y = statistics._shuffled(stacked(A3), stacked(B3), *our_draws(3, 200, 3, 5))
    pooled = stacked(A3).sum((0, 1)) + stacked(B3).sum((0, 1))
    assert not all(np.array_equal(row, pooled) for row in x.sum(1) + y.sum(1))


SEEDS = os.path.join(REPO, "docs", "benchmarks", "cpu-multi30k-seeds")
MULTI30K_REFS = os.path.join(REPO, "docs", "benchmarks", "cpu-multi30k", "baseline", "multi30k-en-de.800",
                             "eval-test", "ref.detok")


def stored_seeds(row):
    """Seed -> the sentence statistics of the row's stored run (docs/benchmarks/cpu-multi30k-seeds)."""
    refs = read_lines(MULTI30K_REFS)
    return {s: statistics.sentence_stats(refs, read_lines(os.path.join(
        SEEDS, row, "multi30k-en-de.800" + ("" if s == 1 else f".seed{s}"), "eval-test", "hyp.detok")), "detok-cased")
        for s in (1, 2, 3)}


def test_stratified_ar_on_the_stored_seeds_is_multevals_p():
    """The 3-seed CPU table's rows against the baseline: MultEval's code with its own draws
    (Python's random, Fisher-Yates) gives the p of ours, within the shuffles' binomial noise."""
    baseline = stored_seeds("baseline")
    for row, theirs in (("m-00", 600), ("ms-1-plus-aif", 600)):
        system = stored_seeds(row)
        ours = statistics.stratified_ar(baseline, system, shuffles=4000)
        rnd = random.Random(2011)
        p = get_two_sided_p(rows({s: v.tolist() for s, v in baseline.items()}),
                            rows({s: v.tolist() for s, v in system.items()}), 3, theirs,
                            lambda shuffling, i: shuffling.shuffle(rnd))[1]
        sd = math.sqrt(p * (1 - p) * (1 / theirs + 1 / 4000))
        assert abs(ours["p_value"] - p) < 4 * sd, (row, ours["p_value"], p)


def test_stratified_ar_blocks_do_not_change_the_draws(monkeypatch):
    """The shuffles are drawn in blocks; blocks of 3 shuffles give the same p as one block."""
    whole = statistics.stratified_ar(arrays(A3), arrays(B3), shuffles=100, seed=5)
    monkeypatch.setattr(statistics, "BLOCK", 100)  # 100 doubles: 3 shuffles of 2 x 3 runs x 5 sentences
    blocks = statistics.stratified_ar(arrays(A3), arrays(B3), shuffles=100, seed=5)
    assert (blocks["count"], blocks["p_value"]) == (whole["count"], whole["p_value"])


def test_identical_systems_give_p_1_and_a_sentence_better_everywhere_a_small_p():
    same = statistics.stratified_ar(arrays(A3), arrays(A3), shuffles=200)  # MultEval: 1 / 201
    assert same["delta"] == 0 and same["count"] == 200 and same["p_value"] == 1.0
    # B better than A on every sentence of 40, in both runs: no shuffle reaches the observed gap
    rng = random.Random(0)
    worse, better = {}, {}
    for k in (1, 2):
        worse[k], better[k] = [], []
        for _ in range(40):
            n = rng.randint(8, 14)
            total = [n - i for i in range(4)]
            worse[k].append([n, n, *(t // 3 for t in total), *total])
            better[k].append([n, n, *(t - 1 for t in total), *total])
    found = statistics.stratified_ar(arrays(worse), arrays(better), shuffles=999)
    assert found["delta"] > 20 and found["count"] == 0 and found["p_value"] == 1 / 1000
    # one run: symmetric in the two systems
    one = statistics.stratified_ar({1: arrays(A)[1]}, {1: arrays(B)[1]}, shuffles=300, seed=2)
    back = statistics.stratified_ar({1: arrays(B)[1]}, {1: arrays(A)[1]}, shuffles=300, seed=2)
    assert one["p_value"] == back["p_value"] and one["delta"] == pytest.approx(-back["delta"])
    assert one["s_dev_system"] is None


def test_stratified_ar_refuses_what_it_cannot_pair():
    with pytest.raises(ValueError, match="no run of both"):
        statistics.stratified_ar({1: arrays(A)[1]}, {2: arrays(B)[2]})
    with pytest.raises(ValueError, match="--shuffles must be at least 1"):
        statistics.stratified_ar(arrays(A), arrays(B), shuffles=0)
    with pytest.raises(ValueError, match="differ in shape"):
        statistics.stratified_ar({1: arrays(A)[1]}, {1: arrays(B)[1][:4]})
    with pytest.raises(ValueError, match="statistic must be one of concatenated, mean"):
        statistics.stratified_ar(arrays(A), arrays(B), statistic="median")


def test_runs_of_other_lengths_empty_runs_and_a_nan_are_one_line_naming_the_run():
    """Not numpy's inhomogeneous shape, an IndexError, or p = 1.0 said of a NaN statistic."""
    a, b = arrays(A), arrays(B)
    nan = b[2].copy()
    nan[2, 5] = np.nan
    cases = [({1: a[1], 2: a[2][:4]}, {1: b[1], 2: b[2][:4]},
              "run 2 of the reference and run 1 of the reference differ in shape ((4, 10) and (5, 10)): every run "
              "must score the same sentences"),
             ({1: np.zeros((0, 10))}, {1: np.zeros((0, 10))}, "run 1 of the reference has no sentence statistics "
                                                              "(shape (0, 10))"),
             ({1: np.array([])}, {1: np.array([])}, "run 1 of the reference has no sentence statistics (shape (0,))"),
             (a, {**b, 2: nan}, "run 2 of the system: the statistic correct[3] of sentence 3 is nan, not a count")]
    for reference, system, message in cases:
        with pytest.raises(ValueError) as error:
            statistics.stratified_ar(reference, system, shuffles=10)
        assert str(error.value) == message and isinstance(error.value, FairseqExtError)  # one line from a command
    with pytest.raises(ValueError, match="run 0 of the system has no sentence statistics"):
        statistics.subsample_bootstrap(a[1], np.array([]))


def test_subsample_bootstrap_is_compare_mts_procedure():
    a, b = np.array(A[1] * 4, dtype=float), np.array(B[1] * 4, dtype=float)  # 20 sentences
    found = statistics.subsample_bootstrap(a, b, samples=200, seed=9)
    rng = np.random.default_rng(9)
    wins_b = wins_a = 0
    for _ in range(200):
        ids = rng.integers(0, 20, 10).tolist()  # int(0.5 * 20) with replacement
        score_a, score_b = (bleu_by_hand(add([rows[i].tolist() for i in ids])) for rows in (a, b))
        wins_b += score_b > score_a
        wins_a += score_a > score_b
    assert (found["system_wins"], found["reference_wins"]) == (wins_b / 200, wins_a / 200)
    assert found["better"] == "system" and found["better_in"] == wins_b / 200
    assert found["p_value"] == pytest.approx(1 - wins_b / 200)
    assert statistics.subsample_bootstrap(a, a, samples=50)["p_value"] == 1.0  # never strictly better


def test_holm_by_hand():
    # sorted: 0.01 * 3 = 0.03; 0.03 * 2 = 0.06; 0.04 * 1 = 0.04, raised to 0.06 (step-down is monotone)
    assert statistics.holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert statistics.holm([0.5, 0.2]) == pytest.approx([0.5, 0.4])
    assert statistics.holm([0.9, 0.8, 0.7]) == pytest.approx([1.0, 1.0, 1.0])
    assert statistics.holm([0.02]) == [0.02] and statistics.holm([]) == []


def test_selection_sd_is_the_bootstrap_spread_of_each_run():
    runs = arrays({1: A[1] * 10})
    spread = statistics.selection_sd(runs, samples=300, seed=4)
    rng = np.random.default_rng(4)
    rows = runs[1]
    scores = [bleu_by_hand(rows[rng.integers(0, 50, 50)].sum(0).tolist()) for _ in range(300)]
    assert spread == pytest.approx(float(np.std(scores, ddof=1)))


def sacrebleu_paired(metric, refs, base, hyps, test, samples, seed, confidence=-1):
    """sacreBLEU's own paired test of ``hyps`` against ``base`` (sacrebleu.significance, the code
    behind ``sacrebleu --paired-bs`` / ``--paired-ar``; SACREBLEU_SEED set to ``seed`` by the
    caller, as PairedTest reads it): (baseline Result with its bootstrap mean and CI, system Result)."""
    from sacrebleu.significance import Result, _bootstrap_resample, _paired_ar_test, _paired_bs_test, estimate_ci

    base_stats = metric._extract_corpus_statistics(base, [refs])
    base_score = metric._aggregate_and_compute(base_stats)
    base_result = Result(base_score.score)
    run = _paired_bs_test if test == "bs" else _paired_ar_test
    _, found = run({base_score.name: (base_stats, base_result)}, "x", hyps, [refs], {base_score.name: metric},
                   samples, confidence, seed)
    _, scores = _bootstrap_resample(base_stats, metric, samples if test == "bs" else confidence)
    base_result.mean, base_result.ci = estimate_ci(np.array([s.score for s in scores]))
    return base_result, found[base_score.name]


def small_corpus(seed, n=57):
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(30)] + ["the", "a", ".", ","]
    refs = [" ".join(rng.choice(words) for _ in range(rng.randint(1, 16))) for _ in range(n)]
    noisy = [[" ".join(w if rng.random() > p else rng.choice(words) for w in r.split()) for r in refs]
             for p in (0.3, 0.2)]
    return refs, noisy[0], noisy[1]


@pytest.mark.parametrize("test, samples, seed", [("bs", 1000, 12345), ("bs", 137, 3), ("ar", 500, 12345),
                                                 ("ar", 301, 8)])
def test_paired_tests_are_sacrebleus_to_the_last_bit(test, samples, seed, monkeypatch):
    """paired_bs and paired_ar on sentence statistics equal sacreBLEU's own tests exactly (the same
    draws from the same seed, sacreBLEU's float32 sums of resamples and its arithmetic): BLEU in
    two flavours, chrF2, chrF2++ and TER."""
    from fairseq_ext.standalone.bleu import metric as more_metric

    monkeypatch.setenv("SACREBLEU_SEED", str(seed))
    for corpus_seed in (0, 1):
        refs, base, hyps = small_corpus(corpus_seed)
        for metric in (statistics.bleu_metric("detok-cased"), statistics.bleu_metric("tok-lc"),
                       more_metric("chrF2", False), more_metric("chrF2++", True), more_metric("TER", False)):
            confidence = 1000 if test == "ar" else -1
            want_base, want = sacrebleu_paired(metric, refs, base, hyps, test, samples, seed, confidence)
            score = statistics.scorer(metric)
            a, b = (statistics.sentence_stats(refs, h, metric) for h in (base, hyps))
            got = (statistics.paired_bs(a, b, score, samples, seed) if test == "bs" else
                   statistics.paired_ar(a, b, score, samples, seed, confidence))
            assert (got["score"], got["p_value"], got["mean"], got["ci"]) == (
                want.score, want.p_value, want.mean, want.ci), (type(metric).__name__, corpus_seed)
            got_base = statistics.bootstrap_ci(a, score, samples if test == "bs" else confidence, seed)
            assert (got_base["mean"], got_base["ci"]) == (want_base.mean, want_base.ci)
            assert float(score(a.sum(0)[None])[0]) == want_base.score


def test_corpus_bleu_of_float32_sums_is_sacrebleus_resample_score():
    """sacreBLEU scores a bootstrap resample from float32 sums, in float32 arithmetic (numpy 2)."""
    metric = statistics.bleu_metric("detok-cased")
    rng = np.random.default_rng(0)
    for _ in range(200):
        total = rng.integers(0, 60, 4).cumsum()[::-1].astype(float)
        stats = np.array([max(0, total[0] + rng.integers(-3, 3)), rng.integers(1, 70), *(total * rng.random(4)).round(),
                          *total], dtype=np.float32)
        stats[2:6] = np.minimum(stats[2:6], stats[6:10])
        assert float(statistics.corpus_bleu(stats[None])[0]) == metric._compute_score_from_stats(stats).score, stats
