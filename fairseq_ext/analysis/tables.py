"""How the analyses write their numbers: a table printed and written as Markdown, CSV and
JSON (the report reads the JSON), and the command that made the directory."""
import csv
import json
import os
import shlex
import sys
from typing import List, Optional


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
