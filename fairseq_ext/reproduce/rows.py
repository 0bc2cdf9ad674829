"""One record per (data set, row) of a table (:func:`build_rows`; over seeds the mean ± sd,
:func:`build_seed_rows`), and what each cell shows: the sub-columns of each column (paper, ours,
Δ and ratio to the reference row, sig.), the decimals of our numbers, the text of each cell."""
from typing import Dict, List, Optional, Tuple

from fairseq_ext.reproduce.planning import AnalysisPlan, RunPlan, row_datasets
from fairseq_ext.reproduce.readers import Cell, Record, RunData, Value, make_value, run_values
from fairseq_ext.reproduce.tables import (Column, Row, Table, format_duration, format_number, parse_duration,
                                          printed_as_difference, printed_decimals, printed_mark, printed_text,
                                          printed_value)
from fairseq_ext.tools import statistics as stats


SPEEDS = ("train_speed", "train_time", "decode_speed", "decode_time")
NOT_COMPARABLE = "n.c."  # a one-seed table's speeds and times: one measurement each, on a maybe shared machine
TIMINGS = SPEEDS + ("decode_speedup",)  # measurements of the machine as much as of the model

# the test behind the marks of a column (its sig. sub-column)
TESTS = {
    "bleu": "sacreBLEU paired bootstrap ({samples} samples) of the row's BLEU against its reference row's "
            "(column 'vs'), same flavour",
    "layer_dependency": "paired bootstrap of the BLEU with the layer masked (f^i replaced by zeros, as the thesis "
                        "masks) against the same model unmasked (the analysis' own test, as the paper's)",
    "decoders": "paired bootstrap of the auxiliary decoder's BLEU against the main decoder of the same model "
                "(the analysis' own test; the paper reports none)",
}


def shows_delta(table: Table, col: Column) -> bool:
    """A BLEU column gets Δ sub-columns unless the paper prints its own Δ column of it."""
    return col.source == "bleu" and not any(c.source == "delta" and c.params.get("of") == col.name
                                            for c in table.columns)


def shows_ratio(col: Column) -> bool:
    return col.source in SPEEDS and bool(col.params.get("ratio", True))


def has_test(col: Column) -> bool:
    """Whether a test stands behind the column's marks (not the unmasked BLEU nor the main decoder)."""
    return col.source in TESTS and col.params.get("layer") != "none" and col.params.get("decoder") != "main"


def has_paper_numbers(table: Table, col: Column) -> bool:
    """Whether any row of the table prints a number in this column."""
    return col.printed and any(printed_text(cells.get(col.name)) not in ("", "–")
                               for r in table.rows for cells in r.paper.values())


def column_digits(table: Table, col: Column) -> int:
    """Decimals of our numbers: the most the paper prints in the column, at least 2 (1 for #Params
    and seconds), so that small differences at small scale stay visible."""
    if col.source == "delta":
        return column_digits(table, table.column(col.params["of"]))
    if col.source == "comet":  # a score between about 0 and 1, as COMET prints it
        return 4
    found = [printed_decimals(cells.get(col.name)) for r in table.rows for cells in r.paper.values()]
    least = 1 if col.source in ("params", "decode_time") and has_paper_numbers(table, col) else 2
    return max([d for d in found if d is not None] + [least])


def ours_text(table: Table, col: Column, cell: dict, ref_cell: Optional[dict], printed: Optional[str]) -> str:
    if cell["ours_text"]:
        return cell["ours_text"]
    value = cell["ours"]
    if value is None:
        return "–"
    if col.source == "train_time":
        return format_duration(value)
    digits = column_digits(table, col)
    if col.source == "params" and printed_as_difference(printed):
        base = (ref_cell or {}).get("ours")
        return format_number(value - base, digits, signed=True) if base is not None else "–"
    return format_number(value, digits, signed=col.source == "delta")


def sub_columns(table: Table, records: List[Record]) -> List[Tuple[Column, str]]:
    """(column, kind): paper, ours, delta_paper, delta_ours, sig, ratio_paper, ratio_ours."""
    with_ref = any(r["reference"] for r in records)
    out = []
    for col in table.columns:
        paper = has_paper_numbers(table, col)  # none printed (a benchmark of ours): no paper sub-columns
        for kind, shown in (("", True), ("delta_", with_ref and shows_delta(table, col)), ("sig", has_test(col)),
                            ("ratio_", with_ref and shows_ratio(col))):
            if shown:
                out += [(col, kind)] if kind == "sig" else [(col, kind + "paper")] * paper + [(col, kind + "ours")]
    return out


def p_text(p: float) -> str:
    """"=0.013", or "<0.001" for a p-value that three decimals would print as 0.000."""
    return "<0.001" if p < 0.0005 else f"={p:.3f}"


def cell_text(table: Table, col: Column, cell: Cell, kind: str, record: Record) -> str:
    if kind == "paper":
        return printed_text(cell["paper"]) if col.printed else "–"
    if kind == "ours":
        return cell["ours_text"]
    if kind == "sig":
        if not cell.get("mark") and cell.get("p_value") is None:
            return ""
        p, p_holm, p_t = cell.get("p_value"), cell.get("p_holm"), cell.get("p_t")
        several = "seeds" in record and "tested_seeds" in cell
        # over seeds by every seed's test: its largest p; the t-test over seeds beside any test
        name = "p_max" if several and "ar" not in cell else "p"
        text = (cell.get("mark") or "") + (f" {name}{p_text(p)}" if p is not None else "")
        text += f" p_holm{p_text(p_holm)}" if p_holm is not None else ""
        text += f" p_t{p_text(p_t)}" if p_t is not None and several else ""
        if several and len(cell["tested_seeds"]) < len(record["seeds"]):
            text += f" (n={len(cell['tested_seeds'])})"
        return text
    if kind == "ratio_ours" and (cell.get("timing_noise") or cell.get("not_comparable")):
        return "—" if cell.get("timing_noise") else NOT_COMPARABLE
    name, whose = kind.split("_")  # delta or ratio; paper or ours
    digits = column_digits(table, col) if name == "delta" else 2
    spread = cell.get(f"{name}_sd") if whose == "ours" else None
    return format_number(cell.get(name if whose == "ours" else f"paper_{name}"), digits, signed=name == "delta") \
        + (f" ± {spread:.{digits}f}" if spread is not None else "")


def seed_count(record: Record) -> str:
    """The n column over seeds: the seeds a row counts, of those asked for."""
    if record["cited"]:
        return "–"
    n, total = len(record.get("seeds_counted", record["seeds_done"])), len(record["seeds"])
    return str(n) if n == total else f"{n} of {total}"


def paper_number(col: Column, printed: Optional[str]) -> Optional[float]:
    return parse_duration(printed) if col.source == "train_time" else printed_value(printed)


def build_rows(table: Table, plans: List[RunPlan], rows: Optional[List[Row]] = None,
               analyses: Optional[List[AnalysisPlan]] = None) -> List[Record]:
    """One record per (data set, row); ``rows``: default every own row whose model has a run in ``plans``."""
    if rows is None:
        rows = [r for r in table.rows if r.runnable and table.owner(r).id in {p.row for p in plans}]
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

    return [_record(table, row, dataset, ours, run_of) for dataset in keys for row in table.rows
            if (dataset in row.paper if row.cited else row in rows and dataset in on[row.id])]


def display_label(table: Table, row: Row) -> str:
    """The row's label, with its id where another row of the table has the same label."""
    return row.label if sum(r.label == row.label for r in table.rows) == 1 else f"{row.label} [{row.id}]"


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
        theirs_ours = (ref_value or {}).get("ours")
        if shows_delta(table, col) and ref is not None:
            paper_value = cell["paper_value"]
            cell["paper_delta"] = None if None in (paper_value, ref_number) else paper_value - ref_number
            cell["delta"] = None if None in (value["ours"], theirs_ours) else value["ours"] - theirs_ours
        if shows_ratio(col) and ref is not None:
            cell["paper_ratio"] = cell["paper_value"] / ref_number if cell["paper_value"] and ref_number else None
            cell["ratio"] = value["ours"] / theirs_ours if value["ours"] and theirs_ours else None
        if col.source in TIMINGS and not row.cited and value["ours"] is not None:
            # one measurement, not interleaved against the reference row: kept in the JSON, not printed
            cell.update(not_comparable=True, ours_text=NOT_COMPARABLE)
        if value.get("missing") and not row.cited:
            missing.append(f"{col.name}: {value['missing']}")
        cells[col.name] = cell
    result = run.result if run is not None else {}
    head = next((cells[c.name] for c in table.columns if c.source == "bleu"), {})
    plan = run.plan if run is not None else None
    return Record(
        table=table.id, dataset=dataset, row=row.id, label=display_label(table, row), group=row.group,
        cited=row.cited, reference=ref.id if ref else None, reference_label=display_label(table, ref) if ref else None,
        model_row=table.owner(row).id if row.runnable else None, run_dir=plan.run_dir if plan else None,
        status="cited" if row.cited else ("done" if result else ("not run" if plan else "not planned")),
        missing=missing, bleu=head.get("ours"), delta=head.get("delta"), mark=head.get("mark", ""),
        p_value=head.get("p_value"), paper_bleu=head.get("paper_value"), paper_delta=head.get("paper_delta"),
        paper_mark=head.get("paper_mark", ""),
        samples=(run.json("significance.json") or {}).get("samples") if run is not None else None,
        params_m=result["params"] / 1e6 if result.get("params") else None, model_bleu=result.get("bleu"),
        adversarial=result.get("adversarial", {}),
        paper_adversarial={k: printed_value(v) for k, v in paper.items() if k.startswith("adv")},
        budget=plan.budget if plan else "",
        data=(plan.data_key + (" (substitute)" if "in place of" in plan.substitution else "")) if plan else "",
        columns=cells)


def complete(records: List[Record]) -> bool:
    """Every own row ran and every number it should have is there."""
    return all(r["status"] in ("done", "cited") and not r["missing"] for r in records)


def build_seed_rows(table: Table, plans_by_seed: Dict[int, List[RunPlan]], rows: Optional[List[Row]] = None,
                    analyses: Optional[List[AnalysisPlan]] = None) -> List[Record]:
    """Each seed's records (:func:`build_rows`) combined per column over the seeds the row counts
    (``seeds_counted``: those it and its reference row ran, else all it ran): the mean ± sd, Δ and
    ratio the mean of the per-seed ones, the mark of statistics.across_seeds; a seed left out is
    named in ``missing``, too noisy speeds and times are not shown (``timing_noise``)."""
    seeds = list(plans_by_seed)
    of_seed = {s: None if analyses is None else [a for a in analyses if a.run.seed == s] for s in seeds}
    by_seed = {s: {(r["dataset"], r["row"]): r for r in build_rows(table, plans, rows, of_seed[s])}
               for s, plans in plans_by_seed.items()}
    return [_combine(table, key, {s: by_seed[s][key] for s in seeds if key in by_seed[s]}, by_seed)
            for key in by_seed[seeds[0]]]


def _combine(table: Table, key: tuple, records: Dict[int, Record], by_seed: Dict[int, Dict[tuple, Record]]) -> Record:
    seeds = list(records)
    first = records[seeds[0]]
    out: Record = {**first, "seeds": seeds, "seeds_done": [], "n": 0}
    if first["cited"]:
        return out
    dataset, _ = key
    refs = {s: by_seed[s].get((dataset, first["reference"])) if first["reference"] else None for s in seeds}
    done = [s for s in seeds if records[s]["status"] == "done"]
    missing = [f"seed {s}: {records[s]['status']}" for s in seeds if s not in done]
    missing += [f"seed {s}: {m}" for s in done for m in records[s]["missing"]]
    counted = [s for s in done if not first["reference"] or (refs[s] is not None and refs[s]["status"] == "done")]
    missing += [f"seed {s}: left out (no finished run of the reference row {first['reference_label']} at this "
                "seed; only the seeds both ran count)" for s in done if s not in counted]
    if first["reference"] and done and not counted:
        missing.append(f"no seed shared with the reference row {first['reference_label']}: the row's own seeds "
                       "are shown, with no Δ or test")
        counted = done
    use = counted or seeds
    columns = {}
    for col in table.columns:
        cells = {s: records[s]["columns"][col.name] for s in use}
        ref_cells = {s: refs[s]["columns"][col.name] for s in use if refs[s] is not None}
        columns[col.name] = cell = _combine_cell(table, col, cells, ref_cells)
        untested = sorted(set(cell.get("per_seed", {})) - set(cell.get("tested_seeds", cell.get("per_seed", {}))))
        missing += [f"seed {s}: {col.name}: no test against the reference row" for s in untested]
    head = next((columns[c.name] for c in table.columns if c.source == "bleu"), {})

    def mean(values):
        values = [v for v in values if v is not None]
        return stats.mean_sd(values)[0] if values else None

    langs = list(dict.fromkeys(lang for s in counted for lang in records[s]["adversarial"]))
    out.update({
        "status": "done" if done else first["status"], "missing": missing, "seeds_done": done,
        "seeds_counted": counted, "n": len(counted),
        "run_dir": records[done[0]]["run_dir"] if done else first["run_dir"],
        "bleu": head.get("ours"), "bleu_sd": head.get("sd"), "delta": head.get("delta"),
        "delta_sd": head.get("delta_sd"), "mark": head.get("mark", ""), "p_value": head.get("p_value"),
        "p_t": head.get("p_t"), "rule": head.get("rule"),
        "params_m": mean(records[s]["params_m"] for s in counted),
        "model_bleu": mean(records[s]["model_bleu"] for s in counted),
        "adversarial": {lang: mean(records[s]["adversarial"].get(lang) for s in counted) for lang in langs},
        "per_seed": {s: {"run_dir": records[s]["run_dir"], "status": records[s]["status"], "bleu": records[s]["bleu"],
                         "delta": records[s]["delta"], "mark": records[s]["mark"], "p_value": records[s]["p_value"]}
                     for s in seeds},
        "columns": columns,
    })
    return out


def _combine_cell(table: Table, col: Column, cells: Dict[int, Cell], ref_cells: Dict[int, Cell]) -> Cell:
    """One column of one row over seeds (see :func:`build_seed_rows`)."""
    first = next(iter(cells.values()))
    keep = ("source", "paper", "paper_value", "paper_mark", "paper_delta", "paper_ratio", "note")
    cell = {k: first[k] for k in keep if k in first}
    values = {s: c["ours"] for s, c in cells.items() if c.get("ours") is not None}
    cell.update({"ours": None, "sd": None, "n": len(values), "per_seed": values, "mark": "", "p_value": None,
                 "missing": None})
    if values:
        cell["ours"], cell["sd"] = stats.mean_sd(list(values.values()))
        if col.source == "params" and cell["sd"] == 0:  # the same model at every seed: one count, no spread
            cell["sd"] = None
        digits = column_digits(table, col)
        if col.source == "train_time":
            cell["ours_text"] = format_duration(cell["ours"]) + (
                f" ± {format_duration(cell['sd'])}" if cell["sd"] is not None else "")
        elif col.source == "delta" or (col.source == "params" and printed_as_difference(first["paper"])):
            base = [ref_cells[s]["ours"] for s in values if s in ref_cells and ref_cells[s].get("ours") is not None]
            ref_mean = {"ours": stats.mean_sd(base)[0]} if base else None
            text = ours_text(table, col, {"ours": cell["ours"], "ours_text": None}, ref_mean, first["paper"])
            cell["ours_text"] = text + (f" ± {cell['sd']:.{digits}f}" if cell["sd"] is not None else "")
        else:
            cell["ours_text"] = stats.format_mean_sd(cell["ours"], cell["sd"], digits)
    else:
        cell["ours_text"] = next((c["ours_text"] for c in cells.values() if c["ours_text"] not in ("–", None)), "–")
        cell["missing"] = next((c["missing"] for c in cells.values() if c.get("missing")), None)
    for name in ("delta", "ratio"):
        if name in first:
            found = [c[name] for c in cells.values() if c.get(name) is not None]
            cell[name], spread = stats.mean_sd(found) if found else (None, None)
            cell[f"{name}_sd"], cell[f"{name}_n"] = spread, len(found)
    if col.source in TIMINGS:
        _timing_noise(cell, values, [c["ours"] for c in ref_cells.values() if c.get("ours") is not None])
    if has_test(col):
        tested = {s: c for s, c in cells.items() if c.get("p_value") is not None}
        if col.source == "bleu":
            system = {s: c["ours"] for s, c in tested.items() if c.get("ours") is not None and s in ref_cells
                      and ref_cells[s].get("ours") is not None}
            reference = {s: ref_cells[s]["ours"] for s in system}
        else:  # the analysis' own difference, against the same model: tested against 0
            system = {s: c["tested_delta"] for s, c in tested.items() if c.get("tested_delta") is not None}
            reference = {s: 0.0 for s in system}
        if system:
            found = stats.across_seeds(reference, system,
                                       {s: {"p_value": tested[s]["p_value"], "mark": tested[s].get("mark", "")}
                                        for s in system}, table.marks)
            cell.update({"mark": found["mark"], "p_value": found["p_max"], "p_t": found["p_t"], "rule": found["rule"],
                         "tested_seeds": found["paired_seeds"],
                         "per_seed_marks": {s: tested[s].get("mark", "") for s in system},
                         "per_seed_p": {s: tested[s]["p_value"] for s in system}})
    return cell


def _timing_noise(cell: Cell, values: Dict[int, float], reference: List[float]) -> None:
    """A speed or time whose sd over seeds is above TIMING_NOISE of its mean measured the machine's
    load: no number (—), and no ratio where the reference row's is too noisy."""
    own, ref = stats.variation(list(values.values())), stats.variation(reference)
    if own is not None and own > stats.TIMING_NOISE:
        cell.update(ours=None, sd=None, ours_text="—", timing_noise={"sd_percent": round(100 * own), "of": "row"})
    elif ref is not None and ref > stats.TIMING_NOISE and cell.get("ratio") is not None:
        cell["timing_noise"] = {"sd_percent": round(100 * ref), "of": "reference row"}
    else:
        return
    if "ratio" in cell:
        cell.update(ratio=None, ratio_sd=None)
