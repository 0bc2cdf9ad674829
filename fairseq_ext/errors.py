"""Errors of the plugin, and how they reach the user.

Every error the plugin raises about something the user can fix (an option, a checkpoint, a
data file) is a :class:`FairseqExtError`. fairseq's command-line entry points do not catch
exceptions, so without help such an error is the last line of a 30-line traceback. On
import, the plugin installs a ``sys.excepthook`` that prints a :class:`FairseqExtError` as
one line, ``<program>: error: <message>``, and exits with status 1 (Python's status for an
uncaught exception); every other exception keeps its traceback. Set
``FAIRSEQ_EXT_TRACEBACK=1`` to see the traceback of ours too.

Each class also derives from the builtin a caller would expect (``ValueError``), so code
that catches ``ValueError`` keeps working.
"""
import os
import sys


class FairseqExtError(Exception):
    """An error the user can fix; printed without a traceback by the command-line tools."""


class OptionError(FairseqExtError, ValueError):
    """An invalid option or combination of options; the message names the option."""


class UnsafeCheckpointError(FairseqExtError, ValueError):
    """A checkpoint whose configuration fairseq would evaluate as code; refused."""


class UnsafeConfigValue(FairseqExtError, ValueError):
    """A configuration string that is not a literal, passed to fairseq's ``eval()``."""


_previous_excepthook = sys.excepthook


def _one_line_excepthook(exc_type, exc, tb):
    if issubclass(exc_type, FairseqExtError) and not os.environ.get("FAIRSEQ_EXT_TRACEBACK"):
        program = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "fairseq"
        sys.stderr.write(f"{program}: error: {exc}\n")
        sys.stderr.flush()
        return
    _previous_excepthook(exc_type, exc, tb)


def install() -> None:
    if sys.excepthook is not _one_line_excepthook:
        global _previous_excepthook
        _previous_excepthook = sys.excepthook
        sys.excepthook = _one_line_excepthook


install()
