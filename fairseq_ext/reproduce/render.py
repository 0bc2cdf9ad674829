"""The table's files, side by side: Markdown (printed too: per data set its scale, the rows, the adversarial
evaluations, the legend), CSV (a line per record), JSON (the records as they are) and LaTeX (booktabs). A printed
difference ("30.78 (+0.17)") that the paper's own numbers contradict is said on the page."""
import csv
import io
import itertools
import json
import os
import re
from typing import Dict, Iterable, List, Optional

from fairseq_ext.reproduce.marks import comparisons_text, test_text
from fairseq_ext.reproduce.readers import Record, Scale, scale_lines, scale_summary
from fairseq_ext.reproduce.rows import (NOT_COMPARABLE, TESTS, TIMINGS, cell_text, complete, has_paper_numbers,
                                        has_test, seed_count, shows_ratio, sub_columns)
from fairseq_ext.reproduce.tables import Column, MARK_CHARS, Table, format_number, printed_decimals, printed_value
from fairseq_ext.tools.statistics import MARKS, TIMING_NOISE


_PARENTHESIS = re.compile(r"\(\s*([-−+]?)\s*(\d+(?:\.\d+)?)\s*\)")


def printed_parenthesis(printed: Optional[str]) -> Optional[float]:
    """The number a printed cell gives in parentheses ("31.29 (−0.03)" -> -0.03), else None."""
    match = _PARENTHESIS.search(str(printed or ""))
    if match is None:
        return None
    value = float(match.group(2))
    return -value if match.group(1) in ("-", "−") else value


def contradicted_differences(table: Table, datasets: Optional[Iterable[str]] = None) -> List[str]:
    """A line for every printed difference that is not the row's printed number minus its reference
    row's (a cited row's: the baseline's) by more than rounding."""
    wanted = set(datasets) if datasets is not None else None
    lines = []
    for row in table.rows:
        reference = table.reference(row) or (table.row(table.baseline) if table.baseline
                                             and row.id != table.baseline else None)
        for dataset, cells in row.paper.items() if reference is not None else []:
            for column, printed in (cells or {}).items() if wanted is None or dataset in wanted else []:
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


# why a column has no significance test (shown under the table)
NO_TEST = {
    "params": "#Params: counted from the checkpoint",
    **dict.fromkeys(TIMINGS, "speeds and times: one measurement each, on a machine that may be shared"),
    "meteor": "METEOR: no paired test here (the paper prints MultEval's ± intervals)",
    "adversarial": "adversarial BLEU: no paired test here (the paper prints MultEval's ± intervals)",
    "probing": "probing accuracies: one probe training per task, no test (the paper reports none)",
    "word_translation": "word-translation accuracies: one projection training per layer, no test (the paper "
                        "reports none)",
    "translate_from_layer": "BLEU from an encoder layer: no test (the paper reports none)",
}


def _header(col: Column, kind: str, smoke: bool, table: Table) -> str:
    any_printed = any(has_paper_numbers(table, c) for c in table.columns)
    name = col.name + ("" if col.printed or not any_printed else " [not in the paper's table]")
    return {"paper": f"{name}: paper", "ours": "ours" if has_paper_numbers(table, col) else f"{name}: ours",
            "sig": "sig. (pipeline check)" if smoke else "sig."}.get(kind, kind.replace("delta", "Δ").replace("_", " "))


def _md_escape(text: str) -> str:
    return str(text).replace("|", "\\|")


def markdown(table: Table, records: List[Record], scales: Optional[Dict[str, Scale]] = None) -> str:
    scales = scales or {}
    smoke = any(s.get("smoke") for s in scales.values())
    out = io.StringIO()
    out.write(f"## {table.id}: {table.paper}\n\n{table.source}\n\n")
    for dataset, ds in table.datasets.items():
        rows = [r for r in records if r["dataset"] == dataset]
        if not rows:
            continue
        out.write(f"### {dataset}\n\n")
        for line in scale_lines(scales[dataset]) if dataset in scales else [f"paper: {ds.get('task', dataset)}"]:
            out.write(f"- {line}\n")
        out.write("\n")
        layout = sub_columns(table, rows)
        with_ref = any(r["reference"] for r in rows)
        several = any("seeds" in r for r in rows)
        head = ["row"] + (["vs"] if with_ref else []) + (["n"] if several else []) + [_header(c, k, smoke, table)
                                                                                     for c, k in layout]
        align = (["---"] + (["---"] if with_ref else []) + ([":-:"] if several else [])
                 + [":-:" if k == "sig" else "---:" for _, k in layout])
        out.write("| " + " | ".join(_md_escape(h) for h in head) + " |\n|" + "|".join(align) + "|\n")
        for r in rows:
            label = r["label"] + (" (cited)" if r["cited"] else "") + ("" if r["status"] in ("done", "cited")
                                                                        else f" ({r['status']})")
            cells = [label] + ([r["reference_label"] or "–"] if with_ref else [])
            cells += [seed_count(r)] if several else []
            cells += [cell_text(table, c, r["columns"][c.name], k, r) for c, k in layout]
            out.write("| " + " | ".join(_md_escape(c) for c in cells) + " |\n")
        out.write("\n")
        adversarial = [r for r in rows if r["adversarial"] or r["paper_adversarial"]]
        if adversarial:
            out.write("Adversarial evaluation (one source replaced by another sentence of the test set; "
                      "BLEU and its drop from the row's BLEU, ours with the source named):\n\n"
                      "| row | paper | ours |\n|---|---|---|\n")

            def drop(full, adv):
                return f" (drop {format_number(full - adv)})" if None not in (full, adv) else ""

            for r in adversarial:
                paper = ", ".join(f"{k.split('(')[-1].rstrip(')')}: {format_number(v)}{drop(r['paper_bleu'], v)}"
                                  for k, v in r["paper_adversarial"].items())
                ours = ", ".join(f"{lang} shuffled: {format_number(v)}{drop(r['bleu'], v)}"
                                 for lang, v in r["adversarial"].items())
                out.write(f"| {r['label']} | {paper or '–'} | {ours or '–'} |\n")
            out.write("\n")
    out.write("\n".join(legend(table, records, smoke)) + "\n")
    return out.getvalue()


# whose marks a table that prints none is given (Table.marks: its paper's where it has some)
MARK_CONVENTION = {"thesis": "the thesis' convention", "mlmha": "the MLMHA paper's convention",
                   "mma": "the MMA paper's convention", "wt": "the word-translation paper's convention"}


def legend(table: Table, records: List[Record], smoke: bool = False) -> List[str]:
    marks = MARKS[table.marks]
    marks_text = ", ".join(f"{m} p < {p}" for p, m in sorted(marks, key=lambda x: -x[0]))
    samples = next((r["samples"] for r in records if r.get("samples")), 1000)
    printed = any(has_paper_numbers(table, c) for c in table.columns)
    if printed:
        lines = ["paper: the cell as the paper prints it (its marks: " + (table.paper_significance or "as printed")
                 + "); ours: our run; –: not printed / not measured."]
    else:
        lines = ["No paper prints these numbers: every column is ours (–: not measured)."]
    if any(r["reference"] for r in records) and not printed:
        lines.append("vs: the row's reference row; Δ ours and ratio ours are against that row's run.")
    elif any(r["reference"] for r in records):
        lines.append("vs: the row's reference row (the paper's own comparison); Δ ours and ratio ours are against that "
                     "row's run; Δ paper and ratio paper are computed from the paper's printed numbers; a difference "
                     "column the paper prints is shown as printed, ours beside it against the same row.")
    several = next((r["seeds"] for r in records if "seeds" in r), None)
    if several:
        lines.append(
            f"Seeds: {len(several)} ({', '.join(str(s) for s in several)}), each row trained once per seed and paired "
            "with its reference row by seed number; a row counts only the seeds both it and its reference row "
            "ran (n; a seed left out is named under the table). ours: the mean ± sample sd over those seeds; "
            "Δ ours and ratio ours: the mean ± sd of the per-seed differences and ratios to the reference row's "
            "run of the same seed. p_t: a paired t-test over seeds, shown beside the mark, not as it (p_t in the "
            "CSV too; every seed's p and mark in the JSON).")
    sources = {c.source for c in table.columns}
    tests = [s for s in TESTS if s in sources and any(has_test(c) for c in table.columns if c.source == s)]
    test = next((r["test"] for r in records if r.get("test")), None)
    for source in tests:
        text = TESTS[source].format(samples=samples)
        if source == "bleu" and test:
            tested = next(r for r in records if r.get("test"))
            text = test_text(test, bool(several), samples, tested.get("shuffles"),
                             tested.get("ar_statistic", "concatenated"))
        elif several:
            text += "; over seeds a mark only where it is significant at every seed with one sign, p_max its largest p"
        whose = ("marks as this paper's" if table.marks_are_the_papers else
                 f"this table prints no marks; ours follow {MARK_CONVENTION[table.marks]}")
        lines.append(f"sig. ({source}): {text}; {whose}: {marks_text}; p: the test's p-value. "
                     "A mark says the difference is significant, its sign the direction."
                     + (" At smoke scale this is a check that the test runs, not evidence: the models are "
                        "undertrained and narrow, the data a small substitute." if smoke else ""))
    correction = next((r["correction"] for r in records if r.get("correction")), "none")
    counted = comparisons_text(table, records, correction)
    lines += [counted] if counted else []
    noisy = timing_noise_text(table, records)
    lines += [noisy] if noisy else []
    if any(cell.get("not_comparable") for r in records for cell in r["columns"].values()):
        lines.append(f"{NOT_COMPARABLE}: not comparable: a speed or time of one run, from its training log or its "
                     "decoding, measured once and at another time than its reference row's, on a machine that may "
                     "be shared (its load, not the technique, can make the difference); the number is in the JSON. "
                     "fairseq-ext benchmark measures speed ratios interleaved against the stock model.")
    notes = dict.fromkeys(cell["note"] for r in records for cell in r["columns"].values() if cell.get("note"))
    lines += [f"ours, {note}" for note in notes]
    row_notes = {r["label"]: table.row(r["row"]).note for r in records if table.row(r["row"]).note}
    lines += [f"{label}: {note}" for label, note in row_notes.items()]
    lines += [f"paper, {line}." for line in contradicted_differences(table, {r["dataset"] for r in records})]
    if "chrf" in sources:
        flavours = ", ".join(dict.fromkeys(ds.get("bleu", "?") for key, ds in table.datasets.items()
                                           if any(r["dataset"] == key for r in records)))
        lines.append(f"chrF: ours, not the paper's: sacreBLEU's chrF2 (character 6-grams, beta 2) of the row's "
                     f"evaluation, on the text its BLEU column scores ({flavours}), with its signature in the "
                     "run's eval-test/metrics.json; no test behind it; –: an evaluation that wrote no chrF.")
    if "comet" in sources:
        lines.append("COMET: ours, not the paper's: COMET's system score (the mean of its segment scores, as "
                     "comet-score computes it) of the row's translations against the raw source and the "
                     "reference, in the run's comet.json with its signature (model, COMET version); comparable "
                     "only between scores of the same model and version; no test behind it.")
    reasons = list(dict.fromkeys(NO_TEST[s] for s in NO_TEST if s in sources))
    if reasons:
        lines.append("No sig. column: " + "; ".join(reasons) + ".")
    if any(shows_ratio(c) for c in table.columns):
        lines.append("ratio: the row's value / its reference row's (speeds: above 1 is faster; times: above 1 is "
                     "slower). Our speeds and times are of this machine, the paper's of its GPUs: compare the ratios.")
    untrained = list(dict.fromkeys(r["label"] for r in records if r.get("model_bleu") is not None
                                   and r["model_bleu"] < 1.0))
    against = list(dict.fromkeys(f"{r['label']} against {r['reference_label']}" for r in records
                                 if r.get("reference_label") in untrained and r["label"] not in untrained))
    if untrained:
        lines.append(f"Our models of {', '.join(untrained)} score BLEU < 1 in their own evaluation: they do not "
                     "translate yet at this budget, and no difference between their numbers means anything"
                     + (f"; nor does a Δ or sig. against one that did not learn ({'; '.join(against)}): it says "
                        "nothing about the technique." if against else "."))
    incomplete = [r for r in records if r["missing"] or r["status"] not in ("done", "cited")]
    if incomplete:
        lines.append("Incomplete: " + "; ".join(
            f"{r['label']} ({r['dataset']}): " + (", ".join(r["missing"]) if r["missing"] else r["status"])
            for r in incomplete) + ".")
    return lines


def timing_noise_text(table: Table, records: List[Record]) -> Optional[str]:
    """The footnote of the speeds and times shown as — (their sd over seeds too large)."""
    found = []
    for r in records:
        for col in table.columns:
            noise = r["columns"][col.name].get("timing_noise")
            if noise:
                spread = f"sd {noise['sd_percent']}% of the mean"
                found.append(f"{col.name} of {r['label']}: {spread}" if noise["of"] == "row" else
                             f"{col.name} ratio of {r['label']} (its reference row's {col.name}: {spread})")
    if not found:
        return None
    return ("—: timing noise, not a result: " + "; ".join(found) + " over seeds (more than "
            f"{round(100 * TIMING_NOISE)}%: the runs measured the machine's load); measure speeds with "
            "fairseq-ext benchmark.")


_LATEX = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_", "{": r"\{", "}": r"\}",
          "~": r"\textasciitilde{}", "^": r"\textasciicircum{}", "Δ": r"\(\Delta\)", "∆": r"\(\Delta\)",
          "±": r"\(\pm\)", "−": "-", "→": r"\(\rightarrow\)", "↔": r"\(\leftrightarrow\)", "×": r"\(\times\)",
          "–": "--", "—": "---", "’": "'", "ρ": r"\(\rho\)", "†": r"\(^{\dagger}\)", "‡": r"\(^{\ddagger}\)"}
_LATEX_MARKS = {"††": r"\dagger\dagger", "†": r"\dagger", "‡": r"\ddagger", "*": "*"}


def latex_escape(text: str) -> str:
    """Plain text as LaTeX: special characters escaped, the tables' non-ASCII symbols as math;
    "--beam" stays two hyphens, not an en dash."""
    text = str(text)
    return "".join("-{}" if ch == "-" and text[i + 1:i + 2] == "-" else _LATEX.get(ch, ch) for i, ch in enumerate(text))


def _latex_number(text: str, mark: str = "") -> str:
    return latex_escape(text) + (f"\\(^{{{''.join(_LATEX_MARKS.get(m, m) for m in mark)}}}\\)" if mark else "")


def latex(table: Table, records: List[Record], scales: Optional[Dict[str, Scale]] = None) -> str:
    """The table in LaTeX (booktabs): per data set a tabular, marks as superscripts, the scale in the caption."""
    scales = scales or {}
    out = io.StringIO()
    out.write(f"% {table.id}: {table.paper} -- {table.source}. Requires \\usepackage{{booktabs}}.\n")
    for dataset in table.datasets:
        rows = [r for r in records if r["dataset"] == dataset]
        if not rows:
            continue
        layout = [(c, k) for c, k in sub_columns(table, rows) if k != "sig"]  # marks go on our numbers
        with_ref = any(r["reference"] for r in rows)
        titles = {"delta": "\\(\\Delta\\)", "ratio": "ratio"}  # (title, sub-columns) of a column's kinds
        groups = [(title, list(subs)) for (title, _), subs in itertools.groupby(
            layout, key=lambda ck: (titles.get(ck[1].split("_")[0], latex_escape(ck[0].name)), id(ck[0])))]
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
        sub = [""] * lead + [k.split("_")[-1] for _, k in layout]
        out.write(" & ".join(sub) + " \\\\\n\\midrule\n")
        for r in rows:
            cells = [latex_escape(r["label"] + (" (cited)" if r["cited"] else ""))]
            cells += [latex_escape(r["reference_label"] or "--")] if with_ref else []
            cells += [latex_escape(seed_count(r))] if several else []
            for col, kind in layout:  # the marks as superscripts: the paper's, and ours of a tested column
                cell, paper = r["columns"][col.name], kind == "paper"
                text = cell_text(table, col, cell, kind, r)
                mark = cell["paper_mark"] if paper else cell.get("mark", "") if kind == "ours" and has_test(col) else ""
                cells.append(_latex_number(re.sub(f"[{MARK_CHARS}]", "", text) if paper else text, mark))
            out.write(" & ".join(cells) + " \\\\\n")
        out.write("\\bottomrule\n\\end{tabular}\n\\end{table}\n\n")
    return out.getvalue()


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


def write_reports(table: Table, records: List[Record], out_dir: str, name: str = "table",
                  scales: Optional[Dict[str, Scale]] = None) -> Dict[str, str]:
    os.makedirs(out_dir, exist_ok=True)
    paths = {ext: os.path.join(out_dir, f"{name}.{ext}") for ext in ("md", "csv", "json", "tex")}
    with open(paths["md"], "w", encoding="utf-8") as f:
        f.write(markdown(table, records, scales))
    flat = [_flat(r) for r in records]
    with open(paths["csv"], "w", encoding="utf-8", newline="") as f:
        if flat:
            w = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for r in flat for k in r)))
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
