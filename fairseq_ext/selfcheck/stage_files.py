"""What every stage of the self-check shares: its files (``OUT/STAGE.json``, ``OUT/STAGE.md`` and
the index ``OUT/README.md``), its commands run with their output in a log, its markdown tables."""
import datetime
import json
import os
import shlex
import subprocess
import time
from typing import List, Optional, Union

from fairseq_ext.errors import CommandError

STAGES = ("env", "tests", "bench", "train", "paper")
INDEX_TITLE = "# fairseq_ext self-check"


def check_out(out: str) -> None:
    """Refuse an --out holding a file the self-check would replace but did not write: a README.md that is not its index
    (``--out .`` in a checkout), a STAGE.json that is not its record of that stage, a STAGE.md without that record."""
    if os.path.exists(out) and not os.path.isdir(out):
        raise CommandError(f"--out {out}: exists and is not a folder")
    index = os.path.join(out, "README.md")
    if os.path.exists(index):
        with open(index, encoding="utf-8", errors="replace") as f:
            if f.readline().strip() != INDEX_TITLE:
                raise CommandError(f"--out {out}: its README.md is not the self-check's index (it would be "
                                   "replaced): choose another folder")
    for stage in STAGES:
        record, notes = (os.path.join(out, f"{stage}.{ext}") for ext in ("json", "md"))
        for path in (record, notes):
            if os.path.exists(path) and not _own_record(record, stage):
                raise CommandError(f"--out {out}: its {os.path.basename(path)} was not written by the self-check "
                                   "(it would be replaced): choose another folder")


def _own_record(path: str, stage: str) -> bool:
    """Whether ``path`` is the self-check's JSON record of ``stage``."""
    try:
        with open(path, encoding="utf-8") as f:
            found = json.load(f)
    except (OSError, ValueError):
        return False
    return isinstance(found, dict) and found.get("stage") == stage and "written" in found


def chosen(value: str, known, option: str, what: str, usage: bool = False) -> List[str]:
    """The names of a comma list (or ``all``), each one of ``known``."""
    names = list(known) if value == "all" else [n.strip() for n in value.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise CommandError(f"{option}: unknown {what} {', '.join(unknown) or repr(value)} "
                           f"(choose from {', '.join(known)}, or all)", usage=usage)
    return names


def write_stage(out: str, stage: str, record: dict, markdown: List[str]) -> List[str]:
    """Write the stage's JSON and markdown and the index; return the markdown."""
    os.makedirs(out, exist_ok=True)
    written = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    with open(os.path.join(out, f"{stage}.json"), "w", encoding="utf-8") as f:
        json.dump({"stage": stage, "written": written, **record}, f, indent=1, default=str)
        f.write("\n")
    with open(os.path.join(out, f"{stage}.md"), "w", encoding="utf-8") as f:
        f.write("\n".join(markdown).rstrip() + "\n")
    lines = [INDEX_TITLE, "", "Written by `fairseq-ext selfcheck`; one line per stage found here.", "",
             "| stage | written | result | summary |", "|---|---|---|---|"]
    for name in STAGES:
        found = read_json(os.path.join(out, f"{name}.json"))
        if found:
            lines.append(f"| {name} | {found.get('written', '')} | {found.get('result', '')} | "
                         f"[{name}.md]({name}.md) |")
    with open(os.path.join(out, "README.md"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    return markdown


def read_json(path: str) -> dict:
    """A record the self-check wrote ({} when there is none); one that is not a JSON object is an error."""
    if not os.path.exists(path):
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            found = json.load(f)
    except (OSError, ValueError) as error:
        raise CommandError(f"{path}: not a readable JSON record ({error}); remove it or copy it again") from None
    if not isinstance(found, dict):
        raise CommandError(f"{path}: holds a JSON {type(found).__name__}, not the record the self-check writes")
    return found


def run_logged(cmd: List[str], log: str, until: float, cwd: Optional[str] = None,
               append: bool = True) -> Union[int, str]:
    """``cmd`` with its output in ``log`` after a ``$ CMD`` line; its exit status, or ``"timeout"`` (stopped at
    ``until``, said in the log)."""
    with open(log, "a" if append else "w", encoding="utf-8") as f:  # the child keeps the file open
        f.write("$ " + shlex.join(cmd) + "\n")
        f.flush()
        started, proc = time.time(), subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=cwd)
    try:
        return proc.wait(timeout=max(1.0, until - time.time()))
    except subprocess.TimeoutExpired:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        with open(log, "a", encoding="utf-8") as f:
            f.write(f"\nstopped after {max(1.0, until - started):.0f} s\n")
        return "timeout"


def last_line(log: str) -> str:
    with open(log, encoding="utf-8", errors="replace") as f:
        lines = f.read().strip().splitlines()
    return lines[-1] if lines else "no output"


def table(header: List[str], rows: List[List[object]], align_right_from: int = 1) -> List[str]:
    """A markdown table; columns from ``align_right_from`` on right-aligned."""
    rule = ["---" if i < align_right_from else "---:" for i in range(len(header))]
    return ["| " + " | ".join(header) + " |", "|" + "|".join(rule) + "|"] + [
        "| " + " | ".join("–" if cell is None else str(cell) for cell in row) + " |" for row in rows]
