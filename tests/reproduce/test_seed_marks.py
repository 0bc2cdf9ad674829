"""The marks of a table's BLEU column and what stands beside them (``fairseq-ext reproduce
--test / --shuffles / --correction``): the stratified approximate randomization over seeds as
the default of several seeds, compare-mt's bootstrap as the thesis ran it, the count of
comparisons and Holm's correction; one set of seeds per row (those it shares with its reference
row) for every number of the row; speeds whose spread over seeds is load, not shown as numbers.

Runs here are hand-made run directories (result.json, eval-test/, significance.json), as in
test_seeds_table.py."""
import json
import os
import statistics

import pytest

from fairseq_ext.errors import FairseqExtError
from fairseq_ext.reproduce import __main__ as cli
from fairseq_ext.reproduce import planning
from fairseq_ext.reproduce.tables import load_setups, load_table
from fairseq_ext.tools import statistics as stats
from reproduce_utils import BLEU, make_seed_runs, options, report_cli, write_seed_runs

CPU = "configs/benchmarks/cpu-multi30k.yaml"
REFS = [f"a small dog number {i} runs over the green grass near the old house ." for i in range(24)]


def worse(i, line):
    """The baseline's translation: two of its words wrong, differently per sentence."""
    words = line.split()
    words[i % 5] = "cat"
    words[5 + i % 4] = "blue"
    return " ".join(words)


def write_texts(plan, hyps):
    where = os.path.join(plan.run_dir, "eval-test")
    os.makedirs(where, exist_ok=True)
    for name, lines in (("hyp.detok", hyps), ("ref.detok", REFS), ("hyp.tok", hyps), ("ref.tok", REFS)):
        with open(os.path.join(where, name), "w") as f:
            f.write("\n".join(lines) + "\n")


def cpu_runs(tmp_path, seeds, results=None):
    """Finished runs of the CPU benchmark's baseline and MMA rows: MMA translates every sentence
    right, the baseline gets two words of each wrong (at seed 2, the first 4 sentences right)."""
    table = load_table(CPU)
    by_seed = planning.plan_seeds(table, table.select("mma"), load_setups(), options(tmp_path), seeds)
    results = results or {}
    for seed, plans in by_seed.items():
        for p in plans:
            os.makedirs(p.run_dir, exist_ok=True)
            hyps = REFS if p.row == "mma" else [r if seed == 2 and i < 4 else worse(i, r) for i, r in enumerate(REFS)]
            write_texts(p, hyps)
    write_seed_runs(by_seed, lambda row, seed: 30.0 if row == "mma" else 20.0 + seed)
    for seed, plans in by_seed.items():  # per-seed measurements on top of BLEU
        for p in plans:
            path = os.path.join(p.run_dir, "result.json")
            with open(path) as f:
                result = json.load(f)
            result.update(results.get((p.row, seed), {}))
            with open(path, "w") as f:
                json.dump(result, f)
    return by_seed


def stats_of(plan):
    with open(os.path.join(plan.run_dir, "eval-test", "hyp.detok")) as f:
        hyps = f.read().splitlines()
    return stats.sentence_stats(REFS, hyps, "detok-cased")


def test_several_seeds_are_marked_by_the_stratified_randomization_over_them(tmp_path, capsys):
    by_seed = cpu_runs(tmp_path, [1, 2])
    assert report_cli(tmp_path, CPU, "--rows", "mma", "--budget", "60", "--seeds", "1,2", "--shuffles", "999") == 0
    out = capsys.readouterr().out
    out_dir = tmp_path / "runs" / "cpu-multi30k"
    with open(out_dir / "table.smoke.60.seeds-1-2.rows-mma.json") as f:
        record = next(r for r in json.load(f)["rows"] if r["row"] == "mma")
    cell = record["columns"]["BLEU"]
    plans = {(s, p.row): p for s, ps in by_seed.items() for p in ps}
    expected = stats.stratified_ar({s: stats_of(plans[s, "baseline"]) for s in (1, 2)},
                                             {s: stats_of(plans[s, "mma"]) for s in (1, 2)}, 999)
    assert cell["test"] == record["test"] == "ar" and cell["test_name"] == "stratified approximate randomization"
    assert cell["p_value"] == round(expected["p_value"], 4) == round(1 / 1000, 4) and cell["mark"] == "‡"
    assert cell["ar"]["delta"] == pytest.approx(expected["delta"]) and cell["ar"]["shuffles"] == 999
    assert cell["ar"]["s_dev_reference"] == pytest.approx(expected["s_dev_reference"])
    assert cell["ar"]["s_sel_system"] is not None and cell["ar"]["runs"] == [1, 2]
    assert "stratified approximate randomization over seeds 1 and 2 (999 shuffles)" in cell["rule"]
    line = next(line for line in out.splitlines() if line.startswith("| MMA (G,L,F,B) |"))
    assert "| ‡ p=0.001 p_t=" in line and "p_max" not in line  # the t-test over seeds beside it
    assert cell["ar"]["statistic"] == "concatenated" and cell["ar"]["system_concatenated"] == pytest.approx(
        expected["system_concatenated"])
    for said in ("stratified approximate randomization (Clark et al. 2011, as MultEval runs it; 999 shuffles)",
                 "the corpus BLEU of each row's runs concatenated (MultEval's)",
                 "permuted at random across the seeds sentence by sentence",
                 "Comparisons: 1 against Transformer (no option) (multi30k-en-de)",
                 "not corrected for multiplicity"):
        assert said in out, said
    csv_text = (out_dir / "table.smoke.60.seeds-1-2.rows-mma.csv").read_text()
    assert "BLEU | test" in csv_text and "stratified approximate randomization" in csv_text
    tex = (out_dir / "table.smoke.60.seeds-1-2.rows-mma.tex").read_text()
    assert "Marks: stratified approximate randomization" in tex
    # the result is kept beside the row's first run and reused while its inputs are the same
    cache = os.path.join(plans[1, "mma"].run_dir, "significance-ar.json")
    with open(cache) as f:
        kept = json.load(f)
    kept["p_value"] = 0.5
    with open(cache, "w") as f:
        json.dump(kept, f)
    assert report_cli(tmp_path, CPU, "--rows", "mma", "--budget", "60", "--seeds", "1,2", "--shuffles", "999") == 0
    assert "| MMA (G,L,F,B) |" in capsys.readouterr().out
    with open(out_dir / "table.smoke.60.seeds-1-2.rows-mma.json") as f:
        assert next(r for r in json.load(f)["rows"] if r["row"] == "mma")["columns"]["BLEU"]["p_value"] == 0.5
    # the mean over seeds of per-run BLEU, by name: a statistic of its own, not the cached result
    assert report_cli(tmp_path, CPU, "--rows", "mma", "--budget", "60", "--seeds", "1,2", "--shuffles", "999",
                      "--ar-statistic", "mean") == 0
    assert "the mean over seeds of per-run corpus BLEU (--ar-statistic mean; not MultEval's)" in capsys.readouterr().out
    with open(out_dir / "table.smoke.60.seeds-1-2.rows-mma.json") as f:
        ar = next(r for r in json.load(f)["rows"] if r["row"] == "mma")["columns"]["BLEU"]["ar"]
    assert ar["statistic"] == "mean" and ar["delta"] == pytest.approx(expected["system_mean"] - expected["reference_mean"])


def test_the_thesis_test_is_compare_mts_subsample_bootstrap(tmp_path, capsys):
    by_seed = cpu_runs(tmp_path, [1])
    assert report_cli(tmp_path, CPU, "--rows", "mma", "--budget", "60", "--test", "thesis", "--samples", "200") == 0
    out = capsys.readouterr().out
    plans = {p.row: p for p in by_seed[1]}
    with open(os.path.join(plans["mma"].run_dir, "significance.json")) as f:
        entry = json.load(f)
    expected = stats.subsample_bootstrap(stats_of(plans["baseline"]), stats_of(plans["mma"]), 200)
    assert entry["test"] == "thesis" and entry["p_value"] == round(expected["p_value"], 4)
    assert entry["better"] == "system" and entry["better_in"] == expected["better_in"] == 1.0
    assert "compare-mt's paired bootstrap as the thesis ran it (200 subsamples of half the sentences, one-sided" in out
    # the bootstrap of sacreBLEU replaces it when asked for
    assert report_cli(tmp_path, CPU, "--rows", "mma", "--budget", "60", "--test", "bootstrap") == 0
    with open(os.path.join(plans["mma"].run_dir, "significance.json")) as f:
        assert json.load(f)["test"] == "bootstrap"
    assert "sacreBLEU paired bootstrap (1000 samples, two-sided, full-size resamples)" in capsys.readouterr().out


def test_holm_corrects_the_rows_tested_against_one_reference_row(tmp_path, capsys):
    """Seed 2 of mma-4 (hand-made p): + MMA p = 0.03 (†), + Forward p = 0.01, + Local 0.2,
    + Backward 0.4. Holm over the 4: 0.01 x 4 = 0.04 (†), 0.03 x 3 = 0.09 (no mark)."""
    make_seed_runs(tmp_path, seeds=[2])
    out_dir = tmp_path / "runs" / "mma-4"
    assert report_cli(tmp_path, "mma-4", "--budget", "60", "--seed", "2") == 0
    out = capsys.readouterr().out
    assert "Comparisons: 4 against Transformer (iwslt14-de-en); marks not corrected" in out
    assert "| † p=0.030 |" in next(line for line in out.splitlines() if line.startswith("| + MMA |"))
    assert report_cli(tmp_path, "mma-4", "--budget", "60", "--seed", "2", "--correction", "holm") == 0
    out = capsys.readouterr().out
    with open(out_dir / "table.smoke.60.json") as f:
        cells = {r["row"]: r["columns"]["BLEU"] for r in json.load(f)["rows"]}
    assert cells["plus-mma"]["p_holm"] == pytest.approx(0.09) and cells["plus-mma"]["mark"] == ""
    assert cells["plus-forward-attention"]["p_holm"] == pytest.approx(0.04)
    assert cells["plus-forward-attention"]["mark"] == "†"
    assert all(c["comparisons"] == 4 for row, c in cells.items() if row != "transformer")
    assert "|  p=0.030 p_holm=0.090 |" in next(line for line in out.splitlines() if line.startswith("| + MMA |"))
    assert "Comparisons: 4 against Transformer (iwslt14-de-en); marks Holm-corrected" in out


def test_a_row_counts_only_the_seeds_its_reference_row_ran(tmp_path, capsys):
    """The Transformer has no seed 3: + MMA's mean, sd, Δ and test are all over seeds 1 and 2,
    and seed 3 is named as left out."""
    by_seed = make_seed_runs(tmp_path)
    os.remove(os.path.join(next(p for p in by_seed[3] if p.row == "transformer").run_dir, "result.json"))
    assert report_cli(tmp_path, "mma-4", "--budget", "60", "--seeds", "1,2,3") == 0
    out = capsys.readouterr().out
    with open(tmp_path / "runs" / "mma-4" / "table.smoke.60.seeds-1-2-3.partial.json") as f:
        record = next(r for r in json.load(f)["rows"] if r["row"] == "plus-mma")
    cell = record["columns"]["BLEU"]
    mma = [BLEU["plus-mma"][s] for s in (1, 2)]
    assert cell["n"] == 2 and cell["ours"] == pytest.approx(statistics.mean(mma))
    assert record["seeds_counted"] == [1, 2] and record["seeds_done"] == [1, 2, 3]
    assert cell["sd"] == pytest.approx(statistics.stdev(mma)) and cell["tested_seeds"] == [1, 2]
    assert record["columns"]["Δ"]["ours"] == pytest.approx(statistics.mean(
        [BLEU["plus-mma"][s] - BLEU["transformer"][s] for s in (1, 2)]))
    line = next(line for line in out.splitlines() if line.startswith("| + MMA |"))
    assert "| 2 of 3 |" in line and f"{statistics.mean(mma):.2f} ± {statistics.stdev(mma):.2f}" in line
    assert "seed 3: left out (no finished run of the reference row Transformer" in out


def test_speeds_that_vary_like_the_load_are_not_shown_as_numbers(tmp_path, capsys):
    decode = {("baseline", 1): 10.0, ("baseline", 2): 150.0, ("mma", 1): 20.0, ("mma", 2): 22.0}
    ups = {("baseline", 1): 2.0, ("baseline", 2): 2.2, ("mma", 1): 1.0, ("mma", 2): 3.0}
    cpu_runs(tmp_path, [1, 2], {key: {"decode_sents_per_s": decode[key], "train_ups": ups[key]} for key in decode})
    assert report_cli(tmp_path, CPU, "--rows", "mma", "--budget", "60", "--seeds", "1,2") == 0
    out = capsys.readouterr().out
    lines = {row: next(line for line in out.splitlines() if line.startswith(f"| {row} |"))
             for row in ("Transformer (no option)", "MMA (G,L,F,B)")}
    cells = lines["Transformer (no option)"].split(" | ")
    assert "2.10 ± 0.14" in cells and "—" in cells and "80.00" not in lines["Transformer (no option)"]
    cells = lines["MMA (G,L,F,B)"].split(" | ")
    # MMA's own decoding speed holds (sd 7% of the mean), its ratio to a noisy baseline does not;
    # its training speed (1.0 and 3.0) does not either
    assert "21.00 ± 1.41" in cells and "2.00 ± 1.41" not in cells and lines["MMA (G,L,F,B)"].count("—") == 3
    assert ("—: timing noise, not a result: Decode of Transformer (no option): sd 124% of the mean; "
            "Train (steps/s) of MMA (G,L,F,B): sd 71% of the mean; Decode ratio of MMA (G,L,F,B) (its reference "
            "row's Decode: sd 124% of the mean) over seeds (more than 25%") in out
    assert "measure speeds with fairseq-ext benchmark" in out


@pytest.mark.parametrize("argv, message", [
    (["--test", "iu"], "--test: invalid choice: 'iu'"),
    (["--correction", "bonferroni"], "--correction: invalid choice"),
])
def test_bad_test_options_name_the_option(tmp_path, capsys, argv, message):
    with pytest.raises(SystemExit):
        cli.main(["mma-4", "--dry-run", *argv, "--work-dir", str(tmp_path / "runs")])
    assert message in capsys.readouterr().err


def test_shuffles_must_be_positive(tmp_path):
    with pytest.raises(FairseqExtError, match="--shuffles must be at least 1, not 0"):
        cli.main(["mma-4", "--dry-run", "--shuffles", "0", "--work-dir", str(tmp_path / "runs")])
