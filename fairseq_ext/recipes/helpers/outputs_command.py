#!/usr/bin/env python3
"""The output-directory protocol as the bash recipes run it (recipes/lib/common.sh), a plain
file (no package import: it would load fairseq and torch):

  check-replaceable DIR [INPUT...]   exit 1 with one line unless an existing DIR may be replaced
  writer DIR                         the script that wrote DIR (exit 1: none of this package)
  owned-entries DIR WRITER           the entries WRITER wrote into DIR (its marker's lines)
  entries WRITER                     what WRITER writes, for a directory marked before the manifest
  mark DIR [ENTRY...]                write the marker into DIR: the exact manifest of what DIR holds
                                     (ENTRY...: a legacy marker listing these names or globs)
  add-entries DIR ENTRY...           add entries to DIR's marker (SUB/: a nested output)
  write-evaluation-complete DIR KEY=VALUE...
  check-evaluation DIR               exit 1 with one line unless DIR holds a complete evaluation
  lock DIR FD PID [WHAT]             lock DIR for the bash script PID on its open file FD of DIR's lock
                                     file (locks.py): exit 1 with one line when another command
                                     holds it, 3 when the file was replaced meanwhile (open it again)
  stale-staging DIR                  one line about the temporary directories beside DIR that
                                     runs killed before they finished left behind (none: nothing)

The rules are :mod:`outputs` (markers, replacing) and :mod:`evaluations`; the environment it
reads is described there.
"""
import argparse
import sys
from typing import List, Optional

if __package__:
    from .corpus import die
    from .evaluations import check_evaluation, write_evaluation_complete
    from .locks import lock_inherited_fd, stale_staging_warning
    from .outputs import (OutputError, add_output_entries, check_replaceable, default_entries, dir_writer,
                          mark_output, owned_entries)
else:  # run as a file by the recipes (no package import: it would load fairseq and torch)
    from corpus import die
    from evaluations import check_evaluation, write_evaluation_complete
    from locks import lock_inherited_fd, stale_staging_warning
    from outputs import (OutputError, add_output_entries, check_replaceable, default_entries, dir_writer,
                         mark_output, owned_entries)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="outputs_command.py", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, args in (("check-replaceable", ("dir", "inputs*")), ("writer", ("dir",)),
                       ("owned-entries", ("dir", "writer")), ("entries", ("writer",)), ("mark", ("dir", "entries*")),
                       ("add-entries", ("dir", "entries+")), ("write-evaluation-complete", ("dir", "fields*")),
                       ("check-evaluation", ("dir",)), ("lock", ("dir", "fd", "pid", "what?")),
                       ("stale-staging", ("dir",))):
        command = sub.add_parser(name)
        for arg in args:
            command.add_argument(arg.rstrip("*+?"), nargs={"*": "*", "+": "+", "?": "?"}.get(arg[-1]))
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "lock":
            return lock_inherited_fd(args.dir, int(args.fd), args.what or "output directory", int(args.pid))
        if args.command == "stale-staging":
            message = stale_staging_warning(args.dir)
            if message:
                print(message)
        elif args.command == "check-replaceable":
            check_replaceable(args.dir, args.inputs)
        elif args.command == "writer":
            writer = dir_writer(args.dir)
            if writer is None:
                return 1
            print(writer)
        elif args.command == "owned-entries":
            print("".join(e + "\n" for e in owned_entries(args.dir, args.writer)), end="")
        elif args.command == "entries":
            print("".join(e + "\n" for e in default_entries(args.writer)), end="")
        elif args.command == "mark":
            mark_output(args.dir, args.entries)
        elif args.command == "add-entries":
            add_output_entries(args.dir, args.entries)
        elif args.command == "write-evaluation-complete":
            write_evaluation_complete(args.dir, args.fields)
        else:
            check_evaluation(args.dir)
    except OutputError as e:
        die(str(e))
    return 0


if __name__ == "__main__":
    sys.exit(main())
