"""The one rule for a file a command writes (``translate --output``, ``score --output``; docs/trust.md,
"Scripts never delete what they did not write"): checked before the model loads
(:func:`check_output_file`), written beside it and renamed into place on success
(:func:`staged_output_file`).
"""
import contextlib
import os
import tempfile
from typing import Dict, Iterator, Optional, TextIO

from fairseq_ext.errors import FairseqExtError
from fairseq_ext.standalone.corpus import open_text


class OutputFileError(FairseqExtError, ValueError):
    """An output file that would replace an input, or cannot be written where it is named."""


def _same(a: str, b: str) -> bool:
    return os.path.exists(a) and os.path.exists(b) and os.path.samefile(a, b)


def check_output_file(output: Optional[str], option: str = "--output", inputs: Optional[Dict[str, str]] = None,
                      checkpoints: Optional[str] = None, data: Optional[str] = None) -> None:
    """Refuse ``output`` when writing it would lose a file or cannot work; ``inputs`` maps an
    option to its path; ``checkpoints`` is ``--checkpoint`` (several joined with ':')."""
    if not output:
        return
    if os.path.isdir(output):
        raise OutputFileError(f"{option} {output} is a folder: name a file")
    folder = os.path.dirname(os.path.abspath(output))
    if not os.path.isdir(folder):
        raise OutputFileError(f"{option} {output}: the folder {folder} does not exist")
    for flag, path in (inputs or {}).items():
        if path and _same(output, path):
            raise OutputFileError(f"{option} {output} is the {flag} file: it would be replaced by the output")
    for checkpoint in (checkpoints or "").split(":"):
        if checkpoint and _same(output, checkpoint):
            raise OutputFileError(f"{option} {output} is the checkpoint: the model would be replaced by the output")
    if os.path.isfile(output) and os.path.realpath(output).endswith((".pt", ".ckpt")):
        raise OutputFileError(f"{option} {output} is a checkpoint: a model would be replaced by the output; name "
                              "another file")
    if data and os.path.isdir(data):
        root = os.path.realpath(data)
        if os.path.realpath(output).startswith(root + os.sep):
            raise OutputFileError(f"{option} {output} is inside the data directory {data}: its dictionaries and "
                                  "binarized files are the model's inputs; write the output elsewhere")


@contextlib.contextmanager
def staged_output_file(path: str) -> Iterator[TextIO]:
    """A text file (UTF-8, LF; gzip for .gz) written beside ``path`` and renamed onto it when
    the block ends without an exception; on an exception it is removed and ``path`` untouched.
    A link's target is the file replaced; a path that exists and is not a regular file (a
    device, a FIFO) is written through as it is."""
    path = os.path.realpath(path)
    if os.path.exists(path) and not os.path.isfile(path):
        with open_text(path) as f:
            yield f
        return
    folder = os.path.dirname(os.path.abspath(path))
    suffix = ".tmp.gz" if path.endswith(".gz") else ".tmp"  # open_text compresses by the name
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=suffix, dir=folder)
    os.close(fd)
    try:
        with open_text(tmp) as f:
            yield f
        mode = os.stat(path).st_mode & 0o777 if os.path.exists(path) else 0o666 & ~_umask()
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
