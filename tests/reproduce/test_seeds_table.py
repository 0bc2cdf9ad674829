"""A table trained with several seeds (``fairseq-ext reproduce TABLE --seeds 1,2,3``): one run
directory per row and seed, the one-seed directory kept for seed 1; the table shows mean ± sd
over seeds, Δ as the mean of the per-seed differences, and a mark only where every seed's
paired bootstrap is significant with one sign; its files never replace a one-seed table.

Runs here are hand-made run directories (result.json, significance.json), as in
reproduce_utils.py."""
import json
import os
import statistics

import pytest
from scipy.stats import ttest_rel

from fairseq_ext.errors import FairseqExtError
from fairseq_ext.reproduce import __main__ as cli
from fairseq_ext.reproduce import planning
from fairseq_ext.reproduce.tables import load_setups, load_table
from reproduce_utils import BLEU, SEEDS, SIG, make_seed_runs, options, report_cli, write_seed_runs

def test_seeds_plan_one_run_directory_per_row_and_seed(tmp_path, capsys):
    table = load_table("thesis-3.2")
    rows = table.select("m-10")
    setups = load_setups()
    single = planning.plan_table(table, rows, setups, options(tmp_path))
    by_seed = planning.plan_seeds(table, rows, setups, options(tmp_path), SEEDS)
    assert list(by_seed) == SEEDS
    for i, p in enumerate(single):
        runs = [by_seed[s][i] for s in SEEDS]
        assert len({r.run_dir for r in runs}) == 3 and all(r.row == p.row for r in runs)
        assert [r.train[r.train.index("--seed") + 1] for r in runs] == ["1", "2", "3"]
        assert runs[0].run_dir == p.run_dir  # seed 1 reuses the one-seed run
        assert runs[1].run_dir == p.run_dir + ".seed2"
    # one seed, --seed or --seeds: the directory of today, with that seed
    (alone,) = planning.plan_seeds(table, rows, setups, options(tmp_path), [2]).values()
    assert [p.run_dir for p in alone] == [p.run_dir for p in single]
    assert all(p.train[p.train.index("--seed") + 1] == "2" for p in alone)
    # the dry run prints every seed's commands
    cli.main(["thesis-3.2", "--rows", "m-10", "--dry-run", "--smoke", "--budget", "60", "--seeds", "1,2,3",
              "--work-dir", str(tmp_path / "runs"), "--data-root", str(tmp_path / "data")])
    out = capsys.readouterr().out
    for s in SEEDS:
        for p in by_seed[s]:
            assert planning.shell_line(p.train) in out
    assert "table.smoke.60.seeds-1-2-3.rows-m-10.{md,csv,json,tex}" in out


@pytest.mark.parametrize("argv, message", [
    (["--seeds", "1,two"], "--seeds: expected a comma list of integers"),
    (["--seeds", "1,2,1"], "--seeds: a seed appears twice"),
    (["--seeds", "1,2", "--seed", "3"], "--seed 3 and --seeds 1,2 disagree"),
])
def test_bad_seeds_name_the_option(tmp_path, argv, message):
    with pytest.raises(FairseqExtError, match=message):
        cli.main(["mma-4", "--dry-run", *argv, "--work-dir", str(tmp_path / "runs")])


def _line(out, label):
    return next(line for line in out.splitlines() if line.startswith(f"| {label} |"))


def test_seeds_table_shows_mean_sd_and_marks_only_what_holds_at_every_seed(tmp_path, capsys):
    out_dir = tmp_path / "runs" / "mma-4"
    make_seed_runs(tmp_path)
    # the one-seed table of seed 1 first: the seeds table is written beside it
    assert report_cli(tmp_path, "mma-4", "--budget", "60") == 0
    single = (out_dir / "table.smoke.60.md").read_text()
    capsys.readouterr()
    assert report_cli(tmp_path, "mma-4", "--budget", "60", "--seeds", "1,2,3", "--test", "bootstrap") == 0
    out = capsys.readouterr().out
    assert (out_dir / "table.smoke.60.md").read_text() == single
    assert (out_dir / "table.smoke.60.seeds-1-2-3.md").read_text().startswith("## mma-4")
    with open(out_dir / "table.smoke.60.seeds-1-2-3.json") as f:
        records = {r["row"]: r for r in json.load(f)["rows"]}
    base = BLEU["transformer"]
    for row, bleu in BLEU.items():
        cell = records[row]["columns"]["BLEU"]
        values = [bleu[s] for s in SEEDS]
        assert cell["ours"] == pytest.approx(statistics.mean(values)) and cell["n"] == 3
        assert cell["sd"] == pytest.approx(statistics.stdev(values))
        assert f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f}" in _line(out, records[row]["label"])
        if row == "transformer":
            continue
        deltas = [bleu[s] - base[s] for s in SEEDS]
        assert records[row]["columns"]["Δ"]["ours"] == pytest.approx(statistics.mean(deltas))
        assert cell["p_value"] == max(p for p, _ in SIG[row].values())  # p_max
        assert cell["p_t"] == pytest.approx(ttest_rel(values, [base[s] for s in SEEDS]).pvalue)
    # significant at every seed, above at every seed: the weakest seed's mark
    assert records["plus-mma"]["columns"]["BLEU"]["mark"] == "†" == records["plus-mma"]["mark"]
    assert "| † p_max=0.030 p_t=" in _line(out, "+ MMA")
    # not significant at seed 2; below the transformer at seed 2: no mark
    for row in ("plus-local-attention", "plus-forward-attention", "plus-backward-attention"):
        assert records[row]["columns"]["BLEU"]["mark"] == "", row
    assert "|  p_max=0.200 p_t=" in _line(out, "+ Local Attention")
    for said in ("training: 60 updates per row (60 of 60 updates done), CPU, seeds 1, 2, 3",
                 "Seeds: 3 (1, 2, 3)", "significant at every seed with one sign", "paired t-test over seeds"):
        assert said in out, said
    # the exports carry mean, sd and n
    csv_text = (out_dir / "table.smoke.60.seeds-1-2-3.csv").read_text()
    assert "BLEU | sd" in csv_text and "BLEU | n" in csv_text and "BLEU | p_t" in csv_text
    tex = (out_dir / "table.smoke.60.seeds-1-2-3.tex").read_text()
    mma = list(BLEU["plus-mma"].values())
    assert f"+ MMA & Transformer & 3 & 35.41 & {statistics.mean(mma):.2f} \\(\\pm\\) {statistics.stdev(mma):.2f}" \
        "\\(^{\\dagger}\\)" in tex
    # and the one-seed table, written again, leaves the seeds table as it was
    seeds_md = (out_dir / "table.smoke.60.seeds-1-2-3.md").read_text()
    assert report_cli(tmp_path, "mma-4", "--budget", "60") == 0
    assert (out_dir / "table.smoke.60.seeds-1-2-3.md").read_text() == seeds_md


def test_a_missing_seed_is_reported_not_averaged(tmp_path, capsys):
    by_seed = make_seed_runs(tmp_path)
    missing = next(p for p in by_seed[2] if p.row == "plus-mma")
    os.remove(os.path.join(missing.run_dir, "result.json"))
    assert report_cli(tmp_path, "mma-4", "--budget", "60", "--seeds", "1,2,3", "--test", "bootstrap") == 0
    out = capsys.readouterr().out
    out_dir = tmp_path / "runs" / "mma-4"
    assert not (out_dir / "table.smoke.60.seeds-1-2-3.md").exists()
    with open(out_dir / "table.smoke.60.seeds-1-2-3.partial.json") as f:
        record = next(r for r in json.load(f)["rows"] if r["row"] == "plus-mma")
    cell = record["columns"]["BLEU"]
    values = [BLEU["plus-mma"][s] for s in (1, 3)]
    assert cell["n"] == 2 and cell["ours"] == pytest.approx(statistics.mean(values))
    assert cell["sd"] == pytest.approx(statistics.stdev(values))
    assert record["seeds_done"] == [1, 3] and "seed 2: not run" in record["missing"]
    assert "| + MMA | Transformer | 2 of 3 |" in out
    assert "Incomplete: + MMA (iwslt14-de-en): seed 2: not run" in out


def test_a_table_no_paper_prints_shows_only_ours_and_one_parameter_count(tmp_path, capsys):
    """configs/benchmarks/cpu-multi30k.yaml (a benchmark of ours, no printed numbers) with two
    seeds: no "paper" sub-columns, each column's name heads ours; #Params, the same at every
    seed, once with 2 decimals (2.41, not "2.4 ± 0.0"); BLEU as mean ± sd."""
    table = load_table("configs/benchmarks/cpu-multi30k.yaml")
    opts = options(tmp_path)
    by_seed = planning.plan_seeds(table, table.select("mma"), load_setups(), opts, [1, 2])
    bleu = {("baseline", 1): 28.0, ("baseline", 2): 28.5, ("mma", 1): 30.0, ("mma", 2): 29.0}
    write_seed_runs(by_seed, lambda row, seed: bleu[row, seed], params=2_412_800)
    assert report_cli(tmp_path, "configs/benchmarks/cpu-multi30k.yaml", "--rows", "mma", "--budget", "60",
                      "--seeds", "1,2") == 0
    out = capsys.readouterr().out
    assert ": paper |" not in out and "| BLEU: ours | Δ ours | sig. (pipeline check) | chrF: ours | #Params (M): ours |" in out
    assert "| MMA (G,L,F,B) | Transformer (no option) | 2 | 29.50 ± 0.71 | +1.25 ± 1.06 |" in out
    assert "| 2.41 |" in out and "± 0.00" not in out
    assert "No paper prints these numbers: every column is ours" in out
    assert "vs: the row's reference row; Δ ours and ratio ours are against that row's run." in out
