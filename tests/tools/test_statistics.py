"""fairseq_ext.tools.statistics: corpus BLEU from summed statistics against sacreBLEU's
own, the stratified approximate randomization against a plain-Python recomputation of its
definition on a hand-made example (2 runs x 5 sentences), its degenerate cases, compare-mt's
subsample bootstrap recomputed the same way, Holm's adjustment by hand, and the paired bootstrap
and approximate randomization against sacreBLEU's own (sacrebleu.significance), bit for bit."""
import math
import random

import numpy as np
import pytest
from sacrebleu.metrics import BLEU

from fairseq_ext.tools import statistics


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


def multeval_ar(a, b, shuffles, seed):
    """MultEval's StratifiedApproximateRandomizationTest.getTwoSidedP transcribed to plain
    Python: each system's data points are its runs' sentences concatenated (run by run, runs
    paired by position); overallDiff = |BLEU(sum of B's rows) - BLEU(sum of A's rows)|; each
    shuffle draws one coin per data point and builds X from A's row where the coin says keep,
    else B's, and Y from the other; c counts |BLEU(X) - BLEU(Y)| reaching overallDiff. The
    coins: the doubles of default_rng(seed) in the order (shuffle, data point), below 0.5 = swap."""
    runs = sorted(a)
    rows_a = [row for k in runs for row in a[k]]
    rows_b = [row for k in runs for row in b[k]]
    observed = bleu_by_hand(add(rows_b)) - bleu_by_hand(add(rows_a))
    doubles = np.random.default_rng(seed).random((shuffles, len(rows_a))).tolist()
    c = 0
    for r in range(shuffles):
        x = [rb if doubles[r][i] < 0.5 else ra for i, (ra, rb) in enumerate(zip(rows_a, rows_b))]
        y = [ra if doubles[r][i] < 0.5 else rb for i, (ra, rb) in enumerate(zip(rows_a, rows_b))]
        c += abs(bleu_by_hand(add(y)) - bleu_by_hand(add(x))) >= abs(observed) - 1e-9
    return observed, c, (c + 1) / (shuffles + 1)


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


@pytest.mark.parametrize("case", ["hand", "flip"])
def test_stratified_ar_is_multevals(case):
    a, b = (A, B) if case == "hand" else (FLIP_A, FLIP_B)
    observed, c, p = multeval_ar(a, b, 400, 7)
    found = statistics.stratified_ar(arrays(a), arrays(b), shuffles=400, seed=7)
    assert found["statistic"] == "concatenated" and found["delta"] == pytest.approx(observed, abs=1e-9)
    assert (found["count"], found["p_value"]) == (c, p)
    assert found["system_concatenated"] - found["reference_concatenated"] == pytest.approx(observed)
    if case == "flip":  # the old statistic, still there by name, says the opposite
        mean = statistics.stratified_ar(arrays(a), arrays(b), shuffles=400, seed=7, statistic="mean")
        assert observed == pytest.approx(-2.248, abs=1e-3) and mean["delta"] == pytest.approx(6.484, abs=1e-3)
        assert mean["delta"] == pytest.approx(found["system_mean"] - found["reference_mean"])
        assert (mean["count"], mean["p_value"]) == ar_by_hand(a, b, 400, 7)[1:]


def ar_by_hand(a, b, shuffles, seed):
    """statistic="mean": the statistic is mean over runs of BLEU(B) - mean of BLEU(A); each
    shuffle swaps sentence i of run pair k when the next double of default_rng(seed) (order:
    shuffle, run, sentence) is below 0.5; p = (c + 1) / (R + 1), c = #{|shuffled| >= |observed|}."""
    runs = sorted(a)
    observed = (sum(bleu_by_hand(add(b[k])) for k in runs) - sum(bleu_by_hand(add(a[k])) for k in runs)) / len(runs)
    doubles = np.random.default_rng(seed).random((shuffles, len(runs), len(a[runs[0]]))).tolist()
    c = 0
    for r in range(shuffles):
        total = 0.0
        for j, k in enumerate(runs):
            new_a = [b[k][i] if doubles[r][j][i] < 0.5 else a[k][i] for i in range(len(a[k]))]
            new_b = [a[k][i] if doubles[r][j][i] < 0.5 else b[k][i] for i in range(len(a[k]))]
            total += bleu_by_hand(add(new_b)) - bleu_by_hand(add(new_a))
        c += abs(total / len(runs)) >= abs(observed) - 1e-9
    return observed, c, (c + 1) / (shuffles + 1)


def arrays(runs):
    return {k: np.array(v, dtype=float) for k, v in runs.items()}


@pytest.mark.parametrize("seed", [1, 12345])
def test_stratified_ar_mean_statistic_is_its_definition(seed):
    observed, c, p = ar_by_hand(A, B, 500, seed)
    found = statistics.stratified_ar(arrays(A), arrays(B), shuffles=500, seed=seed, statistic="mean")
    assert found["delta"] == pytest.approx(observed, abs=1e-9) and observed > 0
    assert (found["count"], found["p_value"]) == (c, p)
    assert 0 < c < 500  # a case that is neither extreme
    assert found["runs"] == [1, 2]
    by_run = {k: bleu_by_hand(add(B[k])) for k in (1, 2)}
    assert found["system_bleu"] == pytest.approx(by_run)
    assert found["s_dev_system"] == pytest.approx(abs(by_run[1] - by_run[2]) / math.sqrt(2))


def test_stratified_ar_blocks_do_not_change_the_draws(monkeypatch):
    """The shuffles are drawn in blocks; blocks of 7 shuffles give the same p as one block."""
    whole = statistics.stratified_ar(arrays(A), arrays(B), shuffles=100, seed=5)
    monkeypatch.setattr(statistics, "BLOCK", 70)  # 70 doubles: 7 shuffles of 2 runs x 5 sentences
    blocks = statistics.stratified_ar(arrays(A), arrays(B), shuffles=100, seed=5)
    assert (blocks["count"], blocks["p_value"]) == (whole["count"], whole["p_value"]) == multeval_ar(A, B, 100, 5)[1:]


def test_identical_systems_give_p_1_and_a_sentence_better_everywhere_a_small_p():
    same = statistics.stratified_ar(arrays(A), arrays(A), shuffles=200)
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
    # one run: the plain approximate randomization, symmetric in the two systems
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
