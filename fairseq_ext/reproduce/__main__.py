"""Reproduce a results table of the papers: one command per table.

    fairseq-ext reproduce --list                         # every table: data sets, rows, metrics
    fairseq-ext reproduce --list thesis-3.2              # its rows, flags and printed numbers
    fairseq-ext reproduce thesis-3.2 --dry-run           # the exact commands, row by row
    fairseq-ext reproduce thesis-3.2 --rows transformer,m-10 --nproc 8     # at paper scale on 8 GPUs
    fairseq-ext reproduce thesis-4.6 --smoke --budget 200                  # CPU smoke run
    fairseq-ext reproduce thesis-3.5 --cpu-scale --rows s-agg,iter-s-agg   # models that translate, on a CPU
    fairseq-ext reproduce thesis-3.2 --report                              # only the side-by-side table
    fairseq-ext reproduce thesis-3.2 --smoke --seeds 1,2,3                 # each row once per seed: mean ± sd

(also: python -m fairseq_ext.reproduce ...). For each row and data set: prepare the data if missing, train (fairseq-ext
train), average the last checkpoints where the paper did, evaluate (fairseq-ext evaluate) with the table's BLEU flavour,
count the parameters, read the training and decoding speed; then run the analyses the table's columns read (python -m
fairseq_ext.analysis.NAME, METEOR), test every row's BLEU against its reference row (sacreBLEU paired bootstrap, 1000
samples) and print every printed column of the paper next to ours, with the scale of our runs. Finished runs and
analyses are reused. The table goes to WORK/TABLE/table[.SCALE].{md,csv,json,tex}, replaced only by a complete run of
every row and data set; a subset (--rows, --datasets) writes table[.SCALE].rows-.../datasets-..., a run with failures or
missing numbers ....partial. With --seeds each row is trained once per seed and the table (table[.SCALE].seeds-1-2-3...)
shows mean ± sd over the seeds each row shares with its reference row, marked by the stratified approximate
randomization over those seeds (--test ar; --test bootstrap: only where every seed's bootstrap agrees). --correction
holm corrects the marks for the number of rows tested against one reference row.
"""
import argparse
import dataclasses
import hashlib
import math
import os
import re
import shlex
import sys
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from fairseq_ext.errors import FairseqExtError
from fairseq_ext.reproduce.planning import (SHARE_RULE, AnalysisPlan, Options, ReproduceError, RunPlan, budget_flags,
                                            plan_analyses, plan_seeds, scale_name, scale_settings, shell_line)
from fairseq_ext.reproduce.readers import scales as scales_of
from fairseq_ext.reproduce.render import markdown, write_reports
from fairseq_ext.reproduce.rows import build_rows, build_seed_rows, complete
from fairseq_ext.reproduce.tables import Row, Table, load_setups, load_table, load_tables, with_comet
from fairseq_ext.reproduce import execute, marks, schedule
from fairseq_ext import resources
from fairseq_ext.tools import comet as comet_metric
from fairseq_ext.tools import statistics


def list_tables():
    tables = load_tables()
    print(f"{'table':<12} {'rows':>9}  {'data sets':<46} columns")
    for t in tables:
        own = sum(r.runnable for r in t.rows)
        print(f"{t.id:<12} {own:>3} (+{len(t.rows) - own:>2})  {', '.join(t.datasets):<46} {', '.join(t.metrics)[:70]}")
    print(f"\n{len(tables)} tables, {sum(len(t.rows) for t in tables)} rows "
          f"({sum(r.runnable for t in tables for r in t.rows)} of the papers' own systems; "
          "the others are numbers quoted from other papers).")


def list_rows(table, setups):
    print(f"{table.id}: {table.paper}\n{table.source}\n{table.caption}\n")
    for key, ds in table.datasets.items():
        sub = setups["datasets"][key].get("substitute")
        recipe = setups["datasets"][key].get("recipe") or f"no recipe: substitute {sub}"
        print(f"data set {key}: {ds['task']}\n  BLEU {ds['bleu']}, training {ds['training']}, recipe: {recipe}"
              + (f"\n  every row's --arch becomes {ds['arch']} here" if ds.get("arch") else ""))
    print(f"baseline row: {table.baseline}")
    print("columns:")
    for c in table.columns:
        params = ", ".join(f"{k} {v}" for k, v in c.params.items())
        print(f"  {c.name}: {c.source}" + (f" ({params})" if params else "")
              + ("" if c.printed else "  [ours only: not in the paper's table]"))
    if table.analyses:
        print(f"analyses (fairseq_ext.analysis): {', '.join(table.analyses)}")
    print()
    for row in table.rows:
        numbers = "; ".join(f"{k}: " + ", ".join(f"{m} {v}" for m, v in cells.items())
                            for k, cells in row.paper.items())
        kind = f"cited ({row.cited})" if row.cited else " ".join(row.flags)
        at = row.flags.index("--arch") + 1 if not row.cited and "--arch" in row.flags else None
        for key, ds in table.datasets.items() if at is not None else []:  # a data set that names its own size preset
            if ds.get("arch") and ds["arch"] != row.flags[at]:
                kind += f"\n    on {key}: {' '.join([*row.flags[:at], ds['arch'], *row.flags[at + 1:]])}"
        print(f"- {row.id}  [{row.label}]\n    {kind}\n    paper: {numbers or '–'}")
        if table.reference(row) is not None:
            print(f"    compared with: {table.reference(row).id}")
        if row.model:
            analysis = ", ".join(f"{k} {v}" for k, v in row.analysis.items())
            print(f"    reports on the model of: {row.model}" + (f" ({analysis})" if analysis else ""))
        if row.note:
            print(f"    note: {row.note}")


def parse_from(values, option="--from"):
    out = {}
    for v in values or []:
        key, sep, path = v.partition("=")
        if not sep or not key or not path:
            raise FairseqExtError(
                f"{option}: expected DATASET=DIR (e.g. iwslt15-en-vi=/data/mt/iwslt15-en-vi), not {v!r}")
        out[key] = os.path.abspath(path)
    return out


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="fairseq-ext reproduce", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    add = ap.add_argument  # every option: docs/reproduction.md
    add("table", nargs="?", help="table id, e.g. thesis-3.2, mlmha-6, mma-2, ms-1, wt-4 (see --list)")
    add("--list", action="store_true", help="list every table, or the rows of TABLE")
    add("--dry-run", action="store_true", help="print the commands of every row; run nothing")
    add("--report", action="store_true", help="only build the side-by-side table from finished runs")
    add("--rows", help="comma list of row ids or labels (default: the paper's own rows; the baseline is always added)")
    add("--datasets", help="comma list of the table's data sets (default: all)")
    scale = ap.add_mutually_exclusive_group()
    scale.add_argument("--smoke", action="store_true", help="CPU smoke scale: substitute data (3000 pairs), narrow "
                                                             "models of the same depth and technique")
    scale.add_argument("--cpu-scale", action="store_true", help="CPU scale: the substitute data in full, the paper's "
                                                                 "depth and technique at d 128, 1600 updates a row")
    add("--substitute", action="store_true", help="use each data set's substitute (setups.yaml)")
    add("--budget", help="training budget per row: updates (300) or time (20m, 2h)")
    add("--share", type=float, help="the thesis' schedule at this share of its tokens (e.g. 0.21; the small config)")
    add("--work-dir", default="runs", help="where runs and tables go (default runs/)")
    add("--data-root", default="data-bin", help="binarized data sets go to DATA_ROOT/reproduce/ (default data-bin)")
    add("--from", dest="data_from", action="append", metavar="DATASET=DIR", help="a data set's release files")
    add("--prepared", action="append", metavar="DATASET=DIR", help="a data set binarized elsewhere (with prep.env)")
    add("--nproc", type=int, default=1, help="processes (GPUs) per node, through fairseq-ext train")
    add("--nnodes", type=int, default=1)
    add("--node-rank", type=int, default=0)
    add("--master-addr", default="127.0.0.1")
    add("--master-port", type=int, default=29500)
    add("--seed", type=int, help="the training seed of every row (default 1)")
    add("--seeds", help="comma list of seeds, e.g. 1,2,3: every row once per seed, mean ± sd, marks over the seeds")
    add("--cpu", action="store_true", default=None, help="decode on the CPU (default: when no GPU)")
    add("--train-args", default="", help="more fairseq-train flags for every row, e.g. --train-args='--fp16'")
    add("--generate-args", default="", help="more fairseq-generate flags for every row")
    add("--devices", help="comma list of GPUs, e.g. 0,1,2,3 (default: every GPU torch sees, else the CPU)")
    add("--per-device", type=int, help="trainings at once on each device (default: the best measured, else 1)")
    add("--plan", action="store_true", help="train nothing: each run's device, slot and time, and the device-hours")
    add("--plan-device", help="--plan for this device (default the first GPU's, else NVIDIA H200)")
    add("--time-limit", type=float, metavar="SECONDS", help="start only the runs that end within it by their plan")
    add("--slurm-array", metavar="DIR", help="write a Slurm job array of one run a task into DIR; train nothing")
    add("--array-task", type=int, metavar="K", help="run only the K-th run of the plan (a --slurm-array task)")
    add("--samples", type=int, default=1000, help="paired bootstrap samples (default 1000)")
    add("--test", choices=marks.TESTS, help="the test behind the BLEU marks: sacreBLEU's paired bootstrap, compare-mt's"
                                            " as the thesis ran it, or the stratified approximate randomization over "
                                            "the seeds (default: bootstrap with one seed, ar with several)")
    add("--shuffles", type=int, default=10000, help="--test ar: shuffles (default 10000, MultEval's)")
    add("--ar-statistic", choices=statistics.STATISTICS, default="concatenated",
        help="--test ar: BLEU of each row's runs concatenated (MultEval's, the default) or the mean of per-run BLEU")
    add("--correction", choices=marks.CORRECTIONS, default="none",
        help="holm: corrects the marks of the rows tested against one reference row (default none)")
    add("--senteval", help="SentEval's data/probing directory (default: SentLen, WC, BShift from the training text)")
    comet_metric.add_arguments(ap)  # a COMET column after chrF (docs/evaluation.md)
    return ap


def check_args(args) -> List[int]:
    """The checks of the options that need no table; the seeds (--seeds, else [--seed], default [1])."""
    if args.samples < 1:
        raise FairseqExtError(f"--samples must be at least 1, not {args.samples}")
    if args.shuffles < 1:
        raise FairseqExtError(f"--shuffles must be at least 1, not {args.shuffles}")
    if args.share is not None and not 0 < args.share <= 1:
        raise FairseqExtError(f"--share must be in (0, 1], not {args.share}")
    if args.share is not None and (args.budget or args.smoke or args.cpu_scale):
        raise FairseqExtError("--share sets the updates itself: leave out --budget, --smoke and --cpu-scale")
    if args.per_device is not None and args.per_device < 1:
        raise FairseqExtError(f"--per-device must be at least 1, not {args.per_device}")
    text, seed = args.seeds, args.seed
    if text is None:
        return [1 if seed is None else seed]
    try:
        seeds = [int(part.strip()) for part in text.split(",")]
    except ValueError:
        raise FairseqExtError(f"--seeds: expected a comma list of integers (e.g. 1,2,3), not {text!r}") from None
    if len(set(seeds)) != len(seeds):
        raise FairseqExtError(f"--seeds: a seed appears twice in {text!r}")
    if seed is not None and seeds != [seed]:
        raise FairseqExtError(f"--seed {seed} and --seeds {text} disagree: give one of them "
                              "(--seed N is the one-seed form of --seeds)")
    return seeds


@dataclass
class Reproduction:
    """One table's reproduction as planned: rows, options, per seed the runs, and the analyses."""
    table: Table
    rows: List[Row]
    opts: Options
    seeds: List[int]
    by_seed: Dict[int, List[RunPlan]]
    analyses: List[AnalysisPlan]

    @property
    def plans(self) -> List[RunPlan]:
        return [p for ps in self.by_seed.values() for p in ps]


def plan(table: Table, args, setups: dict, seeds: List[int]) -> Reproduction:
    same = {f.name: getattr(args, f.name) for f in dataclasses.fields(Options) if f.name in vars(args)}
    opts = Options(**{**same, "work_dir": os.path.abspath(args.work_dir), "data_root": os.path.abspath(args.data_root),
                      "data_from": parse_from(args.data_from), "prepared": parse_from(args.prepared, "--prepared"),
                      "extra_train": shlex.split(args.train_args),
                      "extra_generate": shlex.split(args.generate_args), "comet": comet_metric.from_args(args),
                      "senteval": os.path.abspath(args.senteval) if args.senteval else None})
    for option, given in (("--from", opts.data_from), ("--prepared", opts.prepared)):
        unknown = sorted(set(given) - set(setups["datasets"]))
        if unknown:
            raise FairseqExtError(f"{option} {unknown[0]}=...: unknown data set {unknown[0]} (choose from "
                                  f"{', '.join(sorted(setups['datasets']))})")
    if scale_name(opts) and not opts.budget:
        opts.budget = str(scale_settings(setups, opts).get("budget", "200"))
    budget_flags(opts.budget)  # check it before anything runs
    rows = table.select(args.rows)
    datasets = [d.strip() for d in args.datasets.split(",") if d.strip()] if args.datasets else None
    todo = Reproduction(table, rows, opts, seeds, plan_seeds(table, rows, setups, opts, seeds, datasets), [])
    todo.analyses = plan_analyses(table, todo.plans, setups, opts, args.samples)
    return todo


def print_dry_run(todo: Reproduction, args) -> None:
    """Every command of every run and analysis as a user would type it, and the table's file."""
    for seed, seed_plans in todo.by_seed.items():
        if len(todo.seeds) > 1:
            print(f"# ==== seed {seed} ====\n")
        for p in seed_plans:
            shared = [r for r in todo.rows if r.model == p.row]
            print(f"# {p.table} / {p.row} [{p.label}] / {p.dataset}: BLEU {p.bleu}, budget {p.budget}"
                  + (f"\n#   data: {p.substitution}" if p.substitution else "")
                  + (f"\n#   the same model for the rows: {', '.join(f'{r.id} [{r.label}]' for r in shared)}"
                     if shared else ""))
            for cmd in p.commands():
                print(shell_line(cmd))
            print()
    if todo.analyses:
        print("# then, on each trained model, what the table's columns read (docs/analysis.md):")
        for a in todo.analyses:
            where = f"{a.run.row} / {a.run.dataset}"
            if a.name in ("meteor", "comet"):
                what = "METEOR" if a.name == "meteor" else f"COMET ({a.comet.name})"
                print(f"# {where}: {what} of eval-test/hyp.detok (fairseq_ext.tools.{a.name}) -> {a.out}")
            elif a.command is None:
                print(f"# {where}: {a.name}: unavailable: {a.unavailable}")
            else:
                print(shell_line(a.command))
        print()
    name = output_name(todo.table, args, todo.opts, todo.seeds)
    print(f"# table: {os.path.join(todo.opts.work_dir, todo.table.id, name)}.{{md,csv,json,tex}}")


def slots(todo: Reproduction, args) -> Tuple[List[Optional[str]], int]:
    """(devices, trainings at once on each): one at a time over all of them for a run of several processes."""
    if todo.opts.nproc != 1 or todo.opts.nnodes != 1:
        return [None], 1
    devices = schedule.parse_devices(args.devices, todo.plans[0].cpu if todo.plans else True)
    if args.per_device:
        return devices, args.per_device
    config, _, max_tokens = schedule.training_of(todo.plans[0]) if todo.plans else ("", None, 0)
    name = schedule.device_name(devices[0], todo.plans[0].cpu)  # what the rates are measured on
    return devices, schedule.default_per_device(schedule.rates(todo.opts.work_dir), name, config, max_tokens)


def prepare_data(todo: Reproduction) -> Dict[str, str]:
    """Each data set the runs need, prepared once before any run starts; data dir -> why its preparation failed."""
    failed = {}
    for p in todo.plans:
        if p.prepare and p.data_dir not in failed and not os.path.exists(os.path.join(p.data_dir, "prep.env")):
            try:
                execute.run_command(p.prepare, os.path.join(p.run_dir, "prepare.log"), resources.command_environment())
            except ReproduceError as e:
                print(f"{p.where} FAILED: {e}", file=sys.stderr, flush=True)
                failed[p.data_dir] = f"data {p.data_key}: {e}"
    return failed


def run_all(todo: Reproduction, args) -> List[str]:
    """The data, every run over the devices' slots, every analysis of a finished run; the failed steps (said)."""
    unprepared = prepare_data(todo)
    failed = list(unprepared.values())
    plans = [p for p in todo.plans if p.data_dir not in unprepared]
    devices, at_once = slots(todo, args)
    if args.time_limit is not None:
        todo_now = [p for p in plans if not os.path.exists(os.path.join(p.run_dir, "result.json"))]
        fit = schedule.fitting(todo_now, devices, at_once, args.time_limit, schedule.rates(todo.opts.work_dir))
        if len(fit) < len(todo_now):
            print(f"{len(todo_now) - len(fit)} run(s) left for the next command: by their planned times they would "
                  f"not end within --time-limit {args.time_limit:g} s (fairseq-ext reproduce ... --plan)", flush=True)
        plans = [p for p in plans if p in fit or p not in todo_now]
    where = ", ".join(d or "the --nproc processes" for d in devices)
    print(f"{len(plans)} run(s), {at_once} at once on each of: {where}", flush=True)
    started = time.time()
    failed += execute.on_slots(plans, devices, at_once)
    print(f"{len(plans)} run(s) ended in {time.time() - started:.0f} s", flush=True)
    for a in todo.analyses:  # of a run that finished (a failed training is said above)
        if os.path.exists(os.path.join(a.run.run_dir, "result.json")):
            try:
                execute.run_analysis(a)
            except ReproduceError as e:
                print(f"{a.run.where} {a.name} FAILED: {e}", file=sys.stderr, flush=True)
                failed.append(f"{a.run.row}/{a.run.dataset} {a.name}: {e}")
    return failed


def timed(todo: Reproduction, args, device: str, measured: List[dict], count: int):
    """(trainings at once on each of ``count`` devices, each run's (seconds or None, its rate's source))."""
    config, _, max_tokens = schedule.training_of(todo.plans[0])
    at_once = args.per_device or schedule.default_per_device(measured, device, config, max_tokens)
    load = at_once * count if device.startswith("cpu") else at_once
    return at_once, [schedule.estimate(p, measured, device, load) for p in todo.plans]


def print_plan(todo: Reproduction, args, setups: dict) -> None:
    """--plan: each run's device, slot and time; the device-hours at the paper's schedule and a share, 1 GPU and N."""
    measured, (devices, _) = schedule.rates(todo.opts.work_dir), slots(todo, args)
    here = schedule.device_name(devices[0], todo.plans[0].cpu)
    stored = todo.plans[0].cpu and not (todo.opts.cpu or scale_name(todo.opts))  # no GPU here: plan for the H200
    name = args.plan_device or ("NVIDIA H200" if stored else here)
    names = devices if name == here else [str(i) for i in range(len(devices) if args.devices else 1)]
    at_once, runs = timed(todo, args, name, measured, len(names))
    sources = list(dict.fromkeys(source for _, source in runs))
    placed, end = schedule.place([t or 0.0 for t, _ in runs], names, at_once)
    print(f"# {todo.table.id}: {len(runs)} run(s) on {len(names)} x {name}, at most {at_once} at once on each"
          + ("" if name == here else f" (this machine's: {here}; --plan-device NAME for another)")
          + "\n\n| run | row | data set | seed | training | device | slot | starts (h) | hours | rate |\n"
          + "|---:|---|---|---:|---|---:|---:|---:|---:|---|")
    for i, (p, (seconds, source), (device, slot, start)) in enumerate(zip(todo.plans, runs, placed)):
        _, updates, tokens = schedule.training_of(p)
        print(f"| {i} | {p.label} | {p.dataset} | {p.seed} | {updates or '?'} x {tokens:,} tokens | {device} | {slot} "
              f"| {start / 3600:.2f} | {'–' if seconds is None else f'{seconds / 3600:.2f}'} "
              f"| [{sources.index(source) + 1}] |")
    unknown = sum(t is None for t, _ in runs)
    print("\n" + "\n".join(f"[{i + 1}] {source}" for i, source in enumerate(sources))
          + ("\n\nWall clock: not measured, no rate is known here (a first run measures it)" if unknown == len(runs)
             else f"\n\nWall clock {end / 3600:.1f} h ({end:.0f} s), {end * len(names) / 3600:.1f} device-hours"
             + (f"; {unknown} run(s) not measured, counted as 0" if unknown else "")) + ".")
    alternative = schedule.training_of(todo.plans[0])[0] == SHARE_RULE["config"] and not (todo.opts.budget or
                                                                                         scale_name(todo.opts))
    counts = [1] if name.startswith("cpu") else sorted({1, len(names) if len(names) > 1 else 4})
    print(f"\n| schedule | {' | '.join(f'{n} x {name}: wall h, device-h' for n in counts)} |\n|---|"
          + "---:|" * len(counts))
    for share in [args.share] + ([None if args.share else 0.21] if alternative else []):
        other = todo if share == args.share else plan(todo.table, argparse.Namespace(**{**vars(args), "share": share}),
                                                      setups, todo.seeds)
        cells = []
        for n in counts:
            at, runs = timed(other, args, name, measured, n)
            end = schedule.place([t or 0.0 for t, _ in runs], [str(i) for i in range(n)], at)[1]
            cells.append(f"{end / 3600:.1f}, {end * n / 3600:.1f}" if any(t for t, _ in runs) else "not measured")
        label, unknown = other.plans[0].budget, sum(t is None for t, _ in runs)
        what = "the paper's schedule" if label == "paper" else f"budget {label}" if label[:1].isdigit() \
            and " " not in label else label
        print(f"| {what}, {at} at once{f' (not measured: {unknown} runs)' if unknown else ''} | {' | '.join(cells)} |")


def report(todo: Reproduction, args, failed: List[str]) -> str:
    """The side-by-side table of what finished, printed and written under WORK/TABLE/; its markdown file."""
    table, opts, seeds = todo.table, todo.opts, todo.seeds
    test = args.test or ("ar" if len(seeds) > 1 else "bootstrap")
    for ps in todo.by_seed.values():  # each seed's runs against the reference rows' runs of the same seed
        marks.per_run(table, ps, "thesis" if test == "thesis" else "bootstrap", n_samples=args.samples,
                      seed=12345, rows=todo.rows)
    records = build_seed_rows(table, todo.by_seed, todo.rows, todo.analyses) if len(seeds) > 1 \
        else build_rows(table, todo.plans, todo.rows, todo.analyses)
    if test == "ar":
        marks.mark_pooled(table, records, todo.by_seed, args.shuffles, statistic=args.ar_statistic)
    marks.label(table, records, test, len(seeds) > 1, args.shuffles, args.correction, args.ar_statistic)
    failed += [f"{r['label']} ({r['dataset']}): its BLEU is {r['model_bleu']}, a failed evaluation ({r['run_dir']})"
               for r in records if isinstance(r.get("model_bleu"), float) and not math.isfinite(r["model_bleu"])]
    scales = scales_of(table, todo.plans)
    print(markdown(table, records, scales))
    partial = bool(failed) or not complete(records)
    name = output_name(table, args, opts, seeds, partial)
    out_dir = os.path.join(opts.work_dir, table.id)
    paths = write_reports(table, records, out_dir, name, scales)
    print(f"written: {paths['md']}, .csv, .json, .tex")
    whole = output_name(table, argparse.Namespace(rows=None, datasets=None), opts, seeds)
    if name != whole:
        subset = output_name(table, args, opts, seeds) != whole
        why = (["a subset of the table (--rows / --datasets)"] * subset
               + ["incomplete (failed runs or missing numbers)"] * partial)
        print(f"  ({' and '.join(why)}: {whole}.md, the complete table at this scale, is written only by a "
              "complete run of every row and data set"
              + (", and was left as it was" if os.path.exists(os.path.join(out_dir, whole + ".md")) else "") + ")")
    return paths["md"]


def main(argv=None, written: Optional[List[str]] = None):
    """``written``: the table's markdown file is appended to it (even when a step failed)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    seeds = check_args(args)
    setups = load_setups()
    if args.list and not args.table:
        list_tables()
        return 0
    if not args.table:
        parser.error("name a table (see --list)")
    table = load_table(args.table, setups=setups)
    if args.comet_model:
        table = dataclasses.replace(table, columns=with_comet(table.columns))
    if args.list:
        list_rows(table, setups)
        return 0
    todo = plan(table, args, setups, seeds)
    if args.dry_run:
        print_dry_run(todo, args)
        return 0
    if args.plan:
        print_plan(todo, args, setups)
        return 0
    try:
        with execute.children_die_with_the_runner():
            if args.slurm_array or args.array_task is not None:
                return slurm(todo, args, argv if argv is not None else sys.argv[1:])
            if not args.report and args.node_rank > 0:
                for p in todo.plans:  # worker node of a multi-node run: train only
                    execute.run_on_worker_node(p)
                return 0
            failed = [] if args.report else run_all(todo, args)
    except KeyboardInterrupt:  # Ctrl-C: the children were stopped; one line, no traceback
        print(f"\n{parser.prog}: interrupted: the running command was stopped; finished rows are kept and reused: "
              "run the same command again to go on", file=sys.stderr, flush=True)
        return 130
    md = report(todo, args, failed)
    if written is not None:
        written.append(md)
    if failed:
        raise ReproduceError(f"{len(failed)} step(s) failed:\n  " + "\n  ".join(failed))
    return 0


def slurm(todo: Reproduction, args, argv: List[str]) -> int:
    """--slurm-array: prepare the data here, write the job array; --array-task K: train and evaluate the K-th run."""
    if args.array_task is not None:
        if not 0 <= args.array_task < len(todo.plans):
            raise FairseqExtError(f"--array-task {args.array_task}: the plan has {len(todo.plans)} runs "
                                  f"(0-{len(todo.plans) - 1})")
        execute.run(todo.plans[args.array_task])
        return 0
    unprepared = prepare_data(todo)
    if unprepared:
        raise ReproduceError("no job array written: " + "; ".join(unprepared.values()))
    keep = [a for i, a in enumerate(argv) if a != "--slurm-array" and (i == 0 or argv[i - 1] != "--slurm-array")
            and not a.startswith("--slurm-array=")]
    script = schedule.write_slurm_array(os.path.abspath(args.slurm_array), keep, todo.plans, max(1, todo.opts.nproc),
                                        len(todo.plans))
    print(f"written: {script} ({len(todo.plans)} tasks, one run each; tasks.tsv beside it). Submit it with "
          f"`sbatch {script}`; when every task has ended, the table: fairseq-ext reproduce {shlex.join(keep)} --report")
    return 0


def output_name(table: Table, args, opts: Options, seeds: List[int], partial: bool = False) -> str:
    """A table's file name without extension: ``table``, with the scale (``smoke.200``), the seeds
    (``seeds-1-2-3``), the subset (``rows-m-00``, ``datasets-...``) and ``partial`` added, so that
    only a complete run at the same scale and seeds replaces a table."""
    scale = scale_name(opts)
    parts = ["table"] + [p for p in (scale, "substitute" if opts.substitute and not scale else "", opts.budget) if p]
    parts += ["seeds-" + "-".join(str(x) for x in seeds)] if len(seeds) > 1 else []
    rows = datasets = ""
    if args.rows and {r.id for r in table.select(args.rows)} != {r.id for r in table.rows if r.runnable}:
        rows = ",".join(r.id for r in table.named(args.rows))
    chosen = [d.strip() for d in (args.datasets or "").split(",") if d.strip()]
    if chosen and set(chosen) != set(table.datasets):
        datasets = ",".join(chosen)
    for kind, spec in (("rows", rows), ("datasets", datasets)):
        if spec:
            names = [re.sub(r"[^A-Za-z0-9.+-]+", "_", s.strip()) for s in spec.split(",") if s.strip()]
            text = "+".join(names)
            if len(text) > 60:
                text = f"{len(names)}-{hashlib.sha1(text.encode()).hexdigest()[:8]}"
            parts.append(f"{kind}-{text}")
    return ".".join(parts + (["partial"] if partial else []))


if __name__ == "__main__":
    sys.exit(main())
