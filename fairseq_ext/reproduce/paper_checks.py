"""The paper's printed numbers read against each other: a printed difference (the number in
parentheses, "30.78 (+0.17)") that the table's own numbers contradict is said on the page,
where a reader comparing our Δ with the paper's would otherwise meet it unexplained."""
import re
from typing import Iterable, List, Optional

from fairseq_ext.reproduce.cells import printed_decimals, printed_value
from fairseq_ext.reproduce.tables import Row, Table

_PARENTHESIS = re.compile(r"\(\s*([-−+]?)\s*(\d+(?:\.\d+)?)\s*\)")


def printed_parenthesis(printed: Optional[str]) -> Optional[float]:
    """The number a printed cell gives in parentheses ("31.29 (−0.03)" -> -0.03), else None."""
    match = _PARENTHESIS.search(str(printed or ""))
    if match is None:
        return None
    value = float(match.group(2))
    return -value if match.group(1) in ("-", "−") else value


def _reference(table: Table, row: Row) -> Optional[Row]:
    """The row the paper's parentheses are against: the row's reference, or for a row cited from
    another table (which has no run to compare), the table's baseline."""
    reference = table.reference(row)
    if reference is None and table.baseline and row.id != table.baseline:
        reference = table.row(table.baseline)
    return reference


def contradicted_differences(table: Table, datasets: Optional[Iterable[str]] = None) -> List[str]:
    """One line for every printed difference that is not the row's printed number minus its
    reference row's by more than rounding (half a unit of the last printed decimal of each)."""
    wanted = set(datasets) if datasets is not None else None
    lines = []
    for row in table.rows:
        reference = _reference(table, row)
        if reference is None:
            continue
        for dataset, cells in row.paper.items():
            if wanted is not None and dataset not in wanted:
                continue
            for column, printed in (cells or {}).items():
                given = printed_parenthesis(printed)
                theirs = (reference.paper.get(dataset) or {}).get(column)
                if given is None or printed_value(theirs) is None:
                    continue
                recomputed = printed_value(printed) - printed_value(theirs)
                rounding = sum(0.5 * 10 ** -(printed_decimals(p) or 0) for p in (printed, theirs))
                if abs(recomputed - given) > rounding + 1e-9:
                    digits = max(printed_decimals(printed) or 0, printed_decimals(theirs) or 0)
                    lines.append(f"{row.label} ({dataset}, {column}): the paper prints ({given:+.{digits}f}) against "
                                 f"{reference.label}, but its own numbers give {printed_value(printed):.{digits}f} − "
                                 f"{printed_value(theirs):.{digits}f} = {recomputed:+.{digits}f}; Δ paper shows the "
                                 "latter")
    return lines
