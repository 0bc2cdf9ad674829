"""The table's files: their name (``table[.SCALE][.seeds-...][.rows-...][.datasets-...][.partial]``,
so that only a complete run of every row and data set at one scale replaces a table) and the
four formats written side by side: Markdown, CSV (one line per record, one column per cell's
number), JSON (the records as they are, with the table's columns and scale) and LaTeX."""
import csv
import hashlib
import json
import os
import re
from typing import Dict, List, Optional

from fairseq_ext.reproduce.latex import latex
from fairseq_ext.reproduce.markdown import markdown
from fairseq_ext.reproduce.records import Record
from fairseq_ext.reproduce.rows import complete
from fairseq_ext.reproduce.scale import Scale
from fairseq_ext.reproduce.tables import Table


def _flat(record: Record) -> dict:
    out = {k: v for k, v in record.items() if k not in ("columns", "adversarial", "paper_adversarial", "missing",
                                                        "per_seed")}
    if "seeds" in record:
        out["seeds"] = " ".join(str(x) for x in record["seeds"])
        out["seeds_done"] = " ".join(str(x) for x in record["seeds_done"])
    out["missing"] = "; ".join(record["missing"])
    for name, cell in record["columns"].items():
        for key in ("paper", "ours", "ours_text", "sd", "n", "mark", "p_value", "test", "p_holm", "comparisons",
                    "p_t", "paper_delta", "delta", "delta_sd", "paper_ratio", "ratio"):
            if key in cell:
                out[f"{name} | {key}"] = cell[key]
        if cell.get("timing_noise"):  # a speed shown as —: its sd over seeds in % of its mean, and whose
            out[f"{name} | timing noise"] = f"sd {cell['timing_noise']['sd_percent']}% ({cell['timing_noise']['of']})"
    return out


def table_name(scale_tag: str = "", rows: str = "", datasets: str = "", partial: bool = False,
               seeds: Optional[List[int]] = None) -> str:
    """The file name (without extension) of a table: ``table`` for a complete table at the
    paper's scale; the scale (``smoke.200``), the seeds of a table of several seeds
    (``seeds-1-2-3``), the subset (``rows-m-00``, ``datasets-...``) and ``partial`` (a run with
    failures or missing numbers) added, so that nothing but a complete run of every row and
    data set at the same scale and with the same seeds replaces a table."""
    parts = ["table"]
    if scale_tag:
        parts.append(scale_tag)
    if seeds:
        parts.append("seeds-" + "-".join(str(x) for x in seeds))
    for kind, spec in (("rows", rows), ("datasets", datasets)):
        if spec:
            names = [re.sub(r"[^A-Za-z0-9.+-]+", "_", s.strip()) for s in spec.split(",") if s.strip()]
            text = "+".join(names)
            if len(text) > 60:
                text = f"{len(names)}-{hashlib.sha1(text.encode()).hexdigest()[:8]}"
            parts.append(f"{kind}-{text}")
    if partial:
        parts.append("partial")
    return ".".join(parts)


def write_reports(table: Table, records: List[Record], out_dir: str, name: str = "table",
                  scales: Optional[Dict[str, Scale]] = None) -> Dict[str, str]:
    os.makedirs(out_dir, exist_ok=True)
    paths = {ext: os.path.join(out_dir, f"{name}.{ext}") for ext in ("md", "csv", "json", "tex")}
    with open(paths["md"], "w", encoding="utf-8") as f:
        f.write(markdown(table, records, scales))
    flat = [_flat(r) for r in records]
    with open(paths["csv"], "w", encoding="utf-8", newline="") as f:
        if flat:
            fields = list(dict.fromkeys(k for r in flat for k in r))
            w = csv.DictWriter(f, fieldnames=fields)
            w.writeheader()
            w.writerows(flat)
    with open(paths["json"], "w", encoding="utf-8") as f:
        json.dump({"table": table.id, "paper": table.paper, "source": table.source,
                   "columns": [{"name": c.name, "source": c.source, **c.params, "printed": c.printed}
                               for c in table.columns],
                   "scale": scales or {}, "complete": complete(records), "rows": records},
                  f, indent=1, ensure_ascii=False)
    with open(paths["tex"], "w", encoding="utf-8") as f:
        f.write(latex(table, records, scales))
    return paths
