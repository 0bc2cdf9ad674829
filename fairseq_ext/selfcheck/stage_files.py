"""What every stage of the self-check writes: ``OUT/STAGE.json`` (every number) and
``OUT/STAGE.md`` (the summary a person reads), and ``OUT/README.md``, the index of the stages
found in OUT, made anew after each stage."""
import datetime
import json
import os
import shlex
import subprocess
from typing import List, Optional, Union

STAGES = ("env", "tests", "bench", "train", "paper")


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


INDEX_TITLE = "# fairseq_ext self-check"


def check_out(out: str) -> None:
    """Refuse an --out whose files the self-check would replace though it did not write them
    (its README.md is the index of the stages; ``--out .`` in a checkout would replace the
    project's)."""
    from fairseq_ext.errors import CommandError

    if os.path.exists(out) and not os.path.isdir(out):
        raise CommandError(f"--out {out}: exists and is not a folder")
    index = os.path.join(out, "README.md")
    if os.path.exists(index):
        with open(index, encoding="utf-8", errors="replace") as f:
            first = f.readline().strip()
        if first != INDEX_TITLE:
            raise CommandError(f"--out {out}: its README.md is not the self-check's index (it would be replaced): "
                               "choose another folder")


def write_stage(out: str, stage: str, record: dict, markdown: List[str]) -> str:
    """Write the stage's JSON and markdown; return the markdown's path."""
    os.makedirs(out, exist_ok=True)
    record = {"stage": stage, "written": now(), **record}
    with open(os.path.join(out, f"{stage}.json"), "w", encoding="utf-8") as f:
        json.dump(record, f, indent=1, default=str)
        f.write("\n")
    path = os.path.join(out, f"{stage}.md")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(markdown).rstrip() + "\n")
    write_index(out)
    return path


def read_stage(out: str, stage: str) -> dict:
    path = os.path.join(out, f"{stage}.json")
    if not os.path.exists(path):
        return {}
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def run_logged(cmd: List[str], log: str, timeout: float, cwd: Optional[str] = None,
               append: bool = False) -> Union[int, str]:
    """Run ``cmd`` with its output in ``log`` after a ``$ CMD`` line (``append``: after what
    the log holds, as a run resumed by a later command); its exit status, or ``"timeout"``
    when it ran past ``timeout`` seconds (stopped, and said at the end of the log)."""
    with open(log, "a" if append else "w", encoding="utf-8") as f:
        f.write("$ " + shlex.join(cmd) + "\n")
        f.flush()
        try:
            return subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=max(1.0, timeout),
                                  cwd=cwd).returncode
        except subprocess.TimeoutExpired:
            f.write(f"\nstopped after {timeout:.0f} s\n")
            return "timeout"


def last_line(log: str) -> str:
    with open(log, encoding="utf-8", errors="replace") as f:
        lines = f.read().strip().splitlines()
    return lines[-1] if lines else "no output"


def write_index(out: str) -> None:
    lines = [INDEX_TITLE, "",
             "Written by `fairseq-ext selfcheck`; one line per stage found here.", "",
             "| stage | written | result | summary |", "|---|---|---|---|"]
    for stage in STAGES:
        record = read_stage(out, stage)
        if record:
            lines.append(f"| {stage} | {record.get('written', '')} | {record.get('result', '')} | "
                         f"[{stage}.md]({stage}.md) |")
    with open(os.path.join(out, "README.md"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


def table(header: List[str], rows: List[List[object]], align_right_from: int = 1) -> List[str]:
    """A markdown table; columns from ``align_right_from`` on are right-aligned (numbers)."""
    rule = ["---" if i < align_right_from else "---:" for i in range(len(header))]
    return ["| " + " | ".join(header) + " |", "|" + "|".join(rule) + "|"] + [
        "| " + " | ".join("–" if cell is None else str(cell) for cell in row) + " |" for row in rows]
