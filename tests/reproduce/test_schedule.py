"""The reproduction runner over one machine's devices (fairseq_ext/reproduce/schedule.py): every run once, in the
planned order, never more at once on a device than its slots; a failing run said in one line while the others go on;
--plan's device-hours recomputed from the stored measurements; the Slurm job array, one run a task."""
import json
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import pytest
import yaml

from fairseq_ext.reproduce import __main__ as cli
from fairseq_ext.reproduce import execute, schedule
from fairseq_ext.errors import FairseqExtError
from fairseq_ext.reproduce.planning import ReproduceError
from model_utils import clean_env


def fake_plans(n):
    return [SimpleNamespace(where=f"[t/r{i}/d]", row=f"r{i}", dataset="d", seed=1, index=i) for i in range(n)]


def test_runs_fill_every_slot_in_the_planned_order_each_once():
    plans, started, running, peak, lock = fake_plans(9), [], {}, {}, threading.Lock()

    def work(plan, device, at_once):
        with lock:
            started.append((plan.index, device))
            running[device] = running.get(device, 0) + 1
            peak[device] = max(peak.get(device, 0), running[device])
        time.sleep(0.05 + 0.03 * (plan.index % 3))  # runs of different lengths
        with lock:
            running[device] -= 1

    assert schedule.run_on_slots(plans, ["0", "1"], 2, work) == []
    assert [i for i, _ in started] == list(range(9))  # each once, started in the planned order
    assert peak == {"0": 2, "1": 2}  # two at once on each device, never more
    # the simulated placement puts runs of equal length the same way: round the slots, device by device
    placed, end = schedule.place([1.0] * 5, ["0", "1"], 2)
    assert [(d, s) for d, s, _ in placed] == [("0", 0), ("1", 0), ("0", 1), ("1", 1), ("0", 0)] and end == 2.0


def test_a_failing_run_does_not_stop_the_others(capsys):
    done = []

    def work(plan, device, at_once):
        if plan.index == 1:
            raise ReproduceError("command failed (1); full log: r1/train.log")
        done.append(plan.index)

    failed = schedule.run_on_slots(fake_plans(4), ["0"], 2, work)
    assert sorted(done) == [0, 2, 3]
    assert failed == ["r1/d (seed 1): command failed (1); full log: r1/train.log"]
    assert capsys.readouterr().err.strip().splitlines() == ["[t/r1/d] FAILED: command failed (1); full log: r1/train.log"]


def test_a_bug_in_a_run_stops_the_table():
    def work(plan, device, at_once):
        if plan.index == 0:
            raise KeyError("bug")
        time.sleep(0.1)

    with pytest.raises(KeyError):
        schedule.run_on_slots(fake_plans(6), ["0"], 1, work)


def test_devices_are_checked():
    assert schedule.parse_devices("0, 1,2", cpu=False) == ["0", "1", "2"]
    assert schedule.parse_devices(None, cpu=True) == ["cpu"]
    for bad in ("0,0", "gpu0", ","):
        with pytest.raises(ReproduceError, match="--devices"):
            schedule.parse_devices(bad, cpu=False)


def _stored(device, max_tokens, at_once):
    with open(schedule.RATES, encoding="utf-8") as f:
        return next(m for m in yaml.safe_load(f) if (m["device"], m["max_tokens"], m["at_once"]) ==
                    (device, max_tokens, at_once))


def test_the_plan_of_a_thesis_column_with_three_seeds(capsys, tmp_path):
    """27 runs (9 rows x 3 seeds), timed from device-rates.yaml: the thesis' 200,000 updates of 2,048 tokens (one
    run alone, the H100's rate: no H200 measurement at that batch) and 0.21 of its tokens (2,625 updates of 32,768
    tokens, two runs at once on the H200), on one GPU and on four."""
    assert cli.main(["thesis-3.3", "--datasets", "iwslt15-en-vi", "--seeds", "1,2,3", "--plan", "--work-dir",
                     str(tmp_path), "--plan-device", "NVIDIA H200"]) == 0
    out = capsys.readouterr().out
    runs = [line for line in out.splitlines() if line.startswith("| ") and line.split("|")[1].strip().isdigit()]
    assert len(runs) == 27 and {line.split("|")[4].strip() for line in runs} == {"1", "2", "3"}
    alone = _stored("NVIDIA H100 80GB HBM3", 2048, 1)
    run_s = alone["start_s"] + 200_000 / alone["updates_per_s"] + alone["evaluate_s"]
    two = _stored("NVIDIA H200", 32768, 2)
    share_s = two["start_s"] + 2625 / two["updates_per_s"] + two["evaluate_s"]
    one_gpu, four = 27 * run_s, 7 * run_s  # four GPUs: 7 rounds of the 27 runs
    share_one, share_four = 14 * share_s, 4 * share_s  # two at once: 14 rounds on one GPU, 4 on four (8 slots)
    assert (f"| the paper's schedule, 1 at once | {one_gpu / 3600:.1f}, {one_gpu / 3600:.1f} | {four / 3600:.1f}, "
            f"{4 * four / 3600:.1f} |") in out
    assert (f"| 0.21 of the thesis' tokens (2,625 updates of 32,768 tokens, lr 1e-3, warm-up 400), 2 at once | {share_one / 3600:.1f}, {share_one / 3600:.1f} | "
            f"{share_four / 3600:.1f}, {4 * share_four / 3600:.1f} |") in out
    assert "NVIDIA H100 80GB HBM3, not NVIDIA H200" in out  # the rate's source is said


def test_the_slurm_array_is_one_run_a_task(tmp_path, monkeypatch, capsys):
    argv = ["thesis-3.3", "--rows", "iter-c-agg", "--datasets", "iwslt15-en-vi", "--seeds", "1,2", "--smoke",
            "--work-dir", str(tmp_path / "runs"), "--data-root", str(tmp_path / "data")]
    monkeypatch.setattr(execute, "run_command", lambda *a, **k: None)  # the data preparation
    assert cli.main([*argv, "--slurm-array", str(tmp_path / "array")]) == 0
    script = (tmp_path / "array" / "reproduce-array.sbatch").read_text()
    tasks = (tmp_path / "array" / "tasks.tsv").read_text().splitlines()
    assert tasks[0].split("\t") == ["task", "row", "dataset", "seed", "run_dir"] and len(tasks) == 5  # 2 rows x 2
    assert "#SBATCH --array=0-3%4" in script
    command = shlex.split(script.rstrip().splitlines()[-1])
    assert command[:2] == ["exec", command[1]] and command[2:5] == ["-m", "fairseq_ext", "reproduce"]
    assert command[5:-2] == argv and command[-2:] == ["--array-task", "${SLURM_ARRAY_TASK_ID:?run with sbatch, or set SLURM_ARRAY_TASK_ID}"]
    ran = []
    monkeypatch.setattr(execute, "run", lambda plan, *_: ran.append(plan.run_dir))
    for task in range(4):  # each task through the same entry point
        assert cli.main([*argv, "--array-task", str(task)]) == 0
    assert ran == [line.split("\t")[4] for line in tasks[1:]]
    with pytest.raises(FairseqExtError, match="--array-task 4: the plan has 4 runs"):
        cli.main([*argv, "--array-task", "4"])


def test_a_run_made_elsewhere_with_the_same_settings_joins_the_table(tmp_path):
    """A finished run copied from another machine's work dir (other paths, same commands) is reused; one with other
    settings is still refused."""
    from reproduce_utils import options, write_seed_runs
    from fairseq_ext.reproduce import planning
    from fairseq_ext.reproduce.tables import load_setups, load_table

    table, setups = load_table("thesis-3.3"), load_setups()
    there = planning.plan_seeds(table, table.select("iter-c-agg"), setups, options(tmp_path / "there"), [1])
    write_seed_runs(there, lambda row, seed: 20.0)
    here_opts = options(tmp_path / "here")
    for p in there[1]:
        shutil.copytree(os.path.dirname(p.run_dir), os.path.join(here_opts.work_dir, table.id, p.row), dirs_exist_ok=True)
    here = planning.plan_seeds(table, table.select("iter-c-agg"), setups, here_opts, [1])[1]
    assert here[0].run_dir != there[1][0].run_dir
    assert all(execute.finished(p)["bleu"] == 20.0 for p in here)
    here_opts.extra_train = ["--dropout", "0.3"]
    other = planning.plan_seeds(table, table.select("iter-c-agg"), setups, here_opts, [1])[1]
    with pytest.raises(ReproduceError, match="holds a run with other settings"):
        execute.finished(other[0])


def _tree(pid):
    """``pid`` and every process below it (the runner's commands lead process groups of their own)."""
    parents = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
        except (FileNotFoundError, ValueError, ProcessLookupError):
            continue
    found, todo = [pid], [pid]
    while todo:
        current = todo.pop()
        children = [p for p, parent in parents.items() if parent == current]
        found += children
        todo += children
    return found


def _files(folder):
    return {os.path.relpath(os.path.join(d, f), folder): open(os.path.join(d, f), "rb").read()
            for d, _, names in os.walk(folder) for f in names}


@pytest.mark.slow
@pytest.mark.release
def test_runs_on_slots_are_timed_by_the_plan_and_resume_after_a_kill(smoke_data_root, tmp_path):
    """Smoke-scale runs on two CPU slots: the plan of the next seeds is the finished runs' rates' arithmetic, and
    within a factor 2 of their measured time; a SIGKILL of the runner and everything it started, mid-run, then the
    same command: the finished run's files are unchanged and the killed run resumes from its checkpoint."""
    shutil.copytree(smoke_data_root, tmp_path / "data", symlinks=True)

    def reproduce(seeds, *more, devices="0,1"):
        return [sys.executable, "-m", "fairseq_ext", "reproduce", "thesis-3.3", "--rows", "transformer", "--datasets",
                "iwslt15-en-vi", "--smoke", "--budget", "60", "--seeds", seeds, "--devices", devices, "--per-device",
                "1", "--cpu", "--samples", "10", "--work-dir", str(tmp_path / "runs"), "--data-root",
                str(tmp_path / "data"), "--train-args=--save-interval-updates 20", *more]

    def run(cmd):
        res = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=clean_env(), timeout=900)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        return res.stdout

    assert "2 run(s) ended in" in run(reproduce("1,2"))  # the rates of the next runs
    results = sorted((tmp_path / "runs").glob("*/*/*/result.json"))
    rates = [json.loads(p.read_text())["rate"] for p in results]
    assert len(rates) == 2 and all(r["at_once"] == 2 for r in rates)
    mean = lambda key: statistics.mean(r[key] for r in rates)  # noqa: E731
    plan = run(reproduce("3,4", "--plan"))
    planned = float(re.search(r"Wall clock [0-9.]+ h \((\d+) s\)", plan).group(1))
    # both runs at once on the two slots, each start + updates / rate + evaluation, by the finished runs' mean rate
    assert planned == round(mean("start_s") + 60 / mean("updates_per_s") + mean("evaluate_s")), plan
    sources = re.search(r"^\[1\] (.*)$", plan, re.M).group(1).split("; ")  # the rates' source: the two runs
    assert sorted(sources) == [str(p.parent.relative_to(tmp_path / "runs")) for p in results], plan
    measured = float(re.search(r"2 run\(s\) ended in (\d+) s", run(reproduce("3,4"))).group(1))
    # the same runs again take about as long; a loose bound, as the other tests share the cores
    assert measured / 2 <= planned <= measured * 2, (planned, measured)

    runs = tmp_path / "runs" / "thesis-3.3" / "transformer"
    first, second = (runs / f"iwslt15-en-vi.multi30k-en-de.smoke.60.seed{s}" for s in (5, 6))
    proc = subprocess.Popen(reproduce("5,6", devices="0"), cwd=tmp_path, stdout=subprocess.DEVNULL,
                            env=dict(clean_env(), FAIRSEQ_EXT_TEST_FRESH_PYTHON="1"),  # killed by its process tree
                            stderr=subprocess.DEVNULL)
    deadline = time.time() + 600
    while not (second / "checkpoints" / "checkpoint_last.pt").exists():  # the first finished, the second saved
        assert proc.poll() is None and time.time() < deadline
        time.sleep(0.1)
    for pid in _tree(proc.pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()
    assert (first / "result.json").exists() and not (second / "result.json").exists()
    kept = _files(first)
    out = run(reproduce("5,6", devices="0"))
    assert _files(first) == kept and "finished before: reused" in out
    log = (second / "train.log").read_text()
    assert re.search(r"Loaded checkpoint .*checkpoint_last\.pt \(epoch \d+ @ [1-9]\d* updates\)", log), log[-3000:]
    assert json.loads((second / "result.json").read_text())["updates"] == 60
