"""Plan and run one table: for each row and data set, prepare the data if missing, train
(scripts/train.sh), average checkpoints where the paper did, evaluate (fairseq-ext evaluate)
with the table's BLEU flavour, count parameters and read the speeds; then run what the
table's columns read beyond that (the analysis commands, ``python -m fairseq_ext.analysis.NAME``,
and METEOR), and test the BLEU of every row against its reference row (sacreBLEU's paired
bootstrap).

A run's directory is ``WORK/<table>/<row>/<data set>[.smoke|.cpu][.budget][.seedN]`` (the row that
trains the model: rows that report on another row's model share that row's run; ``.seedN``: a
seed other than 1 of a table trained with several seeds, ``--seeds``); it holds
``plan.json`` (the commands), the logs, ``eval-test/`` and, when the run finished,
``result.json``; then ``analysis/NAME/`` (each analysis of its model, with
``.reproduce-command.json``, the command that finished there), ``meteor.json`` and
``significance.json`` (against its reference row). A finished run with the same commands is
reused, never retrained; a finished analysis with the same command is reused, never rerun.
Everything of one run stays in its directory, so that several runs of a row (seeds) can be
read one by one.
"""
import glob
import hashlib
import json
import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Dict, List, Optional, Set

from fairseq_ext.errors import FairseqExtError
from fairseq_ext import resources
from fairseq_ext.reproduce import children
from fairseq_ext.reproduce.tables import Row, Table

FLAVOUR_FILES = {"detok": ("hyp.detok", "ref.detok"), "tok": ("hyp.tok", "ref.tok")}
ANALYSIS_DONE = ".reproduce-command.json"  # in an analysis' output: the command that finished there


class ReproduceError(FairseqExtError):
    pass


@dataclass
class Options:
    work_dir: str = "runs"
    data_root: str = "data-bin"
    smoke: bool = False
    cpu_scale: bool = False  # setups.yaml's cpu block: the substitute in full, quickstart width, the paper's depth
    budget: Optional[str] = None  # "N" updates, "Nm" / "Nh" of training time
    nproc: int = 1
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    seed: int = 1
    seed_in_path: bool = False  # one of several seeds: a seed other than 1 runs in ....seedN (plan_seeds)
    cpu: Optional[bool] = None  # None: when torch sees no GPU
    data_from: Dict[str, str] = field(default_factory=dict)  # data set -> local directory
    extra_train: List[str] = field(default_factory=list)
    extra_generate: List[str] = field(default_factory=list)
    substitute: bool = False  # use every data set's substitute (also implied by --smoke)
    senteval: Optional[str] = None  # SentEval's data/probing directory, for the probing columns


@dataclass
class RunPlan:
    table: str
    row: str  # the row that trains this model
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
    scale: str = ""  # "smoke", "cpu" (a reduced scale of setups.yaml) or "" (the paper's models)
    cpu: bool = False
    generate: List[str] = field(default_factory=list)  # the decoding flags (evaluation and analyses)
    model_flags: List[str] = field(default_factory=list)  # the flags that shape the model (row, size preset, scale)

    @property
    def smoke(self) -> bool:
        return self.scale == "smoke"

    def commands(self) -> List[List[str]]:
        return [c for c in (self.prepare, self.train, self.average, self.evaluate) if c] + self.adversarial


@dataclass
class AnalysisPlan:
    """One analysis of one trained model (a run), written into the run's directory."""
    name: str  # fairseq_ext.analysis.NAME, or "meteor" (computed here, fairseq_ext.tools.meteor)
    run: RunPlan
    out: str  # output directory (meteor: the JSON file)
    command: Optional[List[str]] = None
    unavailable: str = ""  # why it cannot run with what is here (its columns say so)

    @property
    def log(self) -> str:
        return os.path.join(self.run.run_dir, f"analysis-{self.name}.log")


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


def describe_budget(budget: str) -> str:
    """A run's budget in words, with its unit: "200 updates", "20 min", "2 h", or the paper's
    schedule."""
    m = re.fullmatch(r"(\d+)([mh]?)", budget or "")
    if not m:
        return "the paper's schedule (the training config's --max-update / --max-epoch)"
    value, unit = int(m.group(1)), m.group(2)
    return {"": f"{value} updates", "m": f"{value} min of training", "h": f"{value} h of training"}[unit]


def has_gpu() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # pragma: no cover
        return False


def local_copy(key: str, setups: dict, opts: Options) -> Optional[str]:
    """The local directory of data set ``key``'s release files (--from, else $FAIRSEQ_EXT_DATA)."""
    local = opts.data_from.get(key)
    if local is None and setups["datasets"][key].get("local"):
        local = resources.local_data(setups["datasets"][key]["local"])
    return local


def scale_name(opts: Options) -> str:
    """The reduced scale of setups.yaml the run uses: "smoke", "cpu", or "" (the paper's models)."""
    return "smoke" if opts.smoke else ("cpu" if opts.cpu_scale else "")


def scale_settings(setups: dict, opts: Options) -> dict:
    """setups.yaml's block of that scale (flags, generate, budget, analysis_args), or {}."""
    name = scale_name(opts)
    return setups[name] if name else {}


def resolve_data(key: str, setups: dict, opts: Options) -> (str, str, Optional[str]):
    """(data set used, why it is a substitute or "", local directory to read or None)."""
    datasets = setups["datasets"]
    wanted = key
    reason = ""
    if opts.smoke or opts.cpu_scale or opts.substitute:
        sub = datasets[key].get("substitute")
        if sub:
            flag = "--smoke" if opts.smoke else ("--cpu-scale" if opts.cpu_scale else "--substitute")
            reason = f"{sub} in place of {key} ({flag})"
            key = sub
    if datasets[key].get("recipe") is None:
        sub = datasets[key]["substitute"]
        reason = f"{sub} in place of {wanted} (no recipe for {key} in the package's configs/tables/setups.yaml)"
        key = sub
    return key, reason, local_copy(key, setups, opts)


def plan_run(table: Table, row: Row, dataset: str, setups: dict, opts: Options) -> RunPlan:
    ds = table.datasets[dataset]
    training = setups["trainings"][ds["training"]]
    data_key, reason, local = resolve_data(ds.get("data", dataset), setups, opts)
    if ds.get("data") and not reason:
        reason = f"{data_key} for {dataset}" + (f" ({ds['data_note']})" if ds.get("data_note") else "")
    data_cfg = setups["datasets"][data_key]
    suffix = ".smoke" if opts.smoke else ""  # the smoke cut is its own data; the cpu scale reads all of it
    data_dir = os.path.join(opts.data_root, "reproduce", data_key + suffix)
    tag = dataset + (f".{data_key}" if data_key != dataset else "") + suffix + (".cpu" if opts.cpu_scale else "") \
        + (f".{opts.budget}" if opts.budget else "")
    if opts.seed_in_path and opts.seed != 1:  # seed 1 keeps the one-seed directory: its runs are reused
        tag += f".seed{opts.seed}"
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
    reduced = scale_settings(setups, opts)
    scale_flags = shlex.split(reduced.get("flags", "")) if reduced else []
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
    train += ["--", *training_flags, *flags, *extra_data_flags, *scale_flags, *budget_flags(opts.budget),
              "--seed", str(opts.seed), *opts.extra_train]

    average = None
    checkpoint = os.path.join(checkpoints, "checkpoint_best.pt")
    n_avg = int(training.get("average_last") or 0)
    if n_avg > 1 and not reduced and not opts.budget:
        checkpoint = os.path.join(checkpoints, f"checkpoint_avg{n_avg}.pt")
        average = ["fairseq-ext", "average-checkpoints", "--inputs", checkpoints,
                   "--num-update-checkpoints", str(n_avg), "--output", checkpoint]
    generate = shlex.split(reduced["generate"]) if reduced else shlex.split(training["generate"])
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
    budget = opts.budget or (scale_name(opts) or "paper")
    return RunPlan(table=table.id, row=row.id, label=row.label, dataset=dataset, data_key=data_key,
                   substitution=reason, bleu=ds["bleu"], data_dir=data_dir, run_dir=run_dir, prepare=prepare,
                   train=train, average=average, evaluate=evaluate, checkpoint=checkpoint, budget=budget,
                   adversarial=adversarial, scale=scale_name(opts), cpu=cpu, generate=generate + opts.extra_generate,
                   model_flags=[*training_flags, *flags, *scale_flags])


def row_datasets(table: Table, rows: List[Row], keys: List[str]) -> Dict[str, Set[str]]:
    """The data sets each row is reported on: those the paper prints it on (all of them when it
    prints it on none), and those of every row that is compared with it or reports on its model."""
    on = {}
    for r in rows:
        printed = {k for k in keys if k in r.paper}
        on[r.id] = printed if printed or any(k in r.paper for k in table.datasets) else set(keys)
    changed = True
    while changed:
        changed = False
        for r in rows:
            for needed in (table.reference(r), table.owner(r)):
                if needed is not None and needed.id in on and not on[r.id] <= on[needed.id]:
                    on[needed.id] |= on[r.id]
                    changed = True
    return on


def plan_table(table: Table, rows: List[Row], setups: dict, opts: Options, datasets: Optional[List[str]] = None):
    """One run per (data set, row that trains a model): ``rows`` and the rows whose model they
    report on, on the data sets they are reported on (:func:`row_datasets`)."""
    keys = datasets or list(table.datasets)
    for k in keys:
        if k not in table.datasets:
            raise ReproduceError(f"--datasets: {table.id} has no data set {k!r} ({', '.join(table.datasets)})")
    on = row_datasets(table, rows, keys)
    plans = []
    for key in keys:
        owners = []
        for row in rows:
            owner = table.owner(row)
            if key in on[row.id] and row.runnable and owner not in owners:
                owners.append(owner)
        plans += [plan_run(table, owner, key, setups, opts) for owner in owners]
    return plans


def plan_seeds(table: Table, rows: List[Row], setups: dict, opts: Options, seeds: List[int],
               datasets: Optional[List[str]] = None) -> Dict[int, List[RunPlan]]:
    """:func:`plan_table` once per seed (seed -> its runs). With one seed, the runs of
    ``opts`` with that seed; with several, a seed other than 1 runs in its own directory
    (``....seedN``) and seed 1 in the one-seed directory, so that its finished runs are reused."""
    several = len(seeds) > 1
    return {s: plan_table(table, rows, setups, replace(opts, seed=s, seed_in_path=several), datasets) for s in seeds}


def shell_line(cmd: List[str]) -> str:
    return " ".join(shlex.quote(c) for c in cmd)


# ---- analyses ----------------------------------------------------------------------------

def _option(flags: List[str], name: str, default: str) -> str:
    return flags[flags.index(name) + 1] if name in flags and flags.index(name) + 1 < len(flags) else default


def _analysis_command(name: str, plan: RunPlan, out: str, names: bool = True) -> List[str]:
    cmd = ["python", "-m", f"fairseq_ext.analysis.{name}", "--checkpoint", plan.checkpoint]
    cmd += ["--names", plan.row] if names else []
    cmd += ["--data", plan.data_dir, "--split", "test", "--out", out]
    return cmd + (["--cpu"] if plan.cpu else [])


def _bootstrap_analysis(name, table, plan, out, setups, opts, samples):
    """layer_dependency, decoders: decodings of the test set with their paired bootstrap."""
    from fairseq_ext.tools.significance import MARKS

    prefix = table.id.split("-")[0]
    return _analysis_command(name, plan, out) + [
        f"--generate-args={' '.join(plan.generate)}", "--flavour", plan.bleu, "--samples", str(samples),
        "--marks", prefix if prefix in MARKS else "thesis"], ""


def training_text(plan: RunPlan, setups: dict, opts: Options):
    """(the source side of the data set's training text in its local copy, whether it is
    Moses-tokenized already), or (None, why not)."""
    cfg = setups["datasets"][plan.data_key]
    pattern = cfg.get("train_text")
    local = local_copy(plan.data_key, setups, opts)
    if not pattern or not local:
        return None, f"no local copy of {plan.data_key}'s training text"
    recipe = shlex.split(cfg.get("recipe") or "")
    src = (cfg.get("sources") or [None])[0] or _option(recipe, "--src", "")
    path = os.path.join(local, pattern.format(src=src))
    if not os.path.exists(path):
        return None, f"{path} does not exist"
    return path, bool(cfg.get("train_text_tokenized"))


def _probing(name, table, plan, out, setups, opts, samples):
    """probing: SentEval's ten tasks (--senteval), else SentLen, WC and BShift generated from the
    data set's training text (the other seven need SentEval's files)."""
    if opts.senteval:
        tasks = ["--senteval", opts.senteval]
    else:
        corpus, tokenized_or_why = training_text(plan, setups, opts)
        if corpus is None:
            return None, (f"probing needs SentEval's probing files (--senteval DIR) or a local copy of the training "
                          f"text to generate SentLen, WC and BShift from ({tokenized_or_why})")
        tasks = ["--corpus", corpus] + (["--corpus-tokenized"] if tokenized_or_why else [])
    return _analysis_command(name, plan, out) + tasks, ""


def _word_translation(name, table, plan, out, setups, opts, samples):
    return _analysis_command(name, plan, out, names=False), ""


def _translate_from_layer(name, table, plan, out, setups, opts, samples):
    """translate_from_layer: FULL with the row's own beam and length penalty."""
    return _analysis_command(name, plan, out, names=False) + [
        "--beam", _option(plan.generate, "--beam", "4"), "--lenpen", _option(plan.generate, "--lenpen", "1.0")], ""


# analysis -> (name, table, run plan, output, setups, options, bootstrap samples) -> (command or None, why not)
ANALYSIS_COMMANDS = {
    "layer_dependency": _bootstrap_analysis,
    "decoders": _bootstrap_analysis,
    "probing": _probing,
    "word_translation": _word_translation,
    "translate_from_layer": _translate_from_layer,
}


def analysis_dir(run: RunPlan, name: str) -> str:
    return os.path.join(run.run_dir, "analysis", name)


def plan_analyses(table: Table, plans: List[RunPlan], setups: dict, opts: Options,
                  samples: int = 1000) -> List[AnalysisPlan]:
    """What the table's columns read beyond a run's result: each analysis once per trained
    model, with the table's and (--smoke) the smoke scale's arguments, and METEOR."""
    out = []
    wanted = list(table.analyses)
    if any(c.source == "meteor" for c in table.columns):
        wanted.append("meteor")
    for plan in plans:
        for name in wanted:
            if name == "meteor":
                out.append(AnalysisPlan(name, plan, os.path.join(plan.run_dir, "meteor.json")))
                continue
            directory = analysis_dir(plan, name)
            cmd, why = ANALYSIS_COMMANDS[name](name, table, plan, directory, setups, opts, samples)
            if cmd is not None:
                reduced = (scale_settings(setups, opts).get("analysis_args") or {}).get(name, "")
                cmd += shlex.split(reduced) + shlex.split(table.analysis_args.get(name, ""))
            out.append(AnalysisPlan(name, plan, directory, cmd, why))
    return out


def analysis_finished(ap: AnalysisPlan) -> bool:
    path = os.path.join(ap.out, ANALYSIS_DONE)
    if not os.path.exists(path):
        return False
    with open(path, encoding="utf-8") as f:
        return json.load(f).get("command") == ap.command


def execute_analysis(ap: AnalysisPlan) -> None:
    """Run one analysis of a finished run unless the same command finished there before."""
    where = f"[{ap.run.table}/{ap.run.row}/{ap.run.dataset}] {ap.name}"
    if ap.name == "meteor":
        run_meteor(ap)
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
    _run(ap.command, ap.log, resources.command_environment())
    os.makedirs(ap.out, exist_ok=True)
    with open(marker, "w", encoding="utf-8") as f:
        json.dump({"command": ap.command}, f, indent=1)


def read_prep_env(data_dir: str) -> Dict[str, str]:
    from fairseq_ext.tools.evaluate import read_prep_env as read

    return read(data_dir) if os.path.exists(os.path.join(data_dir, "prep.env")) else {}


def run_meteor(ap: AnalysisPlan) -> dict:
    """METEOR of the run's detokenized hypotheses (fairseq_ext.tools.meteor) into meteor.json;
    {"unavailable": why} when it cannot be computed here (tried again on the next run)."""
    if os.path.exists(ap.out):
        with open(ap.out, encoding="utf-8") as f:
            done = json.load(f)
        if "score" in done:
            return done
    eval_dir = os.path.join(ap.run.run_dir, "eval-test")
    language = read_prep_env(ap.run.data_dir).get("tgt", "")
    try:
        from fairseq_ext.tools import meteor
    except ImportError as e:
        result = {"unavailable": f"fairseq_ext.tools.meteor cannot be imported ({e})"}
    else:
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


# ---- measurements ------------------------------------------------------------------------

def count_parameters(checkpoint: str) -> int:
    """Trainable parameters of the model in ``checkpoint`` (shared tensors counted once,
    as the papers count a tied embedding once), read through the plugin's safe loader."""
    return model_summary(checkpoint)["params"]


def model_summary(checkpoint: str) -> dict:
    """{"params": trainable parameters (shared tensors once), "model": {layers, widths, heads}}
    of the model in ``checkpoint``, read through the plugin's safe loader."""
    from fairseq_ext.guards.checkpoint_safety import load_checkpoint_state

    state = load_checkpoint_state(checkpoint)
    seen, total = set(), 0
    for name, tensor in state["model"].items():
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape))
        if key in seen or not tensor.is_floating_point() or name.endswith("_float_tensor") or name.endswith(".version"):
            continue
        seen.add(key)
        total += tensor.numel()
    cfg = (state.get("cfg") or {}).get("model") if state.get("cfg") is not None else state.get("args")

    def get(name):
        value = cfg.get(name) if isinstance(cfg, dict) else getattr(cfg, name, None)
        return value if isinstance(value, (int, float, str)) else None

    shape = {k: get(k) for k in SHAPE_KEYS} if cfg is not None else {}
    return {"params": total, "model": shape}


SHAPE_KEYS = ("encoder_layers", "decoder_layers", "encoder_embed_dim", "encoder_ffn_embed_dim",
              "encoder_attention_heads")


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


def read_lines(path: str) -> List[str]:
    """Lines as every tool reads them (:func:`fairseq_ext.recipes.helpers.corpus.read_lines`: UTF-8
    checked, BOM and CRs removed, lines as wc -l counts them)."""
    from fairseq_ext.recipes.helpers.corpus import read_lines as _read_lines

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
    """A planned command as it runs: ``fairseq-ext ...`` and ``python -m ...`` through this
    Python (the plan prints the command a user would type; running it this way needs no
    ``fairseq-ext`` on PATH and keeps the runner's own installation)."""
    if cmd and cmd[0] == "fairseq-ext":
        return [sys.executable, "-m", "fairseq_ext", *cmd[1:]]
    if cmd and cmd[0] == "python":
        return [sys.executable, *cmd[1:]]
    return cmd


def _run(cmd: List[str], log: str, env=None):
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
    summary = model_summary(plan.checkpoint)
    result = {
        "plan": _plan_key(plan),
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


def _digest(paths: List[str]) -> str:
    h = hashlib.sha1()
    for path in paths:
        with open(path, "rb") as f:
            h.update(f.read())
    return h.hexdigest()


def significance(table: Table, plans: List[RunPlan], n_samples: int = 1000, seed: int = 12345,
                 rows: Optional[List[Row]] = None) -> Dict[str, dict]:
    """Paired bootstrap of the BLEU of every row against its reference row (``compare_with``,
    else the baseline), per data set, with the table's BLEU flavour; writes
    ``significance.json`` into the row's run directory (skipped when one of the same test on
    the same hypotheses is there) and returns {run_dir: {...}}."""
    from fairseq_ext.tools.significance import MARKS, paired_significance

    if not any(c.source == "bleu" for c in table.columns):
        return {}
    by_key = {(p.dataset, p.row): p for p in plans}
    rows = rows if rows is not None else [r for r in table.rows if r.runnable]
    groups: Dict[str, tuple] = {}  # reference run -> (its plan, [plans tested against it])
    for row in rows:
        ref = table.reference(row)
        if ref is None:
            continue
        for dataset in table.datasets:
            plan = by_key.get((dataset, table.owner(row).id))
            base = by_key.get((dataset, table.owner(ref).id))
            if plan is None or base is None or plan is base:
                continue
            entry = groups.setdefault(base.run_dir, (base, []))
            if plan not in entry[1]:
                entry[1].append(plan)
    prefix = table.id.split("-")[0]
    out = {}
    for base, tested in groups.values():
        level = "tok" if base.bleu.startswith("tok") else "detok"
        hyp_name, ref_name = FLAVOUR_FILES[level]
        base_dir = os.path.join(base.run_dir, "eval-test")
        if not os.path.exists(os.path.join(base_dir, hyp_name)):
            continue
        todo = {}
        for p in tested:
            hyp = os.path.join(p.run_dir, "eval-test", hyp_name)
            if not os.path.exists(hyp):
                continue
            digest = _digest([os.path.join(base_dir, ref_name), os.path.join(base_dir, hyp_name), hyp])
            known = os.path.join(p.run_dir, "significance.json")
            if os.path.exists(known):
                with open(known, encoding="utf-8") as f:
                    old = json.load(f)
                if (old.get("baseline"), old.get("flavour"), old.get("samples"), old.get("inputs")) == \
                        (base.row, base.bleu, n_samples, digest):
                    out[p.run_dir] = old
                    continue
            todo[p.row] = (p, digest)
        if not todo:
            continue
        refs = read_lines(os.path.join(base_dir, ref_name))
        result = paired_significance(refs, read_lines(os.path.join(base_dir, hyp_name)),
                                     {name: read_lines(os.path.join(p.run_dir, "eval-test", hyp_name))
                                      for name, (p, _) in todo.items()},
                                     flavour=base.bleu, method="bs", n_samples=n_samples, seed=seed,
                                     marks=prefix if prefix in MARKS else "thesis")
        for name, (p, digest) in todo.items():
            entry = {"baseline": base.row, "flavour": base.bleu, "samples": n_samples, "inputs": digest,
                     "baseline_bleu": result["baseline"].get("bleu"), **result[name]}
            out[p.run_dir] = entry
            with open(os.path.join(p.run_dir, "significance.json"), "w", encoding="utf-8") as f:
                json.dump(entry, f, indent=1)
    return out
