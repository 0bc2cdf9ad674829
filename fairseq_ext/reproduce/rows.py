"""One record per (data set, row) of a table: per column the paper's printed cell and our
number from the run of the row's model, the differences and ratios to the row's reference row,
the marks; cited rows with the paper's numbers only (:mod:`fairseq_ext.reproduce.records`)."""
from typing import Dict, List, Optional

from fairseq_ext.reproduce.cells import parse_duration, printed_mark, printed_value
from fairseq_ext.reproduce.columns import Column
from fairseq_ext.reproduce.layout import NOT_COMPARABLE, SPEEDS, ours_text, shows_delta, shows_ratio
from fairseq_ext.reproduce.planning import AnalysisPlan, RunPlan, row_datasets
from fairseq_ext.reproduce.readers import RunData, make_value, run_values
from fairseq_ext.reproduce.records import Cell, Record, Value
from fairseq_ext.reproduce.tables import Row, Table


def paper_number(col: Column, printed: Optional[str]) -> Optional[float]:
    return parse_duration(printed) if col.source == "train_time" else printed_value(printed)


def default_rows(table: Table, plans: List[RunPlan]) -> List[Row]:
    """Every own row whose model has a run among ``plans``."""
    owners = {p.row for p in plans}
    return [r for r in table.rows if r.runnable and table.owner(r).id in owners]


def build_rows(table: Table, plans: List[RunPlan], rows: Optional[List[Row]] = None,
               analyses: Optional[List[AnalysisPlan]] = None) -> List[Record]:
    """One record per (data set, row): per column the paper's printed cell and our number,
    differences and ratios to the row's reference row, marks; cited rows with the paper's only."""
    rows = rows if rows is not None else default_rows(table, plans)
    keys = [k for k in table.datasets if any(p.dataset == k for p in plans)]
    on = row_datasets(table, rows, keys)
    by_run: Dict[str, Dict[str, AnalysisPlan]] = {}
    for ap in analyses or []:
        by_run.setdefault(ap.run.run_dir, {})[ap.name] = ap
    runs = {(p.dataset, p.row): RunData(p, by_run.get(p.run_dir) if analyses is not None else None) for p in plans}
    memo: Dict[tuple, Dict[str, Value]] = {}

    def run_of(row, dataset):
        return runs.get((dataset, table.owner(row).id)) if row is not None and row.runnable else None

    def ours(row, dataset):
        if row is None or not row.runnable:
            return {}
        key = (row.id, dataset)
        if key not in memo:
            ref = table.reference(row)
            memo[key] = run_values(table, row, run_of(row, dataset), run_of(ref, dataset))
            for col in table.columns:  # printed differences, from the other numbers
                if col.source != "delta":
                    continue
                of, against = col.params["of"], col.params.get("against_column")
                other = memo[key].get(against) if against else ours(ref, dataset).get(of)
                mine = memo[key].get(of, {})
                both = mine.get("ours") is not None and (other or {}).get("ours") is not None
                memo[key][col.name] = make_value(mine["ours"] - other["ours"] if both else None)
        return memo[key]

    records = []
    for dataset in keys:
        for row in table.rows:
            if row.cited and dataset not in row.paper:
                continue
            if not row.cited and (row not in rows or dataset not in on[row.id]):
                continue
            records.append(_record(table, row, dataset, ours, run_of))
    return records


def display_label(table: Table, row: Row) -> str:
    """The row's label, with its id where another row of the table has the same label."""
    same = sum(r.label == row.label for r in table.rows)
    return row.label if same == 1 else f"{row.label} [{row.id}]"


def _record(table: Table, row: Row, dataset: str, ours, run_of) -> Record:
    ref = table.reference(row)
    paper, ref_paper = row.paper.get(dataset, {}), (ref.paper.get(dataset, {}) if ref else {})
    mine, theirs = ours(row, dataset), ours(ref, dataset)
    run = run_of(row, dataset)
    cells, missing = {}, []
    for col in table.columns:
        printed = paper.get(col.name)
        value = dict(mine.get(col.name) or make_value(text="cited" if row.cited else None))
        ref_value = theirs.get(col.name) if ref else None
        cell: Cell = {"source": col.source, "paper": printed, "paper_value": paper_number(col, printed),
                      "paper_mark": printed_mark(printed), **value,
                      "ours_text": ours_text(table, col, value, ref_value, printed) if not row.cited else "–"}
        ref_number = paper_number(col, ref_paper.get(col.name))
        if shows_delta(table, col) and ref is not None:
            cell["paper_delta"] = (cell["paper_value"] - ref_number
                                   if None not in (cell["paper_value"], ref_number) else None)
            cell["delta"] = (value["ours"] - ref_value["ours"]
                             if ref_value and None not in (value["ours"], ref_value["ours"]) else None)
        if shows_ratio(col) and ref is not None:
            cell["paper_ratio"] = cell["paper_value"] / ref_number if cell["paper_value"] and ref_number else None
            cell["ratio"] = (value["ours"] / ref_value["ours"]
                             if ref_value and value["ours"] and ref_value["ours"] else None)
        if (col.source in SPEEDS or col.source == "decode_speedup") and not row.cited and value["ours"] is not None:
            # one measurement, not interleaved against the reference row: kept in the JSON, not printed
            cell.update(not_comparable=True, ours_text=NOT_COMPARABLE)
        if value.get("missing") and not row.cited:
            missing.append(f"{col.name}: {value['missing']}")
        cells[col.name] = cell
    result = run.result if run is not None else {}
    bleu_col = next((c for c in table.columns if c.source == "bleu"), None)
    head = cells.get(bleu_col.name, {}) if bleu_col else {}
    plan = run.plan if run is not None else None
    return Record(
        table=table.id, dataset=dataset, row=row.id, label=display_label(table, row), group=row.group,
        cited=row.cited, reference=ref.id if ref else None,
        reference_label=display_label(table, ref) if ref else None,
        model_row=table.owner(row).id if row.runnable else None,
        run_dir=plan.run_dir if plan else None,
        status="cited" if row.cited else ("done" if result else ("not run" if plan else "not planned")),
        missing=missing,
        bleu=head.get("ours"), delta=head.get("delta"), mark=head.get("mark", ""),
        p_value=head.get("p_value"), paper_bleu=head.get("paper_value"),
        paper_delta=head.get("paper_delta"), paper_mark=head.get("paper_mark", ""),
        samples=(run.json("significance.json") or {}).get("samples") if run is not None else None,
        params_m=result["params"] / 1e6 if result.get("params") else None,
        model_bleu=result.get("bleu"),
        adversarial=result.get("adversarial", {}),
        paper_adversarial={k: printed_value(v) for k, v in paper.items() if k.startswith("adv")},
        budget=plan.budget if plan else "",
        data=(plan.data_key + (" (substitute)" if "in place of" in plan.substitution else "")) if plan else "",
        columns=cells,
    )


def complete(records: List[Record]) -> bool:
    """Every own row ran and every number it should have is there."""
    return all(r["status"] in ("done", "cited") and not r["missing"] for r in records)
