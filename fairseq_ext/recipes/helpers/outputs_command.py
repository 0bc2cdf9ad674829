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

The rules are :mod:`outputs` (markers, replacing) and :mod:`evaluations`; the environment it
reads is described there.
"""
import os
import sys
from typing import List, Optional

if __package__:
    from .outputs import (OutputError, add_output_entries, check_replaceable, default_entries, dir_writer,
                          mark_output, owned_entries)
    from .evaluations import check_evaluation, write_evaluation_complete
else:  # run as a file by the recipes (no package import: it would load fairseq and torch)
    from outputs import (OutputError, add_output_entries, check_replaceable, default_entries, dir_writer,
                         mark_output, owned_entries)
    from evaluations import check_evaluation, write_evaluation_complete


def _die(message: str) -> "NoReturn":  # noqa: F821
    prog = os.environ.get("FSX_PROG")
    print(f"{prog}: error: {message}" if prog else f"error: {message}", file=sys.stderr)
    sys.exit(1)


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    usage = __doc__.split("\n\n")[1]
    if not argv or argv[0] in ("-h", "--help"):
        print(usage)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    need = {"check-replaceable": 1, "writer": 1, "owned-entries": 2, "entries": 1, "mark": 1, "add-entries": 2,
            "write-evaluation-complete": 1, "check-evaluation": 1}
    if command not in need:
        _die(f"outputs_command.py: unknown command {command!r}\n{usage}")
    if len(rest) < need[command]:
        _die(f"outputs_command.py {command}: missing arguments\n{usage}")
    try:
        if command == "check-replaceable":
            check_replaceable(rest[0], rest[1:])
        elif command == "writer":
            writer = dir_writer(rest[0])
            if writer is None:
                return 1
            print(writer)
        elif command == "owned-entries":
            print("".join(e + "\n" for e in owned_entries(rest[0], rest[1])), end="")
        elif command == "entries":
            print("".join(e + "\n" for e in default_entries(rest[0])), end="")
        elif command == "mark":
            mark_output(rest[0], rest[1:])
        elif command == "add-entries":
            add_output_entries(rest[0], rest[1:])
        elif command == "write-evaluation-complete":
            write_evaluation_complete(rest[0], rest[1:])
        else:
            check_evaluation(rest[0])
    except OutputError as e:
        _die(str(e))
    return 0


if __name__ == "__main__":
    sys.exit(main())
