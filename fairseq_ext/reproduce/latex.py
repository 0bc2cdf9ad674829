"""The table in LaTeX (booktabs): per data set a tabular with the paper's and our number of
every column side by side, Δ and ratio to the reference row, the marks as superscripts, the
scale in the caption."""
import io
import re
from typing import Dict, List, Optional

from fairseq_ext.reproduce.cells import MARK_CHARS, printed_text
from fairseq_ext.reproduce.layout import cell_text, has_test, seed_count, sub_columns
from fairseq_ext.reproduce.records import Record
from fairseq_ext.reproduce.scale import Scale, scale_summary
from fairseq_ext.reproduce.tables import Table

_LATEX_SPECIAL = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                  "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}


_LATEX_UNICODE = {"Δ": r"\(\Delta\)", "∆": r"\(\Delta\)", "±": r"\(\pm\)", "−": "-", "→": r"\(\rightarrow\)",
                  "↔": r"\(\leftrightarrow\)", "×": r"\(\times\)", "–": "--", "—": "---", "’": "'",
                  "ρ": r"\(\rho\)"}


_LATEX_MARKS = {"††": r"\dagger\dagger", "†": r"\dagger", "‡": r"\ddagger", "*": "*"}


def latex_escape(text: str) -> str:
    """Plain text as LaTeX: its special characters escaped, the few non-ASCII symbols of the
    tables as math, the significance marks as superscripts."""
    out = []
    text = str(text)
    for i, ch in enumerate(text):
        if ch == "-" and text[i + 1:i + 2] == "-":  # "--beam" stays two hyphens, not an en dash
            out.append("-{}")
        elif ch in _LATEX_SPECIAL:
            out.append(_LATEX_SPECIAL[ch])
        elif ch in _LATEX_UNICODE:
            out.append(_LATEX_UNICODE[ch])
        elif ch in "†‡":
            out.append(f"\\(^{{{_LATEX_MARKS[ch]}}}\\)")
        else:
            out.append(ch)
    return "".join(out)


def _latex_number(text: str, mark: str = "") -> str:
    body = latex_escape(text)
    return body + (f"\\(^{{{''.join(_LATEX_MARKS.get(m, m) for m in mark)}}}\\)" if mark else "")


def latex(table: Table, records: List[Record], scales: Optional[Dict[str, Scale]] = None) -> str:
    """The table in LaTeX (booktabs; ``\\usepackage{booktabs}``): per data set a tabular with
    the paper's and our number of every column side by side, Δ / ratio to the reference row,
    marks as superscripts, the scale in the caption."""
    scales = scales or {}
    out = io.StringIO()
    out.write(f"% {table.id}: {table.paper} -- {table.source}. Requires \\usepackage{{booktabs}}.\n")
    for dataset in table.datasets:
        rows = [r for r in records if r["dataset"] == dataset]
        if not rows:
            continue
        layout = [(c, k) for c, k in sub_columns(table, rows) if k != "sig"]  # marks go on our numbers
        with_ref = any(r["reference"] for r in rows)
        groups = []  # (title, sub-columns)
        for col, kind in layout:
            title = {"delta_paper": "\\(\\Delta\\)", "delta_ours": "\\(\\Delta\\)", "ratio_paper": "ratio",
                     "ratio_ours": "ratio"}.get(kind, latex_escape(col.name))
            if groups and groups[-1][0] == title and groups[-1][1][-1][0] is col:
                groups[-1][1].append((col, kind))
            else:
                groups.append((title, [(col, kind)]))
        several = any("seeds" in r for r in rows)
        lead = 1 + with_ref + several
        caption = f"{table.id}, {table.source}: the paper's numbers and ours"
        if dataset in scales:
            caption += f" ({dataset}). " + scale_summary(scales[dataset])
        if several:
            caption += " Ours: mean ± sd over the seeds each row shares with its reference row (n per row)."
        test = next((r for r in rows if r.get("test_name")), None)
        if test:
            caption += (f" Marks: {test['test_name']}"
                        + (", Holm-corrected per reference row" if test.get("correction") == "holm" else "") + ".")
        out.write("\\begin{table}[t]\n\\centering\n\\small\n")
        out.write(f"\\caption{{{latex_escape(caption)}}}\n")
        out.write(f"\\begin{{tabular}}{{{'l' * lead}{'r' * len(layout)}}}\n\\toprule\n")
        head, rules, position = ["Row"] + (["vs"] if with_ref else []) + (["n"] if several else []), [], lead + 1
        for title, subs in groups:
            head.append(f"\\multicolumn{{{len(subs)}}}{{c}}{{{title}}}")
            rules.append(f"\\cmidrule(lr){{{position}-{position + len(subs) - 1}}}")
            position += len(subs)
        out.write(" & ".join(head) + " \\\\\n" + "".join(rules) + "\n")
        sub = [""] * lead + [{"paper": "paper", "ours": "ours", "delta_paper": "paper", "delta_ours": "ours",
                              "ratio_paper": "paper", "ratio_ours": "ours"}[k] for _, k in layout]
        out.write(" & ".join(sub) + " \\\\\n\\midrule\n")
        for r in rows:
            cells = [latex_escape(r["label"] + (" (cited)" if r["cited"] else ""))]
            cells += [latex_escape(r["reference_label"] or "--")] if with_ref else []
            cells += [latex_escape(seed_count(r))] if several else []
            for col, kind in layout:
                cell = r["columns"][col.name]
                if kind == "paper":
                    text = printed_text(cell["paper"]) if col.printed else "–"
                    cells.append(_latex_number(re.sub(f"[{MARK_CHARS}]", "", text), cell["paper_mark"]))
                elif kind == "ours":
                    cells.append(_latex_number(cell["ours_text"], cell.get("mark", "") if has_test(col) else ""))
                else:
                    cells.append(latex_escape(cell_text(table, col, cell, kind, r)))
            out.write(" & ".join(cells) + " \\\\\n")
        out.write("\\bottomrule\n\\end{tabular}\n\\end{table}\n\n")
    return out.getvalue()
