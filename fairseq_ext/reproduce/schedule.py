"""A table's runs over one machine's devices, ``--per-device`` at once on each, in the planned order; ``--plan``'s
simulation of it with the measured rates (:func:`rates`); beyond one machine, a Slurm job array of one run a task."""
import glob
import heapq
import json
import os
import queue
import shlex
import statistics
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, List, Optional, Tuple

import yaml

from fairseq_ext import resources
from fairseq_ext.reproduce.planning import ReproduceError, RunPlan, config_flags, last_flag

RATES = os.path.join(resources.CONFIG_DIR, "benchmarks", "device-rates.yaml")
UNMEASURED_START_S, UNMEASURED_EVALUATE_S = 60.0, 60.0  # for a run whose budget is time, not updates


def device_name(device: Optional[str], cpu: bool = False) -> str:
    """What a rate is measured on: "cpu (N cores)" for a CPU run or device, else GPU ``device``'s (0's) name."""
    if cpu or device == "cpu":
        return f"cpu ({os.cpu_count()} cores)"
    import torch

    return torch.cuda.get_device_name(int(device or 0)) if torch.cuda.is_available() else f"GPU {device or 0}"


def parse_devices(text: Optional[str], cpu: bool) -> List[str]:
    """``--devices``: GPU indices (names of the slots under ``--cpu``), default every GPU torch sees, else the CPU."""
    if not text:
        import torch

        return ["cpu"] if cpu or not torch.cuda.is_available() else [str(i) for i in range(torch.cuda.device_count())]
    found = [d.strip() for d in text.split(",") if d.strip()]
    if not found or len(set(found)) < len(found) or any(d != "cpu" and not d.isdigit() for d in found):
        raise ReproduceError(f"--devices {text!r}: expected a comma list of distinct GPU indices, e.g. 0,1,2,3, or cpu")
    return found


def training_of(plan: RunPlan) -> Tuple[str, Optional[int], int]:
    """(the training config and scale, updates or None for a time budget, --max-tokens) of a run's command."""
    config = plan.train[plan.train.index("--config") + 1]
    flags = config_flags(config) + plan.train
    updates = None if last_flag(plan.train, "--stop-time-hours") else int(last_flag(flags, "--max-update") or 0)
    return config + (f"/{plan.scale}" if plan.scale else ""), updates or None, int(last_flag(flags, "--max-tokens"))


def rates(work_dir: Optional[str] = None) -> List[dict]:
    """configs/benchmarks/device-rates.yaml, then each finished run's under ``work_dir`` (result.json's ``rate``)."""
    with open(RATES, encoding="utf-8") as f:
        found = yaml.safe_load(f)
    for path in sorted(glob.glob(os.path.join(work_dir or "", "*", "*", "*", "result.json"))) if work_dir else []:
        try:
            with open(path, encoding="utf-8") as f:
                rate = json.load(f).get("rate")
        except (OSError, ValueError):
            continue
        if isinstance(rate, dict) and rate.get("updates_per_s"):
            found.append({**rate, "source": os.path.relpath(os.path.dirname(path), work_dir)})
    return found


def rate_for(measured: List[dict], device: str, config: str, max_tokens: int, at_once: int) -> Optional[dict]:
    """The mean rate measured there with ``at_once`` runs at once; else one run alone on another device; else None."""
    for same_device in (True, False):
        hits = [m for m in measured if m["config"] == config and m["max_tokens"] == max_tokens
                and m["at_once"] == (at_once if same_device else 1) and (m["device"] == device) == same_device]
        if hits and (same_device or at_once == 1):
            mean = {k: statistics.mean(m[k] for m in hits) for k in ("updates_per_s", "start_s", "evaluate_s")}
            where = "; ".join(dict.fromkeys(m["source"] for m in hits))
            return {**mean, "source": where if same_device else f"{hits[0]['device']}, not {device}: {where}"}
    return None


def default_per_device(measured: List[dict], device: str, config: str, max_tokens: int) -> int:
    """The trainings at once that trained the most updates a second on that device at that batch (1 unmeasured)."""
    counts = {m["at_once"] for m in measured if (m["device"], m["config"], m["max_tokens"]) == (device, config,
                                                                                                 max_tokens)}
    return max(counts, default=1, key=lambda n: n * rate_for(measured, device, config, max_tokens, n)["updates_per_s"])


def estimate(plan: RunPlan, measured: List[dict], device: str, at_once: int) -> Tuple[Optional[float], str]:
    """(seconds a run holds its slot, where the rate comes from), (None, why) where nothing measured applies."""
    config, updates, max_tokens = training_of(plan)
    budget = last_flag(plan.train, "--stop-time-hours")
    rate = rate_for(measured, device, config, max_tokens, at_once)
    if budget is not None:
        start, evaluate = (rate["start_s"], rate["evaluate_s"]) if rate else (UNMEASURED_START_S, UNMEASURED_EVALUATE_S)
        return start + float(budget) * 3600 + evaluate, "its time budget" + (f"; {rate['source']}" if rate else "")
    if rate is None:
        return None, f"not measured: {device} at {config}, {max_tokens} tokens, {at_once} at once"
    return rate["start_s"] + updates / rate["updates_per_s"] + rate["evaluate_s"], rate["source"]


def place(durations: List[float], devices: List[str], per_device: int) -> Tuple[List[Tuple[str, int, float]], float]:
    """The runs in order, each on the slot that frees first ((device, slot, start s) a run), and when the last ends."""
    free = [(0.0, i, d, s) for i, (s, d) in enumerate((s, d) for s in range(per_device) for d in devices)]
    placed, end = [], 0.0
    for seconds in durations:
        start, order, device, slot = heapq.heappop(free)
        placed.append((device, slot, start))
        end = max(end, start + seconds)
        heapq.heappush(free, (start + seconds, order, device, slot))
    return placed, end


def fitting(plans: List[RunPlan], devices: List[str], per_device: int, seconds: float,
            measured: List[dict]) -> List[RunPlan]:
    """The runs up to the first that would not end within ``seconds`` by its estimate (none: it fits)."""
    name = device_name(devices[0], bool(plans) and plans[0].cpu)
    load = per_device * len(devices) if name.startswith("cpu") else per_device
    times = [estimate(p, measured, name, load)[0] or 0.0 for p in plans]
    placed, _ = place(times, [d or "0" for d in devices], per_device)
    ends = [start + t for t, (_, _, start) in zip(times, placed)]
    return plans[:next((i for i, end in enumerate(ends) if end > seconds), len(plans))]


def run_on_slots(plans: List[RunPlan], devices: List[str], per_device: int,
                 work: Callable[[RunPlan, str, int], None]) -> List[str]:
    """``work(plan, device, at_once)`` of every plan, in order, each as soon as a slot is free; the failures, each said
    in one line as it happens (:class:`ReproduceError`; anything else, or an interrupt, stops the table)."""
    slots, failed, stop = queue.SimpleQueue(), [], threading.Event()
    for device in [d for _ in range(per_device) for d in devices]:
        slots.put(device)

    def run(plan):
        device = None if stop.is_set() else slots.get()
        try:
            if device is not None:
                work(plan, device, per_device)
        except ReproduceError as e:
            if not stop.is_set():  # (a command the runner stopped fails too)
                print(f"{plan.where} FAILED: {e}", file=sys.stderr, flush=True)
                failed.append(f"{plan.row}/{plan.dataset} (seed {plan.seed}): {e}")
        finally:
            slots.put(device)

    pool = ThreadPoolExecutor(len(devices) * per_device)
    try:
        for future in [pool.submit(run, plan) for plan in plans]:
            future.result()
    except BaseException:
        stop.set()
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()
    return failed


def write_slurm_array(directory: str, argv: List[str], plans: List[RunPlan], gpus: int, parallel: int) -> str:
    """DIR/reproduce-array.sbatch, one run a task (``fairseq-ext reproduce ARGV --array-task K``), and tasks.tsv."""
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "tasks.tsv"), "w", encoding="utf-8") as f:
        f.write("task\trow\tdataset\tseed\trun_dir\n")
        f.writelines(f"{i}\t{p.row}\t{p.dataset}\t{p.seed}\t{p.run_dir}\n" for i, p in enumerate(plans))
    command = shlex.join([sys.executable, "-m", "fairseq_ext", "reproduce", *argv])
    script = os.path.join(directory, "reproduce-array.sbatch")
    with open(script, "w", encoding="utf-8") as f:
        f.write(f"""#!/usr/bin/env bash
# One training of the table a task (tasks.tsv beside this file), then, once all are done, the table:
#   sbatch {script}
#   {command} --report
#SBATCH --job-name=fairseq_ext-reproduce
#SBATCH --array=0-{len(plans) - 1}%{parallel}
#SBATCH --ntasks=1
#SBATCH --gpus-per-task={gpus}
#SBATCH --output={directory}/task-%a.out
set -euo pipefail
exec {command} --array-task "${{SLURM_ARRAY_TASK_ID:?run with sbatch, or set SLURM_ARRAY_TASK_ID}}"
""")
    os.chmod(script, 0o755)
    return script
