"""The table runner (scripts/reproduce.sh, fairseq_ext.reproduce): every results table of
paper-tables.json is configured with every row and printed number; every row's flags build
the model the table's #Params column describes; --list and --dry-run cover every table;
the side-by-side report computes its deltas and ratios; and (slow) one table runs end to
end at a tiny budget: data, training, evaluation, significance, table."""
import csv
import dataclasses
import json
import logging
import os
import shutil
import subprocess

import pytest

from fairseq_ext.errors import FairseqExtError
from fairseq_ext.reproduce import __main__ as cli
from fairseq_ext.reproduce import execute, params, planning
from fairseq_ext.reproduce.readers import scale_lines, scales
from fairseq_ext.reproduce.render import markdown, write_reports
from fairseq_ext.reproduce.rows import build_rows
from fairseq_ext.reproduce.tables import TableConfigError, load_setups, load_table, load_tables, table_ids, with_comet
from model_utils import MULTI30K, REPO

# every row of the papers' results tables with its printed numbers, written from the papers'
# table list (paper-tables.json) when the table configs were first written
PRINTED = os.path.join(os.path.dirname(__file__), "..", "fixtures", "paper-tables-printed.json")


def test_every_table_row_and_printed_number_is_configured():
    with open(PRINTED, encoding="utf-8") as f:
        printed_tables = json.load(f)
    tables = {t.id: t for t in load_tables()}
    expected_ids = set(printed_tables)
    for tid, rows in printed_tables.items():
        ours = tables[tid]
        papers = [r for r in ours.rows if not r.ours_only]  # our own reference rows print no paper number
        assert all(not r.paper for r in ours.rows if r.ours_only), tid
        assert len(papers) == len(rows), tid
        for theirs, row in zip(rows, papers):
            assert bool(row.cited) == theirs["cited"], (tid, row.id)
            kept = sorted(v for cells in row.paper.values() for v in cells.values())
            assert kept == theirs["printed"], (tid, row.id)
    assert set(tables) == expected_ids
    # every row the papers print that is not another system's cited number is ours to run, and so
    # is every reference row of our own
    printed_own = sum(not theirs["cited"] for rows in printed_tables.values() for theirs in rows)
    ours_only = sum(r.ours_only for t in tables.values() for r in t.rows)
    assert sum(r.runnable for t in tables.values() for r in t.rows) == printed_own + ours_only


def test_every_row_builds_and_every_params_column_matches():
    """The flags of every own row build (fairseq's parser, device meta), and each row with
    a printed #Params differs from its baseline by the paper's difference; the two rows whose
    printed numbers the paper itself contradicts are recorded and still differ (if they ever
    match, the note is stale)."""
    logging.disable(logging.WARNING)
    try:
        checked, noted, known = 0, set(), set()
        for table in load_tables():
            for row in table.rows:
                if row.runnable:
                    assert params.count(row.flags) > 0
                if row.params_check:
                    noted.add((table.id, row.id))
            for row_id, dataset, paper, ours, ok, note in params.check_table(table):
                checked += 1
                if note:
                    known.add((table.id, row_id))
                    assert not ok, f"{table.id} {row_id}: matches now; remove its params_check note"
                else:
                    assert ok, f"{table.id} {row_id} ({dataset}): paper {paper:+.2f}M, ours {ours:+.2f}M"
        assert known == noted and checked > len(noted)  # every note is on a row that is checked
    finally:
        logging.disable(logging.NOTSET)


def test_params_check_fails_for_a_wrong_row(tmp_path):
    """A row whose flags miss its technique (here M-10 without --joint-attention-layers 3) fails."""
    table = load_table("thesis-3.4")
    row = table.row("m-10-n-3")
    row.flags = [f for f in row.flags if f not in ("--joint-attention-layers", "3")]
    logging.disable(logging.WARNING)
    try:
        results = {r[0]: r for r in params.check_table(table)}
    finally:
        logging.disable(logging.NOTSET)
    assert results["m-10-n-3"][4] is False and results["m-10-n-2"][4] is True


def test_list_and_dry_run_cover_every_table(capsys):
    assert cli.main(["--list"]) == 0
    listing = capsys.readouterr().out
    ids = table_ids()
    with open(PRINTED, encoding="utf-8") as f:
        assert set(ids) == set(json.load(f))  # every results table of the five papers
    assert all(f"\n{t} " in "\n" + listing for t in ids)
    setups = load_setups()
    for tid in ids:
        assert cli.main(["--list", tid]) == 0
        assert cli.main([tid, "--dry-run", "--work-dir", "/nonexistent/runs", "--data-root", "/nonexistent/data"]) == 0
        out = capsys.readouterr().out
        table = load_table(tid, setups=setups)
        for row in table.rows:
            if row.runnable:  # a row that reports on another row's model is listed with that model
                assert f"/ {table.owner(row).id} [" in out and f"{row.id} [" in out, (tid, row.id)
        assert "fairseq-ext train " in out and "fairseq-ext evaluate " in out
        assert "--headline" in out


def test_dry_run_commands_carry_the_rows_flags_and_the_papers_settings(capsys):
    cli.main(["thesis-3.2", "--dry-run", "--rows", "m-10", "--work-dir", "/w", "--data-root", "/d"])
    out = capsys.readouterr().out
    # the baseline is added for significance; the paper's WMT decoding: beam 4, lenpen 0.6
    assert "/ transformer [Transformer]" in out and "/ m-10 [M-10]" in out
    assert "--joint-attention m-10" in out and "--beam 4 --lenpen 0.6" in out
    assert "--config wmt14 " in out
    assert "--headline detok-cased" in out
    # no WMT'14 copy here and no --smoke: the recipe downloads into DATA_ROOT/reproduce
    assert "fairseq-ext prepare wmt14-en-de --out /d/reproduce/wmt14-en-de" in out
    # the word-translation paper averages its last 5 checkpoints
    cli.main(["wt-4", "--dry-run", "--rows", "enc10-dec2", "--work-dir", "/w", "--data-root", "/d"])
    out = capsys.readouterr().out
    assert "--num-update-checkpoints 5" in out and "checkpoint_avg5.pt" in out
    assert "--encoder-layers 10 --decoder-layers 2" in out
    # a data set without a recipe is substituted, and the substitution is printed
    cli.main(["mma-1", "--dry-run", "--work-dir", "/w", "--data-root", "/d"])
    out = capsys.readouterr().out
    assert "multi30k-en-de in place of wat17-en-ja" in out
    # mma-3's WAT column uses the base preset for every row
    cli.main(["mma-3", "--dry-run", "--datasets", "wat17-ja-en", "--work-dir", "/w", "--data-root", "/d"])
    out = capsys.readouterr().out
    assert "multilayer_transformer_mma_iwslt" not in out and "multilayer_transformer_mma_wmt_en_de" in out


def test_multi_gpu_flags_reach_train_sh(capsys):
    cli.main(["thesis-3.2", "--dry-run", "--rows", "m-10", "--nproc", "8", "--nnodes", "2", "--node-rank", "1",
              "--master-addr", "node0", "--train-args=--fp16"])
    out = capsys.readouterr().out
    assert "--nproc 8 --nnodes 2 --node-rank 1 --master-addr node0 --master-port 29500 --" in out
    assert "--seed 1 --fp16" in out


@pytest.mark.parametrize("argv, message", [
    (["thesis-9.9", "--dry-run"], "no table 'thesis-9.9'"),
    (["thesis-3.2", "--dry-run", "--rows", "m-99"], "--rows: thesis-3.2 has no row 'm-99'"),
    (["thesis-3.2", "--dry-run", "--rows", "convseq2seq-gehring-et-al.-2017"], "quoted from another paper"),
    (["thesis-3.2", "--dry-run", "--budget", "ten"], "--budget: expected a number of updates"),
    (["thesis-3.3", "--dry-run", "--datasets", "wmt14-en-de"], "--datasets: thesis-3.3 has no data set"),
    (["thesis-3.2", "--dry-run", "--from", "wmt14"], "--from: expected DATASET=DIR"),
    (["thesis-3.2", "--dry-run", "--from", "wmt-14-en-de=/data"], "--from wmt-14-en-de=...: unknown data set"),
])
def test_errors_name_the_option(argv, message):
    with pytest.raises((TableConfigError, planning.ReproduceError, Exception)) as e:
        cli.main(argv)
    assert message in str(e.value)


def test_budget_flags():
    assert planning.budget_flags("300") == ["--max-update", "300", "--max-epoch", "0"]
    assert planning.budget_flags("30m")[:2] == ["--stop-time-hours", "0.5000"]
    assert planning.budget_flags("2h")[:2] == ["--stop-time-hours", "2.0000"]
    assert planning.budget_flags(None) == []


def test_report_puts_our_numbers_next_to_the_papers(tmp_path):
    """Hand-made results: deltas, ratios and marks are computed from them, not copied; a
    significance test against another row than the reference is not shown."""
    table = load_table("thesis-3.2")
    opts = planning.Options(work_dir=str(tmp_path), data_root=str(tmp_path / "d"), budget="100")
    plans = planning.plan_table(table, table.select("m-10,m-11"), load_setups(), opts)
    ours = {"transformer": (30.0, 61_000_000, 4.0, 100.0), "m-10": (31.25, 92_500_000, 3.0, 80.0),
            "m-11": (30.5, 84_900_000, 3.5, 90.0)}
    model = {"encoder_layers": 6, "decoder_layers": 6, "encoder_embed_dim": 512, "encoder_ffn_embed_dim": 2048,
             "encoder_attention_heads": 8}
    for p in plans:
        os.makedirs(p.run_dir)
        bleu, n, ups, sps = ours[p.row]
        with open(os.path.join(p.run_dir, "result.json"), "w") as f:
            json.dump({"bleu": bleu, "params": n, "train_ups": ups, "decode_sents_per_s": sps, "model": model}, f)
        if p.row == "m-10":  # what fairseq-ext evaluate writes beside bleu.json; m-11's evaluation has none
            os.makedirs(os.path.join(p.run_dir, "eval-test"))
            with open(os.path.join(p.run_dir, "eval-test", "metrics.json"), "w") as f:
                json.dump({"chrF2": {"score": 55.55, "signature": "nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no"}}, f)
        if p.row != "transformer":
            with open(os.path.join(p.run_dir, "significance.json"), "w") as f:
                json.dump({"baseline": "transformer" if p.row == "m-10" else "m-10", "mark": "‡", "p_value": 0.001}, f)
    records = {r["row"]: r for r in build_rows(table, plans)}
    m10 = records["m-10"]
    assert m10["delta"] == pytest.approx(1.25) and m10["mark"] == "‡" and m10["reference"] == "transformer"
    assert m10["params_m"] == pytest.approx(92.5)
    train = m10["columns"]["Train (steps/s)"]
    assert train["ours"] == 3.0 and train["ratio"] == pytest.approx(0.75)
    assert train["paper_ratio"] == pytest.approx(2.59 / 3.66, rel=1e-3)
    assert m10["paper_bleu"] == pytest.approx(29.08) and m10["paper_delta"] == pytest.approx(29.08 - 28.37)
    assert m10["paper_mark"] == "‡"
    assert records["m-11"]["mark"] == "" and records["m-11"]["p_value"] is None  # tested against m-10, not the baseline
    assert records["transformer"]["delta"] is None
    assert records["convseq2seq-gehring-et-al.-2017"]["status"] == "cited"
    md = markdown(table, list(records.values()), scales(table, plans))
    # one seed: our speeds are one measurement each, at other times than the reference row's: not printed
    assert "| M-10 | Transformer | 92.7 | 92.5 | 2.59 | n.c. | 0.71 | n.c. | 29.08 (+0.71)‡ | 31.25 | +0.71 | +1.25 " \
           "| ‡ p=0.001 | 55.55 |" in md
    assert train["not_comparable"] and "n.c.: not comparable: a speed or time of one run" in md
    assert m10["columns"]["chrF"]["ours"] == 55.55 and records["m-11"]["columns"]["chrF"]["ours"] is None
    assert "chrF [not in the paper's table]: ours" in md and "chrF: ours, not the paper's: sacreBLEU's chrF2" in md
    assert "model: 6+6 layers, d_model 512, FFN 2048, 8 heads; 61.00M to 92.50M parameters" in md
    assert "training: 100 updates per row" in md
    paths = write_reports(table, list(records.values()), str(tmp_path / "out"))
    with open(paths["json"]) as f:
        assert len(json.load(f)["rows"]) == len(records)
    # --comet-model: a COMET column after chrF, read from each run's comet.json
    with open(os.path.join(next(p for p in plans if p.row == "m-10").run_dir, "comet.json"), "w") as f:
        json.dump({"score": 0.8123, "signature": "model:Unbabel/wmt22-comet-da|nrefs:1|version:2.2.7"}, f)
    with_comet_table = dataclasses.replace(table, columns=with_comet(table.columns))
    names = [c.name for c in with_comet_table.columns]
    assert names[names.index("chrF") + 1] == "COMET"
    comet_md = markdown(with_comet_table, build_rows(with_comet_table, plans), scales(table, plans))
    assert "| ‡ p=0.001 | 55.55 | 0.8123 |" in comet_md and "COMET: ours, not the paper's" in comet_md
    with open(paths["csv"]) as f:
        assert float(next(r for r in csv.DictReader(f) if r["row"] == "m-10")["chrF | ours"]) == 55.55
    with open(paths["tex"]) as f:
        tex = f.read()
    assert "chrF" in tex and "55.55" in tex


def test_a_finished_run_is_reused_and_other_settings_are_refused(tmp_path):
    table = load_table("thesis-4.6")
    setups = load_setups()
    opts = planning.Options(work_dir=str(tmp_path), data_root=str(tmp_path / "d"), smoke=True, budget="5")
    plan = planning.plan_table(table, table.select("ms-1"), setups, opts)[1]
    assert " ".join(plan.prepare).endswith("--max-lines 3000 --bpe-merges 2000")  # the smoke cut of the data
    os.makedirs(plan.run_dir)
    with open(os.path.join(plan.run_dir, "result.json"), "w") as f:
        json.dump({"plan": plan.result_key(), "bleu": 1.0}, f)
    assert execute.run(plan)["bleu"] == 1.0  # nothing runs (there is no data to train on)
    other = planning.plan_table(table, table.select("ms-1"), setups,
                                planning.Options(work_dir=str(tmp_path), data_root=str(tmp_path / "d"), smoke=True,
                                                 budget="5"), seed=2)[1]
    assert other.run_dir == plan.run_dir
    with pytest.raises(planning.ReproduceError, match="holds a run with other settings"):
        execute.run(other)


def test_a_truncated_result_is_a_run_not_finished(tmp_path, capsys):
    """A result.json cut short (a kill during its write on a filesystem without atomic rename,
    a full disk) is said in one line and the run counts as unfinished, not a JSONDecodeError."""
    table = load_table("thesis-4.6")
    opts = planning.Options(work_dir=str(tmp_path), data_root=str(tmp_path / "d"), smoke=True, budget="5")
    plan = planning.plan_table(table, table.select("ms-1"), load_setups(), opts)[1]
    os.makedirs(plan.run_dir)
    result = os.path.join(plan.run_dir, "result.json")
    with open(result, "w") as f:
        f.write(json.dumps({"plan": plan.result_key(), "bleu": 1.0})[:40])
    assert execute.finished(plan) is None
    said = capsys.readouterr().out.strip().splitlines()
    assert len(said) == 1 and said[0].startswith(f"[thesis-4.6/{plan.row}/") and f"{result} is unreadable" in said[0]
    assert said[0].endswith("not finished, so it runs again")


def test_the_cpu_scale_keeps_depth_and_technique_reads_the_substitute_in_full(tmp_path):
    """--cpu-scale: the paper's arch and joint attention, the quickstart's width and schedule
    (after the row's flags, so they win), beam 5, 800 updates; the substitute's full data (no
    --max-lines, the same directory as --substitute); runs and table named .cpu, the scale said
    on the page."""
    table, setups = load_table("thesis-3.5"), load_setups()
    opts = planning.Options(work_dir=str(tmp_path / "runs"), data_root=str(tmp_path / "d"), cpu_scale=True, budget="800")
    plan = planning.plan_table(table, table.select("iter-s-agg"), setups, opts)[0]
    assert plan.scale == "cpu" and not plan.smoke and plan.data_key == "multi30k-en-de"
    assert "(--cpu-scale)" in plan.substitution
    assert plan.data_dir == str(tmp_path / "d" / "reproduce" / "multi30k-en-de")
    assert "--max-lines" not in plan.prepare
    assert os.path.basename(plan.run_dir) == "wmt14-en-de.multi30k-en-de.cpu.800"
    train = plan.train

    def last(flag):
        return train[len(train) - 1 - train[::-1].index(flag) + 1]
    assert last("--arch") == "multilayer_transformer_wmt_en_de" and last("--joint-attention") == "iter-s-agg"
    assert last("--encoder-embed-dim") == "128" and last("--encoder-ffn-embed-dim") == "512"
    assert last("--lr-scheduler") == "inverse_sqrt" and last("--max-update") == "800" and last("--lr") == "1e-3"
    assert plan.generate[:2] == ["--beam", "5"] and plan.average is None
    substitute = planning.plan_table(table, table.select("iter-s-agg"), setups,
                                     planning.Options(work_dir=str(tmp_path / "runs"), data_root=str(tmp_path / "d"),
                                                      substitute=True))[0]
    assert substitute.data_dir == plan.data_dir and substitute.run_dir != plan.run_dir
    lines = scale_lines(scales(table, [plan])["wmt14-en-de"])
    assert any(line.startswith("CPU scale (--cpu-scale)") for line in lines)
    assert not any("smoke" in line for line in lines)


def test_the_cpu_scale_on_the_command_line(tmp_path, capsys):
    assert cli.main(["thesis-4.7", "--cpu-scale", "--rows", "ms-1", "--datasets", "iwslt14-de-en", "--dry-run",
                     "--work-dir", str(tmp_path / "runs"), "--data-root", str(tmp_path / "d")]) == 0
    out = capsys.readouterr().out
    assert "multi30k-de-en-lc in place of iwslt14-de-en (--cpu-scale)" in out and "budget 1600" in out
    assert "table.cpu.1600.rows-ms-1.datasets-iwslt14-de-en" in out
    with pytest.raises(SystemExit):
        cli.main(["thesis-4.7", "--cpu-scale", "--smoke", "--dry-run"])
    assert "not allowed with argument" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.release
def test_one_table_end_to_end_at_a_tiny_budget(smoke_data_root, tmp_path):
    """thesis-4.6 (#Params, training and decoding speed, BLEU) with the baseline and MS-1+AIF
    (part (b): the same model as (a)'s MS-i+AIF, compared with (b)'s baseline, the same model as
    (a)'s), on Multi30k (the --smoke substitute), 30 updates each: data preparation, training,
    evaluation, significance, table; a second call reuses both runs."""
    if not os.path.isdir(MULTI30K):
        pytest.skip(f"no Multi30k copy at {MULTI30K}")
    cmd = [os.path.join(REPO, "scripts", "reproduce.sh"), "thesis-4.6", "--rows", "ms-1-plus-aif", "--smoke",
           "--budget", "30", "--work-dir", str(tmp_path / "runs"), "--data-root", str(tmp_path / "data"),
           "--samples", "100"]
    shutil.copytree(smoke_data_root, tmp_path / "data", symlinks=True)  # prepared as the runner prepares it
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with open(tmp_path / "runs" / "thesis-4.6" / "table.smoke.30.rows-ms-1-plus-aif.json") as f:
        rows = {r["row"]: r for r in json.load(f)["rows"]}
    base, aif = rows["baseline"], rows["ms-1-plus-aif"]
    assert base["status"] == aif["status"] == "done" and aif["reference"] == "baseline-2"
    assert base["bleu"] is not None and aif["bleu"] is not None
    assert aif["delta"] == pytest.approx(aif["bleu"] - base["bleu"])
    assert 0 < base["columns"]["chrF"]["ours"] < 100 and 0 < aif["columns"]["chrF"]["ours"] < 100
    # one auxiliary decoder and AIF on the smoke model (d 64, FFN 128, 4+4 layers, 4 heads):
    # a post-norm decoder stack (4 x (4 d^2 self + 4 d^2 cross + 2 d ffn) + biases/norms, no final
    # norm: the smoke model is post-norm) and d^2 of AIF per layer
    run = tmp_path / "runs" / "thesis-4.6"
    res = {r: json.load(open(next((run / r).iterdir()) / "result.json")) for r in ("baseline", "ms-i-plus-aif")}
    extra = res["ms-i-plus-aif"]["params"] - res["baseline"]["params"]
    d, f, layers = 64, 128, 4
    decoder = layers * (2 * (4 * d * d + 4 * d) + (2 * d * f + d + f) + 3 * 2 * d)
    assert extra == decoder + layers * d * d
    assert res["baseline"]["train_ups"] > 0 and res["baseline"]["decode_sents_per_s"] > 0
    assert res["baseline"]["decode_sentences"] == 1000  # test_2016_flickr, every sentence
    sig = json.load(open(next((run / "ms-i-plus-aif").iterdir()) / "significance.json"))
    assert sig["baseline"] == "baseline" and "p_value" in sig
    assert "| MS-1+AIF | Baseline [baseline-2] |" in proc.stdout and "test set test_2016_flickr, 1,000 test sentences" in proc.stdout
    again = subprocess.run(cmd, capture_output=True, text=True, cwd=str(tmp_path))
    assert again.returncode == 0 and again.stdout.count("finished before: reused") == 2


def test_a_worker_node_waits_for_the_data_and_only_trains(tmp_path, monkeypatch):
    table = load_table("thesis-3.2")
    opts = planning.Options(work_dir=str(tmp_path / "w"), data_root=str(tmp_path / "d"), nproc=8, nnodes=2,
                            node_rank=1, master_addr="node0")
    plan = planning.plan_table(table, table.select("m-10"), load_setups(), opts)[1]
    calls = []
    monkeypatch.setattr(execute, "run_command", lambda cmd, log, env=None: calls.append((cmd, log)))
    with pytest.raises(planning.ReproduceError, match="node 0 prepares the data"):
        execute.run_on_worker_node(plan, wait_seconds=0)
    os.makedirs(plan.data_dir)
    open(os.path.join(plan.data_dir, "prep.env"), "w").close()
    execute.run_on_worker_node(plan, wait_seconds=0)
    assert [c for c, _ in calls] == [plan.train] and calls[0][1].endswith("train.node1.log")
    assert "--node-rank 1" in planning.shell_line(plan.train)


def test_no_bootstrap_sample_is_refused():
    with pytest.raises(FairseqExtError, match="--samples must be at least 1, not 0"):
        cli.main(["thesis-3.2", "--dry-run", "--samples", "0"])
