"""Reproduce a results table of the papers: one command per table.

    scripts/reproduce.sh --list                         # every table: data sets, rows, metrics
    scripts/reproduce.sh --list thesis-3.2              # its rows, flags and printed numbers
    scripts/reproduce.sh thesis-3.2 --dry-run           # the exact commands, row by row
    scripts/reproduce.sh thesis-3.2 --rows transformer,m-10 --nproc 8     # at paper scale on 8 GPUs
    scripts/reproduce.sh thesis-4.6 --smoke --budget 200                  # CPU smoke run
    scripts/reproduce.sh thesis-3.2 --report                              # only the side-by-side table

(also: python -m fairseq_ext.reproduce ...). For each row and data set: prepare the data if
missing, train (scripts/train.sh), average the last checkpoints where the paper did,
evaluate (fairseq-ext evaluate) with the table's BLEU flavour, count the parameters, read the
training and decoding speed; then test every row against the baseline row (sacreBLEU paired
bootstrap, 1000 samples) and print our numbers next to the paper's. Finished runs are reused.
"""
import argparse
import os
import sys

from fairseq_ext.errors import FairseqExtError
from fairseq_ext.errors import install as install_excepthook
from fairseq_ext.reproduce import report, runner
from fairseq_ext.reproduce.tables import load_setups, load_table, load_tables


def list_tables(setups):
    tables = load_tables()
    print(f"{'table':<12} {'rows':>9}  {'data sets':<46} metrics")
    for t in tables:
        own = sum(r.runnable for r in t.rows)
        datasets = ", ".join(t.datasets)
        metrics = ", ".join(m for m in t.metrics)
        print(f"{t.id:<12} {own:>3} (+{len(t.rows) - own:>2})  {datasets:<46} {metrics[:70]}")
    print(f"\n{len(tables)} tables, {sum(len(t.rows) for t in tables)} rows "
          f"({sum(r.runnable for t in tables for r in t.rows)} of the papers' own systems; "
          "the others are numbers quoted from other papers).")


def list_rows(table, setups):
    print(f"{table.id}: {table.paper}\n{table.source}\n{table.caption}\n")
    for key, ds in table.datasets.items():
        sub = setups["datasets"][key].get("substitute")
        recipe = setups["datasets"][key].get("recipe") or f"no recipe: substitute {sub}"
        print(f"data set {key}: {ds['task']}\n  BLEU {ds['bleu']}, training {ds['training']}, recipe: {recipe}")
    print(f"baseline row: {table.baseline}")
    if table.analyses:
        print(f"analyses (fairseq_ext.analysis): {', '.join(table.analyses)}")
    print()
    for row in table.rows:
        numbers = "; ".join(f"{k}: " + ", ".join(f"{m} {v}" for m, v in cells.items()) for k, cells in row.paper.items())
        kind = f"cited ({row.cited})" if row.cited else " ".join(row.flags)
        print(f"- {row.id}  [{row.label}]\n    {kind}\n    paper: {numbers or '–'}")
        if row.note:
            print(f"    note: {row.note}")


def parse_from(values):
    out = {}
    for v in values or []:
        key, sep, path = v.partition("=")
        if not sep or not key or not path:
            raise FairseqExtError(f"--from: expected DATASET=DIR (e.g. iwslt15-en-vi=/data/mt/iwslt15-en-vi), not {v!r}")
        out[key] = os.path.abspath(path)
    return out


def main(argv=None):
    install_excepthook()
    import shlex

    ap = argparse.ArgumentParser(prog="reproduce.sh", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("table", nargs="?", help="table id, e.g. thesis-3.2, mlmha-6, mma-2, ms-1, wt-4 (see --list)")
    ap.add_argument("--list", action="store_true", help="list every table, or the rows of TABLE")
    ap.add_argument("--dry-run", action="store_true", help="print the commands of every row; run nothing")
    ap.add_argument("--report", action="store_true", help="only build the side-by-side table from finished runs")
    ap.add_argument("--rows", help="comma list of row ids or labels (default: all the paper's own rows; "
                                   "the baseline is always added)")
    ap.add_argument("--datasets", help="comma list of the table's data sets (default: all)")
    ap.add_argument("--smoke", action="store_true", help="CPU smoke scale: substitute data (3000 pairs), "
                                                          "narrow models of the same depth and technique")
    ap.add_argument("--substitute", action="store_true", help="use each data set's substitute (setups.yaml)")
    ap.add_argument("--budget", help="training budget per row: updates (300) or time (20m, 2h)")
    ap.add_argument("--work-dir", default="runs", help="where runs and tables go (default runs/)")
    ap.add_argument("--data-root", default="data-bin", help="binarized data sets go to DATA_ROOT/reproduce/ "
                                                             "(default data-bin)")
    ap.add_argument("--from", dest="data_from", action="append", metavar="DATASET=DIR",
                    help="local copy of a data set's release files (repeatable)")
    ap.add_argument("--nproc", type=int, default=1, help="processes (GPUs) per node, through scripts/train.sh")
    ap.add_argument("--nnodes", type=int, default=1)
    ap.add_argument("--node-rank", type=int, default=0)
    ap.add_argument("--master-addr", default="127.0.0.1")
    ap.add_argument("--master-port", type=int, default=29500)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--cpu", action="store_true", default=None, help="decode on the CPU (default: when no GPU)")
    ap.add_argument("--train-args", default="", help="more fairseq-train flags for every row, e.g. --train-args='--fp16'")
    ap.add_argument("--generate-args", default="", help="more fairseq-generate flags for every row")
    ap.add_argument("--samples", type=int, default=1000, help="paired bootstrap samples (default 1000)")
    args = ap.parse_args(argv)
    if args.samples < 1:
        raise FairseqExtError(f"--samples must be at least 1, not {args.samples}")

    setups = load_setups()
    if args.list and not args.table:
        list_tables(setups)
        return 0
    if not args.table:
        ap.error("name a table (see --list)")
    table = load_table(args.table, setups=setups)
    if args.list:
        list_rows(table, setups)
        return 0
    opts = runner.Options(work_dir=os.path.abspath(args.work_dir), data_root=os.path.abspath(args.data_root),
                          smoke=args.smoke, budget=args.budget, nproc=args.nproc, nnodes=args.nnodes,
                          node_rank=args.node_rank, master_addr=args.master_addr, master_port=args.master_port,
                          seed=args.seed, cpu=args.cpu, data_from=parse_from(args.data_from),
                          extra_train=shlex.split(args.train_args), extra_generate=shlex.split(args.generate_args),
                          substitute=args.substitute)
    if opts.smoke and not opts.budget:
        opts.budget = str(setups["smoke"].get("budget", "200"))
    runner.budget_flags(opts.budget)  # check it before anything runs
    rows = table.select(args.rows)
    datasets = [d.strip() for d in args.datasets.split(",")] if args.datasets else None
    plans = runner.plan_table(table, rows, setups, opts, datasets)
    if args.dry_run:
        for p in plans:
            print(f"# {p.table} / {p.row} [{p.label}] / {p.dataset}: BLEU {p.bleu}, budget {p.budget}"
                  + (f"\n#   data: {p.substitution}" if p.substitution else ""))
            for cmd in p.commands():
                print(runner.shell_line(cmd))
            print()
        if table.analyses:
            print(f"# then the analyses of this table: {', '.join(table.analyses)} (docs/analysis.md)")
        return 0
    if not args.report and args.node_rank > 0:
        for p in plans:  # worker node of a multi-node run: train only
            runner.execute_worker_node(p)
        return 0
    failed = []
    if not args.report:
        for p in plans:
            try:
                runner.execute(p)
            except runner.ReproduceError as e:  # go on with the other rows; say it at the end
                print(f"[{p.table}/{p.row}/{p.dataset}] FAILED: {e}", file=sys.stderr, flush=True)
                failed.append(f"{p.row}/{p.dataset}: {e}")
        runner.significance(table, plans, n_samples=args.samples, seed=12345)
    records = report.build_rows(table, plans)
    text = report.markdown(table, records)
    print(text)
    paths = report.write_reports(table, records, os.path.join(opts.work_dir, table.id))
    print(f"written: {paths['md']}, {paths['csv']}, {paths['json']}")
    if failed:
        raise runner.ReproduceError(f"{len(failed)} run(s) failed:\n  " + "\n  ".join(failed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
