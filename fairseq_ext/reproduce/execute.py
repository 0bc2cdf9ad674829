"""Running a table's plans: each run's commands (data, training, averaging, evaluation) in its
directory with their logs, its measurements into result.json, and each analysis of a finished
run. A finished run with the same commands is reused, never retrained; a finished analysis
with the same command is reused, never rerun. Every command runs in its own process group and
stops with the runner (:mod:`fairseq_ext.reproduce.children`)."""
import json
import os
import subprocess
import sys
import time
from typing import List, Optional

from fairseq_ext import resources
from fairseq_ext.common.data_text import read_lines, read_prep_env
from fairseq_ext.reproduce import children
from fairseq_ext.reproduce.measure import (decoding_speed, model_summary, read_bleu, training_progress,
                                           training_speed)
from fairseq_ext.reproduce.planning import ANALYSIS_DONE, AnalysisPlan, ReproduceError, RunPlan, shell_line
from fairseq_ext.tools import comet, meteor


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
        returncode = children.run(executable(cmd), stdout=out, stderr=subprocess.STDOUT, env=env)
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
