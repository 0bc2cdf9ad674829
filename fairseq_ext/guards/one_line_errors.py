"""Errors of the plugin reach the user as one line, not as a traceback (docs/trust.md).

:func:`install` wraps ``sys.excepthook``: a :class:`~fairseq_ext.errors.FairseqExtError` prints as
``<program>: error: <message>`` with exit status 1; other exceptions keep their traceback. hydra
catches a failed fairseq-hydra-train job's exception itself, so the failed job's result
(``JobReturn.return_value``) says ours in the same line. ``FAIRSEQ_EXT_TRACEBACK=1`` shows the
traceback of ours too.
"""
import os
import sys

from fairseq_ext.errors import FairseqExtError, error_line
from fairseq_ext.guards.patching import replace


def _said_in_one_line(exc) -> bool:
    """Print ``exc`` in one line if it is ours, or fairseq's bare ``Exception`` raised while
    handling ours (its Trainer's "Cannot load model parameters"), and no traceback was asked for."""
    if type(exc) is Exception and isinstance(exc.__context__, FairseqExtError):
        exc = exc.__context__
    if not isinstance(exc, FairseqExtError) or os.environ.get("FAIRSEQ_EXT_TRACEBACK"):
        return False
    program = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "fairseq"
    sys.stderr.write(error_line(program, str(exc)) + "\n")
    sys.stderr.flush()
    return True


def _printing_ours_as_one_line(previous_hook):
    def excepthook(exc_type, exc, tb):
        if not _said_in_one_line(exc):
            previous_hook(exc_type, exc, tb)

    return excepthook


class _GuardedProperty(property):
    """A property that takes attributes (the guard's marker)."""


def _failed_job_in_one_line(original: property):
    def return_value(job):
        if job.status.name == "FAILED" and _said_in_one_line(job._return_value):
            sys.exit(1)
        return original.fget(job)

    return _GuardedProperty(return_value, original.fset, original.fdel, original.__doc__)


def install_excepthook() -> None:
    """The excepthook alone (idempotent): ``fairseq_ext/__init__.py`` installs it at once, for the
    commands that never import fairseq."""
    replace(sys, "excepthook", _printing_ours_as_one_line)


def install() -> None:
    install_excepthook()
    try:
        from hydra.core.utils import JobReturn
    except ImportError:  # pragma: no cover (hydra is a fairseq dependency)
        return
    replace(JobReturn, "return_value", _failed_job_in_one_line)
