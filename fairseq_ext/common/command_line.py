"""What every Python command of the package shares: its parser, the beam search's options, its
one error line (:func:`fail`; :mod:`fairseq_ext.guards.one_line_errors` for errors that escape)
and its logging (:func:`setup_cli`: WARNING, so that fairseq's INFO lines stay out of its output).
"""
import argparse
import logging
import signal
import sys
from typing import Callable, Optional, Sequence, Tuple, Type

from fairseq_ext.errors import CommandError, error_line


class CommandParser(argparse.ArgumentParser):
    """A command's parser: the description and epilog printed as written, no abbreviated
    options (an option fairseq-generate takes must never be read as a prefix of ours), and
    errors raised as :class:`CommandError` with the usage attached."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        raise CommandError(message, usage=True)


def fail(prog: str, error: Exception, usage: Optional[str] = None) -> int:
    """Print ``error`` as the command's one error line (the usage before it when the error
    says so); 1."""
    if usage and getattr(error, "usage", False):
        print(usage, file=sys.stderr)
    print(error_line(prog, str(error)), file=sys.stderr, flush=True)
    return 1


def run_main(prog: str, body: Callable[[], object], errors: Tuple[Type[Exception], ...],
                usage: Callable[[], str]) -> int:
    """Run ``body`` as the command ``prog``: 0, or one error line and 1 for ``errors``, 130 on
    Ctrl-C. As in the recipes, a kill (SIGTERM) exits through the command's cleanup."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        body()
    except errors as e:
        return fail(prog, e, usage())
    except KeyboardInterrupt:
        return 130
    return 0


def log_line(prog: str, message: str) -> None:
    """A progress or warning line of a command on stderr: ``[PROG] message``."""
    print(f"[{prog}] {message}", file=sys.stderr, flush=True)


def search_arguments(parser, beam: Optional[int] = None, beam_help: str = "", max_len: Optional[Sequence] = None,
                     max_len_help: str = "", lenpen: bool = False) -> None:
    """The beam search's options of the commands that run fairseq's SequenceGenerator themselves:
    --beam, --lenpen, --max-len-a/--max-len-b (``max_len``: output length a * |x| + b)."""
    if beam is not None:
        parser.add_argument("--beam", type=int, default=beam, help=beam_help or None)
    if lenpen:
        parser.add_argument("--lenpen", type=float, default=1.0)
    if max_len is not None:
        parser.add_argument("--max-len-a", type=float, default=max_len[0], help=max_len_help or None)
        parser.add_argument("--max-len-b", type=int, default=max_len[1])


def setup_cli() -> None:
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger().setLevel(logging.WARNING)
    logging.getLogger("matplotlib").setLevel(logging.WARNING)
