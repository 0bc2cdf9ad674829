"""Errors of the plugin reach the user as one line, not as a traceback.

fairseq's command-line entry points do not catch exceptions, so an option error of the plugin
would be the last line of a 30-line traceback. :func:`install` wraps ``sys.excepthook``: a
:class:`~fairseq_ext.errors.FairseqExtError` is printed as one line,
``<program>: error: <message>``, and the process exits with status 1 (Python's status for an
uncaught exception); every other exception goes to the previous hook and keeps its
traceback. Set ``FAIRSEQ_EXT_TRACEBACK=1`` to see the traceback of ours too.
"""
import os
import sys

from fairseq_ext.errors import FairseqExtError, error_line
from fairseq_ext.guards.patching import replace


def _printing_ours_as_one_line(previous_hook):
    def excepthook(exc_type, exc, tb):
        if issubclass(exc_type, FairseqExtError) and not os.environ.get("FAIRSEQ_EXT_TRACEBACK"):
            program = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "fairseq"
            sys.stderr.write(error_line(program, str(exc)) + "\n")
            sys.stderr.flush()
            return
        previous_hook(exc_type, exc, tb)

    return excepthook


def install() -> None:
    replace(sys, "excepthook", _printing_ours_as_one_line)
