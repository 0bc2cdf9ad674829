"""Errors of the plugin.

Every error the plugin raises about something the user can fix (an option, a checkpoint, a
data file) is a :class:`FairseqExtError`. fairseq's command-line entry points do not catch
exceptions, so without help such an error is the last line of a 30-line traceback; the guard
:mod:`fairseq_ext.guards.one_line_errors`, installed when the plugin is imported, prints it
as one line instead.

Each class also derives from the builtin a caller would expect (``ValueError``), so code
that catches ``ValueError`` keeps working.
"""


class FairseqExtError(Exception):
    """An error the user can fix; printed without a traceback by the command-line tools."""


class OptionError(FairseqExtError, ValueError):
    """An invalid option or combination of options; the message names the option."""


class UnsafeCheckpointError(FairseqExtError, ValueError):
    """A checkpoint whose configuration fairseq would evaluate as code; refused."""


class UnsafeConfigValue(FairseqExtError, ValueError):
    """A configuration string that is not a literal, passed to fairseq's ``eval()``."""


class ResumeError(FairseqExtError):
    """A checkpoint to resume from is missing or unreadable."""


def install() -> None:
    """Print errors of the plugin as one line (the excepthook of
    :mod:`fairseq_ext.guards.one_line_errors`); a no-op once installed."""
    from fairseq_ext.guards import one_line_errors

    one_line_errors.install()
