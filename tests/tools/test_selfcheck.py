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
    paper = read(str(out / "paper.json"))  # fairseq-ext reproduce thesis-3.3 on the pack's data, its table
    assert paper["result"] == "ok" and "--prepared=iwslt15-en-vi=" + str(packed / "data" / "iwslt15.en-vi") in \
        paper["reproduce"]
    rows = {r["row"]: r for r in read(paper["table"][:-3] + ".json")["rows"]}
    assert rows["iter-c-agg"]["reference"] == "transformer" and rows["iter-c-agg"]["status"] == "done"
    assert "| Iter-C-Agg | Transformer | 31.13 (+0.55) |" in read(str(out / "paper.md"))
    assert "test set tst2013, 11 test sentences" in read(str(out / "paper.md"))
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
    result = out / "paper" / "thesis-3.3" / "iter-c-agg" / "iwslt15-en-vi.8" / "result.json"
    stamp = result.stat().st_mtime_ns
    res = selfcheck("selfcheck", "--out", str(out), "--device", "cpu", "--quick", "--stage", "paper",
                    "--rows", "iter-c-agg", "--data", str(packed / "data"))
    assert res.returncode == 0 and result.stat().st_mtime_ns == stamp  # a finished run is kept
    assert res.stdout.count("finished before: reused") == 2

    # Enc-DC Vi->En (Table 5.3) on the same pair's data, the other way
    res = selfcheck("selfcheck", "--out", str(tmp_path / "t53"), "--device", "cpu", "--quick", "--stage", "paper",
                    "--table", "thesis-5.3", "--rows", "enc-dc", "--datasets", "iwslt15-vi-en", "--data",
                    str(packed / "data"))
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    run = tmp_path / "t53" / "paper" / "thesis-5.3" / "enc-dc" / "iwslt15-vi-en.8"
    assert "--source-lang vi --target-lang en" in (run / "train.log").read_text()
    assert "| Enc-DC | Transformer | 29.42 |" in read(str(tmp_path / "t53" / "paper.md"))

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


def test_the_paper_stage_is_a_preset_of_reproduce(tmp_path, capsys):
    """The stage's runs are fairseq-ext reproduce's at 0.208 of the thesis' tokens: 2,600 updates of 32,768 tokens,
    lr 1e-3, warm-up 400, as the stored H200 runs trained; --plan is reproduce's; nothing is written."""
    import torch

    from fairseq_ext.reproduce import __main__ as reproduce
    from fairseq_ext.selfcheck import main as command
    from fairseq_ext.selfcheck import training

    (tmp_path / "data" / "iwslt15.en-vi").mkdir(parents=True)
    (tmp_path / "data" / "iwslt15.en-vi" / "prep.env").write_text("src=en\ntgt=vi\ntest_set=tst2013\n")
    argv = training.reproduce_args(str(tmp_path / "out"), torch.device("cuda"), str(tmp_path / "data"), False, 540,
                                   "thesis-5.3", None, "iwslt15-vi-en", "1,2", training.SHARE, ["--dropout", "0.2"])
    assert reproduce.main([*argv, "--dry-run"]) == 0
    trains = [line for line in capsys.readouterr().out.splitlines() if line.startswith("fairseq-ext train")]
    assert len(trains) == 4 and all(line.endswith("--fp16 --dropout 0.2") for line in trains)  # 2 rows x 2 seeds
    assert all("--source-lang vi --target-lang en --max-tokens 32768 --max-update 2600 --lr 1e-3 --warmup-updates "
               "400 --seed" in line for line in trains)
    assert "--devices" in argv and argv[argv.index("--devices") + 1] == "0" and "--time-limit" in argv
    assert command.main(["--out", str(tmp_path / "p"), "--stage", "paper", "--plan", "--table", "thesis-4.1", "--rows",
                         "ms-1,ms-1-plus-aif", "--seed", "1,2", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "# thesis-4.1: 6 run(s)" in out and out.count("| 2600 x 32,768 tokens |") == 6  # and the baseline
    assert not (tmp_path / "p").exists()  # nothing trained, nothing written
    assert command.main(["--out", str(tmp_path / "p"), "--stage", "paper", "--table", "thesis-3.2", "--device",
                         "cpu"]) == 1
    assert "--table thesis-3.2: the paper stage runs" in capsys.readouterr().err
