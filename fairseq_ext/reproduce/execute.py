"""Running a table's plans (each run's commands in its directory with their logs, its
measurements in result.json, then each analysis of a finished run; what finished with the same
commands is reused), and what a finished run measured, read from what it left.

The child commands die with the runner (:func:`children_die_with_the_runner`): each runs in its own process group
(:func:`run_child`), so that a SIGTERM or SIGINT of the runner reaches the whole tree (data-loader workers,
torch.distributed processes); the group gets SIGTERM, ``GRACE_SECONDS`` to end, then SIGKILL, and the runner ends the
way the signal would have ended it."""
import contextlib
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
from fairseq_ext.reproduce.planning import ANALYSIS_DONE, AnalysisPlan, ReproduceError, RunPlan, shell_line, write_json
from fairseq_ext.reproduce import schedule
from fairseq_ext.tools import comet, meteor
from fairseq_ext import resources


GRACE_SECONDS = 10.0
SIGNALS = (signal.SIGTERM, signal.SIGINT)
_running: Dict[int, subprocess.Popen] = {}  # the child run_child waits for
STOPPING = threading.Event()  # the runner stops its commands: their failures are not theirs to say


class _Stopped(BaseException):
    """Raised by the signal handler in the main thread, out of whatever it waits for."""

    def __init__(self, signum):
        super().__init__(signum)
        self.signum = signum


def _stop(signum, frame):
    raise _Stopped(signum)


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)  # the child leads its own group (start_new_session)
    except (ProcessLookupError, PermissionError):
        pass


def run_child(cmd: List[str], **popen_kwargs) -> int:
    """``subprocess.run(cmd, ...).returncode`` in a process group of its own, which :func:`stop_children` stops."""
    proc = subprocess.Popen(cmd, start_new_session=True, **popen_kwargs)
    _running[proc.pid] = proc
    code = proc.wait()  # (interrupted, it stays listed for stop_children)
    _running.pop(proc.pid, None)
    return code


def stop_children() -> None:
    """SIGTERM to the group of every running command, ``GRACE_SECONDS`` to end, then SIGKILL."""
    STOPPING.set()
    procs = list(_running.values())
    for proc in procs:
        _signal_group(proc, signal.SIGTERM)
    deadline = time.time() + GRACE_SECONDS
    for proc in procs:
        try:
            proc.wait(timeout=max(0.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            pass
        _signal_group(proc, signal.SIGKILL)
        _running.pop(proc.pid, None)


@contextlib.contextmanager
def children_die_with_the_runner():
    """While the main thread is inside, SIGTERM or SIGINT stops every running command, then ends the runner as the
    signal would have (SIGINT: KeyboardInterrupt); an ignored signal (nohup) or a non-Python handler is left alone."""
    main = threading.current_thread() is threading.main_thread()
    handled = {sig: signal.getsignal(sig) for sig in SIGNALS if main and signal.getsignal(sig) not in
               (None, signal.SIG_IGN)}
    for sig in handled:
        signal.signal(sig, _stop)
    try:
        yield
    except _Stopped as stopped:
        stop_children()
        for sig, handler in handled.items():
            signal.signal(sig, handler)
        handler = handled[stopped.signum]
        if callable(handler):
            handler(stopped.signum, None)  # e.g. Python's SIGINT handler: KeyboardInterrupt
        else:
            os.kill(os.getpid(), stopped.signum)
        raise
    finally:
        for sig, handler in handled.items():
            signal.signal(sig, handler)


def on_slots(plans: List[RunPlan], devices: List[Optional[str]], at_once: int) -> List[str]:
    """:func:`run` of every plan over the devices' slots (:func:`schedule.run_on_slots`), the failures."""
    return schedule.run_on_slots(plans, devices, at_once,  # on the CPU, every device's slots share the one CPU
                                 lambda plan, device, n: run(plan, device, n * len(devices) if plan.cpu else n))


def log_lines(path: str):
    if os.path.exists(path):
        with open(path, encoding="utf-8", errors="replace") as f:
            yield from f


def training_speed(log_path: str) -> Dict[str, float]:
    """The mean over fairseq's epoch summaries (``| train | ... | wps W | ups U |``) of ups and wps."""
    found = {"train_ups": [], "train_wps": []}
    for line in log_lines(log_path):
        if re.search(r"\|\s*train\s*\|", line):
            for key, name in (("train_ups", "ups"), ("train_wps", "wps")):
                m = re.search(rf"\b{name} ([0-9.]+)", line)
                if m:
                    found[key].append(float(m.group(1)))
    return {key: sum(values) / len(values) for key, values in found.items() if values}


def training_progress(log_path: str) -> Dict[str, int]:
    """Updates done and planned, from ``training ended: U of P updates`` (guards.training_summary),
    else the last ``num_updates`` logged."""
    out = {}
    for line in log_lines(log_path):
        m = re.search(r"training ended: (\d+) of (\d+|\?) updates", line)
        if m:
            out = {"updates": int(m.group(1))}
            if m.group(2) != "?":
                out["planned_updates"] = int(m.group(2))
        elif "planned_updates" not in out:
            m = re.search(r"\bnum_updates (\d+)", line)
            if m:
                out["updates"] = int(m.group(1))
    return out


def decoding_speed(eval_dir: str) -> Dict[str, float]:
    """fairseq-generate's "Translated N sentences (T tokens) in Xs (S sentences/s, K tokens/s)"."""
    pattern = os.path.join(eval_dir, "generate-*")
    for path in sorted(glob.glob(pattern + ".txt") + glob.glob(pattern + ".log")):
        for line in log_lines(path):
            m = re.search(r"Translated ([\d,]+) sentences \(([\d,]+) tokens\) in ([0-9.]+)s "
                          r"\(([0-9.]+) sentences/s, ([0-9.]+) tokens/s\)", line)
            if m:
                return {"decode_sentences": int(m.group(1).replace(",", "")), "decode_seconds": float(m.group(3)),
                        "decode_sents_per_s": float(m.group(4)), "decode_tokens_per_s": float(m.group(5))}
    return {}


def read_bleu(eval_dir: str, flavour: str) -> Optional[float]:
    path = os.path.join(eval_dir, "bleu.json")
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f).get(flavour, {}).get("score")


def read_record(path: str, where: str) -> Optional[dict]:
    """A JSON record the runner wrote; None when there is none or it is unreadable (cut by a kill,
    a full disk: said in one line, and the step runs again)."""
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


def portable(key: dict) -> dict:
    """A result key with its run and data directories as placeholders: a run made elsewhere with the same settings."""
    text = json.dumps(key)
    for name in ("run_dir", "data_dir"):
        if key.get(name):
            text = text.replace(json.dumps(key[name])[1:-1], "{" + name + "}")
    return json.loads(text)


def finished(plan: RunPlan) -> Optional[dict]:
    result = read_record(os.path.join(plan.run_dir, "result.json"), plan.where)
    if result is None:
        return None
    recorded, current = portable(result.get("plan", {})), portable(plan.result_key())
    # what makes a result: the commands that trained and evaluated it (not the labels around them)
    if any(recorded.get(k, [] if k == "adversarial" else None) != current[k]
           for k in ("train", "average", "evaluate", "checkpoint", "adversarial")):
        raise ReproduceError(f"{plan.run_dir} holds a run with other settings (see its result.json): "
                             "choose another --work-dir, or remove that directory to retrain")
    return result


def executable(cmd: List[str]) -> List[str]:
    """A planned command as it runs: ``fairseq-ext`` and ``python`` through this Python (no
    ``fairseq-ext`` needed on PATH; the runner's own installation)."""
    through = {"fairseq-ext": [sys.executable, "-m", "fairseq_ext"], "python": [sys.executable]}
    return through[cmd[0]] + cmd[1:] if cmd and cmd[0] in through else cmd


def run_command(cmd: List[str], log: str, env=None):
    os.makedirs(os.path.dirname(log), exist_ok=True)
    print(f"  $ {shell_line(cmd)}", flush=True)
    with open(log, "a", encoding="utf-8") as out:
        out.write(f"$ {shell_line(cmd)}\n")
        out.flush()
        returncode = run_child(executable(cmd), stdout=out, stderr=subprocess.STDOUT, env=env)
    if returncode != 0 and not STOPPING.is_set():
        with open(log, encoding="utf-8", errors="replace") as f:
            sys.stderr.write("".join(f.readlines()[-15:]))
        raise ReproduceError(f"command failed ({returncode}); full log: {log}")


def run_on_worker_node(plan: RunPlan, wait_seconds: int = 6 * 3600) -> None:
    """Node rank > 0: wait for node 0's data (a shared file system), then train; node 0 evaluates."""
    if os.path.exists(os.path.join(plan.run_dir, "result.json")):
        return
    print(f"{plan.where} training as a worker node", flush=True)
    deadline = time.time() + wait_seconds
    while not os.path.exists(os.path.join(plan.data_dir, "prep.env")):
        if time.time() > deadline:
            raise ReproduceError(f"{plan.data_dir} did not appear: node 0 prepares the data on a shared file system")
        time.sleep(10)
    node = plan.train[plan.train.index("--node-rank") + 1]
    run_command(plan.train, os.path.join(plan.run_dir, f"train.node{node}.log"), resources.command_environment())


def run(plan: RunPlan, device: Optional[str] = None, at_once: int = 1) -> dict:
    """Data, train, average, evaluate, measure, unless it finished before; on ``device``, one of ``at_once`` there."""
    done = finished(plan)
    if done is not None:
        print(f"{plan.where} finished before: reused ({plan.run_dir})")
        return done
    print(f"{plan.where} {plan.label}" + (f"  (data: {plan.substitution})" if plan.substitution else "")
          + (f"  [device {device}]" if device is not None else ""), flush=True)
    os.makedirs(plan.run_dir, exist_ok=True)
    write_json(os.path.join(plan.run_dir, "plan.json"), plan.as_json())
    env = resources.command_environment()
    if device is not None and not plan.cpu:
        env["CUDA_VISIBLE_DEVICES"] = device
    elif at_once > 1:
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // at_once))
    if plan.prepare and not os.path.exists(os.path.join(plan.data_dir, "prep.env")):
        run_command(plan.prepare, os.path.join(plan.run_dir, "prepare.log"), env)
    train_log = os.path.join(plan.run_dir, "train.log")
    started, resumed = time.time(), os.path.exists(os.path.join(plan.run_dir, "checkpoints", "checkpoint_last.pt"))
    run_command(plan.train, train_log, env)
    train_seconds, started = time.time() - started, time.time()
    if plan.average:
        run_command(plan.average, os.path.join(plan.run_dir, "average.log"), env)
    run_command(plan.evaluate, os.path.join(plan.run_dir, "evaluate.log"), env)
    eval_dir = os.path.join(plan.run_dir, "eval-test")
    adversarial = {}
    for cmd in plan.adversarial:
        lang = cmd[-1]
        run_command(cmd, os.path.join(plan.run_dir, f"evaluate-shuffle-{lang}.log"), env)
        adversarial[lang] = read_bleu(cmd[cmd.index("--out") + 1], plan.bleu)
    evaluate_seconds = time.time() - started
    state = checkpoints.load_state(plan.checkpoint)
    try:  # the model's layers, widths and heads ({} when the checkpoint records no configuration)
        size = checkpoints.shape(checkpoints.saved_config(state, plan.checkpoint))
    except CheckpointError:
        size = {}
    result = {"plan": plan.result_key(), "bleu": read_bleu(eval_dir, plan.bleu),
              "params": checkpoints.count_parameters(state), "model": size, "train_seconds": round(train_seconds, 1),
              **training_progress(train_log), **training_speed(train_log), **decoding_speed(eval_dir)}
    if adversarial:
        result["adversarial"] = adversarial
    config, _, max_tokens = schedule.training_of(plan)
    if result.get("train_ups") and result.get("updates") and not resumed:  # a measurement for --plan
        result["rate"] = {"device": schedule.device_name(device, plan.cpu), "config": config,
                          "max_tokens": max_tokens, "at_once": at_once, "updates_per_s": result["train_ups"],
                          "start_s": max(0.0, train_seconds - result["updates"] / result["train_ups"]),
                          "evaluate_s": round(evaluate_seconds, 1)}
    tmp = os.path.join(plan.run_dir, ".result.json.tmp")
    write_json(tmp, result)
    os.replace(tmp, os.path.join(plan.run_dir, "result.json"))
    print(f"{plan.where} BLEU ({plan.bleu}) {result['bleu']}, {result['params'] / 1e6:.2f}M parameters", flush=True)
    return result


def run_analysis(ap: AnalysisPlan) -> None:
    """One analysis of a finished run, unless the same command finished there before."""
    if ap.name in ("meteor", "comet"):
        (run_meteor if ap.name == "meteor" else run_comet)(ap)
        return
    where = f"{ap.run.where} {ap.name}"
    if ap.command is None:
        print(f"{where}: not run: {ap.unavailable}", flush=True)
        return
    marker = os.path.join(ap.out, ANALYSIS_DONE)
    if (read_record(marker, where) or {}).get("command") == ap.command:
        print(f"{where}: finished before: reused ({ap.out})", flush=True)
        return
    print(f"{where}", flush=True)
    if os.path.exists(marker):  # another command's outputs, replaced now: not finished until this one is
        os.remove(marker)
    run_command(ap.command, os.path.join(ap.run.run_dir, f"analysis-{ap.name}.log"), resources.command_environment())
    os.makedirs(ap.out, exist_ok=True)
    write_json(marker, {"command": ap.command})


def run_comet(ap: AnalysisPlan) -> dict:
    """COMET of the raw source, eval-test's detokenized hypotheses and reference (lowercased for a
    lowercased BLEU flavour) into comet.json; reused while the model and COMET's version are the same."""
    where = f"{ap.run.where} COMET"
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
    write_json(ap.out, result)
    print(f"{where} ({ap.comet.name}): {result['score']:.4f}", flush=True)
    return result


def run_meteor(ap: AnalysisPlan) -> dict:
    """METEOR of the detokenized hypotheses into meteor.json; {"unavailable": why} (tried again next run)."""
    where = ap.run.where
    done = read_record(ap.out, f"{where} meteor")
    language = read_prep_env(ap.run.data_dir).get("tgt", "")
    if done is not None and "score" in done and done.get("implementation") == meteor.describe(language):
        return done  # scored by this implementation (another one's score is made again)
    eval_dir = os.path.join(ap.run.run_dir, "eval-test")
    try:
        result = meteor.corpus_score(read_lines(os.path.join(eval_dir, "hyp.detok")),
                                     read_lines(os.path.join(eval_dir, "ref.detok")), language)
    except meteor.MeteorUnavailable as e:
        result = {"unavailable": str(e)}
    write_json(ap.out, result)
    print(f"{where} METEOR: "
          + (f"{result['score']:.2f}" if "score" in result else f"unavailable: {result['unavailable']}"), flush=True)
    return result
