"""What reproducing one table runs: the :class:`Options`, one :class:`RunPlan` per (row that
trains a model, data set, seed), and an :class:`AnalysisPlan` per analysis a table's columns read
on a trained model (``python -m fairseq_ext.analysis.NAME``, or why it cannot run here; METEOR; COMET).

A run's directory is ``WORK/<table>/<row>/<data set>[.smoke|.cpu][.budget][.seedN]`` (rows that
report on another row's model share its run; ``.seedN``: a seed other than 1 under ``--seeds``):
``plan.json``, the logs, ``eval-test/``, ``result.json`` once finished, ``analysis/NAME/`` (with
``.reproduce-command.json``, the command that finished there), ``meteor.json``, ``significance.json``."""
import json
import os
import re
import shlex
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional, Set, Tuple

import torch

from fairseq_ext.analysis import registry
from fairseq_ext.errors import FairseqExtError
from fairseq_ext.reproduce.tables import Row, Table
from fairseq_ext import resources


ANALYSIS_DONE = ".reproduce-command.json"  # in an analysis' output: the command that finished there


class ReproduceError(FairseqExtError):
    pass


def write_json(path: str, record) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(record, f, indent=1)


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
    cpu: Optional[bool] = None  # None: when torch sees no GPU
    data_from: Dict[str, str] = field(default_factory=dict)  # data set -> local directory
    extra_train: List[str] = field(default_factory=list)
    extra_generate: List[str] = field(default_factory=list)
    substitute: bool = False  # use every data set's substitute (also implied by --smoke)
    senteval: Optional[str] = None  # SentEval's data/probing directory, for the probing columns
    comet: Optional[object] = None  # fairseq_ext.tools.comet.Comet: --comet-model's settings, checked
    share: Optional[float] = None  # the thesis' schedule compressed to this share of its tokens (SHARE_RULE)
    prepared: Dict[str, str] = field(default_factory=dict)  # data set -> its binarized directory, prepared elsewhere


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
    seed: int = 1  # the training seed (its --seed)

    @property
    def smoke(self) -> bool:
        return self.scale == "smoke"

    @property
    def where(self) -> str:
        return f"[{self.table}/{self.row}/{self.dataset}" + (f" seed {self.seed}]" if self.seed != 1 else "]")

    def commands(self) -> List[List[str]]:
        return [c for c in (self.prepare, self.train, self.average, self.evaluate) if c] + self.adversarial

    def as_json(self) -> dict:
        """The plan as plan.json holds it (the seed is the training command's --seed)."""
        return {k: v for k, v in asdict(self).items() if k != "seed"}

    def result_key(self) -> dict:
        """The plan as result.json records it: without the data preparation (no change to a result)."""
        return {k: v for k, v in self.as_json().items() if k != "prepare"}


@dataclass
class AnalysisPlan:
    """One analysis of one trained model, written into the run's directory."""
    name: str  # fairseq_ext.analysis.NAME, or "meteor" / "comet" (computed here, fairseq_ext.tools)
    run: RunPlan
    out: str  # output directory (meteor: the JSON file)
    command: Optional[List[str]] = None
    unavailable: str = ""  # why it cannot run with what is here (its columns say so)
    comet: Optional[object] = None  # "comet": fairseq_ext.tools.comet.Comet


def analysis_dir(run: RunPlan, name: str) -> str:
    return os.path.join(run.run_dir, "analysis", name)


def budget_flags(budget: Optional[str]) -> List[str]:
    if not budget:
        return []
    m = re.fullmatch(r"(\d+)([mh]?)", budget.strip())
    if not m or int(m.group(1)) <= 0:
        raise ReproduceError("--budget: expected a number of updates (e.g. 300) or minutes/hours (20m, 2h), "
                             f"not {budget!r}")
    value, unit = int(m.group(1)), m.group(2)
    if unit == "":
        return ["--max-update", str(value), "--max-epoch", "0"]
    hours = value / 60 if unit == "m" else value
    return ["--stop-time-hours", f"{hours:.4f}", "--max-epoch", "0", "--max-update", "0"]


# The compressed schedule (--share): what trained the small config on one H200 (docs/selfcheck.md#the-paper-stage)
SHARE_RULE = {"config": "iwslt", "max_tokens": 32768, "lr": "1e-3", "warmup": 400}


def last_flag(flags: List[str], name: str) -> Optional[str]:
    """The last value of ``name`` in ``flags`` (the one fairseq's parser keeps)."""
    at = [i for i, f in enumerate(flags[:-1]) if f == name]
    return flags[at[-1] + 1] if at else None


def config_flags(config: str) -> List[str]:
    with open(resources.config_path(config), encoding="utf-8") as f:
        return shlex.split(f.read(), comments=True)


def share_flags(config: str, share: float, where: str) -> List[str]:
    """The thesis' schedule of ``config`` at ``share`` of its tokens: SHARE_RULE's batch, learning rate and warm-up,
    and the updates that make the share (one cosine cycle after the warm-up, as the config's)."""
    if config != SHARE_RULE["config"]:
        raise ReproduceError(f"--share: the compressed schedule was measured for the small config (configs/"
                             f"{SHARE_RULE['config']}.args) only; {where} trains with --config {config}")
    flags = config_flags(config)
    tokens = share * int(last_flag(flags, "--max-update")) * int(last_flag(flags, "--max-tokens"))
    updates = max(1, round(tokens / SHARE_RULE["max_tokens"]))
    return ["--max-tokens", str(SHARE_RULE["max_tokens"]), "--max-update", str(updates), "--lr", SHARE_RULE["lr"],
            "--warmup-updates", str(min(SHARE_RULE["warmup"], updates // 4))]


def describe_budget(budget: str) -> str:
    """"200 updates", "20 min of training", "2 h of training", or the paper's schedule."""
    m = re.fullmatch(r"(\d+)([mh]?)", budget or "")
    if not m:
        return budget or "the paper's schedule (the training config's --max-update / --max-epoch)"
    value, unit = int(m.group(1)), m.group(2)
    return {"": f"{value} updates", "m": f"{value} min of training", "h": f"{value} h of training"}[unit]


def local_copy(key: str, setups: dict, opts: Options) -> Optional[str]:
    """The local directory of data set ``key``'s release files (--from, else $FAIRSEQ_EXT_DATA)."""
    local = opts.data_from.get(key)
    named = setups["datasets"][key].get("local")
    return resources.local_data(named) if local is None and named else local


def scale_name(opts: Options) -> str:
    """The reduced scale of setups.yaml: "smoke", "cpu", or "" (the paper's models)."""
    return "smoke" if opts.smoke else ("cpu" if opts.cpu_scale else "")


def scale_settings(setups: dict, opts: Options) -> dict:
    """setups.yaml's block of that scale (flags, generate, budget, analysis_args), or {}."""
    return setups[scale_name(opts)] if scale_name(opts) else {}


def resolve_data(key: str, setups: dict, opts: Options) -> (str, str, Optional[str]):
    """(data set used, why it is a substitute or "", local directory to read or None)."""
    datasets, wanted, reason = setups["datasets"], key, ""
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


def plan_run(table: Table, row: Row, dataset: str, setups: dict, opts: Options, seed: int = 1,
             several_seeds: bool = False) -> RunPlan:
    """The run of ``row`` (a row that trains a model) on ``dataset`` with ``seed``."""
    ds = table.datasets[dataset]
    training = setups["trainings"][ds["training"]]
    data_key, reason, local = resolve_data(ds.get("data", dataset), setups, opts)
    if ds.get("data") and not reason:
        reason = f"{data_key} for {dataset}" + (f" ({ds['data_note']})" if ds.get("data_note") else "")
    data_cfg = setups["datasets"][data_key]
    suffix = ".smoke" if opts.smoke else ""  # the smoke cut is its own data; the cpu scale reads all of it
    data_dir = opts.prepared.get(data_key) or os.path.join(opts.data_root, "reproduce", data_key + suffix)
    tag = dataset + (f".{data_key}" if data_key != dataset else "") + suffix + (".cpu" if opts.cpu_scale else "") \
        + (f".{opts.budget}" if opts.budget else "") + (f".share{opts.share:g}" if opts.share else "") \
        + (f".seed{seed}" if several_seeds and seed != 1 else "")  # seed 1 keeps the one-seed runs: reused
    run_dir = os.path.join(opts.work_dir, table.id, row.id, tag)
    cpu = (not torch.cuda.is_available()) if opts.cpu is None else opts.cpu
    smoke = setups["smoke"]
    if data_key in opts.prepared and not os.path.exists(os.path.join(data_dir, "prep.env")):
        raise ReproduceError(f"--prepared {data_key}={data_dir}: no prep.env there (a directory fairseq-ext prepare "
                             "wrote)")
    prepare = None if os.path.exists(os.path.join(data_dir, "prep.env")) else [
        "fairseq-ext", "prepare", *shlex.split(data_cfg["recipe"]), "--out", data_dir,
        *(["--from", local] if local else []),
        *(["--max-lines", str(smoke["max_lines"]), "--bpe-merges", str(smoke["bpe_merges"])] * opts.smoke)]

    extra_data_flags = shlex.split(data_cfg.get("flags", "") or "")
    generate_task_flags = []
    sources = data_cfg.get("sources") or []
    recipe = shlex.split(data_cfg.get("recipe") or "")
    if data_key in opts.prepared and "--src" in recipe:  # (one pair's directory serves either direction)
        extra_data_flags += ["--source-lang", last_flag(recipe, "--src"), "--target-lang", last_flag(recipe, "--tgt")]
        generate_task_flags = ["--src", last_flag(recipe, "--src"), "--tgt", last_flag(recipe, "--tgt")]
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
    share = share_flags(training["config"], opts.share, f"{table.id}/{dataset}") if opts.share else []
    train += ["--", *training_flags, *flags, *extra_data_flags, *scale_flags, *budget_flags(opts.budget), *share,
              "--seed", str(seed), *opts.extra_train]

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
                "--headline", ds["bleu"], *generate, *generate_task_flags, *opts.extra_generate,
                *(["--cpu"] if cpu else [])]
    adversarial = []
    if table.adversarial and row.multi_source:
        langs = sources if table.adversarial == "all" else sources[1:]
        for lang in langs:
            cmd = list(evaluate)
            cmd[cmd.index("--out") + 1] = os.path.join(run_dir, f"eval-test-shuffle-{lang}")
            adversarial.append(cmd + ["--shuffle-source", lang])
    budget = opts.budget or scale_name(opts) or "paper"
    if share:  # the settings beside every number of the table (--train-args may change them)
        updates, tokens, lr, warmup = (last_flag(train, f) for f in ("--max-update", "--max-tokens", "--lr",
                                                                     "--warmup-updates"))
        budget = f"{opts.share:g} of the thesis' tokens ({int(updates):,} updates of {int(tokens):,} tokens, lr {lr}, "\
                 f"warm-up {warmup})"
    return RunPlan(table=table.id, row=row.id, label=row.label, dataset=dataset, data_key=data_key,
                   substitution=reason, bleu=ds["bleu"], data_dir=data_dir, run_dir=run_dir, prepare=prepare,
                   train=train, average=average, evaluate=evaluate, checkpoint=checkpoint, budget=budget,
                   adversarial=adversarial, scale=scale_name(opts), cpu=cpu, generate=generate + opts.extra_generate,
                   model_flags=[*training_flags, *flags, *scale_flags], seed=seed)


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


def plan_table(table: Table, rows: List[Row], setups: dict, opts: Options, datasets: Optional[List[str]] = None,
               seed: int = 1, several_seeds: bool = False) -> List[RunPlan]:
    """One run per (data set, row that trains a model): of ``rows`` and the rows whose model they
    report on, on the data sets they are reported on (:func:`row_datasets`)."""
    keys = datasets or list(table.datasets)
    for k in keys:
        if k not in table.datasets:
            raise ReproduceError(f"--datasets: {table.id} has no data set {k!r} ({', '.join(table.datasets)})")
    on = row_datasets(table, rows, keys)
    plans = []
    for key in keys:
        owners = dict.fromkeys(table.owner(row).id for row in rows if key in on[row.id] and row.runnable)
        plans += [plan_run(table, table.row(owner), key, setups, opts, seed, several_seeds) for owner in owners]
    return plans


def plan_seeds(table: Table, rows: List[Row], setups: dict, opts: Options, seeds: List[int],
               datasets: Optional[List[str]] = None) -> Dict[int, List[RunPlan]]:
    """:func:`plan_table` per seed (seed -> its runs); seed 1 runs in the one-seed directory
    (its finished runs reused), another seed of several in its own (``....seedN``)."""
    several = len(seeds) > 1
    return {s: plan_table(table, rows, setups, opts, datasets, seed=s, several_seeds=several) for s in seeds}


shell_line = shlex.join  # a planned command as a user would type it


def _decodings(table: Table, plan: RunPlan, setups: dict, opts: Options, samples: int):
    """layer_dependency, decoders: test-set decodings with their paired bootstrap."""
    return [f"--generate-args={' '.join(plan.generate)}", "--flavour", plan.bleu, "--samples", str(samples),
            "--marks", table.marks]


def _probing(table: Table, plan: RunPlan, setups: dict, opts: Options, samples: int):
    """probing: SentEval's ten tasks (--senteval), else SentLen, WC and BShift from the source
    side of the local copy's training text."""
    if opts.senteval:
        return ["--senteval", opts.senteval]
    cfg = setups["datasets"][plan.data_key]
    local = local_copy(plan.data_key, setups, opts)
    if not cfg.get("train_text") or not local:
        why = f"no local copy of {plan.data_key}'s training text"
    else:
        src = (cfg.get("sources") or [None])[0] or (last_flag(shlex.split(cfg.get("recipe") or ""), "--src") or "")
        corpus = os.path.join(local, cfg["train_text"].format(src=src))
        if os.path.exists(corpus):
            return ["--corpus", corpus] + (["--corpus-tokenized"] if cfg.get("train_text_tokenized") else [])
        why = f"{corpus} does not exist"
    return ("probing needs SentEval's probing files (--senteval DIR) or a local copy of the training text to "
            f"generate SentLen, WC and BShift from ({why})")


# analysis -> (whether its command names the row, (table, plan, setups, opts, samples) -> its arguments or why not)
ANALYSIS_COMMANDS = {
    "layer_dependency": (True, _decodings), "decoders": (True, _decodings), "probing": (True, _probing),
    "word_translation": (False, lambda *_: []),
    "translate_from_layer": (False, lambda table, plan, *_: [  # FULL with the row's own beam and length penalty
        "--beam", last_flag(plan.generate, "--beam") or "4",
        "--lenpen", last_flag(plan.generate, "--lenpen") or "1.0"]),
}


def analysis_command(name: str, table: Table, plan: RunPlan, out: str, setups: dict, opts: Options,
                     samples: int) -> Tuple[Optional[List[str]], str]:
    """(``python -m fairseq_ext.analysis.NAME`` on ``plan``'s model into ``out``, "") or (None, why not)."""
    names, arguments = ANALYSIS_COMMANDS[name]
    own = arguments(table, plan, setups, opts, samples)
    if isinstance(own, str):
        return None, own
    cmd = ["python", "-m", registry.get(name).module, "--checkpoint", plan.checkpoint]
    cmd += (["--names", plan.row] if names else []) + ["--data", plan.data_dir, "--split", "test", "--out", out]
    return cmd + (["--cpu"] if plan.cpu else []) + own, ""


def plan_analyses(table: Table, plans: List[RunPlan], setups: dict, opts: Options,
                  samples: int = 1000) -> List[AnalysisPlan]:
    """Each analysis the table's columns read, once per trained model, with the table's and the
    reduced scale's arguments; METEOR and COMET."""
    out = []
    sources = {c.source for c in table.columns}
    wanted = table.analyses + ["meteor"] * ("meteor" in sources) + ["comet"] * (opts.comet is not None
                                                                                  and "comet" in sources)
    for plan in plans:
        for name in wanted:
            if name in ("meteor", "comet"):  # computed here (fairseq_ext.tools), into the run's NAME.json
                out.append(AnalysisPlan(name, plan, os.path.join(plan.run_dir, f"{name}.json"),
                                        comet=opts.comet if name == "comet" else None))
                continue
            directory = analysis_dir(plan, name)
            cmd, why = analysis_command(name, table, plan, directory, setups, opts, samples)
            if cmd is not None:
                reduced = (scale_settings(setups, opts).get("analysis_args") or {}).get(name, "")
                cmd += shlex.split(reduced) + shlex.split(table.analysis_args.get(name, ""))
            out.append(AnalysisPlan(name, plan, directory, cmd, why))
    return out
