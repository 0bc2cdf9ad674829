"""Plan and run one table: for each row and data set, prepare the data if missing, train
(scripts/train.sh), average checkpoints where the paper did, evaluate (fairseq-ext evaluate)
with the table's BLEU flavour, count parameters and read the speeds; then test significance
against the table's baseline row (sacreBLEU's paired bootstrap).

A run's directory is ``WORK/<table>/<row>/<data set>[.smoke][.budget]``; it holds
``plan.json`` (the commands) and, when the run finished, ``result.json``. A finished run with
the same commands is reused, never retrained.
"""
import glob
import json
import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional

from fairseq_ext.errors import FairseqExtError
from fairseq_ext import resources
from fairseq_ext.reproduce.tables import Row, Table

FLAVOUR_FILES = {"detok": ("hyp.detok", "ref.detok"), "tok": ("hyp.tok", "ref.tok")}


class ReproduceError(FairseqExtError):
    pass


@dataclass
class Options:
    work_dir: str = "runs"
    data_root: str = "data-bin"
    smoke: bool = False
    budget: Optional[str] = None  # "N" updates, "Nm" / "Nh" of training time
    nproc: int = 1
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    seed: int = 1
    cpu: Optional[bool] = None  # None: when torch sees no GPU
    data_from: Dict[str, str] = field(default_factory=dict)  # data set -> local directory
    extra_train: List[str] = field(default_factory=list)
    extra_generate: List[str] = field(default_factory=list)
    substitute: bool = False  # use every data set's substitute (also implied by --smoke)


@dataclass
class RunPlan:
    table: str
    row: str
    label: str
    dataset: str  # the table's data set
    data_key: str  # the data set actually used (a substitute, or the same)
    substitution: str  # "" or why and what
    bleu: str
    data_dir: str
    run_dir: str
    prepare: Optional[List[str]]
    train: List[str]
    average: Optional[List[str]]
    evaluate: List[str]
    checkpoint: str
    budget: str
    adversarial: List[List[str]] = field(default_factory=list)  # evaluations with one source shuffled

    def commands(self) -> List[List[str]]:
        return [c for c in (self.prepare, self.train, self.average, self.evaluate) if c] + self.adversarial


def budget_flags(budget: Optional[str]) -> List[str]:
    if not budget:
        return []
    m = re.fullmatch(r"(\d+)([mh]?)", budget.strip())
    if not m or int(m.group(1)) <= 0:
        raise ReproduceError(f"--budget: expected a number of updates (e.g. 300) or minutes/hours (20m, 2h), not {budget!r}")
    value, unit = int(m.group(1)), m.group(2)
    if unit == "":
        return ["--max-update", str(value), "--max-epoch", "0"]
    hours = value / 60 if unit == "m" else value
    return ["--stop-time-hours", f"{hours:.4f}", "--max-epoch", "0", "--max-update", "0"]


def has_gpu() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # pragma: no cover
        return False


def resolve_data(key: str, setups: dict, opts: Options) -> (str, str, Optional[str]):
    """(data set used, why it is a substitute or "", local directory to read or None)."""
    datasets = setups["datasets"]
    wanted = key
    reason = ""
    if opts.smoke or opts.substitute:
        sub = datasets[key].get("substitute")
        if sub:
            reason = f"{sub} in place of {key} ({'--smoke' if opts.smoke else '--substitute'})"
            key = sub
    if datasets[key].get("recipe") is None:
        sub = datasets[key]["substitute"]
        reason = f"{sub} in place of {wanted} (no recipe for {key} in the package's configs/tables/setups.yaml)"
        key = sub
    local = opts.data_from.get(key)
    if local is None and datasets[key].get("local"):
        local = resources.local_data(datasets[key]["local"])
    return key, reason, local


def plan_run(table: Table, row: Row, dataset: str, setups: dict, opts: Options) -> RunPlan:
    ds = table.datasets[dataset]
    training = setups["trainings"][ds["training"]]
    data_key, reason, local = resolve_data(ds.get("data", dataset), setups, opts)
    if ds.get("data") and not reason:
        reason = f"{data_key} for {dataset}" + (f" ({ds['data_note']})" if ds.get("data_note") else "")
    data_cfg = setups["datasets"][data_key]
    suffix = ".smoke" if opts.smoke else ""
    data_dir = os.path.join(opts.data_root, "reproduce", data_key + suffix)
    tag = dataset + (f".{data_key}" if data_key != dataset else "") + suffix + (f".{opts.budget}" if opts.budget else "")
    run_dir = os.path.join(opts.work_dir, table.id, row.id, tag)
    cpu = (not has_gpu()) if opts.cpu is None else opts.cpu

    prepare = None
    if not os.path.exists(os.path.join(data_dir, "prep.env")):
        recipe = shlex.split(data_cfg["recipe"])
        prepare = ["fairseq-ext", "prepare", *recipe, "--out", data_dir]
        if local:
            prepare += ["--from", local]
        if opts.smoke:
            prepare += ["--max-lines", str(setups["smoke"]["max_lines"])]

    extra_data_flags = shlex.split(data_cfg.get("flags", "") or "")
    generate_task_flags = []
    sources = data_cfg.get("sources") or []
    if sources:  # a multi-source data set: the languages are explicit (two pairs in one directory)
        extra_data_flags += ["-s", sources[0], "-t", data_cfg["target"]]
        if row.multi_source:
            task = ["--task", "multi_source_translation", "--extra-source-langs", ",".join(sources[1:])]
            extra_data_flags += task
            generate_task_flags = task
        else:
            generate_task_flags = ["--task", "translation"]  # the first source only
    smoke_flags = shlex.split(setups["smoke"]["flags"]) if opts.smoke else []
    checkpoints = os.path.join(run_dir, "checkpoints")
    train = ["fairseq-ext", "train", data_dir, checkpoints, "--config", training["config"]]
    if opts.nproc != 1 or opts.nnodes != 1:
        train += ["--nproc", str(opts.nproc)]
    if opts.nnodes != 1:
        train += ["--nnodes", str(opts.nnodes), "--node-rank", str(opts.node_rank),
                  "--master-addr", opts.master_addr, "--master-port", str(opts.master_port)]
    flags = list(row.flags)
    if ds.get("arch"):  # the table's data set names the size preset (e.g. mma-3: small De-En, base Ja-En)
        flags[flags.index("--arch") + 1] = ds["arch"]
    training_flags = shlex.split(training.get("flags", "") or "")
    train += ["--", *training_flags, *flags, *extra_data_flags, *smoke_flags, *budget_flags(opts.budget),
              "--seed", str(opts.seed), *opts.extra_train]

    average = None
    checkpoint = os.path.join(checkpoints, "checkpoint_best.pt")
    n_avg = int(training.get("average_last") or 0)
    if n_avg > 1 and not opts.smoke and not opts.budget:
        checkpoint = os.path.join(checkpoints, f"checkpoint_avg{n_avg}.pt")
        average = ["fairseq-ext", "average-checkpoints", "--inputs", checkpoints,
                   "--num-update-checkpoints", str(n_avg), "--output", checkpoint]
    generate = shlex.split(setups["smoke"]["generate"]) if opts.smoke else shlex.split(training["generate"])
    evaluate = ["fairseq-ext", "evaluate", "--checkpoint", checkpoint,
                "--data", data_dir, "--split", "test", "--out", os.path.join(run_dir, "eval-test"),
                "--headline", ds["bleu"], *generate, *generate_task_flags, *opts.extra_generate]
    if cpu:
        evaluate.append("--cpu")
    adversarial = []
    if table.adversarial and row.multi_source:
        langs = sources if table.adversarial == "all" else sources[1:]
        for lang in langs:
            cmd = list(evaluate)
            cmd[cmd.index("--out") + 1] = os.path.join(run_dir, f"eval-test-shuffle-{lang}")
            adversarial.append(cmd + ["--shuffle-source", lang])
    budget = opts.budget or ("smoke" if opts.smoke else "paper")
    return RunPlan(table=table.id, row=row.id, label=row.label, dataset=dataset, data_key=data_key,
                   substitution=reason, bleu=ds["bleu"], data_dir=data_dir, run_dir=run_dir, prepare=prepare,
                   train=train, average=average, evaluate=evaluate, checkpoint=checkpoint, budget=budget,
                   adversarial=adversarial)


def plan_table(table: Table, rows: List[Row], setups: dict, opts: Options, datasets: Optional[List[str]] = None):
    keys = datasets or list(table.datasets)
    for k in keys:
        if k not in table.datasets:
            raise ReproduceError(f"--datasets: {table.id} has no data set {k!r} ({', '.join(table.datasets)})")
    # a row runs on the data sets the paper reports it on (all of them if it reports none)
    return [plan_run(table, row, key, setups, opts) for key in keys for row in rows
            if key in row.paper or not any(k in row.paper for k in table.datasets) or row.id == table.baseline]


def shell_line(cmd: List[str]) -> str:
    return " ".join(shlex.quote(c) for c in cmd)


# ---- measurements ------------------------------------------------------------------------

def count_parameters(checkpoint: str) -> int:
    """Trainable parameters of the model in ``checkpoint`` (shared tensors counted once,
    as the papers count a tied embedding once), read through the plugin's safe loader."""
    from fairseq_ext.guards.checkpoint_safety import load_checkpoint_state

    state = load_checkpoint_state(checkpoint)
    seen, total = set(), 0
    for name, tensor in state["model"].items():
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape))
        if key in seen or not tensor.is_floating_point() or name.endswith("_float_tensor") or name.endswith(".version"):
            continue
        seen.add(key)
        total += tensor.numel()
    return total


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


def decoding_speed(eval_dir: str) -> Dict[str, float]:
    """fairseq-generate's "Translated N sentences (T tokens) in Xs (S sentences/s, K tokens/s)"."""
    for path in sorted(glob.glob(os.path.join(eval_dir, "generate-*.txt")) + glob.glob(os.path.join(eval_dir, "generate-*.log"))):
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                m = re.search(r"Translated ([\d,]+) sentences \(([\d,]+) tokens\) in ([0-9.]+)s \(([0-9.]+) sentences/s, ([0-9.]+) tokens/s\)", line)
                if m:
                    return {"decode_sentences": int(m.group(1).replace(",", "")),
                            "decode_sents_per_s": float(m.group(4)), "decode_tokens_per_s": float(m.group(5))}
    return {}


def read_bleu(eval_dir: str, flavour: str) -> Optional[float]:
    path = os.path.join(eval_dir, "bleu.json")
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        scores = json.load(f)
    return scores.get(flavour, {}).get("score")


def read_lines(path: str) -> List[str]:
    """Lines as every tool reads them (:func:`fairseq_ext.tools.corpus.read_lines`: UTF-8
    checked, BOM and CRs removed, lines as wc -l counts them)."""
    from fairseq_ext.tools.corpus import read_lines as _read_lines

    return list(_read_lines(path))


# ---- running -----------------------------------------------------------------------------

def _plan_key(plan: RunPlan) -> dict:
    d = asdict(plan)
    d.pop("prepare")  # data that exists or not does not change a result
    return d


# what makes a result: the commands that trained and evaluated it (not the labels around them)
RESULT_FIELDS = ("train", "average", "evaluate", "checkpoint", "adversarial")


def same_run(recorded: dict, plan: RunPlan) -> bool:
    current = _plan_key(plan)
    return all(recorded.get(k, [] if k == "adversarial" else None) == current[k] for k in RESULT_FIELDS)


def finished(plan: RunPlan) -> Optional[dict]:
    path = os.path.join(plan.run_dir, "result.json")
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        result = json.load(f)
    if not same_run(result.get("plan", {}), plan):
        raise ReproduceError(f"{plan.run_dir} holds a run with other settings (see its result.json): "
                             "choose another --work-dir, or remove that directory to retrain")
    return result


def executable(cmd: List[str]) -> List[str]:
    """A planned command as it runs: ``fairseq-ext ...`` through this Python (the plan prints
    the command a user would type; running it this way needs no ``fairseq-ext`` on PATH and
    keeps the runner's own installation)."""
    if cmd and cmd[0] == "fairseq-ext":
        return [sys.executable, "-m", "fairseq_ext", *cmd[1:]]
    return cmd


def _run(cmd: List[str], log: str, env=None):
    os.makedirs(os.path.dirname(log), exist_ok=True)
    print(f"  $ {shell_line(cmd)}", flush=True)
    with open(log, "a", encoding="utf-8") as out:
        out.write(f"$ {shell_line(cmd)}\n")
        out.flush()
        proc = subprocess.run(executable(cmd), stdout=out, stderr=subprocess.STDOUT, env=env)
    if proc.returncode != 0:
        with open(log, encoding="utf-8", errors="replace") as f:
            tail = f.readlines()[-15:]
        sys.stderr.write("".join(tail))
        raise ReproduceError(f"command failed ({proc.returncode}); full log: {log}")


def execute_worker_node(plan: RunPlan, wait_seconds: int = 6 * 3600) -> None:
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
    env = resources.command_environment()
    _run(plan.train, os.path.join(plan.run_dir, f"train.node{plan.train[plan.train.index('--node-rank') + 1]}.log"), env)


def execute(plan: RunPlan) -> dict:
    """Run one plan (data, train, average, evaluate, measure) unless it finished before."""
    done = finished(plan)
    if done is not None:
        print(f"[{plan.table}/{plan.row}/{plan.dataset}] finished before: reused ({plan.run_dir})")
        return done
    print(f"[{plan.table}/{plan.row}/{plan.dataset}] {plan.label}"
          + (f"  (data: {plan.substitution})" if plan.substitution else ""), flush=True)
    os.makedirs(plan.run_dir, exist_ok=True)
    with open(os.path.join(plan.run_dir, "plan.json"), "w", encoding="utf-8") as f:
        json.dump(asdict(plan), f, indent=1)
    env = resources.command_environment()
    if plan.prepare and not os.path.exists(os.path.join(plan.data_dir, "prep.env")):
        _run(plan.prepare, os.path.join(plan.run_dir, "prepare.log"), env)
    train_log = os.path.join(plan.run_dir, "train.log")
    started = time.time()
    _run(plan.train, train_log, env)
    train_seconds = time.time() - started
    if plan.average:
        _run(plan.average, os.path.join(plan.run_dir, "average.log"), env)
    _run(plan.evaluate, os.path.join(plan.run_dir, "evaluate.log"), env)
    eval_dir = os.path.join(plan.run_dir, "eval-test")
    adversarial = {}
    for cmd in plan.adversarial:
        lang = cmd[-1]
        _run(cmd, os.path.join(plan.run_dir, f"evaluate-shuffle-{lang}.log"), env)
        adversarial[lang] = read_bleu(cmd[cmd.index("--out") + 1], plan.bleu)
    result = {
        "plan": _plan_key(plan),
        "bleu": read_bleu(eval_dir, plan.bleu),
        "params": count_parameters(plan.checkpoint),
        "train_seconds": round(train_seconds, 1),
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


def significance(table: Table, plans: List[RunPlan], n_samples: int = 1000, seed: int = 12345) -> Dict[str, dict]:
    """Paired bootstrap of every row against the baseline row, per data set, with the table's
    BLEU flavour; writes ``significance.json`` into each run directory and returns
    {run_dir: {...}}."""
    from fairseq_ext.tools.significance import MARKS, paired_significance

    out = {}
    by_dataset: Dict[str, List[RunPlan]] = {}
    for p in plans:
        by_dataset.setdefault(p.dataset, []).append(p)
    for dataset, group in by_dataset.items():
        base = [p for p in group if p.row == table.baseline]
        if not base:
            continue
        base = base[0]
        level = "tok" if base.bleu.startswith("tok") else "detok"
        hyp_name, ref_name = FLAVOUR_FILES[level]
        base_dir = os.path.join(base.run_dir, "eval-test")
        if not os.path.exists(os.path.join(base_dir, hyp_name)):
            continue
        refs = list(read_lines(os.path.join(base_dir, ref_name)))
        baseline = list(read_lines(os.path.join(base_dir, hyp_name)))
        systems = {}
        for p in group:
            path = os.path.join(p.run_dir, "eval-test", hyp_name)
            if p is not base and os.path.exists(path):
                systems[p.row] = list(read_lines(path))
        if not systems:
            continue
        prefix = table.id.split("-")[0]
        result = paired_significance(refs, baseline, systems, flavour=base.bleu, method="bs",
                                     n_samples=n_samples, seed=seed, marks=prefix if prefix in MARKS else "thesis")
        for p in group:
            entry = result.get(p.row) if p is not base else result.get("baseline", {})
            if entry is None:
                continue
            out[p.run_dir] = entry
            with open(os.path.join(p.run_dir, "significance.json"), "w", encoding="utf-8") as f:
                json.dump({"baseline": base.row, "flavour": base.bleu, "samples": n_samples, **entry}, f, indent=1)
    return out
