"""The one rule for a file a command writes (``translate --output``, ``score --output``; docs/trust.md,
"Scripts never delete what they did not write"): checked before the model loads
(:func:`check_output_file`), written beside it and renamed into place on success
(:func:`staged_output_file`).
"""
import contextlib
import os
import zlib
from typing import Dict, Iterator, Optional, TextIO

from fairseq_ext.errors import OutputFileError
from fairseq_ext.guards.checkpoint_safety import staged_file
from fairseq_ext.standalone.corpus import open_text


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
    kind = None if not os.path.isfile(output) else _not_text(output)
    if kind:
        raise OutputFileError(f"{option} {output} is {kind}: it would be replaced by the output; name another file")
    if data and os.path.isdir(data):
        root = os.path.realpath(data)
        if os.path.realpath(output).startswith(root + os.sep):
            raise OutputFileError(f"{option} {output} is inside the data directory {data}: its dictionaries and "
                                  "binarized files are the model's inputs; write the output elsewhere")


def _not_text(path: str) -> Optional[str]:
    """What an existing file is when it is not a text file a command could have written (UTF-8,
    gzip for .gz): "a checkpoint" (torch's zip or a pickle), "a binary file"; else None."""
    with open(path, "rb") as f:
        head = f.read(1 << 16)
    if head.startswith(b"PK\x03\x04") or head[:1] == b"\x80" and head[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05"):
        return "a checkpoint (torch's zip or pickle format)"
    if head.startswith(b"\x1f\x8b") and path.endswith(".gz"):
        try:  # the text of the first 64 KiB of the gzip stream
            head = zlib.decompressobj(zlib.MAX_WBITS | 16).decompress(head, 1 << 16)
        except zlib.error:
            return "a binary file, not text"
    return _binary(head)


def _binary(head: bytes) -> Optional[str]:
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as error:
        if error.start < len(head) - 3:  # not just a character cut at the end of the head
            return "a binary file, not text"
    return "a binary file, not text" if b"\0" in head else None


@contextlib.contextmanager
def staged_output_file(path: str) -> Iterator[TextIO]:
    """A text file (UTF-8, LF; gzip for .gz) written beside ``path`` and renamed onto it when the block ends without an
    exception; on an exception it is removed and ``path`` untouched (a full disk: an OutputFileError naming ``path``).
    A link's target is the file replaced; a path that exists and is not a regular file (a device, a FIFO) is written
    through as it is."""
    path = os.path.realpath(path)
    if os.path.exists(path) and not os.path.isfile(path):
        with open_text(path) as f:
            yield f
        return
    with staged_file(path, ".tmp.gz" if path.endswith(".gz") else ".tmp") as tmp:  # open_text compresses by the name
        with open_text(tmp) as f:
            yield f
