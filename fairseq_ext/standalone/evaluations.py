"""The evaluation-complete file: evaluation writes it into its output last, with what was
evaluated and the checksum of each of EVAL_FILES; significance reads only directories that hold
it and whose files still match (:func:`check_evaluation`)."""
import hashlib
import os
from typing import Sequence

from .outputs import OutputError

EVAL_COMPLETE = ".evaluation-complete"
EVAL_FILES = ("hyp.tok", "hyp.detok", "ref.tok", "ref.detok", "src.tok")


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_evaluation_complete(directory: str, fields: Sequence[str]) -> None:
    """Evaluation's last file: the KEY=VALUE ``fields``, then the checksum of each of EVAL_FILES."""
    tmp = os.path.join(directory, EVAL_COMPLETE + ".tmp")
    with open(tmp, "w", encoding="utf-8", newline="\n") as f:
        f.writelines(field + "\n" for field in fields)
        f.writelines(f"sha256.{name}={_sha256(os.path.join(directory, name))}\n" for name in EVAL_FILES)
    os.replace(tmp, os.path.join(directory, EVAL_COMPLETE))


def read_evaluation_complete(directory: str) -> dict:
    """The KEY=VALUE lines of ``directory``'s evaluation-complete file (the first of each key)."""
    fields = {}
    with open(os.path.join(directory, EVAL_COMPLETE), encoding="utf-8", errors="replace") as f:
        for line in f:
            key, sep, value = line.rstrip("\n").partition("=")
            if sep and key not in fields:
                fields[key] = value
    return fields


def count_lines(path: str) -> int:
    """Lines as wc -l counts them (LF bytes)."""
    with open(path, "rb") as f:
        return sum(block.count(b"\n") for block in iter(lambda: f.read(1 << 20), b""))


def check_evaluation(directory: str) -> None:
    """Raise OutputError unless ``directory`` holds one complete evaluation, each of EVAL_FILES
    with the checksum it recorded."""
    why = "holds no complete evaluation"
    fix = "rerun scripts/evaluate.sh into it"
    if not os.path.isfile(os.path.join(directory, EVAL_COMPLETE)):
        raise OutputError(f"{directory} {why} (no {EVAL_COMPLETE}: evaluate.sh did not finish there); {fix}")
    fields = read_evaluation_complete(directory)
    for name in EVAL_FILES:
        path = os.path.join(directory, name)
        if not os.path.isfile(path):
            raise OutputError(f"{directory} {why}: {name} is missing; {fix}")
        want = fields.get(f"sha256.{name}", "")
        if not want:
            raise OutputError(f"{directory} {why}: {EVAL_COMPLETE} records no checksum of {name}; {fix}")
        if _sha256(path) != want:
            raise OutputError(f"{directory} {why}: {name} is not the file evaluate.sh wrote (changed since); {fix}")
