"""What every stage of the self-check writes: ``OUT/STAGE.json`` (every number) and
``OUT/STAGE.md`` (the summary a person reads), and ``OUT/README.md``, the index of the stages
found in OUT, made anew after each stage."""
import datetime
import json
import os
from typing import List

STAGES = ("env", "tests", "bench", "train")


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


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


def write_index(out: str) -> None:
    lines = ["# fairseq_ext self-check", "",
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
