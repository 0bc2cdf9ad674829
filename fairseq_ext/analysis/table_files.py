"""How the analyses write their numbers: a table printed and written as Markdown, CSV and
JSON (the report reads the JSON), the command that made the directory, and a table read back
(:func:`read_table`: the JSON, or the Markdown where only that was kept) to draw it again."""
import csv
import json
import os
import shlex
import sys
from typing import List, Optional, Union


def write_table(rows: List[dict], out_dir: str, name: str, title: str = "", floatfmt: str = ".2f") -> str:
    """Print ``rows`` (dicts with the same keys) as a Markdown table and write
    ``OUT/NAME.md``, ``.csv`` and ``.json``; returns the Markdown."""
    os.makedirs(out_dir, exist_ok=True)
    columns = list(rows[0]) if rows else []

    def cell(v):
        if isinstance(v, float):
            return format(v, floatfmt)
        return "–" if v is None else str(v)

    lines = ([f"### {title}", ""] if title else []) + ["| " + " | ".join(columns) + " |",
                                                     "|" + "|".join("---" for _ in columns) + "|"]
    lines += ["| " + " | ".join(cell(r[c]) for c in columns) + " |" for r in rows]
    text = "\n".join(lines) + "\n"
    with open(os.path.join(out_dir, f"{name}.md"), "w", encoding="utf-8") as f:
        f.write(text)
    with open(os.path.join(out_dir, f"{name}.csv"), "w", encoding="utf-8", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    with open(os.path.join(out_dir, f"{name}.json"), "w", encoding="utf-8") as f:
        json.dump(rows, f, indent=1, ensure_ascii=False)
    record_command(out_dir)
    print(text)
    return text


def record_command(out_dir: str) -> Optional[str]:
    """Write ``OUT/command.txt``: the analysis command that is running (``python -m
    fairseq_ext.analysis.NAME ARGS``), for the HTML report and for whoever finds the
    directory later. Nothing when the analysis was called from Python rather than as a command."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    module = getattr(spec, "name", "") or ""
    if not module.startswith("fairseq_ext.analysis."):
        return None
    line = " ".join(shlex.quote(a) for a in ["python", "-m", module, *sys.argv[1:]])
    path = os.path.join(out_dir, "command.txt")
    with open(path, "w", encoding="utf-8") as f:
        f.write(line + "\n")
    return path


def _cell_value(text: str) -> Union[None, int, float, str]:
    """A Markdown cell as :func:`write_table` wrote its value: "–" is None, numbers are numbers."""
    if text == "–":
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def read_table(out_dir: str, name: str) -> List[dict]:
    """The rows of the table ``name`` that :func:`write_table` wrote into ``out_dir``: from
    NAME.json, or, where only the Markdown was kept, from NAME.md (numbers as printed there)."""
    path = os.path.join(out_dir, f"{name}.json")
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    with open(os.path.join(out_dir, f"{name}.md"), encoding="utf-8") as f:
        lines = [l.strip() for l in f if l.strip().startswith("|")]
    if len(lines) < 2:
        raise ValueError(f"{out_dir}/{name}.md holds no table")

    def cells(line):  # cells are separated by " | " (a header such as "|Y|" holds bars of its own)
        return [c.strip() for c in line[1:-1].strip().split(" | ")] if line != "|" else []

    columns = cells(lines[0])
    return [dict(zip(columns, map(_cell_value, cells(line)))) for line in lines[2:]]
