"""What every Python command of the package does at start: logging at WARNING (fairseq's INFO
lines and matplotlib's chatter kept out of a command's own output). Errors of the package print
as one line (``PROG: error: ...``, :func:`fairseq_ext.errors.error_line`) through the guard the
plugin installs when it is imported (:mod:`fairseq_ext.guards.one_line_errors`)."""
import logging


def setup_cli() -> None:
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger().setLevel(logging.WARNING)
    logging.getLogger("matplotlib").setLevel(logging.WARNING)
