"""Errors of the plugin. Every error about something the user can fix is a
:class:`FairseqExtError`, printed as one line by the commands and, inside fairseq's own commands,
by :mod:`fairseq_ext.guards.one_line_errors`; some also derive from the builtin a caller would expect.
"""
import pickle


class FairseqExtError(Exception):
    """An error the user can fix; printed without a traceback by the command-line tools."""


class OptionError(FairseqExtError, ValueError):
    """An invalid option or combination of options; the message names the option."""


class UnsafeCheckpointError(FairseqExtError, ValueError):
    """A checkpoint whose configuration fairseq would evaluate as code; refused."""


class UnsafePickleError(UnsafeCheckpointError, pickle.UnpicklingError):
    """A checkpoint whose pickle would import a global no fairseq checkpoint holds (torch's
    ``weights_only`` load stopped it); refused in one line naming the global."""


class UnsafeArchiveError(UnsafeCheckpointError):
    """A model archive with a member that would be written outside its folder (an absolute
    name, ``..``, a link out of it) or is not a file, folder or link; refused, nothing written."""


class UnsafeConfigValue(FairseqExtError, ValueError):
    """A configuration string that is not a literal, passed to fairseq's ``eval()``."""


class OutputFileError(FairseqExtError, ValueError):
    """An output file that would replace an input, cannot be written where it is named, or did not fit on the disk."""


class ResumeError(FairseqExtError):
    """A checkpoint to resume from is missing or unreadable."""


class SaveDirBusyError(FairseqExtError):
    """Another training run is writing the same ``--save-dir``; the message names it."""


class CheckpointError(FairseqExtError):
    """A checkpoint that is missing, unreadable or lacks what a command needs from it."""


class DataError(FairseqExtError):
    """A data directory or text file that is missing or does not hold what a command needs."""


class CommandError(FairseqExtError):
    """A command that cannot run or failed; the message is its one-line error. ``usage``: the
    command's usage goes with it (a required option is missing)."""

    def __init__(self, message: str, usage: bool = False):
        super().__init__(message)
        self.usage = usage


def error_line(prog: str, message: str) -> str:
    """The one format of an error line of the package's commands, argparse's own."""
    return f"{prog}: error: {message}"
