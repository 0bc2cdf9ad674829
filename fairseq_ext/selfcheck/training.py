"""The ``train`` and ``paper`` stages of the self-check (docs/selfcheck.md): each run one
``fairseq-ext train`` and one ``fairseq-ext evaluate`` of its last checkpoint, on the data of
``--data`` as ``fairseq-ext selfcheck-pack`` prepares it. ``train`` resumes a run of
``OUT/train/NAME`` and keeps a finished one; ``paper`` trains every row and seed at once, never
trains a finished run of ``OUT/paper/runs/NAME/`` again, and builds ``OUT/paper.md`` from every
run there."""
import functools
import json
import math
import os
import re
import shlex
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import torch

from fairseq_ext.common import checkpoints
from fairseq_ext.common.data_text import env_headline, read_lines, read_prep_env
from fairseq_ext.errors import CommandError
from fairseq_ext.reproduce.execute import log_lines, read_bleu, training_progress, training_speed
from fairseq_ext.reproduce.tables import Row, Table, load_setups, load_table
from fairseq_ext.selfcheck.stage_files import read_json, run_logged, table, write_stage
from fairseq_ext.selfcheck.timing import SIZES
from fairseq_ext.tools.statistics import format_mean_sd, mean_sd

MULTI30K, IWSLT = "multi30k.en-de", "iwslt15.en-vi"
MULTI30K_RUNS = [("multi30k-baseline", []), ("multi30k-m-10", ["--joint-attention", "m-10"])]
IWSLT_RUN = ("iwslt15-small", ["--arch", "multilayer_transformer_iwslt"])
GENERATE = ["--beam", "5", "--max-len-a", "1.2", "--max-len-b", "10"]
# test sentences longer than training's 150 positions (tst2012: 160 BPE tokens): the sinusoids extend to them
POSITIONS = repr({"max_source_positions": 1024, "max_target_positions": 1024})
# --quick: the benchmark's tiny model and schedule, a few tokens of decoding, the same commands otherwise
QUICK_MODEL = SIZES["tiny"][2] + ["--max-epoch", "0"]
QUICK_TRAIN = ["--max-tokens", "1000", "--warmup-updates", "4", "--max-update", "8"]
QUICK_GENERATE = {"train": ["--beam", "1", "--max-len-a", "0", "--max-len-b", "5"],
                  "paper": ["--beam", "2", "--max-len-a", "0", "--max-len-b", "5"]}
# kept back from training for each evaluation (train: twice Multi30k's 27-29 s on an H100)
EVALUATE_SECONDS = {"train": {"cuda": 60, "cpu": 90}, "paper": {"cuda": 100, "cpu": 90}}

# the thesis' tables with an IWSLT'15 En-Vi column (configs/tables/), each direction the pack's data serves
TABLES = ("thesis-3.3", "thesis-4.1", "thesis-5.3")
DIRECTIONS = {"iwslt15-en-vi": ("en", "vi"), "iwslt15-vi-en": ("vi", "en")}
# each table's default rows: the thesis' largest En->Vi gain and the row it is printed against
DEFAULT_ROWS = {"thesis-3.3": "transformer,iter-c-agg", "thesis-4.1": "ms-1,ms-1-plus-aif",
                "thesis-5.3": "transformer,enc-dc"}
THESIS_UPDATES, THESIS_MAX_TOKENS = 200_000, 2_048  # configs/iwslt.args: the thesis' training
# what every run trains with on a GPU (docs/selfcheck.md#the-paper-stage says why)
SETTINGS = {"updates": 2600, "max_tokens": 32768, "lr": 1e-3, "warmup": 400}
QUICK_SETTINGS = {"updates": 8, "max_tokens": 1000, "lr": 1e-3, "warmup": 4}
SCHEDULE = ["--lr-scheduler", "cosine", "--warmup-init-lr", "1e-7", "--no-epoch-checkpoints", "--log-interval", "50"]
START_SECONDS = 20  # python, fairseq, the data and the model before fairseq's training clock starts
LEARNED_BLEU = 1.0  # a reference run under it did not learn (e.g. too high a learning rate): no Δ or p against it
# the fields of a run.json the table reads, and their types (None: not measured)
RUN_FIELDS = {"dataset": str, "flags": str, "seed": int, "updates_planned": int, "max_tokens": int, "lr": (int, float),
              "warmup": int, **dict.fromkeys(("bleu", "chrf", "updates", "target_tokens", "train_wall_s", "train_ups",
                                              "valid_loss"), (int, float, type(None)))}


def fairseq_ext(command: str, *args: str) -> List[str]:
    return [sys.executable, "-m", "fairseq_ext", command, *args]


def precision(device) -> List[str]:
    return ["--fp16"] if device.type == "cuda" else ["--cpu"]


def evaluate_command(checkpoint: str, data: str, eval_dir: str, generate: List[str], device,
                     *overrides: str) -> List[str]:
    return fairseq_ext("evaluate", "--checkpoint", checkpoint, "--data", data, "--out", eval_dir, *generate,
                       *overrides, *precision(device))


def data_dir(data: Optional[str], name: str, stage: str = "train", required: bool = False) -> Optional[str]:
    """``DATA/NAME`` when prepared (its prep.env), else None (an error when ``required`` or no ``--data``)."""
    pack = "fairseq-ext selfcheck-pack" + (f" --datasets {IWSLT}" if stage == "paper" else "")
    if not data:
        needed = f"{MULTI30K}/ and {IWSLT}/" if stage == "train" else f"{IWSLT}/"
        raise CommandError(f"--data: the {stage} stage needs the folder of prepared data ({pack} writes it: "
                           f"PACK/data, with {needed})")
    path = os.path.join(data, name)
    if required and not os.path.exists(os.path.join(path, "prep.env")):
        raise CommandError(f"--data: no {name}/prep.env under {data} ({pack} prepares it)")
    return path if os.path.exists(os.path.join(path, "prep.env")) else None


# ---- the train stage ----------------------------------------------------------------------

def previous_training_seconds(save: str) -> float:
    """The training time of earlier commands that fairseq's --stop-time-hours counts too."""
    last = os.path.join(save, "checkpoint_last.pt")
    extra = (checkpoints.load_state(last).get("extra_state") or {}) if os.path.exists(last) else {}
    return float(extra.get("previous_training_time") or 0.0)


def finished(save: str, log: str, settings: str) -> bool:
    """A run trained to its planned updates with these settings: kept (a resumed one would train one more update)."""
    path = os.path.join(save, "selfcheck.settings")
    if not os.path.exists(path) or not os.path.exists(os.path.join(save, "checkpoint_last.pt")):
        return False
    with open(path, encoding="utf-8") as f:
        progress = training_progress(log) if f.read() == settings else {}  # other settings: not finished
    return "planned_updates" in progress and progress.get("updates", 0) >= progress["planned_updates"]


def train_and_evaluate(name: str, data: str, config: str, flags: List[str], out: str, device,
                       seconds: float, generate: List[str]) -> dict:
    """Train ``name`` for at most ``seconds`` (resumed; a finished run kept), evaluate its last
    checkpoint; the run's record."""
    save = os.path.join(out, "train", name)
    os.makedirs(save, exist_ok=True)
    log, keep_back = os.path.join(save, "train.log"), EVALUATE_SECONDS["train"][device.type]
    cmd = fairseq_ext("train", data, save, "--config", config, "--", *flags, *precision(device),
                      "--no-epoch-checkpoints")
    settings = shlex.join(cmd[3:]) + "\n"
    start, kept, trained = time.time(), finished(save, log, settings), 0
    if not kept:
        limit_hours = (previous_training_seconds(save) + max(0.0, seconds - keep_back)) / 3600
        trained = run_logged({name: (cmd + ["--stop-time-hours", f"{limit_hours:.6f}"], log)},
                             time.time() + seconds)[name]
        with open(os.path.join(save, "selfcheck.settings"), "w", encoding="utf-8") as f:
            f.write(settings)
    train_seconds = time.time() - start
    record = {"name": name, "data": data, "command": cmd, "train_returncode": trained, "kept": kept,
              "train_wall_s": round(train_seconds, 1), "training_time_s": round(previous_training_seconds(save), 1),
              **training_progress(log), **training_speed(log)}
    checkpoint, eval_dir = os.path.join(save, "checkpoint_last.pt"), os.path.join(save, "eval-test")
    flavour, _ = env_headline(read_prep_env(data))
    if kept and read_bleu(eval_dir, flavour) is not None:
        record.update(eval_returncode=0, bleu=read_bleu(eval_dir, flavour), bleu_flavour=flavour)
    elif trained == 0 and os.path.exists(checkpoint):
        start = time.time()
        evaluate = evaluate_command(checkpoint, data, eval_dir, generate, device, "--model-overrides", POSITIONS)
        record["eval_returncode"] = run_logged({name: (evaluate, log)},
                                               start + max(keep_back, seconds - train_seconds))[name]
        record["eval_wall_s"] = round(time.time() - start, 1)
        record.update(bleu=read_bleu(eval_dir, flavour), bleu_flavour=flavour)
    return record


def run_train(out: str, device, data: Optional[str], quick: bool, time_limit: float, **_) -> List[str]:
    deadline = time.time() + time_limit
    multi30k, iwslt = data_dir(data, MULTI30K, required=True), data_dir(data, IWSLT)
    setup = load_setups()["trainings"]["cpu-quickstart"]
    quick_flags, generate = (QUICK_MODEL + QUICK_TRAIN, QUICK_GENERATE["train"]) if quick else ([], GENERATE)
    records = []
    runs = MULTI30K_RUNS[:1] if quick else MULTI30K_RUNS  # --quick: the baseline's code path is M-10's
    for i, (name, flags) in enumerate(runs):
        share = (deadline - time.time()) / (len(runs) - i + (1 if iwslt else 0))
        records.append(train_and_evaluate(name, multi30k, setup["config"], shlex.split(setup["flags"]) + quick_flags
                                          + flags, out, device, share, generate))
    if iwslt and deadline - time.time() > EVALUATE_SECONDS["train"][device.type] + 30:
        name, flags = IWSLT_RUN
        records.append(train_and_evaluate(name, iwslt, "iwslt", flags + quick_flags, out, device,
                                          deadline - time.time(), generate))
    ok = all(r.get("train_returncode") == 0 and r.get("eval_returncode") == 0 for r in records)
    rows = [[r["name"], r.get("updates"), r.get("planned_updates"), r.get("train_ups") and f"{r['train_ups']:.1f}",
             f"{r['training_time_s']:.0f}" + (" (kept)" if r.get("kept") else ""), r.get("eval_wall_s"),
             r.get("bleu") if r.get("bleu") is None else f"{r['bleu']:.2f}", r.get("bleu_flavour")] for r in records]
    lines = ["# Training on the device", "",
             f"{'fp16 on ' + device.type if device.type == 'cuda' else 'fp32 on the CPU'}"
             + (" (`--quick`: a tiny model for a few updates, the BLEU means nothing)" if quick else "")
             + f", at most {time_limit:.0f} s for the stage. Each run is `fairseq-ext train` then "
             f"`fairseq-ext evaluate {' '.join(generate)}` on the test set; a run that stopped on time resumes from "
             "its `checkpoint_last.pt` when the stage runs again with the same `--out`.", ""]
    lines += table(["run", "updates", "planned", "updates/s", "training s", "evaluate s", "BLEU", "flavour"], rows)
    if not iwslt:
        lines += ["", f"IWSLT'15 En-Vi: not run (no {IWSLT}/ in --data)."]
    for r in records:
        if r.get("train_returncode") != 0 or r.get("eval_returncode") not in (0, None):
            lines += ["", f"- {r['name']}: train exit {r.get('train_returncode')}, evaluate exit "
                          f"{r.get('eval_returncode')}; see train/{r['name']}/train.log"]
    return write_stage(out, "train", {"result": "ok" if ok else "a run failed", "device": str(device), "quick": quick,
                                      "runs": records}, lines)


# ---- the paper stage ----------------------------------------------------------------------

@dataclass(frozen=True)
class Run:
    slug: str  # the model: Table 3.3's row id where the flags are its row's (shared by the tables), else TABLE-ROW
    flags: str
    dataset: str
    seed: int
    updates: int
    max_tokens: int
    lr: float
    warmup: int

    @property
    def settings(self) -> str:
        return f"{self.updates:,} updates of {self.max_tokens} tokens, lr {self.lr:g}, warm-up {self.warmup}"

    @property
    def name(self) -> str:
        """The run's folder: its direction (En->Vi bare), model, seed and settings."""
        prefix = "" if self.dataset == "iwslt15-en-vi" else self.dataset.split("-", 1)[1] + "-"
        return f"{prefix}{self.slug}-s{self.seed}-u{self.updates}-mt{self.max_tokens}-lr{self.lr:g}-wu{self.warmup}"


def row_flags(row: Row) -> str:
    """A row's flags as one string: what identifies a run's model across the tables."""
    return " ".join(shlex.split(" ".join(row.flags)))


def table_rows(table: Table, dataset: str) -> List[Row]:
    """The rows of ``table`` that train on ``dataset``: the thesis' and our reference rows."""
    return [r for r in table.rows if r.runnable and (dataset in r.paper or r.ours_only)]


@functools.lru_cache(maxsize=None)
def slugs() -> Dict[str, str]:
    """flags -> the run's model name: Table 3.3's row id first, so that the tables share its runs."""
    found: Dict[str, str] = {}
    for table_id in TABLES:
        for row in (r for r in load_table(table_id).rows if r.runnable):
            found.setdefault(row_flags(row), row.id if table_id == TABLES[0] else f"{table_id.split('-')[1]}-{row.id}")
    return found


def thesis_number(row: Row, dataset: str) -> Tuple[Optional[float], Optional[float]]:
    """(BLEU, gain) as the thesis prints them: '31.13 (+0.55)'."""
    found = re.findall(r"[-+]?\d+\.\d+", row.paper.get(dataset, {}).get("BLEU", "").replace("−", "-"))
    return (float(found[0]) if found else None), (float(found[1]) if len(found) > 1 else None)


def plan(table_id: str, rows: Optional[str], datasets: str, seeds: str, updates: Optional[str],
         max_tokens: Optional[str], lr: Optional[str], warmup: Optional[str], quick: bool) -> List[Run]:
    """Every run of rows x directions x seeds x settings of a table."""
    if table_id not in TABLES:
        raise CommandError(f"--table {table_id}: the paper stage runs {', '.join(TABLES)} (their IWSLT'15 En-Vi "
                           "columns)")
    table = load_table(table_id)
    served = [d for d in table.datasets if d in DIRECTIONS]
    wanted = [d.strip() for d in datasets.split(",") if d.strip()]
    if not wanted or set(wanted) - set(served):
        raise CommandError(f"--datasets {datasets}: {table_id} has {', '.join(served)}")
    names = [s.strip() for s in (rows or DEFAULT_ROWS[table_id]).split(",") if s.strip()]
    known = {r.id: r for d in wanted for r in table_rows(table, d)}
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise CommandError(f"--rows: unknown row {', '.join(unknown) or repr(rows)} of {table_id} "
                           f"(choose from {', '.join(known)})")

    def values(value, kind, option, key=None):
        if key and not value:
            return [(QUICK_SETTINGS if quick else SETTINGS)[key]]
        try:
            found = [kind(v) for v in value.split(",") if v.strip()]
        except ValueError:
            found = []
        if not found or any(not v > 0 or v == float("inf") for v in found):  # nan, inf too
            raise CommandError(f"{option}: {value!r}: expected a comma list of positive numbers")
        return found

    grid = [(u, m, l, w) for u in values(updates, int, "--updates", "updates")
            for m in values(max_tokens, int, "--max-tokens", "max_tokens")
            for l in values(lr, float, "--lr", "lr") for w in values(warmup, int, "--warmup", "warmup")]
    for u, _, _, w in grid:
        if w >= u:
            raise CommandError(f"--warmup ({w}) must be below --updates ({u}): the cosine cycle follows the warm-up")
    flags = {n: row_flags(known[n]) for n in names}
    return [Run(slugs()[flags[n]], flags[n], d, s, *settings) for d in wanted for n in names
            for s in values(seeds, int, "--seed") for settings in grid if known[n] in table_rows(table, d)]


# measured, two runs at once at 32,768 tokens on one H200: the mean of the baseline's 12.33 and Iter-C-Agg's 12.55
MEASURED = {"max_tokens": 32768, "at_once": 2, "updates_per_s": 12.4, "start_s": 20, "evaluate_s": 50}


def plan_lines(table_id: str, runs: List[Run], quick: bool = False) -> List[str]:
    """``--plan``: the runs with the thesis' numbers, the share of its tokens, and the device minutes
    at the measured speed (commands of two runs at once); with ``quick``, what it trains and its time."""
    thesis, m = load_table(table_id), MEASURED
    rows = {row_flags(r): r for d in DIRECTIONS if d in thesis.datasets for r in table_rows(thesis, d)}
    lines = table(["run", "row", "thesis BLEU", "settings", "of the thesis' tokens"], [
        [r.name, rows[r.flags].label, rows[r.flags].paper.get(r.dataset, {}).get("BLEU", "–"), r.settings,
         f"{100 * r.updates * r.max_tokens / (THESIS_UPDATES * THESIS_MAX_TOKENS):.2g}%"] for r in runs])
    if quick:  # run_paper trains them all at once; the GPU's speed says nothing of a tiny model
        return lines + ["", f"Device time: --quick trains these {len(runs)} runs at once in one command, a 2+2-layer "
                            f"model of width 32 for {QUICK_SETTINGS['updates']} updates each, then decodes 5 tokens a "
                            "sentence: the code path, its numbers mean nothing. 2 runs took 24 s on a 2-core CPU "
                            "(measured), more take longer."]
    timed = [r for r in runs if r.max_tokens == m["max_tokens"]]
    batches = [timed[i:i + m["at_once"]] for i in range(0, len(timed), m["at_once"])]
    seconds = sum(m["start_s"] + m["evaluate_s"] + max(r.updates for r in b) / m["updates_per_s"] for b in batches)
    return lines + ["", f"Device time: about {seconds / 60:.1f} minutes in {-(-len(timed) // m['at_once'])} "
                        f"command(s) of {m['at_once']} runs at once, at {m['updates_per_s']} updates/s a run (the "
                        f"mean of the baseline and Iter-C-Agg, two runs at {m['max_tokens']} tokens on one H200, "
                        "measured; a slower row takes longer), plus the machine's start"
                    + (f"; {len(runs) - len(timed)} run(s) at another --max-tokens: not measured" if len(runs) >
                       len(timed) else "") + "."]


def target_tokens(log: str) -> Optional[int]:
    """Target tokens trained on: per epoch summary, ``wpb`` times the epoch's updates."""
    total, previous = 0.0, 0
    for line in log_lines(log):
        wpb, upd = re.search(r"\bwpb ([0-9.]+)", line), re.search(r"\bnum_updates (\d+)", line)
        if ("| train |" in line or " | train " in line) and wpb and upd:
            total += float(wpb.group(1)) * (int(upd.group(1)) - previous)
            previous = int(upd.group(1))
    return round(total) if previous else None


def valid_loss(log: str) -> Optional[float]:
    """The last validation loss fairseq printed (base 2, label-smoothed)."""
    found = [re.search(r"valid on 'valid' subset \|.*?\bloss ([0-9.]+)", line) for line in log_lines(log)]
    return next((float(m.group(1)) for m in reversed(found) if m), None)


def run_paper(out: str, device, data: Optional[str], quick: bool, time_limit: float, runs: List[Run],
              train_flags: List[str], table_only: bool = False, **_) -> List[str]:
    """Train and evaluate the unfinished ``runs`` all at once; the table of every run."""
    root, deadline = os.path.join(out, "paper", "runs"), time.time() + time_limit
    todo = [] if table_only else [r for r in runs if read_json(os.path.join(root, r.name, "run.json")).get("bleu")
                                  is None]  # the others are kept
    if todo:
        train_paper_runs(root, data_dir(data, IWSLT, "paper", required=True), device, quick, deadline, todo,
                         train_flags)
    return write_table(out)


def train_paper_runs(root: str, data: str, device, quick: bool, deadline: float, todo: List[Run],
                     train_flags: List[str]) -> None:
    folders = {r.name: os.path.join(root, r.name) for r in todo}
    languages = {r.name: ["--source-lang", DIRECTIONS[r.dataset][0], "--target-lang", DIRECTIONS[r.dataset][1]]
                 for r in todo}
    commands = {r.name: fairseq_ext("train", data, os.path.join(folders[r.name], "checkpoints"), "--config", "iwslt",
                                    "--", *shlex.split(r.flags), *languages[r.name], "--seed", str(r.seed),
                                    "--max-update", str(r.updates), "--max-tokens", str(r.max_tokens), "--lr",
                                    f"{r.lr:g}", "--warmup-updates", str(r.warmup), *SCHEDULE, *precision(device),
                                    *(QUICK_MODEL if quick else []), *train_flags) for r in todo}
    threads = max(1, (os.cpu_count() or 1) // len(todo))
    train_until = deadline - EVALUATE_SECONDS["paper"][device.type]
    hours = max(60.0, train_until - time.time() - START_SECONDS) / 3600
    for folder in folders.values():
        os.makedirs(folder, exist_ok=True)
    begun = time.time()
    codes = run_logged({n: (cmd + ["--stop-time-hours", f"{hours:.6f}"], os.path.join(folders[n], "train.log"))
                        for n, cmd in commands.items()}, train_until + 30, threads)
    trained_s, begun = time.time() - begun, time.time()
    generate = QUICK_GENERATE["paper"] if quick else shlex.split(load_setups()["trainings"]["thesis-iwslt"]["generate"])
    last = {n: os.path.join(folder, "checkpoints", "checkpoint_last.pt") for n, folder in folders.items()}
    evals = {n: (evaluate_command(last[n], data, os.path.join(folder, "eval-test"), generate, device,
                                  "--src", languages[n][1], "--tgt", languages[n][3]),
                 os.path.join(folder, "evaluate.log"))
             for n, folder in folders.items() if os.path.exists(last[n])}
    eval_codes = run_logged(evals, deadline, threads)
    evaluated_s = time.time() - begun
    prep = read_prep_env(data)
    flavour, _ = env_headline(prep)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({os.cpu_count()} cores)"
    for run in todo:
        log, folder = os.path.join(folders[run.name], "train.log"), folders[run.name]
        metrics = read_json(os.path.join(folder, "eval-test", "metrics.json"))
        record = {"name": run.name, "row": run.slug, "flags": run.flags, "dataset": run.dataset, "seed": run.seed,
                  "updates_planned": run.updates, "max_tokens": run.max_tokens, "lr": run.lr, "warmup": run.warmup,
                  "device": name, "precision": "fp16" if device.type == "cuda" else "fp32", "quick": quick,
                  "concurrent_runs": len(todo), "data": data, "test_set": prep.get("test_set"),
                  "bpe_merges": prep.get("bpe_merges"), "dict_size": prep.get("dict_size"),
                  "train_command": commands[run.name], "train_returncode": codes.get(run.name),
                  "train_wall_s": round(trained_s, 1), **training_progress(log), **training_speed(log),
                  "target_tokens": target_tokens(log), "valid_loss": valid_loss(log),
                  "eval_returncode": eval_codes.get(run.name), "eval_wall_s": round(evaluated_s, 1),
                  "generate": generate, "bleu_flavour": flavour,
                  "bleu": read_bleu(os.path.join(folder, "eval-test"), flavour),
                  "chrf": (metrics.get("chrF2") or {}).get("score")}
        with open(os.path.join(folder, "run.json"), "w", encoding="utf-8") as f:
            json.dump(record, f, indent=1)
            f.write("\n")


def sentence_stats(record: dict):
    """sacreBLEU's statistics of each test sentence of a run, or None."""
    from fairseq_ext.reproduce.marks import texts
    from fairseq_ext.tools.statistics import sentence_stats as stats

    flavour = record.get("bleu_flavour", "detok-cased")
    ref, hyp = texts(record["folder"], flavour)
    if not (os.path.exists(hyp) and os.path.exists(ref)):
        return None
    return stats(read_lines(ref), read_lines(hyp), flavour)


def complete(record: dict) -> bool:
    """The run trained all its planned updates (not stopped by the time limit)."""
    return (record.get("updates") or 0) >= record.get("updates_planned", 0)


def settings_of(record: dict) -> Tuple[int, int, float, int]:
    return record["updates_planned"], record["max_tokens"], record["lr"], record["warmup"]


def load_records(out: str) -> List[dict]:
    """Every run.json under OUT/paper/runs, with its folder; a record of the first version (Table
    3.3 En->Vi only) gets its flags and direction."""
    root = os.path.join(out, "paper", "runs")
    first = {r.id: row_flags(r) for r in load_table(TABLES[0]).rows if r.runnable}
    found = []
    for name in sorted(os.listdir(root)) if os.path.isdir(root) else []:
        if os.path.exists(os.path.join(root, name, "run.json")):
            record = {**read_json(os.path.join(root, name, "run.json")), "folder": os.path.join(root, name)}
            record.setdefault("dataset", "iwslt15-en-vi")
            record.setdefault("flags", first.get(record.get("row"), ""))
            found.append(record)
    return found


def unscored(record: dict) -> Optional[str]:
    """Why a run has no row in the table (None: it has one): a malformed run.json, no score, a score that is NaN."""
    for field, kind in RUN_FIELDS.items():
        if not isinstance(record.get(field), kind) or isinstance(record.get(field), bool):
            return f"malformed run.json: {'invalid' if field in record else 'missing'} field {field}"
    if record["bleu"] is None:
        return (f"no score: train exit {record.get('train_returncode')}, evaluate exit "
                f"{record.get('eval_returncode')} (see its train.log and evaluate.log)")
    return None if math.isfinite(record["bleu"]) else f"its BLEU is {record['bleu']}: a failed run"


def write_table(out: str) -> List[str]:
    found = load_records(out)
    records = [r for r in found if unscored(r) is None]
    failed = {os.path.basename(r["folder"]): unscored(r) for r in found if unscored(r) is not None}
    groups: Dict[tuple, Dict[int, dict]] = {}  # (direction, flags, settings) -> seed -> record
    for r in records:
        groups.setdefault((r["dataset"], r["flags"]) + settings_of(r), {})[r["seed"]] = r
    first, quick = (records[0] if records else {}), any(r.get("quick") for r in found)
    lines = [""]
    if quick:
        lines += ["`--quick`: a tiny model for a few updates; the numbers mean nothing.", ""]
    lines += [
        "Each run: `fairseq-ext train --config iwslt` with the row's flags (the thesis' small config: 4+4 layers, "
        "d 256, d_ff 1024 unless the row sets 512, 4 heads, shared embeddings, max length 150) in "
        f"{first.get('precision', '?')} on {' and '.join(sorted({r.get('device', '?') for r in records})) or '?'}, "
        f"{first.get('concurrent_runs', '?')} runs at once on the one device; then "
        f"`fairseq-ext evaluate {' '.join(first.get('generate', []))}` on {first.get('test_set', '?')} "
        f"({first.get('bleu_flavour', '?')} sacreBLEU, the thesis' flavour for En↔Vi; chrF2 on the same text). "
        f"Data: joint BPE with {first.get('bpe_merges', '?')} merges, {first.get('dict_size', '?')} types (the thesis' "
        "shared vocabulary: 21k); Vi→En "
        "trains on the same binarized data the other way. A row that two tables share (the same flags) is one run.",
        "", "Training: on the thesis' schedule (one cosine cycle after a linear warm-up) compressed to the run's "
        "updates; the thesis trains 200,000 updates of 2,048 tokens. \"of the thesis' tokens\": updates × our "
        "--max-tokens over the thesis' 200,000 × 2,048 (both the cap fairseq fills a batch to); \"target tokens\": "
        "the target tokens trained on. \"training s\": the wall time of the trainings, all at once on the device. "
        "Δ: the row's BLEU minus its reference row's (the thesis prints its gain against the same row: the "
        "baseline, MS-l for +AIF), over the seeds both trained to their updates with the same settings; p: the "
        "multi-run approximate randomization test (fairseq_ext.tools.statistics.stratified_ar) over those seeds; "
        f"none against a reference under BLEU {LEARNED_BLEU:g}, which did not learn. Several seeds: mean ± sd.", ""]
    json_rows, shown = [], set()
    for table_id in TABLES:
        table = load_table(table_id)
        for dataset in (d for d in table.datasets if d in DIRECTIONS):
            body, rows = section(table, dataset, groups, quick, shown)
            if body:
                lines += [f"## {table.id.replace('thesis-', 'Thesis Table ')}, IWSLT'15 "
                          f"{'→'.join(x.capitalize() for x in DIRECTIONS[dataset])}", ""] + body + [""]
                json_rows += rows
    numbers = list(dict.fromkeys(r["table"][7:] for r in json_rows)) or [t[7:] for t in TABLES]  # in TABLES' order
    lines.insert(0, f"# Thesis Table{'s ' + ', '.join(numbers[:-1]) + ' and' if numbers[1:] else ''} {numbers[-1]} "
                    "on one device: IWSLT'15 En-Vi")
    if not json_rows:
        lines += ["No finished run yet."]
    if failed:
        lines += ["", "Runs left out of the table (failed):", ""]
        lines += [f"- {name}: {why}" for name, why in failed.items()]
    result = (f"{len(failed)} runs failed: " + "; ".join(f"{name} ({why})" for name, why in failed.items()) if failed
              else "ok" if records else "no finished run")
    runs = [{k: v for k, v in r.items() if k != "folder"} for r in found]
    return write_stage(out, "paper", {"result": result, "quick": quick, "rows": json_rows, "runs": runs}, lines)


def section(thesis: Table, dataset: str, groups: Dict[tuple, Dict[int, dict]], quick: bool, shown: set):
    """The markdown rows and JSON rows of one table's column for one direction: the runs of its rows
    not in an earlier table (``shown``), and the runs they are compared with."""
    from fairseq_ext.tools.statistics import stratified_ar

    spread = lambda values: format_mean_sd(*mean_sd(values))  # noqa: E731  mean ± sd over seeds
    key = lambda row, settings: (dataset, row_flags(row)) + settings  # noqa: E731
    settings_found = sorted({k[2:] for k in groups if k[0] == dataset})
    settings_vary = len(settings_found) > 1
    body, json_rows = [], []
    for settings in settings_found:
        new = [r for r in table_rows(thesis, dataset) if key(r, settings) in groups and key(r, settings) not in shown]
        needed = {key(thesis.reference(r), settings) for r in new if thesis.reference(r)}
        for row in table_rows(thesis, dataset):
            by_seed = groups.get(key(row, settings))
            if not by_seed or (row not in new and key(row, settings) not in needed):
                continue
            shown.add(key(row, settings))
            seeds, runs = sorted(by_seed), [by_seed[s] for s in sorted(by_seed)]
            thesis_bleu, thesis_gain = thesis_number(row, dataset)
            bleu = [r["bleu"] for r in runs]
            chrf = [r["chrf"] for r in runs if r.get("chrf") is not None]
            reference = thesis.reference(row)
            base = groups.get(key(reference, settings), {}) if reference else {}
            # compared over the seeds both trained to their planned updates (equal training), a reference that learned
            paired = [s for s in seeds if s in base and complete(by_seed[s]) and complete(base[s])]
            unlearned = not quick and any(base[s]["bleu"] < LEARNED_BLEU for s in paired)
            delta = p = None
            if paired and not unlearned:
                delta = statistics.mean(by_seed[s]["bleu"] - base[s]["bleu"] for s in paired)
                ours, theirs = ({s: sentence_stats(g[s]) for s in paired} for g in (by_seed, base))
                if all(v is not None for v in list(ours.values()) + list(theirs.values())):
                    p = stratified_ar(theirs, ours, shuffles=1000 if quick else 10000)["p_value"]
            updates = [r.get("updates") or 0 for r in runs]
            short = [f"s{r['seed']}: {u:,} of {r['updates_planned']:,}" for r, u in zip(runs, updates)
                     if not complete(r)]
            tokens = [r.get("target_tokens") or 0 for r in runs]
            mean_tokens = statistics.mean(tokens)
            budget = [u * r["max_tokens"] / (THESIS_UPDATES * THESIS_MAX_TOKENS) for u, r in zip(updates, runs)]
            wall = [r.get("train_wall_s") or 0 for r in runs]
            ups = [r["train_ups"] for r in runs if r.get("train_ups")]  # fairseq's own, of its epochs
            loss = [r["valid_loss"] for r in runs if r.get("valid_loss") is not None]
            cells = [row.label, None if thesis_bleu is None else
                     f"{thesis_bleu:.2f}" + ("" if thesis_gain is None else f" ({thesis_gain:+.2f})"),
                     ", ".join(map(str, seeds)), spread(bleu), reference.label if reference else "–",
                     f"{delta:+.2f}" if delta is not None else (f"none: the reference did not learn (BLEU "
                     f"{spread([base[s]['bleu'] for s in paired])})" if unlearned else None),
                     None if p is None else f"{p:.3f}" if p >= 0.01 else f"{p:.2g}",
                     spread(chrf) if chrf else None,
                     f"{statistics.mean(updates):,.0f}" + (f" (stopped by time: {'; '.join(short)})" if short else ""),
                     f"{mean_tokens / 1e6:.1f}M" if mean_tokens >= 1e6 else f"{mean_tokens:,.0f}",
                     f"{100 * statistics.mean(budget):.2g}%", f"{statistics.mean(wall):.0f}",
                     f"{statistics.mean(ups):.1f}" if ups else None, spread(loss) if loss else None]
            if settings_vary:
                cells.insert(1, Run("", "", dataset, 0, *settings).settings)
            body.append(cells)
            json_rows.append({"table": thesis.id, "dataset": dataset, "row": row.id, "label": row.label,
                              "reference": reference.id if reference else None, "updates_planned": settings[0],
                              "max_tokens": settings[1], "lr": settings[2], "warmup": settings[3], "seeds": seeds,
                              "thesis_bleu": thesis_bleu, "thesis_gain": thesis_gain, "bleu": bleu, "chrf": chrf,
                              "delta_to_reference": delta, "p_value": p, "paired_seeds": paired, "updates": updates,
                              "target_tokens": tokens, "thesis_budget_share": budget, "train_wall_s": wall,
                              "valid_loss": loss})
    if not body:
        return [], []
    header = ["row", "thesis BLEU (gain)", "seeds", "BLEU", "reference row", "Δ to it", "p (AR)", "chrF2",
              "updates", "target tokens", "of the thesis' tokens", "training s", "updates/s", "valid loss"]
    if settings_vary:
        return table(header[:1] + ["settings"] + header[1:], body), json_rows
    return [f"Training: {Run('', '', dataset, 0, *settings_found[0]).settings}.", ""] + table(header, body), json_rows
