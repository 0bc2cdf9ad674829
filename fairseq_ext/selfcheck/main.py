"""``fairseq-ext selfcheck``: does the plugin work on this device, and what does each technique cost here? Each stage
writes OUT/STAGE.json and OUT/STAGE.md (and OUT/README.md, the index) and prints its summary.

    fairseq-ext selfcheck --out selfcheck --stage env
    fairseq-ext selfcheck --out selfcheck --stage tests            # the model tests on the GPU
    fairseq-ext selfcheck --out selfcheck --stage bench            # fp16 and bf16 against stock
    fairseq-ext selfcheck --out selfcheck --stage train --data PACK/data   # again: resumes IWSLT
    fairseq-ext selfcheck --out selfcheck --stage paper --data PACK/data   # 2 of thesis Table 3.3's rows
    fairseq-ext selfcheck --out selfcheck --stage paper --data PACK/data --rows m-01,s-agg --seed 2
    fairseq-ext selfcheck --out selfcheck --stage paper --data PACK/data --table thesis-5.3 --datasets iwslt15-vi-en
    fairseq-ext selfcheck --out /tmp/sc --device cpu --quick --stage all --data PACK/data

Stages: env (device, driver, versions), tests (tests/models/test_on_device.py with
``pytest --device``), bench (the benchmark's rows beside the thesis' overheads), train
(quickstart on Multi30k, baseline and M-10, then IWSLT'15 En-Vi while time lasts), paper (rows of
thesis Table 3.3, 4.1 or 5.3 on IWSLT'15 En-Vi, either way: fairseq-ext reproduce of the runs that fit the stage's
time, beside the thesis' numbers; docs/selfcheck.md#the-paper-stage). Each stage
stops within --time-limit seconds (default 540: one 9-minute command). ``--quick`` runs the
same code at tiny sizes (what ``make test-release`` runs on the CPU; its numbers mean nothing).
``fairseq-ext selfcheck-pack`` gathers the wheels and data for a machine without internet.
"""
import os
import shlex
import sys
import time
from typing import List, Optional

import torch

from fairseq_ext.common.command_line import CommandParser, fail, setup_cli
from fairseq_ext.errors import CommandError
from fairseq_ext.selfcheck import stages, training
from fairseq_ext.selfcheck.stage_files import STAGES, check_out, chosen, read_json

PROG = "fairseq-ext selfcheck"
RUNNERS = {"env": stages.run_env, "tests": stages.run_tests, "bench": stages.run_bench, "train": training.run_train,
           "paper": training.run_paper}


def parser() -> CommandParser:
    p = CommandParser(prog=PROG, description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--out", required=True, metavar="DIR", help="where the stages write (kept between stages)")
    p.add_argument("--stage", default="env", metavar="STAGES",
                   help=f"a comma list of {', '.join(STAGES)}, or all (default env)")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu",
                   help="default: cuda when torch sees a GPU")
    p.add_argument("--data", metavar="DIR", help="train: the prepared data (PACK/data of fairseq-ext selfcheck-pack)")
    p.add_argument("--tests", metavar="DIR", help="tests: the test suite (default: the checkout's tests/)")
    p.add_argument("--dtypes", default=None, metavar="LIST",
                   help="bench: comma list of fp32, fp16, bf16 (default fp16,bf16 on cuda, bf16 on cpu)")
    p.add_argument("--time-limit", type=float, default=540.0, metavar="SECONDS",
                   help="each stage stops within this many seconds (default 540)")
    p.add_argument("--quick", action="store_true", help="tiny sizes: the code path, not the numbers")
    g = p.add_argument_group("the paper stage")
    g.add_argument("--table", default=training.TABLES[0], metavar="ID",
                   help=f"the thesis' table: {', '.join(training.TABLES)} (default {training.TABLES[0]}); its rows "
                        "and numbers come from configs/tables/ID.yaml (fairseq-ext reproduce ID --list)")
    g.add_argument("--rows", metavar="LIST", help="rows of --table, a comma list (default: "
                   + "; ".join(f"{t}: {r}" for t, r in training.DEFAULT_ROWS.items()) + ")")
    g.add_argument("--datasets", default="iwslt15-en-vi", metavar="LIST",
                   help="directions: iwslt15-en-vi (default), iwslt15-vi-en (thesis-5.3 has both), a comma list")
    g.add_argument("--seed", default="1", metavar="LIST", help="training seeds, a comma list (default 1): every "
                   "row trains once per seed")
    g.add_argument("--share", type=float, default=training.SHARE, metavar="FRACTION",
                   help=f"of the thesis' 200,000 x 2,048 tokens (default {training.SHARE:g}: 2,600 updates of 32,768 "
                        "tokens, lr 1e-3, warm-up 400; fairseq-ext reproduce --share)")
    g.add_argument("--train-flags", default="", metavar="FLAGS",
                   help="more fairseq-train flags for every run, after the stage's own (so they win)")
    g.add_argument("--plan", action="store_true", help="train nothing: the runs of --table/--rows/--seed with "
                   "their device, slot and time from the measured rates (fairseq-ext reproduce --plan)")
    g.add_argument("--table-only", action="store_true",
                   help="train nothing: rebuild OUT/paper.md from the finished runs under OUT/paper/ (e.g. copied "
                        "there from other machines; fairseq-ext reproduce --report)")
    return p


def main(argv: Optional[List[str]] = None) -> int:
    setup_cli()
    p = parser()
    try:
        args = p.parse_args(argv)
        names = chosen(args.stage, STAGES, "--stage", "stage", usage=True)
        check_out(args.out)
        device = torch.device(args.device)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise CommandError("--device cuda: torch sees no GPU (torch.cuda.is_available() is False)")
        dtypes = args.dtypes.split(",") if args.dtypes else None
        if dtypes and (set(dtypes) - {"fp32", "fp16", "bf16"} or (device.type == "cpu" and "fp16" in dtypes)):
            raise CommandError(f"--dtypes: {args.dtypes!r}: choose from fp32, fp16, bf16 (fp16 on cuda only)")
        if "train" in names:
            training.data_dir(args.data, training.MULTI30K)  # --data missing: said before any stage runs
        if "tests" in names:
            stages.find_tests(args.tests)
        if args.table not in training.TABLES:
            raise CommandError(f"--table {args.table}: the paper stage runs {', '.join(training.TABLES)} (their "
                               "IWSLT'15 En-Vi columns)")
        reproduce = training.reproduce_args(args.out, device, args.data, args.quick, args.time_limit, args.table,
                                            args.rows, args.datasets, args.seed, args.share,
                                            shlex.split(args.train_flags))
        if args.plan:
            from fairseq_ext.reproduce import __main__ as reproduce_cli

            return reproduce_cli.main(reproduce + ["--plan"])
        if "paper" in names and not args.table_only:
            training.data_dir(args.data, training.IWSLT, "paper", required=True)
        results = {}
        for name in names:
            start = time.time()
            lines = RUNNERS[name](out=args.out, device=device, data=args.data, tests=args.tests, quick=args.quick,
                                  time_limit=args.time_limit, dtypes=dtypes, reproduce=reproduce,
                                  table_only=args.table_only)
            print("\n".join(lines) + f"\n\n({name}: {time.time() - start:.0f} s; {args.out}/{name}.md)\n", flush=True)
            results[name] = read_json(os.path.join(args.out, f"{name}.json")).get("result", "")
    except CommandError as e:
        return fail(PROG, e, p.format_usage())
    bad = {k: v for k, v in results.items() if not str(v).startswith("ok")}
    for name, result in bad.items():
        print(f"{PROG}: stage {name}: {result}", file=sys.stderr)
    return 1 if bad else 0
