"""The ``paper`` stage of the self-check: rows of thesis Table 3.3 (IWSLT'15 En->Vi) at the
thesis' small config, trained on one device within one command, decoded on tst2013 as the
thesis decodes (beam 6, length penalty 1.1) and scored (sacreBLEU detokenized and cased, the
thesis' flavour, and chrF2) beside the thesis' numbers.

Every row and seed trains at once in its own ``fairseq-ext train`` process: a small model's
steps are bound by kernel launches, so several processes fill each other's gaps on a GPU. Every
run trains the same ``--updates`` (the thesis compares rows at equal updates) on the thesis'
schedule, one cosine cycle after a linear warm-up, compressed to them, with a larger batch and
learning rate than the thesis' 200,000 updates of 2,048 tokens (:data:`SETTINGS`); fairseq's
``--stop-time-hours`` stops a run too slow for them before the evaluations' time, and the table
marks it and compares no row with it. A run lives in ``OUT/paper/runs/NAME/`` (``run.json``,
logs, translations, scores, ``checkpoints/``); ``OUT/paper.md`` is built from every run there,
so later commands and runs copied from other machines add rows and seeds to the same table
(``--table-only`` rebuilds it), and a finished run is never trained again."""
import functools
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from fairseq_ext.common.data_text import env_headline, read_lines, read_prep_env
from fairseq_ext.errors import CommandError
from fairseq_ext.reproduce.execute import read_bleu, training_progress, training_speed
from fairseq_ext.reproduce.tables import Row, load_setups, load_table
from fairseq_ext.selfcheck.stage_files import table, write_stage
from fairseq_ext.tools.statistics import format_mean_sd, mean_sd as seed_mean_sd

TABLE, DATASET, FOLDER = "thesis-3.3", "iwslt15-en-vi", "iwslt15.en-vi"
THESIS_UPDATES, THESIS_MAX_TOKENS = 200_000, 2_048  # configs/iwslt.args: the thesis' training
DEFAULT_ROWS = "transformer,iter-c-agg"  # the baseline and the thesis' largest En-Vi gain
# what every run trains with on a GPU, and why (docs/selfcheck.md#the-paper-stage): 3,000
# updates, what two runs at once should reach in the ~400 s of training one 9-minute command
# leaves (estimated from the quickstart model's 19.5 updates/s alone on an H100 in fp16; not
# calibrated on a GPU yet); a batch 4x the thesis' (a small model's step is bound by kernel
# launches, not arithmetic, so a larger batch sees more text per second), the learning rate
# raised with it, and a warm-up of 500 updates instead of 4,000
SETTINGS = {"updates": 3000, "max_tokens": 8192, "lr": 1e-3, "warmup": 500}
SCHEDULE = ["--lr-scheduler", "cosine", "--warmup-init-lr", "1e-7", "--no-epoch-checkpoints", "--log-interval", "50"]
# --quick: a model and schedule that train in seconds on a CPU, the same commands otherwise
QUICK_MODEL = ["--encoder-layers", "2", "--decoder-layers", "2", "--encoder-embed-dim", "32",
               "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64",
               "--encoder-attention-heads", "2", "--decoder-attention-heads", "2", "--max-epoch", "0"]
QUICK_SETTINGS = {"updates": 8, "max_tokens": 1000, "lr": 1e-3, "warmup": 4}
QUICK_GENERATE = ["--beam", "2", "--max-len-a", "0", "--max-len-b", "5"]
# kept back from training for the evaluations (all at once) and for the processes' start
EVALUATE_SECONDS = {"cuda": 100, "cpu": 90}
START_SECONDS = 20  # python, fairseq, the data and the model before fairseq's training clock starts


@dataclass(frozen=True)
class Run:
    row: str
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
        """The run's folder: its row, seed and settings (runs of other settings never mix)."""
        return f"{self.row}-s{self.seed}-u{self.updates}-mt{self.max_tokens}-lr{self.lr:g}-wu{self.warmup}"


def numbers(value: str, kind, option: str) -> list:
    try:
        values = [kind(v) for v in value.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or any(v <= 0 for v in values):
        raise CommandError(f"{option}: {value!r}: expected a comma list of positive numbers")
    return values


@functools.lru_cache(maxsize=None)
def thesis_rows() -> Tuple[Row, ...]:
    """The own rows of Table 3.3 with an En-Vi number: the baseline first, then by the thesis'
    En-Vi gain, largest first (the order in which rows are worth a GPU's minutes)."""
    rows = [r for r in load_table(TABLE).rows if r.runnable and DATASET in r.paper]
    base, others = rows[0], rows[1:]
    return (base, *sorted(others, key=lambda r: -(thesis_number(r)[1] or 0.0)))


def thesis_number(row: Row) -> Tuple[Optional[float], Optional[float]]:
    """(BLEU, gain over the thesis' baseline) as the thesis prints them: '31.13 (+0.55)'."""
    printed = row.paper.get(DATASET, {}).get("BLEU", "").replace("−", "-")
    found = re.findall(r"[-+]?\d+\.\d+", printed)
    return (float(found[0]) if found else None), (float(found[1]) if len(found) > 1 else None)


def chosen_rows(spec: str) -> List[Row]:
    rows = {r.id: r for r in thesis_rows()}
    names = [s.strip() for s in spec.split(",") if s.strip()]
    unknown = [n for n in names if n not in rows]
    if unknown or not names:
        raise CommandError(f"--rows: unknown row {', '.join(unknown) or repr(spec)} of thesis Table 3.3 "
                           f"(choose from {', '.join(rows)})")
    return [rows[n] for n in names]


def plan(rows: str, seeds: str, updates: Optional[str], max_tokens: Optional[str], lr: Optional[str],
         warmup: Optional[str], quick: bool) -> List[Run]:
    """Every run of rows x seeds x settings (a grid when a setting has several values)."""
    default = QUICK_SETTINGS if quick else SETTINGS

    def values(value, kind, option, key):
        return numbers(value, kind, option) if value else [default[key]]

    grid = [(u, m, l, w) for u in values(updates, int, "--updates", "updates")
            for m in values(max_tokens, int, "--max-tokens", "max_tokens")
            for l in values(lr, float, "--lr", "lr") for w in values(warmup, int, "--warmup", "warmup")]
    for u, _, _, w in grid:
        if w >= u:
            raise CommandError(f"--warmup ({w}) must be below --updates ({u}): the cosine cycle follows the warm-up")
    return [Run(r.id, s, *settings) for r in chosen_rows(rows) for s in numbers(seeds, int, "--seed")
            for settings in grid]


def target_tokens(log: str) -> Optional[int]:
    """Target tokens trained on, from fairseq's end-of-epoch lines (``wpb`` = target tokens per
    batch, averaged over the epoch's updates, times the epoch's updates)."""
    if not os.path.exists(log):
        return None
    total, previous = 0.0, 0
    with open(log, encoding="utf-8", errors="replace") as f:
        for line in f:
            if "| train |" not in line and " | train " not in line:
                continue
            wpb, upd = re.search(r"\bwpb ([0-9.]+)", line), re.search(r"\bnum_updates (\d+)", line)
            if wpb and upd:
                total += float(wpb.group(1)) * (int(upd.group(1)) - previous)
                previous = int(upd.group(1))
    return round(total) if previous else None


def valid_loss(log: str) -> Optional[float]:
    """The last validation loss fairseq printed (base 2, label-smoothed)."""
    found = None
    if os.path.exists(log):
        with open(log, encoding="utf-8", errors="replace") as f:
            for line in f:
                m = re.search(r"valid on 'valid' subset \|.*?\bloss ([0-9.]+)", line)
                found = float(m.group(1)) if m else found
    return found


def train_command(run: Run, data: str, save: str, device, quick: bool, train_flags: List[str],
                  row_flags: List[str]) -> List[str]:
    precision = ["--fp16"] if device.type == "cuda" else ["--cpu"]
    return [sys.executable, "-m", "fairseq_ext", "train", data, save, "--config", "iwslt", "--", *row_flags,
            "--seed", str(run.seed), "--max-update", str(run.updates), "--max-tokens", str(run.max_tokens),
            "--lr", f"{run.lr:g}", "--warmup-updates", str(run.warmup), *SCHEDULE, *precision,
            *(QUICK_MODEL if quick else []),
            *train_flags]


def start(cmd: List[str], log: str, threads: int) -> subprocess.Popen:
    """``cmd`` started with its output after a ``$ CMD`` line in ``log`` (the child keeps the
    file open; this process closes its own handle)."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    with open(log, "a", encoding="utf-8") as f:
        f.write("$ " + shlex.join(cmd) + "\n")
        f.flush()
        return subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)


def wait_all(procs: Dict[str, subprocess.Popen], until: float, logs: Dict[str, str]) -> Dict[str, object]:
    """Each process's exit status, or "timeout" for one still running at ``until`` (stopped)."""
    codes: Dict[str, object] = {}
    for name, proc in procs.items():
        try:
            codes[name] = proc.wait(timeout=max(1.0, until - time.time()))
        except subprocess.TimeoutExpired:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            with open(logs[name], "a", encoding="utf-8") as f:
                f.write("\nstopped: the stage's time ran out\n")
            codes[name] = "timeout"
    return codes


def read_json(path: str) -> dict:
    if not os.path.exists(path):
        return {}
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def run_paper(out: str, device, data: Optional[str], quick: bool, time_limit: float, runs: List[Run],
              train_flags: List[str], table_only: bool = False, **_) -> List[str]:
    """Train and evaluate ``runs`` (those not finished before), then write the table of every run
    under OUT/paper/runs."""
    root = os.path.join(out, "paper", "runs")
    if not table_only:
        deadline = time.time() + time_limit
        folder = paper_data(data)
        train_and_evaluate(root, folder, device, quick, deadline, runs, train_flags)
    return write_table(out)


def paper_data(data: Optional[str]) -> str:
    if not data:
        raise CommandError(f"--data: the paper stage needs the folder of prepared data (fairseq-ext selfcheck-pack "
                           f"--datasets {FOLDER} writes it: PACK/data, with {FOLDER}/)")
    folder = os.path.join(data, FOLDER)
    prep = read_prep_env(folder)
    if not prep:
        raise CommandError(f"--data: no {FOLDER}/prep.env under {data} (fairseq-ext selfcheck-pack --datasets "
                           f"{FOLDER} prepares it)")
    return folder


def train_and_evaluate(root: str, data: str, device, quick: bool, deadline: float, runs: List[Run],
                       train_flags: List[str]) -> None:
    rows = {r.id: r for r in thesis_rows()}
    todo = [r for r in runs if read_json(os.path.join(root, r.name, "run.json")).get("bleu") is None]  # others kept
    if not todo:
        return
    folders = {r: os.path.join(root, r.name) for r in todo}
    commands = {r: train_command(r, data, os.path.join(folders[r], "checkpoints"), device, quick, train_flags,
                                 rows[r.row].flags) for r in todo}
    logs = {r.name: os.path.join(folders[r], "train.log") for r in todo}
    threads = max(1, (os.cpu_count() or 1) // len(todo))
    train_until = deadline - EVALUATE_SECONDS[device.type]
    hours = max(60.0, train_until - time.time() - START_SECONDS) / 3600
    begun = time.time()
    for folder in folders.values():
        os.makedirs(folder, exist_ok=True)
    codes = wait_all({r.name: start(commands[r] + ["--stop-time-hours", f"{hours:.6f}"], logs[r.name], threads)
                      for r in todo}, train_until + 30, logs)
    trained_s, begun = time.time() - begun, time.time()

    generate = QUICK_GENERATE if quick else shlex.split(load_setups()["trainings"]["thesis-iwslt"]["generate"])
    precision = ["--fp16"] if device.type == "cuda" else ["--cpu"]
    evals = {r: [sys.executable, "-m", "fairseq_ext", "evaluate", "--checkpoint", checkpoint, "--data", data,
                 "--out", os.path.join(folders[r], "eval-test"), *generate, *precision]
             for r in todo for checkpoint in [os.path.join(folders[r], "checkpoints", "checkpoint_last.pt")]
             if os.path.exists(checkpoint)}
    eval_logs = {r.name: os.path.join(folders[r], "evaluate.log") for r in evals}
    eval_codes = wait_all({r.name: start(cmd, eval_logs[r.name], threads) for r, cmd in evals.items()}, deadline,
                          eval_logs)
    evaluated_s = time.time() - begun

    prep = read_prep_env(data)
    flavour, _ = env_headline(prep)
    for run in todo:
        log, folder = logs[run.name], folders[run]
        metrics = read_json(os.path.join(folder, "eval-test", "metrics.json"))
        record = {"name": run.name, "row": run.row, "seed": run.seed, "updates_planned": run.updates,
                  "max_tokens": run.max_tokens, "lr": run.lr, "warmup": run.warmup, "device": device_name(device),
                  "precision": "fp16" if device.type == "cuda" else "fp32", "quick": quick,
                  "concurrent_runs": len(todo), "data": data, "test_set": prep.get("test_set"),
                  "bpe_merges": prep.get("bpe_merges"), "dict_size": prep.get("dict_size"),
                  "train_command": commands[run], "train_returncode": codes.get(run.name),
                  "train_wall_s": round(trained_s, 1), **training_progress(log), **training_speed(log),
                  "target_tokens": target_tokens(log), "valid_loss": valid_loss(log),
                  "eval_returncode": eval_codes.get(run.name), "eval_wall_s": round(evaluated_s, 1),
                  "generate": generate, "bleu_flavour": flavour,
                  "bleu": read_bleu(os.path.join(folder, "eval-test"), flavour),
                  "chrf": (metrics.get("chrF2") or {}).get("score")}
        with open(os.path.join(folder, "run.json"), "w", encoding="utf-8") as f:
            json.dump(record, f, indent=1)
            f.write("\n")


def device_name(device) -> str:
    import torch

    return torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({os.cpu_count()} cores)"


def read_runs(root: str) -> List[dict]:
    found = [(name, read_json(os.path.join(root, name, "run.json"))) for name in
             (sorted(os.listdir(root)) if os.path.isdir(root) else [])]
    return [{**record, "folder": os.path.join(root, name)} for name, record in found if record]


def sentence_stats(record: dict):
    """sacreBLEU's statistics of each test sentence of a run (for the multi-run test), or None."""
    from fairseq_ext.tools.statistics import sentence_stats as stats

    from fairseq_ext.reproduce.marks import FLAVOUR_FILES

    flavour = record.get("bleu_flavour", "detok-cased")
    hyp, ref = (os.path.join(record["folder"], "eval-test", name)
                for name in FLAVOUR_FILES["tok" if flavour.startswith("tok") else "detok"])
    if not (os.path.exists(hyp) and os.path.exists(ref)):
        return None
    return stats(read_lines(ref), read_lines(hyp), flavour)


def count(n: float) -> str:
    return f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n:,.0f}"


def complete(record: dict) -> bool:
    """The run trained all its planned updates (not stopped early by the time limit)."""
    return (record.get("updates") or 0) >= record.get("updates_planned", 0)


def settings_of(record: dict) -> Tuple[int, int, float, int]:
    return record["updates_planned"], record["max_tokens"], record["lr"], record["warmup"]


def write_table(out: str) -> List[str]:
    from fairseq_ext.tools.statistics import stratified_ar

    spread = lambda values: format_mean_sd(*seed_mean_sd(values))  # noqa: E731  mean ± sd over seeds
    found = read_runs(os.path.join(out, "paper", "runs"))
    records = [r for r in found if r.get("bleu") is not None]
    failed = [r for r in found if r.get("bleu") is None]
    quick = any(r.get("quick") for r in found)
    rows = {r.id: r for r in thesis_rows()}
    order, base_id = list(rows), next(iter(rows))
    groups: Dict[tuple, Dict[int, dict]] = {}
    for r in records:
        groups.setdefault((r["row"],) + settings_of(r), {})[r["seed"]] = r
    body, json_rows = [], []
    settings_vary = len({k[1:] for k in groups}) > 1
    for key in sorted(groups, key=lambda k: (k[1:], order.index(k[0]))):
        row_id, by_seed = key[0], groups[key]
        seeds = sorted(by_seed)
        runs = [by_seed[s] for s in seeds]
        thesis_bleu, thesis_gain = thesis_number(rows[row_id])
        bleu = [r["bleu"] for r in runs]
        chrf = [r["chrf"] for r in runs if r.get("chrf") is not None]
        base = groups.get((base_id,) + key[1:], {})
        # compared over the seeds both trained to their planned updates (equal training)
        paired = [s for s in seeds if s in base and complete(by_seed[s]) and complete(base[s])]
        delta = p = None
        if row_id != base_id and paired:
            # the difference of the mean BLEU over the paired seeds; p from the multi-run test
            delta = statistics.mean(by_seed[s]["bleu"] - base[s]["bleu"] for s in paired)
            ours, theirs = ({s: sentence_stats(g[s]) for s in paired} for g in (by_seed, base))
            if all(v is not None for v in list(ours.values()) + list(theirs.values())):
                p = stratified_ar(theirs, ours, shuffles=1000 if quick else 10000)["p_value"]
        updates = [r.get("updates") or 0 for r in runs]
        short = [f"s{r['seed']}: {u:,} of {r['updates_planned']:,}" for r, u in zip(runs, updates) if not complete(r)]
        tokens = [r.get("target_tokens") or 0 for r in runs]
        budget = [u * r["max_tokens"] / (THESIS_UPDATES * THESIS_MAX_TOKENS) for u, r in zip(updates, runs)]
        wall = [r.get("train_wall_s") or 0 for r in runs]
        ups = [r["train_ups"] for r in runs if r.get("train_ups")]  # fairseq's own, of its epochs
        loss = [r["valid_loss"] for r in runs if r.get("valid_loss") is not None]
        label = rows[row_id].label
        cells = [label, None if thesis_bleu is None else
                 f"{thesis_bleu:.2f}" + ("" if thesis_gain is None else f" ({thesis_gain:+.2f})"),
                 ", ".join(map(str, seeds)), spread(bleu), None if delta is None else f"{delta:+.2f}",
                 None if p is None else f"{p:.3f}", spread(chrf) if chrf else None,
                 f"{statistics.mean(updates):,.0f}" + (f" (stopped by time: {'; '.join(short)})" if short else ""),
                 count(statistics.mean(tokens)), f"{100 * statistics.mean(budget):.2g}%",
                 f"{statistics.mean(wall):.0f}", f"{statistics.mean(ups):.1f}" if ups else None,
                 spread(loss) if loss else None]
        if settings_vary:
            cells.insert(1, Run(row_id, 0, *key[1:]).settings)
        body.append(cells)
        json_rows.append({"row": row_id, "label": label, "updates_planned": key[1], "max_tokens": key[2],
                          "lr": key[3], "warmup": key[4], "seeds": seeds, "thesis_bleu": thesis_bleu,
                          "thesis_gain": thesis_gain, "bleu": bleu, "chrf": chrf, "delta_to_baseline": delta,
                          "p_value": p, "paired_seeds": paired, "updates": updates, "target_tokens": tokens,
                          "thesis_budget_share": budget, "train_wall_s": wall, "valid_loss": loss})
    header = ["row", "thesis BLEU (gain)", "seeds", "BLEU", "Δ to our baseline", "p (AR)", "chrF2", "updates",
              "target tokens", "of the thesis' tokens", "training s", "updates/s", "valid loss"]
    if settings_vary:
        header.insert(1, "settings")
    first = records[0] if records else {}
    lines = ["# Thesis Table 3.3 on one device: IWSLT'15 En→Vi", ""]
    if quick:
        lines += ["`--quick`: a tiny model for a few updates; the numbers mean nothing.", ""]
    shown = Run(base_id, 0, *settings_of(first)).settings if first else ""
    lines += [
        "Each run: `fairseq-ext train --config iwslt` with the row's flags (the thesis' small config: 4+4 layers, "
        f"d 256, d_ff 1024, 4 heads, shared embeddings, max length 150) in {first.get('precision', '?')} on "
        f"{first.get('device', '?')}, {first.get('concurrent_runs', '?')} runs at once on the one device; then "
        f"`fairseq-ext evaluate {' '.join(first.get('generate', []))}` on {first.get('test_set', '?')} "
        f"({first.get('bleu_flavour', '?')} sacreBLEU, the thesis' flavour for En→Vi; chrF2 on the same text). "
        f"Data: joint BPE with {first.get('bpe_merges', '?')} merges, {first.get('dict_size', '?')} types.", "",
        (f"Training: {shown}, " if shown and not settings_vary else "Training: ")
        + "on the thesis' schedule (one cosine cycle after a linear warm-up) compressed to those updates; the thesis "
        "trains 200,000 updates of 2,048 tokens. \"of the thesis' tokens\": updates × our --max-tokens over the "
        "thesis' 200,000 × 2,048 (both the cap fairseq fills a batch to); \"target tokens\": the target tokens "
        "trained on. \"training s\": the wall time of the trainings, all at once on the device. Δ: the row's "
        "BLEU minus our baseline's, over the seeds both trained to their updates with the same settings; p: the "
        "multi-run approximate randomization test (fairseq_ext.tools.statistics.stratified_ar) over those "
        "seeds. Several seeds: mean ± sd.", ""]
    lines += table(header, body) if body else ["No finished run yet."]
    if failed:
        lines += ["", "Runs without a score (see their train.log and evaluate.log):", ""]
        lines += [f"- {r['name']}: train exit {r.get('train_returncode')}, evaluate exit "
                  f"{r.get('eval_returncode')}" for r in failed]
    result = "ok" if records and not failed else ("no finished run" if not records else f"{len(failed)} runs failed")
    write_stage(out, "paper", {"result": result, "quick": quick, "rows": json_rows,
                               "runs": [{k: v for k, v in r.items() if k != "folder"} for r in records + failed]},
                lines)
    return lines
