"""The ``train`` stage of the self-check: real training on the device, in fp16 on a GPU.

1. The quickstart model (configs/quickstart.args with the table runner's ``cpu-quickstart``
   setup: d 128, 3+3 layers, 2,400 updates) on Multi30k En-De, the baseline and M-10, each
   trained, then translated and scored on the test set (``fairseq-ext evaluate``): BLEU,
   updates, updates per second and wall time.
2. While the stage's time lasts: IWSLT'15 En-Vi at the thesis' small config
   (configs/iwslt.args, 200k updates), resumed from its ``checkpoint_last.pt`` by the next
   command with the same ``--out``, and scored on its test set after each command.

Every run is one ``fairseq-ext train`` into ``OUT/train/NAME`` (fairseq resumes a save
directory's ``checkpoint_last.pt``; a finished run is kept and not trained again) and one
``fairseq-ext evaluate``. The data folder (``--data``, as ``fairseq-ext selfcheck-pack``
writes it) holds ``multi30k.en-de/`` and ``iwslt15.en-vi/``, prepared by the recipes."""
import os
import shlex
import sys
import time
from typing import List, Optional

from fairseq_ext.common import checkpoints
from fairseq_ext.common.data_text import env_headline, read_prep_env
from fairseq_ext.errors import CommandError
from fairseq_ext.reproduce.execute import read_bleu, training_progress, training_speed
from fairseq_ext.reproduce.tables import load_setups
from fairseq_ext.selfcheck.stage_files import run_logged, table, write_stage

MULTI30K, IWSLT = "multi30k.en-de", "iwslt15.en-vi"
MULTI30K_RUNS = [("multi30k-baseline", []), ("multi30k-m-10", ["--joint-attention", "m-10"])]
IWSLT_RUN = ("iwslt15-small", ["--arch", "multilayer_transformer_iwslt"])
GENERATE = ["--beam", "5", "--max-len-a", "1.2", "--max-len-b", "10"]
QUICK_GENERATE = ["--beam", "1", "--max-len-a", "0", "--max-len-b", "5"]
# the test sets hold sentences longer than training's 150 positions (IWSLT's tst2012: 160
# BPE tokens); the sinusoidal positions of these models extend to them, so none is dropped
POSITIONS = repr({"max_source_positions": 1024, "max_target_positions": 1024})
# --quick: a model and schedule that train in seconds on a CPU, the same commands otherwise
QUICK_MODEL = ["--encoder-layers", "2", "--decoder-layers", "2", "--encoder-embed-dim", "32",
               "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64",
               "--encoder-attention-heads", "2", "--decoder-attention-heads", "2", "--max-tokens", "1000",
               "--warmup-updates", "4", "--max-update", "8", "--max-epoch", "0"]
# kept back from training for each evaluation: on a GPU twice what Multi30k's took on an H100
# (1,000 sentences, beam 5, fp16, with the command's start: 27-29 s); on the CPU (--quick) more
EVALUATE_SECONDS = {"cuda": 60, "cpu": 90}


def data_dir(data: Optional[str], name: str) -> Optional[str]:
    if not data:
        raise CommandError("--data: the train stage needs the folder of prepared data (fairseq-ext selfcheck-pack "
                           f"writes it: PACK/data, with {MULTI30K}/ and {IWSLT}/)")
    path = os.path.join(data, name)
    return path if os.path.exists(os.path.join(path, "prep.env")) else None


def previous_training_seconds(save: str) -> float:
    """fairseq's --stop-time-hours counts the time of earlier commands (saved in the
    checkpoint), so a resumed run's limit is that time plus this command's share."""
    last = os.path.join(save, "checkpoint_last.pt")
    if not os.path.exists(last):
        return 0.0
    state = checkpoints.load_state(last)
    return float((state.get("extra_state") or {}).get("previous_training_time") or 0.0)


def finished(save: str, log: str, settings: str) -> bool:
    """A run trained to its planned updates with these settings: kept as it is (fairseq-train
    resumed on a finished save directory would train one more update)."""
    path = os.path.join(save, "selfcheck.settings")
    if not os.path.exists(path) or not os.path.exists(os.path.join(save, "checkpoint_last.pt")):
        return False
    with open(path, encoding="utf-8") as f:
        if f.read() != settings:
            return False
    progress = training_progress(log)
    return "planned_updates" in progress and progress.get("updates", 0) >= progress["planned_updates"]


def train_and_evaluate(name: str, data: str, config: str, flags: List[str], out: str, device,
                       seconds: float, generate: List[str]) -> dict:
    """Train ``name`` for at most ``seconds`` of this command (resuming where it stopped; a
    finished run is kept), then evaluate its last checkpoint; the record of the run."""
    save = os.path.join(out, "train", name)
    os.makedirs(save, exist_ok=True)
    log = os.path.join(save, "train.log")
    precision = ["--fp16"] if device.type == "cuda" else ["--cpu"]
    cmd = [sys.executable, "-m", "fairseq_ext", "train", data, save, "--config", config, "--", *flags, *precision,
           "--no-epoch-checkpoints"]
    settings = shlex.join(cmd[3:]) + "\n"
    start = time.time()
    kept = finished(save, log, settings)
    if kept:
        trained = 0
    else:
        limit_hours = (previous_training_seconds(save) + max(0.0, seconds - EVALUATE_SECONDS[device.type])) / 3600
        trained = run_logged(cmd + ["--stop-time-hours", f"{limit_hours:.6f}"], log, seconds, append=True)
        with open(os.path.join(save, "selfcheck.settings"), "w", encoding="utf-8") as f:
            f.write(settings)
    train_seconds = time.time() - start
    record = {"name": name, "data": data, "command": cmd, "train_returncode": trained, "kept": kept,
              "train_wall_s": round(train_seconds, 1), "training_time_s": round(previous_training_seconds(save), 1),
              **training_progress(log), **training_speed(log)}
    checkpoint = os.path.join(save, "checkpoint_last.pt")
    eval_dir = os.path.join(save, "eval-test")
    flavour, _ = env_headline(read_prep_env(data))
    if kept and read_bleu(eval_dir, flavour) is not None:
        record.update(eval_returncode=0, bleu=read_bleu(eval_dir, flavour), bleu_flavour=flavour)
    elif trained == 0 and os.path.exists(checkpoint):
        start = time.time()
        evaluate = [sys.executable, "-m", "fairseq_ext", "evaluate", "--checkpoint", checkpoint, "--data", data,
                    "--out", eval_dir, *generate, "--model-overrides", POSITIONS,
                    *(["--cpu"] if device.type == "cpu" else ["--fp16"])]
        record["eval_returncode"] = run_logged(evaluate, log, max(EVALUATE_SECONDS[device.type],
                                                                  seconds - train_seconds),
                                               append=True)
        record["eval_wall_s"] = round(time.time() - start, 1)
        record.update(bleu=read_bleu(eval_dir, flavour), bleu_flavour=flavour)
    return record


def run(out: str, device, data: Optional[str], quick: bool, time_limit: float, **_) -> List[str]:
    deadline = time.time() + time_limit
    multi30k, iwslt = data_dir(data, MULTI30K), data_dir(data, IWSLT)
    if multi30k is None:
        raise CommandError(f"--data: no {MULTI30K}/prep.env under {data} (fairseq-ext selfcheck-pack prepares it)")
    setup = load_setups()["trainings"]["cpu-quickstart"]
    quickstart = shlex.split(setup["flags"]) + (QUICK_MODEL if quick else [])
    generate = QUICK_GENERATE if quick else GENERATE
    records = []
    runs = MULTI30K_RUNS[:1] if quick else MULTI30K_RUNS  # --quick: the baseline's code path is M-10's
    for i, (name, flags) in enumerate(runs):
        share = (deadline - time.time()) / (len(runs) - i + (1 if iwslt else 0))
        records.append(train_and_evaluate(name, multi30k, setup["config"], quickstart + flags, out, device, share,
                                          generate))
    if iwslt and deadline - time.time() > EVALUATE_SECONDS[device.type] + 30:
        name, flags = IWSLT_RUN
        records.append(train_and_evaluate(name, iwslt, "iwslt", flags + (QUICK_MODEL if quick else []), out, device,
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
    write_stage(out, "train", {"result": "ok" if ok else "a run failed", "device": str(device), "quick": quick,
                               "runs": records}, lines)
    return lines
