"""The ``train`` and ``paper`` stages of the self-check (docs/selfcheck.md), on the data of ``--data`` as
``fairseq-ext selfcheck-pack`` prepares it. ``train`` runs one ``fairseq-ext train`` and one ``fairseq-ext evaluate``
of its last checkpoint a run, resumes a run of ``OUT/train/NAME`` and keeps a finished one; ``paper`` is a preset of
``fairseq-ext reproduce`` (OUT/paper/ its work dir, OUT/paper.md its table)."""
import os
import shlex
import sys
import time
from typing import List, Optional

from fairseq_ext.common import checkpoints
from fairseq_ext.common.data_text import env_headline, read_prep_env
from fairseq_ext.errors import CommandError, FairseqExtError
from fairseq_ext.reproduce.execute import read_bleu, training_progress, training_speed
from fairseq_ext.reproduce.tables import load_setups
from fairseq_ext.selfcheck.stage_files import run_logged, table, write_stage
from fairseq_ext.selfcheck.timing import SIZES

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
EVALUATE_SECONDS = {"cuda": 60, "cpu": 90}

# the thesis' tables with an IWSLT'15 En-Vi column (configs/tables/), each direction the pack's data serves
TABLES = ("thesis-3.3", "thesis-4.1", "thesis-5.3")
DIRECTIONS = ("iwslt15-en-vi", "iwslt15-vi-en")
# each table's default rows: the thesis' largest En->Vi gain and the row it is printed against
DEFAULT_ROWS = {"thesis-3.3": "transformer,iter-c-agg", "thesis-4.1": "ms-1,ms-1-plus-aif",
                "thesis-5.3": "transformer,enc-dc"}
# 2,600 updates of 32,768 tokens, 21% of the thesis' 200,000 x 2,048 (docs/selfcheck.md#the-paper-stage says why)
SHARE = 0.208
QUICK_SETTINGS = {"updates": 8, "max_tokens": 1000, "warmup": 4}


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
    log, keep_back = os.path.join(save, "train.log"), EVALUATE_SECONDS[device.type]
    cmd = fairseq_ext("train", data, save, "--config", config, "--", *flags, *precision(device),
                      "--no-epoch-checkpoints")
    settings = shlex.join(cmd[3:]) + "\n"
    start, kept, trained = time.time(), finished(save, log, settings), 0
    if not kept:
        limit_hours = (previous_training_seconds(save) + max(0.0, seconds - keep_back)) / 3600
        trained = run_logged(cmd + ["--stop-time-hours", f"{limit_hours:.6f}"], log, time.time() + seconds)
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
        record["eval_returncode"] = run_logged(evaluate, log, start + max(keep_back, seconds - train_seconds))
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
    if iwslt and deadline - time.time() > EVALUATE_SECONDS[device.type] + 30:
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


# ---- the paper stage: a preset of fairseq-ext reproduce ------------------------------------

def reproduce_args(out: str, device, data: Optional[str], quick: bool, time_limit: float, table_id: str,
                   rows: Optional[str], datasets: str, seeds: str, share: float, train_flags: List[str]) -> List[str]:
    """The command line of ``fairseq-ext reproduce`` the paper stage is: the rows of ``table_id`` on the pack's
    IWSLT'15 data (either direction), at ``share`` of the thesis' tokens (--quick: a tiny model for 8 updates), on
    the one device, the runs that end within ``time_limit`` seconds, the multi-run approximate randomization test."""
    pair = os.path.abspath(os.path.join(data or "", IWSLT))
    argv = [table_id, "--rows", rows or DEFAULT_ROWS.get(table_id, ""), "--datasets", datasets, "--seeds", seeds,
            "--work-dir", os.path.join(out, "paper"), "--test", "ar", "--time-limit", f"{time_limit:g}",
            *(["--devices", "0"] if device.type == "cuda" else ["--cpu"])]
    if os.path.exists(os.path.join(pair, "prep.env")):  # (else --plan only: the stage needs it)
        argv += [f"--prepared={d}={pair}" for d in DIRECTIONS]
    generate = QUICK_GENERATE["paper"] if quick else []
    if quick:
        argv += ["--budget", str(QUICK_SETTINGS["updates"]), "--samples", "100", "--shuffles", "1000"]
        train_flags = QUICK_MODEL + ["--max-tokens", str(QUICK_SETTINGS["max_tokens"]), "--warmup-updates",
                                     str(QUICK_SETTINGS["warmup"])] + train_flags
    else:
        argv += ["--share", f"{share:g}"]
    fp16 = ["--fp16"] if device.type == "cuda" else []
    return argv + [f"--train-args={shlex.join(fp16 + train_flags)}", f"--generate-args={shlex.join(fp16 + generate)}"]


def run_paper(out: str, device, data: Optional[str], quick: bool, time_limit: float, reproduce: List[str],
              table_only: bool = False, **_) -> List[str]:
    """``fairseq-ext reproduce`` of the stage's table (``--table-only``: ``--report``); OUT/paper.md is the table."""
    from fairseq_ext.reproduce import __main__ as reproduce_cli

    written: List[str] = []
    try:
        code = reproduce_cli.main(reproduce + (["--report"] if table_only else []), written)
        result = "ok" if code == 0 else f"exit {code}"
    except FairseqExtError as e:
        result = str(e).splitlines()[0]
    lines = open(written[0], encoding="utf-8").read().splitlines() if written else ["No table written."]
    return write_stage(out, "paper", {"result": result, "quick": quick, "reproduce": reproduce,
                                      "table": written[0] if written else None}, lines)
