"""Our numbers next to the paper's, for one table: BLEU, delta to the baseline, significance
mark, #params, training and decoding speed relative to the baseline, and the budget and
data each number was made with. Markdown (printed and written), CSV and JSON."""
import csv
import io
import json
import os
import re
from typing import Dict, List, Optional

from fairseq_ext.reproduce.runner import RunPlan
from fairseq_ext.reproduce.tables import Table

_NUMBER = re.compile(r"[-−]?\d+(?:\.\d+)?")


def printed_value(printed: Optional[str]) -> Optional[float]:
    """The first number of a printed cell ("28.24(-0.13)†" -> 28.24); None for "-"."""
    if printed is None:
        return None
    m = _NUMBER.search(str(printed))
    return float(m.group(0).replace("−", "-")) if m else None


def printed_mark(printed: Optional[str]) -> str:
    return "".join(c for c in str(printed or "") if c in "†‡*")


def _paper_metric(cells: Dict[str, str], prefix: str) -> Optional[str]:
    for name, value in cells.items():
        if name == prefix or name.startswith(prefix):
            return value
    return None


def _ratio(value, base):
    if value is None or base in (None, 0):
        return None
    return value / base


def _fmt(value, digits=2, signed=False):
    if value is None:
        return "–"
    return f"{value:+.{digits}f}" if signed else f"{value:.{digits}f}"


def read_results(plans: List[RunPlan]) -> Dict[str, dict]:
    out = {}
    for p in plans:
        entry = {}
        for name in ("result.json", "significance.json"):
            path = os.path.join(p.run_dir, name)
            if os.path.exists(path):
                with open(path, encoding="utf-8") as f:
                    entry[name.split(".")[0]] = json.load(f)
        out[p.run_dir] = entry
    return out


def build_rows(table: Table, plans: List[RunPlan]) -> List[dict]:
    """One record per (data set, row): the paper's numbers and ours (None where not run)."""
    results = read_results(plans)
    records = []
    by_key = {(p.dataset, p.row): p for p in plans}
    for dataset in table.datasets:
        base_plan = by_key.get((dataset, table.baseline))
        base_res = results.get(base_plan.run_dir, {}).get("result", {}) if base_plan else {}
        base_paper = table.row(table.baseline).paper.get(dataset, {}) if table.baseline else {}
        paper_base_bleu = printed_value(_paper_metric(base_paper, "BLEU"))
        paper_base_train = printed_value(_paper_metric(base_paper, "Train"))
        for row in table.rows:
            plan = by_key.get((dataset, row.id))
            paper = row.paper.get(dataset, {})
            if plan is None and not row.cited:
                continue
            res = results.get(plan.run_dir, {}) if plan else {}
            ours = res.get("result", {})
            sig = res.get("significance", {})
            paper_bleu = printed_value(_paper_metric(paper, "BLEU"))
            paper_train = printed_value(_paper_metric(paper, "Train"))
            rec = {
                "table": table.id, "dataset": dataset, "row": row.id, "label": row.label,
                "cited": row.cited,
                "paper_bleu": paper_bleu,
                "paper_delta": (paper_bleu - paper_base_bleu) if None not in (paper_bleu, paper_base_bleu) and row.id != table.baseline else None,
                "paper_mark": printed_mark(_paper_metric(paper, "BLEU")),
                "paper_params_m": printed_value(_paper_metric(paper, "#Params")),
                "paper_train_ratio": _ratio(paper_train, paper_base_train),
                "bleu": ours.get("bleu"),
                "delta": (ours["bleu"] - base_res["bleu"]) if ours.get("bleu") is not None and base_res.get("bleu") is not None and row.id != table.baseline else None,
                "mark": sig.get("mark", "") if row.id != table.baseline else "",
                "p_value": sig.get("p_value") if row.id != table.baseline else None,
                "samples": sig.get("samples"),
                "params_m": ours["params"] / 1e6 if ours.get("params") else None,
                "train_ratio": _ratio(ours.get("train_ups"), base_res.get("train_ups")),
                "decode_ratio": _ratio(ours.get("decode_sents_per_s"), base_res.get("decode_sents_per_s")),
                "adversarial": ours.get("adversarial", {}),
                "paper_adversarial": {k: printed_value(v) for k, v in paper.items() if k.startswith("adv")},
                "budget": plan.budget if plan else "",
                "data": (plan.data_key + (" (substitute)" if plan.substitution else "")) if plan else "",
                "status": ("done" if ours else "not run") if plan else "cited",
            }
            records.append(rec)
    return records


def markdown(table: Table, records: List[dict]) -> str:
    out = io.StringIO()
    out.write(f"## {table.id}: {table.paper}\n\n{table.source}\n\n")
    for dataset, ds in table.datasets.items():
        rows = [r for r in records if r["dataset"] == dataset]
        if not rows:
            continue
        out.write(f"### {ds['task']}  (our BLEU: {ds['bleu']}; baseline row: {table.baseline})\n\n")
        out.write("| row | paper BLEU | paper Δ | ours BLEU | ours Δ | sig. | paper #Params (M) | ours #Params (M) "
                  "| train speed vs baseline (paper / ours) | decode speed vs baseline | data, budget |\n")
        out.write("|---|---:|---:|---:|---:|:-:|---:|---:|---:|---:|---|\n")
        for r in rows:
            label = r["label"] + (" (cited)" if r["cited"] else "")
            paper_bleu = _fmt(r["paper_bleu"]) + r["paper_mark"] if r["paper_bleu"] is not None else "–"
            out.write(f"| {label} | {paper_bleu} | {_fmt(r['paper_delta'], signed=True)} | {_fmt(r['bleu'])} | "
                      f"{_fmt(r['delta'], signed=True)} | {r['mark'] or ''} | {_fmt(r['paper_params_m'], 1)} | "
                      f"{_fmt(r['params_m'], 1)} | {_fmt(r['paper_train_ratio'])} / {_fmt(r['train_ratio'])} | "
                      f"{_fmt(r['decode_ratio'])} | {r['data']}{', ' + r['budget'] if r['budget'] else ''} |\n")
        out.write("\n")
        adversarial = [r for r in rows if r["adversarial"] or r["paper_adversarial"]]
        if adversarial:
            out.write("Adversarial evaluation (one source replaced by another sentence of the test set; "
                      "BLEU and its drop from the row's BLEU, ours with the source named):\n\n"
                      "| row | paper | ours |\n|---|---|---|\n")

            def drop(full, adv):
                return f" (drop {_fmt(full - adv)})" if None not in (full, adv) else ""

            for r in adversarial:
                paper = ", ".join(f"{k.split('(')[-1].rstrip(')')}: {_fmt(v)}{drop(r['paper_bleu'], v)}"
                                  for k, v in r["paper_adversarial"].items())
                ours = ", ".join(f"{lang} shuffled: {_fmt(v)}{drop(r['bleu'], v)}" for lang, v in r["adversarial"].items())
                out.write(f"| {r['label']} | {paper or '–'} | {ours or '–'} |\n")
            out.write("\n")
    from fairseq_ext.tools.significance import MARKS

    marks = MARKS.get(table.id.split("-")[0], MARKS["thesis"])
    legend = ", ".join(f"{m} p < {p}" for p, m in sorted(marks, key=lambda x: -x[0]))
    samples = next((r["samples"] for r in records if r.get("samples")), 1000)
    out.write(f"sig.: sacreBLEU paired bootstrap ({samples} samples) against the baseline row, same BLEU flavour, "
              f"in this paper's marks: {legend} (a mark says the difference is significant, the sign of Δ its "
              "direction). Speeds are ratios to the baseline of the same run set (paper: its Train column).\n")
    return out.getvalue()


def write_reports(table: Table, records: List[dict], out_dir: str) -> Dict[str, str]:
    os.makedirs(out_dir, exist_ok=True)
    paths = {"md": os.path.join(out_dir, "table.md"), "csv": os.path.join(out_dir, "table.csv"),
             "json": os.path.join(out_dir, "table.json")}
    with open(paths["md"], "w", encoding="utf-8") as f:
        f.write(markdown(table, records))
    with open(paths["csv"], "w", encoding="utf-8", newline="") as f:
        if records:
            w = csv.DictWriter(f, fieldnames=list(records[0]))
            w.writeheader()
            w.writerows(records)
    with open(paths["json"], "w", encoding="utf-8") as f:
        json.dump({"table": table.id, "paper": table.paper, "source": table.source, "rows": records}, f, indent=1)
    return paths
