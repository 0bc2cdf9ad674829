"""The side-by-side table's columns: which sub-columns each column of the paper has (the
paper's number, ours, Δ and ratio to the reference row, sig.), whether a test stands behind its
marks, how many decimals our numbers get, and the text of each sub-column's cell."""
from typing import List, Optional, Tuple

from fairseq_ext.reproduce.cells import (format_duration, format_number, printed_as_difference, printed_decimals,
                                         printed_text)
from fairseq_ext.reproduce.columns import Column
from fairseq_ext.reproduce.records import Cell, Record
from fairseq_ext.reproduce.tables import Table

SPEEDS = ("train_speed", "train_time", "decode_speed", "decode_time")
# a one-seed table's speeds and times come from one training log and one decoding each, taken at
# different times on a machine that may be shared: printed as this, not as results
NOT_COMPARABLE = "n.c."
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
    """A BLEU column gets Δ sub-columns against the reference row unless the paper prints its
    own Δ column of it."""
    return col.source == "bleu" and not any(c.source == "delta" and c.params.get("of") == col.name
                                            for c in table.columns)


def shows_ratio(col: Column) -> bool:
    return col.source in SPEEDS and bool(col.params.get("ratio", True))


def has_test(col: Column) -> bool:
    """Whether a test stands behind the column's marks (not the unmasked BLEU, not the main
    decoder: they are what the others are tested against)."""
    return col.source in TESTS and col.params.get("layer") != "none" and col.params.get("decoder") != "main"


def has_paper_numbers(table: Table, col: Column) -> bool:
    """Whether any row of the table prints a number in this column."""
    return col.printed and any(printed_text(cells.get(col.name)) not in ("", "–")
                               for r in table.rows for cells in r.paper.values())


def column_digits(table: Table, col: Column) -> int:
    """Decimals of our numbers: the paper's (the most it prints in the column), at least 2
    (1 for #Params and seconds), so that small differences at small scale stay visible."""
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
    if col.source in ("train_time",):
        return format_duration(value)
    digits = column_digits(table, col)
    if col.source == "params" and printed_as_difference(printed):
        base = (ref_cell or {}).get("ours")
        return format_number(value - base, digits, signed=True) if base is not None else "–"
    return format_number(value, digits, signed=col.source == "delta")


def sub_columns(table: Table, records: List[Record]) -> List[Tuple[Column, str]]:
    """The sub-columns: (column, kind) with kind paper, ours, delta_paper, delta_ours, sig,
    ratio_paper, ratio_ours."""
    with_ref = any(r["reference"] for r in records)
    out = []
    for col in table.columns:
        paper = has_paper_numbers(table, col)  # none printed (a benchmark of ours): no paper sub-columns
        out += ([(col, "paper")] if paper else []) + [(col, "ours")]
        if with_ref and shows_delta(table, col):
            out += ([(col, "delta_paper")] if paper else []) + [(col, "delta_ours")]
        if has_test(col):
            out.append((col, "sig"))
        if with_ref and shows_ratio(col):
            out += ([(col, "ratio_paper")] if paper else []) + [(col, "ratio_ours")]
    return out


def p_text(p: float) -> str:
    """"=0.013", or "<0.001" for a p-value that three decimals would print as 0.000."""
    return "<0.001" if p < 0.0005 else f"={p:.3f}"


def cell_text(table: Table, col: Column, cell: Cell, kind: str, record: Record) -> str:
    if kind == "paper":
        return printed_text(cell["paper"]) if col.printed else "–"
    if kind == "ours":
        return cell["ours_text"]
    if kind.startswith("delta"):
        value = cell.get("paper_delta" if kind == "delta_paper" else "delta")
        spread = cell.get("delta_sd") if kind == "delta_ours" else None
        digits = column_digits(table, col)
        return format_number(value, digits, signed=True) + (f" ± {spread:.{digits}f}" if spread is not None else "")
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
    if kind == "ratio_ours" and cell.get("timing_noise"):
        return "—"
    if kind == "ratio_ours" and cell.get("not_comparable"):
        return NOT_COMPARABLE
    value = cell.get("paper_ratio" if kind == "ratio_paper" else "ratio")
    spread = cell.get("ratio_sd") if kind == "ratio_ours" else None
    return format_number(value) + (f" ± {spread:.2f}" if spread is not None else "")


def seed_count(record: Record) -> str:
    """The n column of a table of several seeds: the seeds a row counts (those it and its
    reference row ran), of those asked for."""
    if record["cited"]:
        return "–"
    n, total = len(record.get("seeds_counted", record["seeds_done"])), len(record["seeds"])
    return str(n) if n == total else f"{n} of {total}"
