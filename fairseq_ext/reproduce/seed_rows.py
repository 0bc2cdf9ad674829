"""One record per (data set, row) of a table trained with several seeds: each seed's records
(:func:`fairseq_ext.reproduce.rows.build_rows`), combined per column into the mean ± sd over
the seeds the row shares with its reference row, with marks only where the per-seed tests
agree (:func:`fairseq_ext.tools.statistics.across_seeds`; the BLEU column's pooled test over seeds, ``--test ar``,
replaces its mark afterwards: :mod:`fairseq_ext.reproduce.marks`)."""
from typing import Dict, List, Optional

from fairseq_ext.reproduce.cells import format_duration, printed_as_difference
from fairseq_ext.reproduce.columns import Column
from fairseq_ext.reproduce.layout import TIMINGS, column_digits, has_test, ours_text
from fairseq_ext.reproduce.planning import AnalysisPlan, RunPlan
from fairseq_ext.reproduce.records import Cell, Record
from fairseq_ext.reproduce.rows import build_rows
from fairseq_ext.reproduce.tables import Row, Table
from fairseq_ext.tools import statistics as stats


def build_seed_rows(table: Table, plans_by_seed: Dict[int, List[RunPlan]], rows: Optional[List[Row]] = None,
                    analyses_by_seed: Optional[Dict[int, List[AnalysisPlan]]] = None) -> List[Record]:
    """One record per (data set, row) of a table trained with several seeds: each seed's
    records (:func:`build_rows` of that seed's runs, every row against the reference row's
    run of the same seed), combined per column over the seeds the row counts
    (``seeds_counted``: those both it and its reference row ran; every seed it ran when it has
    no reference row, or shares no seed with it): the mean ± sd over those that have a number
    (``n``), Δ and ratio the mean of the per-seed ones, and where a per-seed test stands behind
    the column the mark of :func:`fairseq_ext.tools.statistics.across_seeds` (``p_value`` is its
    largest per-seed p, ``p_t`` the paired t-test over seeds). A seed that did not run, lacks a
    number or is left out for want of a reference run is named in the record's ``missing``.
    Speeds and times whose sd over seeds exceeds a quarter of their mean are not shown
    (``timing_noise``)."""
    seeds = list(plans_by_seed)
    by_seed = {s: {(r["dataset"], r["row"]): r for r in
                   build_rows(table, plans, rows, (analyses_by_seed or {}).get(s) if analyses_by_seed else None)}
               for s, plans in plans_by_seed.items()}
    return [_combine(table, key, {s: by_seed[s][key] for s in seeds if key in by_seed[s]}, by_seed, table.marks)
            for key in by_seed[seeds[0]]]


def _combine(table: Table, key: tuple, records: Dict[int, Record], by_seed: Dict[int, Dict[tuple, Record]],
             marks: str) -> Record:
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
    counted, left_out = _shared_seeds(done, refs if first["reference"] else None)
    missing += [f"seed {s}: left out (no finished run of the reference row {first['reference_label']} at this "
                "seed; only the seeds both ran count)" for s in left_out]
    if first["reference"] and done and not counted:
        missing.append(f"no seed shared with the reference row {first['reference_label']}: the row's own seeds "
                       "are shown, with no Δ or test")
        counted = done
    use = counted or seeds
    columns = {}
    for col in table.columns:
        cells = {s: records[s]["columns"][col.name] for s in use}
        ref_cells = {s: refs[s]["columns"][col.name] for s in use if refs[s] is not None}
        columns[col.name] = cell = _combine_cell(table, col, cells, ref_cells, marks)
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


def _shared_seeds(done: List[int], refs: Optional[Dict[int, Optional[Record]]]) -> tuple:
    """(the seeds a row counts, those left out): of the seeds it finished, those at which its
    reference row finished too; all of them for a row without a reference row (``refs`` None)."""
    if refs is None:
        return done, []
    counted = [s for s in done if refs.get(s) is not None and refs[s]["status"] == "done"]
    return counted, [s for s in done if s not in counted]


def _combine_cell(table: Table, col: Column, cells: Dict[int, Cell], ref_cells: Dict[int, Cell], marks: str) -> Cell:
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
                                        for s in system}, marks)
            cell.update({"mark": found["mark"], "p_value": found["p_max"], "p_t": found["p_t"], "rule": found["rule"],
                         "tested_seeds": found["paired_seeds"],
                         "per_seed_marks": {s: tested[s].get("mark", "") for s in system},
                         "per_seed_p": {s: tested[s]["p_value"] for s in system}})
    return cell


def _timing_noise(cell: Cell, values: Dict[int, float], reference: List[float]) -> None:
    """A speed or time whose sd over seeds is above :data:`stats.TIMING_NOISE` of its mean
    measured the machine's load, not the model: no number (``—``), and no ratio either when
    the reference row's is (``timing_noise``: the sd in % of the mean, and whose)."""
    own, ref = stats.variation(list(values.values())), stats.variation(reference)
    if own is not None and own > stats.TIMING_NOISE:
        cell.update(ours=None, sd=None, ours_text="—", timing_noise={"sd_percent": round(100 * own), "of": "row"})
    elif ref is not None and ref > stats.TIMING_NOISE and cell.get("ratio") is not None:
        cell["timing_noise"] = {"sd_percent": round(100 * ref), "of": "reference row"}
    else:
        return
    if "ratio" in cell:
        cell.update(ratio=None, ratio_sd=None)
