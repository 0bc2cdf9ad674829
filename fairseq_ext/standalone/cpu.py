#!/usr/bin/env python3
"""How many CPU threads a CPU training run should use, given what else the machine is doing.

torch's default, one OpenMP thread per core, collapses when another process competes for the cores (measured in
docs/performance.md, "CPU threads"). So a run takes the cores that are idle when it starts (sampled from /proc/stat over
half a second, on the cores this process may use), at least one thread per process:

    python3 cpu.py threads [PROCESSES]   the thread count per process, then the reason (2 lines)

OMP_NUM_THREADS, when set, wins (the callers check it). Runs as a plain file (it imports
nothing outside standalone/).
"""
import argparse
import os
import sys
import time
from typing import Optional, Sequence, Tuple


def usable_cores() -> Sequence[int]:
    """The CPUs this process may run on."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return list(range(os.cpu_count() or 1))


def _cpu_times(cores: Sequence[int]) -> Optional[Tuple[float, float]]:
    """(idle, total) jiffies summed over ``cores``, from /proc/stat; None where unreadable."""
    wanted = {f"cpu{c}" for c in cores}
    idle = total = 0.0
    try:
        with open("/proc/stat", encoding="ascii") as f:
            for line in f:
                fields = line.split()
                if fields and fields[0] in wanted:
                    values = [float(v) for v in fields[1:]]
                    idle += values[3] + (values[4] if len(values) > 4 else 0.0)  # idle + iowait
                    total += sum(values[:8])  # user .. steal (guest time is inside user)
    except (OSError, ValueError, IndexError):
        return None
    return (idle, total) if total else None


def idle_cores(seconds: float = 0.5) -> Tuple[float, int]:
    """(idle cores, usable cores), the idle share measured over ``seconds``; where /proc/stat
    cannot be read, from the 1-minute load average."""
    cores = usable_cores()
    first = _cpu_times(cores)
    if first is not None:
        time.sleep(seconds)
        second = _cpu_times(cores)
        if second is not None and second[1] > first[1]:
            share = (second[0] - first[0]) / (second[1] - first[1])
            return max(0.0, min(1.0, share)) * len(cores), len(cores)
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = 0.0
    return max(0.0, len(cores) - load), len(cores)


def threads_per_process(processes: int = 1, seconds: float = 0.5) -> Tuple[int, str]:
    """Threads for each of ``processes`` training processes, and the reason in words."""
    idle, cores = idle_cores(seconds)
    # a core counts as free when at least three quarters of it are idle
    free = int(idle + 0.25)
    threads = max(1, free // max(1, processes))
    busy = cores - min(cores, free)
    why = f"{idle:.1f} of {cores} cores idle" + (f", {busy} busy with other work" if busy else "")
    return threads, why


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="cpu.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("threads", help="the thread count per process, then the reason (2 lines)").add_argument(
        "processes", nargs="?", type=int, default=1)
    args = parser.parse_args(argv)
    threads, why = threads_per_process(args.processes)
    print(threads)
    print(why)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
