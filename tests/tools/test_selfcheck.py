"""``fairseq-ext selfcheck`` in its CPU mode, end to end, as a user runs it on a GPU machine:
the pack (data from local copies of the corpora), then every stage at tiny sizes (``--quick``)
into one folder, then the train stage again, which resumes. The GPU runs the same commands
without ``--device cpu --quick``."""
import json
import os
import subprocess
import sys

import pytest

from fairseq_ext.selfcheck import pack, stage_files, stages
from model_utils import DATA, REPO, clean_env
from script_utils import M30K_SMALL, head_gz, needs_multi30k, write_lines

IWSLT = os.path.join(DATA, "iwslt15-en-vi")
IWSLT_SMALL = (("train", 71), ("tst2012", 13), ("tst2013", 11))


def selfcheck(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "fairseq_ext", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, env=clean_env())


def read(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f) if path.endswith(".json") else f.read()


@pytest.fixture(scope="module")
def small_corpora(tmp_path_factory):
    """The first lines of the local Multi30k and IWSLT'15 En-Vi copies, laid out as the
    releases are (what --from takes)."""
    if not os.path.exists(os.path.join(IWSLT, "train.en.gz")):
        pytest.skip(f"no local IWSLT'15 En-Vi copy in {IWSLT}")
    root = tmp_path_factory.mktemp("corpora")
    for folder, langs, sizes in (("multi30k", ("en", "de"), M30K_SMALL), ("iwslt15-en-vi", ("en", "vi"), IWSLT_SMALL)):
        for split, n in sizes:
            for lang in langs:
                lines = head_gz(os.path.join(DATA, folder, f"{split}.{lang}.gz"), n)
                write_lines(root / folder / f"{split}.{lang}", lines, gz=True)
    return root


@needs_multi30k
@pytest.mark.slow
@pytest.mark.release
def test_selfcheck_cpu_mode_runs_every_stage_and_resumes(small_corpora, tmp_path):
    packed = tmp_path / "pack"
    res = selfcheck("selfcheck-pack", "--out", str(packed), "--no-wheels", "--from", str(small_corpora))
    assert res.returncode == 0, res.stderr[-3000:]
    assert sorted(os.listdir(packed / "data")) == ["iwslt15.en-vi", "multi30k.en-de"]
    assert "source PACK/install.sh" in read(str(packed / "README.md"))
    assert "pip" not in read(str(packed / "install.sh"))  # --no-wheels: nothing to install

    out = tmp_path / "check"
    res = selfcheck("selfcheck", "--out", str(out), "--device", "cpu", "--quick", "--stage", "all",
                    "--data", str(packed / "data"))
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    env = read(str(out / "env.json"))
    assert env["device"] == "cpu" and env["packages"]["fairseq (import)"].startswith("0.12")
    assert all(isinstance(v, float) and v < 0.05 for v in env["matmul_relative_error"].values())

    tests = read(str(out / "tests.json"))
    assert tests["counts"]["failed"] == tests["counts"]["error"] == 0 and tests["counts"]["passed"] == 10
    # fp32, bf16, memory-efficient fp16 and AMP train on the CPU; fp16 is CUDA's
    assert "| combined | ok | skip | ok | ok | ok | ok | ok | ok | ok | ok | ok |" in read(str(out / "tests.md"))

    bench = read(str(out / "bench.json"))
    assert bench["result"] == "ok" and set(bench["runs"]) == {"base-bf16", "small-bf16"}
    m10 = next(r for r in bench["runs"]["base-bf16"]["configs"] if r["name"] == "M-10")
    assert m10["train_flops_ratio"] > 1.1  # n layers' keys and values: more arithmetic than stock
    assert "| M-10 | 0.71 |" in read(str(out / "bench.md"))  # beside the thesis' speed

    train = read(str(out / "train.json"))
    assert [r["name"] for r in train["runs"]] == ["multi30k-baseline", "iwslt15-small"]  # --quick: no M-10
    for run in train["runs"]:
        assert run["train_returncode"] == 0 and run["eval_returncode"] == 0, run
        assert run["updates"] == 8 and run["bleu"] is not None
    paper = read(str(out / "paper.json"))
    assert paper["result"] == "ok" and [r["row"] for r in paper["rows"]] == ["transformer", "iter-c-agg"]
    for run in paper["runs"]:  # the two rows trained at once, decoded on the thesis' test set
        assert run["train_returncode"] == 0 and run["eval_returncode"] == 0 and run["concurrent_runs"] == 2, run
        assert run["test_set"] == "tst2013" and run["bleu_flavour"] == "detok-cased" and run["updates"] == 8
        assert run["chrf"] is not None and run["target_tokens"] > 0 and run["valid_loss"] > 0
    assert paper["rows"][1]["paired_seeds"] == [1] and 0 < paper["rows"][1]["p_value"] <= 1
    assert "| Iter-C-Agg | 31.13 (+0.55) | 1 |" in read(str(out / "paper.md"))
    index = read(str(out / "README.md"))
    assert all(f"[{stage}.md]({stage}.md)" in index for stage in ("env", "tests", "bench", "train", "paper"))

    # the next command with the same --out keeps each finished run (a run stopped by the time limit
    # resumes from its checkpoint_last.pt): nothing is trained or evaluated again
    checkpoint = out / "train" / "iwslt15-small" / "checkpoint_last.pt"
    stamp = checkpoint.stat().st_mtime_ns
    res = selfcheck("selfcheck", "--out", str(out), "--device", "cpu", "--quick", "--stage", "train",
                    "--data", str(packed / "data"))
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    again = read(str(out / "train.json"))
    assert [r["updates"] for r in again["runs"]] == [8, 8] and all(r["kept"] for r in again["runs"])
    assert [r["bleu"] for r in again["runs"]] == [r["bleu"] for r in train["runs"]]
    assert checkpoint.stat().st_mtime_ns == stamp and "(kept)" in read(str(out / "train.md"))
    run_json = out / "paper" / "runs" / "iter-c-agg-s1-u8-mt1000-lr0.001-wu4" / "run.json"
    stamp = run_json.stat().st_mtime_ns
    res = selfcheck("selfcheck", "--out", str(out), "--device", "cpu", "--quick", "--stage", "paper",
                    "--rows", "iter-c-agg", "--data", str(packed / "data"))
    assert res.returncode == 0 and run_json.stat().st_mtime_ns == stamp  # a finished run is kept
    assert read(str(out / "paper.json"))["rows"] == paper["rows"]

    # the other tables of the En-Vi column, a row each, both at once: MS-1+AIF (Table 4.1), Enc-DC Vi->En (5.3)
    outs = {"4.1": tmp_path / "t41", "5.3": tmp_path / "t53"}
    procs = [subprocess.Popen([sys.executable, "-m", "fairseq_ext", "selfcheck", "--out", str(outs[table[7:]]),
                               "--device", "cpu", "--quick", "--stage", "paper", "--table", table, *args, "--data",
                               str(packed / "data")], cwd=REPO, env=clean_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
             for table, args in (("thesis-4.1", ["--rows", "ms-1-plus-aif"]),
                                 ("thesis-5.3", ["--rows", "enc-dc", "--datasets", "iwslt15-vi-en"]))]
    for proc in procs:
        output = proc.communicate(timeout=600)[0]
        assert proc.returncode == 0, output[-3000:]
    (aif,), (dc,) = (read(str(outs[t] / "paper.json"))["rows"] for t in ("4.1", "5.3"))
    assert (aif["table"], aif["row"], aif["reference"]) == ("thesis-4.1", "ms-1-plus-aif", "ms-1")  # the thesis' MS-l
    assert (dc["table"], dc["dataset"], dc["row"]) == ("thesis-5.3", "iwslt15-vi-en", "enc-dc")
    assert dc["thesis_bleu"] == 29.42
    vi_en = read(str(outs["5.3"] / "paper" / "runs" / "vi-en-5.3-enc-dc-s1-u8-mt1000-lr0.001-wu4" / "run.json"))
    assert vi_en["eval_returncode"] == 0 and "--source-lang vi --target-lang en" in " ".join(vi_en["train_command"])
    assert "## Thesis Table 4.1, IWSLT'15 En→Vi" in read(str(outs["4.1"] / "paper.md"))
    assert "| Enc-DC | 29.42 | 1 |" in read(str(outs["5.3"] / "paper.md"))


def test_selfcheck_says_what_is_missing(tmp_path, capsys):
    from fairseq_ext.selfcheck import main as command

    def error(main, *args):
        code = main(list(args))
        return code, capsys.readouterr().err

    code, err = error(command.main, "--out", str(tmp_path), "--device", "cpu", "--stage", "train")
    assert code == 1 and "fairseq-ext selfcheck: error: --data: the train stage needs" in err
    code, err = error(command.main, "--out", str(tmp_path), "--stage", "env,gpu")
    assert code == 1 and "--stage: unknown stage gpu" in err and "usage:" in err
    code, err = error(command.main, "--out", str(tmp_path), "--device", "cpu", "--stage", "tests",
                      "--tests", str(tmp_path))
    assert code == 1 and "an installed wheel has no test suite" in err
    code, err = error(command.main, "--out", str(tmp_path), "--device", "cpu", "--stage", "bench", "--dtypes", "fp16")
    assert code == 1 and "--dtypes: 'fp16'" in err
    if not __import__("torch").cuda.is_available():
        code, err = error(command.main, "--out", str(tmp_path), "--device", "cuda")
        assert code == 1 and "--device cuda: torch sees no GPU" in err
    assert not os.listdir(tmp_path)  # nothing written before the options are right
    (tmp_path / "README.md").write_text("# my project\n")  # --out . in a checkout: its README is not ours
    code, err = error(command.main, "--out", str(tmp_path), "--device", "cpu", "--stage", "env")
    assert code == 1 and "its README.md is not the self-check's index" in err
    assert (tmp_path / "README.md").read_text() == "# my project\n"
    code, err = error(command.main, "--out", str(tmp_path / "README.md"), "--device", "cpu")
    assert code == 1 and "exists and is not a folder" in err
    (tmp_path / "README.md").unlink()
    (tmp_path / "mine.txt").write_text("a user's file\n")
    code, err = error(pack.main, "--out", str(tmp_path), "--no-wheels")
    assert code == 1 and "is not a pack" in err
    code, err = error(pack.main, "--out", str(tmp_path / "mine.txt"), "--no-wheels")
    assert code == 1 and "exists and is not a folder" in err
    assert os.listdir(tmp_path) == ["mine.txt"] and (tmp_path / "mine.txt").read_text() == "a user's file\n"
    # no index: the stage files a user wrote are not the self-check's either, whatever their names
    for name, text in (("env.json", '{"mine": 1}'), ("env.md", "# my notes\n"), ("paper.json", "[1, 2]")):
        folder = tmp_path / name.replace(".", "-")
        folder.mkdir()
        (folder / name).write_text(text)
        code, err = error(command.main, "--out", str(folder), "--device", "cpu", "--stage", "env")
        assert code == 1 and f"its {name} was not written by the self-check" in err
        assert os.listdir(folder) == [name] and (folder / name).read_text() == text
    # a run.json that is empty, cut short or not an object: one line, no traceback
    for text in ("", '{"bleu": 2', "[1]"):
        run = tmp_path / "t" / "paper" / "runs" / "transformer-s1-u8-mt1000-lr0.001-wu4"
        run.mkdir(parents=True, exist_ok=True)
        (run / "run.json").write_text(text)
        code, err = error(command.main, "--out", str(tmp_path / "t"), "--stage", "paper", "--table-only")
        assert code == 1 and f"{run / 'run.json'}: " in err and len(err.strip().splitlines()) == 1, err


def test_table_only_fails_a_nan_bleu_and_names_a_malformed_run_json(tmp_path, capsys):
    from fairseq_ext.selfcheck import main as command

    record = {"row": "transformer", "dataset": "iwslt15-en-vi", "seed": 1, "updates_planned": 8, "max_tokens": 1000,
              "lr": 0.001, "warmup": 4, "updates": 8, "quick": True, "bleu": 3.5}
    for name, changed in (("transformer-s1-u8-mt1000-lr0.001-wu4", {"bleu": float("nan")}),
                          ("m-10-s1-u8-mt1000-lr0.001-wu4", {"row": "m-10", "seed": "one"}),
                          ("m-11-s1-u8-mt1000-lr0.001-wu4", {"row": "m-11", "warmup": None})):
        fields = {k: v for k, v in {"name": name, **record, **changed}.items() if v is not None}
        (tmp_path / "paper" / "runs" / name).mkdir(parents=True)
        (tmp_path / "paper" / "runs" / name / "run.json").write_text(json.dumps(fields))
    assert command.main(["--out", str(tmp_path), "--stage", "paper", "--table-only", "--device", "cpu"]) == 1
    out, err = capsys.readouterr()
    failed = ["m-10-s1-u8-mt1000-lr0.001-wu4 (malformed run.json: invalid field seed)",
              "m-11-s1-u8-mt1000-lr0.001-wu4 (malformed run.json: missing field warmup)",
              "transformer-s1-u8-mt1000-lr0.001-wu4 (its BLEU is nan: a failed run)"]
    assert err.splitlines() == ["fairseq-ext selfcheck: stage paper: 3 runs failed: " + "; ".join(failed)]
    assert "nan |" not in out and "No finished run yet." in out
    assert [line for line in out.splitlines() if line.startswith("- ")] == [
        "- " + line.replace(" (", ": ", 1)[:-1] for line in failed]


def test_pack_takes_a_wheel_and_else_the_source(monkeypatch, tmp_path):
    """fairseq-fixed and the rest as wheels for the target Python; a package without one (e.g.
    antlr4's runtime) as its source, which pip builds on the target machine."""
    calls = []

    def fake_run(cmd, **kwargs):
        calls.append(cmd)
        binary = "--only-binary=:all:" in cmd
        return subprocess.CompletedProcess(cmd, 1 if binary and cmd[-1].startswith("antlr4") else 0, "", "")

    monkeypatch.setattr(pack.subprocess, "run", fake_run)
    pack.download_wheels(str(tmp_path), "3.12")
    binaries = [c for c in calls if "--only-binary=:all:" in c]
    sources = [c for c in calls if "--no-binary=:all:" in c]
    assert [c[-1] for c in binaries] == pack.WHEELS
    assert all(c[c.index("--python-version") + 1] == "3.12" for c in binaries)
    assert [c[-1] for c in sources] == ["antlr4-python3-runtime==4.9.3"]


def test_pack_prepares_the_chosen_data_sets_only(monkeypatch, tmp_path, capsys):
    calls = []
    monkeypatch.setattr(pack.subprocess, "run", lambda cmd, **kw: calls.append(cmd) or
                        subprocess.CompletedProcess(cmd, 0, "", ""))
    assert pack.main(["--out", str(tmp_path / "p"), "--no-wheels", "--datasets", "multi30k.en-de"]) == 0
    assert [c[c.index("prepare") + 1] for c in calls] == ["multi30k"]
    assert pack.main(["--out", str(tmp_path / "q"), "--no-wheels", "--datasets", "wmt14"]) == 1
    assert "--datasets: unknown data set wmt14 (choose from multi30k.en-de, iwslt15.en-vi, or all)" \
        in capsys.readouterr().err
    assert not (tmp_path / "q").exists()


def test_the_outcome_matrix_reads_every_test_id():
    """Option sets and precisions both hold dashes: each test id is split at a known precision."""
    assert stages.split_test_id("test_fairseq_trainer_steps_lower_the_loss[pre-classifier-memory-efficient-fp16]") \
        == ("test_fairseq_trainer_steps_lower_the_loss", "pre-classifier", "memory-efficient-fp16")
    assert stages.split_test_id("test_incremental_decoding_equals_the_full_forward[m-10-bf16]") \
        == ("test_incremental_decoding_equals_the_full_forward", "m-10", "bf16")
    assert stages.split_test_id("test_something_else[x-fp32]") is None
    cases = [{"name": "test_beam_search_gives_the_same_hypotheses_batched_and_alone[iter-c-agg-fp16]",
              "outcome": "failed", "message": "", "seconds": 0.1}]
    rows = stages.outcome_matrix(cases)
    assert rows[2].startswith("| iter-c-agg |") and "FAIL" in rows[2]


def test_a_benchmark_stopped_by_the_time_limit_keeps_its_finished_rows(monkeypatch, tmp_path):
    """The benchmark writes its JSON after every row; a run the stage stops at its share of the
    time limit still shows the rows it finished, and says that it stopped."""
    timing = {"ratio": 1.25, "iqr": [1.2, 1.3], "pairs": 7}
    row = {"name": "M-10", "train": timing, "generate_beam": timing, "train_flops_ratio": 1.5,
           "decode_flops_ratio": 1.4}

    class StoppedRun:  # a benchmark that has written one row when the stage stops it
        def __init__(self, cmd, **kwargs):
            with open(cmd[cmd.index("--json") + 1], "w", encoding="utf-8") as f:
                json.dump({"settings": {"batch": 16, "src_len": 30, "tgt_len": 30, "steps": 30, "beam": 4},
                           "configs": [row]}, f)

        def wait(self, timeout=None):
            if timeout is not None:
                raise subprocess.TimeoutExpired("benchmark", timeout)

        def terminate(self):
            pass

        kill = terminate

    monkeypatch.setattr(stage_files.subprocess, "Popen", StoppedRun)
    stages.run_bench(str(tmp_path), __import__("torch").device("cpu"), quick=False, time_limit=60)
    bench = read(str(tmp_path / "bench.json"))
    assert bench["result"] == "2 of 2 runs failed"
    assert all(run["returncode"] == "timeout" and run["configs"] == [row] for run in bench["runs"].values())
    page = read(str(tmp_path / "bench.md"))
    assert "| M-10 | 0.71 | 0.80 [0.77-0.83] | 0.67 |" in page  # 1 / 1.25, its IQR turned, 1 / 1.5
    # the base config's 12 rows get 12/15 of the time, the small config's 3 rows what is left
    assert "- base-bf16: stopped after 48 s; rows finished: 1" in page
    assert "- small-bf16: stopped after 60 s; rows finished: 1" in page
    assert "batch 16 x 30/30, decoding 30 steps at beam 4" in page


def test_paper_stage_plan_and_logs(tmp_path):
    """The paper stage's rows, grid and what it reads from fairseq's log, without training."""
    from fairseq_ext.errors import CommandError
    from fairseq_ext.selfcheck import training

    from fairseq_ext.reproduce.tables import load_table

    plan = lambda table, rows, seeds="1", *grid, datasets="iwslt15-en-vi": training.plan(  # noqa: E731
        table, rows, datasets, seeds, *(list(grid) + [None] * 4)[:4], quick=False)
    en_vi = {t: [r.id for r in training.table_rows(load_table(t), "iwslt15-en-vi")] for t in training.TABLES}
    assert en_vi["thesis-3.3"] == ["transformer", "s-agg", "iter-s-agg", "c-agg", "iter-c-agg", "m-00", "m-01",
                                   "m-10", "m-11"]  # the table's rows, from configs/tables/thesis-3.3.yaml
    assert en_vi["thesis-5.3"] == ["transformer", "transformer-dff1024", "enc-dc", "dec-dc", "full-dc"]
    assert {"ms-1", "ms-1-plus-aif", "ms-3-plus-aif"} <= set(en_vi["thesis-4.1"])
    m10 = load_table("thesis-3.3").row("m-10")
    assert training.thesis_number(m10, "iwslt15-en-vi") == (30.71, 0.13)
    runs = plan("thesis-3.3", "transformer,m-01", "1,2", None, "4096,8192")
    assert len(runs) == 8 and {r.lr for r in runs} == {training.SETTINGS["lr"]}
    assert "m-01-s2-u2600-mt4096-lr0.001-wu400" in {r.name for r in runs}
    # a row two tables share (the same flags) is one run; the d_ff-512 baseline of 5.3 is its own
    assert {r.name for r in plan("thesis-4.1", "transformer,layer-aggregation-iter-c-agg,ms-1-plus-aif")} == {
        f"{n}-s1-u2600-mt32768-lr0.001-wu400" for n in ("transformer", "iter-c-agg", "4.1-ms-1-plus-aif")}
    vi_en = plan("thesis-5.3", None, datasets="iwslt15-en-vi,iwslt15-vi-en")
    assert [r.name.split("-s1-")[0] for r in vi_en] == ["5.3-transformer", "5.3-enc-dc", "vi-en-5.3-transformer",
                                                        "vi-en-5.3-enc-dc"]
    for args, kwargs, message in ((("thesis-3.3", "transformer,luong"), {}, "--rows: unknown row luong"),
                                  (("thesis-3.2", None), {}, "--table thesis-3.2: the paper stage runs"),
                                  (("thesis-3.3", None), {"datasets": "iwslt15-vi-en"}, "--datasets iwslt15-vi-en: "),
                                  (("thesis-3.3", "transformer", "1", "300"), {}, r"--warmup \(400\) must be below "
                                                                                   r"--updates \(300\)")):
        with pytest.raises(CommandError, match=message):
            plan(*args, **kwargs)
    for bad in ("0,1e-3", "nan", "inf"):
        with pytest.raises(CommandError, match=f"--lr: '{bad}'"):
            plan("thesis-3.3", "transformer", "1", None, None, bad)
    log = tmp_path / "train.log"
    log.write_text("epoch 001 | valid on 'valid' subset | loss 9.5 | nll_loss 9 | num_updates 100\n"
                   "2026 | INFO | train | epoch 001 | loss 10 | wpb 6000.5 | bsz 200 | num_updates 100\n"
                   "epoch 002 | valid on 'valid' subset | loss 8.25 | nll_loss 8 | num_updates 130\n"
                   "2026 | INFO | train | epoch 002 | loss 9 | wpb 5000 | bsz 150 | num_updates 130\n")
    assert training.target_tokens(str(log)) == round(6000.5 * 100 + 5000 * 30)
    assert training.valid_loss(str(log)) == 8.25


def test_paper_plan_lists_the_runs_with_the_thesis_numbers_and_device_minutes(tmp_path, capsys):
    from fairseq_ext.selfcheck import main as command

    assert command.main(["--out", str(tmp_path / "p"), "--stage", "paper", "--plan", "--table", "thesis-4.1",
                         "--rows", "ms-1,ms-1-plus-aif", "--seed", "1,2", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "| 4.1-ms-1-plus-aif-s2-u2600-mt32768-lr0.001-wu400 | MS-1+AIF | 31.29 (−0.03) |" in out
    assert out.count("| 21% |") == 4 and not (tmp_path / "p").exists()  # nothing trained, nothing written
    # 2 commands of 2 runs: 2 x (20 s + 2,600 / 12.4 s + 50 s)
    assert f"about {2 * (20 + 50 + 2600 / 12.4) / 60:.1f} minutes in 2 command(s)" in out


def test_the_quick_plan_says_what_it_trains_and_its_time(tmp_path, capsys):
    from fairseq_ext.selfcheck import main as command

    assert command.main(["--out", str(tmp_path / "p"), "--stage", "paper", "--plan", "--quick", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "0.0 minutes" not in out and "0 command(s)" not in out and not (tmp_path / "p").exists()
    assert out.strip().splitlines()[-1] == (
        "Device time: --quick trains these 2 runs at once in one command, a 2+2-layer model of width 32 for 8 updates "
        "each, then decodes 5 tokens a sentence: the code path, its numbers mean nothing. 2 runs took 24 s on a 2-core "
        "CPU (measured), more take longer.")
