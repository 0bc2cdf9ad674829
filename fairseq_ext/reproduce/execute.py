"""Running a table's plans, and what a finished run measured.

Each run's commands (data, training, averaging, evaluation) run in its directory with their
logs, its measurements go into result.json, and each analysis of a finished run follows. A
finished run with the same commands is reused, never retrained; a finished analysis with the
same command is reused, never rerun.

The runner's child commands die with it (:func:`run_child`, :func:`install`). ``fairseq-ext
reproduce`` runs long commands (train.sh -> fairseq-train, evaluate, analyses). Each runs in
its own process group, so that a SIGTERM or SIGINT (Ctrl-C, a batch system's time limit,
``kill``) of the runner reaches the whole tree: fairseq-train's data-loader workers and the
torch.distributed processes train.sh starts included. On such a signal the runner sends
SIGTERM to every running child group, waits ``GRACE_SECONDS`` for them to end, kills what is
left, and then ends the way the signal would have ended it.

What a finished run measured is read from what it left: the checkpoint's parameter count and
model size, the training log's speed and updates, fairseq-generate's decoding speed, the
evaluation's BLEU and its text files."""
import glob
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from typing import Dict, List, Optional

from fairseq_ext.common.data_text import read_lines, read_prep_env
from fairseq_ext.common import checkpoints
from fairseq_ext.errors import CheckpointError
from fairseq_ext.reproduce.planning import ANALYSIS_DONE, AnalysisPlan, ReproduceError, RunPlan, shell_line
from fairseq_ext.tools import comet, meteor
from fairseq_ext import resources


GRACE_SECONDS = 10.0
SIGNALS = (signal.SIGTERM, signal.SIGINT)

_running: Dict[int, subprocess.Popen] = {}
_lock = threading.Lock()
_previous: Dict[int, object] = {}


class _Stopped(BaseException):
    """Raised by the signal handler out of a waiting ``run_child`` (whose ``Popen.wait`` holds the
    lock a second wait on the same child would need)."""

    def __init__(self, signum):
        super().__init__(signum)
        self.signum = signum


_waiting = threading.Event()


def stop_all(grace: float = GRACE_SECONDS) -> None:
    """SIGTERM every running child's process group, SIGKILL what is left after ``grace`` s."""
    with _lock:
        procs = list(_running.values())
    for proc in procs:
        _signal_group(proc, signal.SIGTERM)
    deadline = time.monotonic() + grace
    for proc in procs:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal_group(proc, signal.SIGKILL)
            proc.wait()
        _signal_group(proc, signal.SIGKILL)  # the child ended: end what it left in its group


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)  # the child leads its own group (start_new_session)
    except (ProcessLookupError, PermissionError):
        pass


def _end_like(signum, frame=None):
    """Stop the children, then end the way ``signum`` would have ended the runner."""
    stop_all()
    previous = _previous.get(signum, signal.SIG_DFL)
    signal.signal(signum, previous)
    if callable(previous):
        previous(signum, frame)  # e.g. Python's SIGINT handler: KeyboardInterrupt
    elif previous != signal.SIG_IGN:
        os.kill(os.getpid(), signum)


def _handle(signum, frame):
    if _waiting.is_set():
        raise _Stopped(signum)  # caught in run_child(), outside Popen.wait
    _end_like(signum, frame)


def install() -> None:
    """Stop the children on SIGTERM/SIGINT (idempotent; only from the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in SIGNALS:
        current = signal.getsignal(sig)
        if current is _handle or current == signal.SIG_IGN:
            continue  # an ignored signal (nohup, a parent's choice) stays ignored
        _previous[sig] = current
        signal.signal(sig, _handle)


def run_child(cmd: List[str], **popen_kwargs) -> int:
    """``subprocess.run(cmd, ...).returncode`` with the child in its own process group,
    stopped with the runner (see the module docstring)."""
    install()
    proc = subprocess.Popen(cmd, start_new_session=True, **popen_kwargs)
    with _lock:
        _running[proc.pid] = proc
    try:
        _waiting.set()
        try:
            return proc.wait()
        finally:
            _waiting.clear()
    except _Stopped as stopped:
        _end_like(stopped.signum)
        raise  # not reached: _end_like ends the process or raises KeyboardInterrupt
    finally:
        with _lock:
            _running.pop(proc.pid, None)


def model_summary(checkpoint: str) -> dict:
    """{"params": trainable parameters (:func:`fairseq_ext.common.checkpoints.count_parameters`),
    "model": its size (layers, widths, heads; {} when the checkpoint records no configuration)}."""
    state = checkpoints.load_state(checkpoint)
    try:
        size = checkpoints.shape(checkpoints.saved_config(state, checkpoint))
    except CheckpointError:
        size = {}
    return {"params": checkpoints.count_parameters(state), "model": size}


_TRAIN_RE = re.compile(r"\|\s*train\s*\|.*")
_NUM = r"([0-9.]+)"


def training_speed(log_path: str) -> Dict[str, float]:
    """Updates per second and words per second of the last epoch summaries fairseq printed
    (``| train | ... | wps W | ups U |``), as the mean over epochs."""
    ups, wps = [], []
    if not os.path.exists(log_path):
        return {}
    with open(log_path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if not _TRAIN_RE.search(line):
                continue
            m_u = re.search(r"\bups " + _NUM, line)
            m_w = re.search(r"\bwps " + _NUM, line)
            if m_u:
                ups.append(float(m_u.group(1)))
            if m_w:
                wps.append(float(m_w.group(1)))
    out = {}
    if ups:
        out["train_ups"] = sum(ups) / len(ups)
    if wps:
        out["train_wps"] = sum(wps) / len(wps)
    return out


def training_progress(log_path: str) -> Dict[str, int]:
    """Updates done and planned, from fairseq-train's closing line (``training ended: U of P
    updates``, fairseq_ext.guards.training_summary), else the last ``num_updates`` it logged."""
    if not os.path.exists(log_path):
        return {}
    out = {}
    with open(log_path, encoding="utf-8", errors="replace") as f:
        for line in f:
            m = re.search(r"training ended: (\d+) of (\d+|\?) updates", line)
            if m:
                out = {"updates": int(m.group(1))}
                if m.group(2) != "?":
                    out["planned_updates"] = int(m.group(2))
            elif not out or "planned_updates" not in out:
                m = re.search(r"\bnum_updates (\d+)", line)
                if m:
                    out["updates"] = int(m.group(1))
    return out


def decoding_speed(eval_dir: str) -> Dict[str, float]:
    """fairseq-generate's "Translated N sentences (T tokens) in Xs (S sentences/s, K tokens/s)"."""
    for path in sorted(glob.glob(os.path.join(eval_dir, "generate-*.txt")) + glob.glob(os.path.join(eval_dir, "generate-*.log"))):
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                m = re.search(r"Translated ([\d,]+) sentences \(([\d,]+) tokens\) in ([0-9.]+)s \(([0-9.]+) sentences/s, ([0-9.]+) tokens/s\)", line)
                if m:
                    return {"decode_sentences": int(m.group(1).replace(",", "")),
                            "decode_seconds": float(m.group(3)),
                            "decode_sents_per_s": float(m.group(4)), "decode_tokens_per_s": float(m.group(5))}
    return {}


def read_bleu(eval_dir: str, flavour: str) -> Optional[float]:
    path = os.path.join(eval_dir, "bleu.json")
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        scores = json.load(f)
    return scores.get(flavour, {}).get("score")


# what makes a result: the commands that trained and evaluated it (not the labels around them)
RESULT_FIELDS = ("train", "average", "evaluate", "checkpoint", "adversarial")


def same_run(recorded: dict, plan: RunPlan) -> bool:
    current = plan.result_key()
    return all(recorded.get(k, [] if k == "adversarial" else None) == current[k] for k in RESULT_FIELDS)


def read_record(path: str, where: str) -> Optional[dict]:
    """A JSON record the runner wrote (result.json, an analysis' marker, meteor.json); None
    when there is none, or when it is unreadable (truncated by a kill, emptied by a full disk):
    then said in one line, and the step counts as unfinished and runs again."""
    if not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            record = json.load(f)
    except (ValueError, UnicodeDecodeError) as e:  # json.JSONDecodeError is a ValueError
        print(f"{where}: {path} is unreadable ({e.__class__.__name__}: {e}): not finished, so it runs again",
              flush=True)
        return None
    return record if isinstance(record, dict) else None


def finished(plan: RunPlan) -> Optional[dict]:
    result = read_record(os.path.join(plan.run_dir, "result.json"), f"[{plan.table}/{plan.row}/{plan.dataset}]")
    if result is None:
        return None
    if not same_run(result.get("plan", {}), plan):
        raise ReproduceError(f"{plan.run_dir} holds a run with other settings (see its result.json): "
                             "choose another --work-dir, or remove that directory to retrain")
    return result


def executable(cmd: List[str]) -> List[str]:
    """A planned command as it runs: ``fairseq-ext ...`` and ``python -m ...`` through this
    Python (the plan prints the command a user would type; running it this way needs no
    ``fairseq-ext`` on PATH and keeps the runner's own installation)."""
    if cmd and cmd[0] == "fairseq-ext":
        return [sys.executable, "-m", "fairseq_ext", *cmd[1:]]
    if cmd and cmd[0] == "python":
        return [sys.executable, *cmd[1:]]
    return cmd


def run_command(cmd: List[str], log: str, env=None):
    os.makedirs(os.path.dirname(log), exist_ok=True)
    print(f"  $ {shell_line(cmd)}", flush=True)
    with open(log, "a", encoding="utf-8") as out:
        out.write(f"$ {shell_line(cmd)}\n")
        out.flush()
        returncode = run_child(executable(cmd), stdout=out, stderr=subprocess.STDOUT, env=env)
    if returncode != 0:
        with open(log, encoding="utf-8", errors="replace") as f:
            tail = f.readlines()[-15:]
        sys.stderr.write("".join(tail))
        raise ReproduceError(f"command failed ({returncode}); full log: {log}")


def run_on_worker_node(plan: RunPlan, wait_seconds: int = 6 * 3600) -> None:
    """On node rank > 0 of a multi-node run: wait for node 0 to have prepared the data (a
    shared file system), then train; node 0 evaluates and measures."""
    if os.path.exists(os.path.join(plan.run_dir, "result.json")):
        return
    print(f"[{plan.table}/{plan.row}/{plan.dataset}] training as a worker node", flush=True)
    deadline = time.time() + wait_seconds
    while not os.path.exists(os.path.join(plan.data_dir, "prep.env")):
        if time.time() > deadline:
            raise ReproduceError(f"{plan.data_dir} did not appear: node 0 prepares the data on a shared file system")
        time.sleep(10)
    node = plan.train[plan.train.index("--node-rank") + 1]
    run_command(plan.train, os.path.join(plan.run_dir, f"train.node{node}.log"), resources.command_environment())


def run(plan: RunPlan) -> dict:
    """Run one plan (data, train, average, evaluate, measure) unless it finished before."""
    done = finished(plan)
    if done is not None:
        print(f"[{plan.table}/{plan.row}/{plan.dataset}] finished before: reused ({plan.run_dir})")
        return done
    print(f"[{plan.table}/{plan.row}/{plan.dataset}] {plan.label}"
          + (f"  (data: {plan.substitution})" if plan.substitution else ""), flush=True)
    os.makedirs(plan.run_dir, exist_ok=True)
    with open(os.path.join(plan.run_dir, "plan.json"), "w", encoding="utf-8") as f:
        json.dump(plan.as_json(), f, indent=1)
    env = resources.command_environment()
    if plan.prepare and not os.path.exists(os.path.join(plan.data_dir, "prep.env")):
        run_command(plan.prepare, os.path.join(plan.run_dir, "prepare.log"), env)
    train_log = os.path.join(plan.run_dir, "train.log")
    started = time.time()
    run_command(plan.train, train_log, env)
    train_seconds = time.time() - started
    if plan.average:
        run_command(plan.average, os.path.join(plan.run_dir, "average.log"), env)
    run_command(plan.evaluate, os.path.join(plan.run_dir, "evaluate.log"), env)
    eval_dir = os.path.join(plan.run_dir, "eval-test")
    adversarial = {}
    for cmd in plan.adversarial:
        lang = cmd[-1]
        run_command(cmd, os.path.join(plan.run_dir, f"evaluate-shuffle-{lang}.log"), env)
        adversarial[lang] = read_bleu(cmd[cmd.index("--out") + 1], plan.bleu)
    summary = model_summary(plan.checkpoint)
    result = {
        "plan": plan.result_key(),
        "bleu": read_bleu(eval_dir, plan.bleu),
        "params": summary["params"],
        "model": summary["model"],
        "train_seconds": round(train_seconds, 1),
        **training_progress(train_log),
        **training_speed(train_log),
        **decoding_speed(eval_dir),
    }
    if adversarial:
        result["adversarial"] = adversarial
    tmp = os.path.join(plan.run_dir, ".result.json.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
    os.replace(tmp, os.path.join(plan.run_dir, "result.json"))
    print(f"  BLEU ({plan.bleu}) {result['bleu']}, {result['params'] / 1e6:.2f}M parameters", flush=True)
    return result


def analysis_finished(ap: AnalysisPlan) -> bool:
    done = read_record(os.path.join(ap.out, ANALYSIS_DONE), f"[{ap.run.table}/{ap.run.row}/{ap.run.dataset}] {ap.name}")
    return done is not None and done.get("command") == ap.command


def run_analysis(ap: AnalysisPlan) -> None:
    """Run one analysis of a finished run unless the same command finished there before."""
    where = f"[{ap.run.table}/{ap.run.row}/{ap.run.dataset}] {ap.name}"
    if ap.name == "meteor":
        run_meteor(ap)
        return
    if ap.name == "comet":
        run_comet(ap)
        return
    if ap.command is None:
        print(f"{where}: not run: {ap.unavailable}", flush=True)
        return
    if analysis_finished(ap):
        print(f"{where}: finished before: reused ({ap.out})", flush=True)
        return
    print(f"{where}", flush=True)
    marker = os.path.join(ap.out, ANALYSIS_DONE)
    if os.path.exists(marker):  # another command's outputs, replaced now: not finished until this one is
        os.remove(marker)
    run_command(ap.command, ap.log, resources.command_environment())
    os.makedirs(ap.out, exist_ok=True)
    with open(marker, "w", encoding="utf-8") as f:
        json.dump({"command": ap.command}, f, indent=1)


def run_comet(ap: AnalysisPlan) -> dict:
    """COMET (fairseq_ext.tools.comet) of the run's translations into comet.json: the data's
    raw source, eval-test's detokenized hypotheses and reference (lowercased, all three, for a
    lowercased BLEU flavour). Reused while the model and COMET's version are the same."""
    where = f"[{ap.run.table}/{ap.run.row}/{ap.run.dataset}] COMET"
    done = read_record(ap.out, where)
    lowercase = ap.run.bleu.endswith("-lc")
    signature = ap.comet.signature(lowercase=lowercase)
    if done is not None and done.get("signature") == signature:
        return done
    eval_dir = os.path.join(ap.run.run_dir, "eval-test")
    evaluated = (read_record(os.path.join(eval_dir, "metrics.json"), where) or {}).get("COMET")
    if (evaluated and evaluated.get("signature") == signature
            and evaluated.get("flavour") == comet.text_flavour(lowercase)):
        result = evaluated  # the evaluation scored it already ($FAIRSEQ_EXT_COMET_MODEL reaches evaluate too)
    else:
        prep = read_prep_env(ap.run.data_dir)
        src = read_lines(os.path.join(ap.run.data_dir, "text", f"test.raw.{prep.get('src', '')}"))
        hyp, ref = (read_lines(os.path.join(eval_dir, f"{name}.detok")) for name in ("hyp", "ref"))
        result = comet.score(ap.comet, src, hyp, ref, lowercase=lowercase)
    with open(ap.out, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
    print(f"{where} ({ap.comet.name}): {result['score']:.4f}", flush=True)
    return result


def run_meteor(ap: AnalysisPlan) -> dict:
    """METEOR of the run's detokenized hypotheses (fairseq_ext.tools.meteor) into meteor.json;
    {"unavailable": why} when it cannot be computed here (tried again on the next run)."""
    done = read_record(ap.out, f"[{ap.run.table}/{ap.run.row}/{ap.run.dataset}] meteor")
    language = read_prep_env(ap.run.data_dir).get("tgt", "")
    if done is not None and "score" in done and done.get("implementation") == meteor.describe(language):
        return done  # scored by this implementation (another one's score is made again)
    eval_dir = os.path.join(ap.run.run_dir, "eval-test")
    try:
        result = meteor.corpus_score(read_lines(os.path.join(eval_dir, "hyp.detok")),
                                     read_lines(os.path.join(eval_dir, "ref.detok")), language)
    except meteor.MeteorUnavailable as e:
        result = {"unavailable": str(e)}
    with open(ap.out, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
    print(f"[{ap.run.table}/{ap.run.row}/{ap.run.dataset}] METEOR: "
          + (f"{result['score']:.2f}" if "score" in result else f"unavailable: {result['unavailable']}"), flush=True)
    return result
