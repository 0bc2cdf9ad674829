"""Our numbers next to the paper's, for one table: every column the paper prints (BLEU,
#Params, speeds and times, the analyses' numbers, METEOR, adversarial BLEU, printed
differences), each beside ours; the difference or ratio to the row's reference row; the
significance marks of the tests that apply; and per data set the scale our numbers were made
at (data, test sentences, model size, updates, beam, BLEU flavour). Markdown (printed and
written), CSV, JSON and LaTeX (booktabs).

Our numbers of one run come from :func:`run_values` (one run directory: result.json,
significance.json, meteor.json, analysis/NAME/); :func:`build_rows` adds the paper's numbers,
differences and ratios. A table trained with several seeds is :func:`build_rows` per seed,
combined by :func:`build_seed_rows` (mean ± sd, the marks of :mod:`fairseq_ext.tools.seeds`).
"""
import csv
import io
import json
import os
import re
from typing import Dict, List, Optional

from fairseq_ext.reproduce.runner import (ANALYSIS_DONE, AnalysisPlan, RunPlan, analysis_dir, describe_budget,
                                          read_prep_env, row_datasets)
from fairseq_ext.reproduce.tables import Column, Row, Table
from fairseq_ext.tools import seeds as stats

_NUMBER = re.compile(r"([-−+])?\s*(\d+(?:\.\d+)?|\.\d+)")
_DURATION = re.compile(r"(\d+)\s*h\s*(\d+)\s*min")
MARK_CHARS = "†‡*"
SPEEDS = ("train_speed", "train_time", "decode_speed", "decode_time")

# why a column has no significance test (shown under the table)
NO_TEST = {
    "params": "#Params: counted from the checkpoint",
    "train_speed": "speeds and times: one measurement each, on a machine that may be shared",
    "train_time": "speeds and times: one measurement each, on a machine that may be shared",
    "decode_speed": "speeds and times: one measurement each, on a machine that may be shared",
    "decode_time": "speeds and times: one measurement each, on a machine that may be shared",
    "decode_speedup": "speeds and times: one measurement each, on a machine that may be shared",
    "meteor": "METEOR: no paired test here (the paper prints MultEval's ± intervals)",
    "adversarial": "adversarial BLEU: no paired test here (the paper prints MultEval's ± intervals)",
    "probing": "probing accuracies: one probe training per task, no test (the paper reports none)",
    "word_translation": "word-translation accuracies: one projection training per layer, no test (the paper "
                        "reports none)",
    "translate_from_layer": "BLEU from an encoder layer: no test (the paper reports none)",
}
# the test behind the marks of a column (its sig. sub-column)
TESTS = {
    "bleu": "sacreBLEU paired bootstrap ({samples} samples) of the row's BLEU against its reference row's "
            "(column 'vs'), same flavour",
    "layer_dependency": "paired bootstrap of the BLEU with the layer masked against the same model unmasked "
                        "(the analysis' own test, as the paper's)",
    "decoders": "paired bootstrap of the auxiliary decoder's BLEU against the main decoder of the same model "
                "(the analysis' own test; the paper reports none)",
}


def printed_value(printed: Optional[str]) -> Optional[float]:
    """The first number of a printed cell ("28.24(-0.13)†" -> 28.24, "+ 18.11" -> 18.11,
    "−0.22" -> -0.22, "38.3 ± .8" -> 38.3); None for "-"."""
    if printed is None:
        return None
    m = _NUMBER.search(str(printed))
    if not m:
        return None
    value = float(m.group(2))
    return -value if m.group(1) in ("-", "−") else value


def printed_mark(printed: Optional[str]) -> str:
    return "".join(c for c in str(printed or "") if c in MARK_CHARS)


def printed_text(printed: Optional[str]) -> str:
    """A printed cell as the paper prints it, spaces normalised ("+ 18.11" -> "+18.11")."""
    if printed is None:
        return "–"
    text = re.sub(r"\s+", " ", str(printed)).strip()
    return re.sub(r"^([-+−]) (?=\d)", r"\1", text)


def parse_duration(printed: Optional[str]) -> Optional[float]:
    """Seconds of a printed duration ("33h33min" -> 120780)."""
    m = _DURATION.search(str(printed or ""))
    return int(m.group(1)) * 3600 + int(m.group(2)) * 60 if m else printed_value(printed)


def format_duration(seconds: Optional[float]) -> str:
    if seconds is None:
        return "–"
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{int(seconds // 60)}min{int(seconds % 60):02d}s"
    return f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}min"


def _decimals(printed: Optional[str]) -> Optional[int]:
    m = _NUMBER.search(str(printed or ""))
    if not m:
        return None
    number = m.group(2)
    return len(number.split(".")[1]) if "." in number else 0


def _fmt(value, digits=2, signed=False):
    if value is None:
        return "–"
    return f"{value:+.{digits}f}" if signed else f"{value:.{digits}f}"


# ---- one run's numbers -------------------------------------------------------------------

class RunData:
    """The files of one run directory, each read once; ``analyses`` (name -> plan): the
    planned analyses of the run (those that cannot run here say why)."""

    def __init__(self, plan: RunPlan, analyses: Optional[Dict[str, AnalysisPlan]] = None):
        self.plan = plan
        self.analyses = analyses
        self._cache = {}

    def json(self, *parts):
        path = os.path.join(self.plan.run_dir, *parts)
        if path not in self._cache:
            self._cache[path] = None
            if os.path.exists(path):
                with open(path, encoding="utf-8") as f:
                    self._cache[path] = json.load(f)
        return self._cache[path]

    @property
    def result(self) -> dict:
        return self.json("result.json") or {}

    def unavailable(self, name: str) -> str:
        ap = (self.analyses or {}).get(name)
        return ap.unavailable if ap is not None and ap.command is None else ""

    def analysis(self, name: str, file: str):
        """The JSON an analysis of this run wrote (None until it finished). A run reruns an
        analysis whose command changed before the table is built; --report reads what finished."""
        if not os.path.exists(os.path.join(analysis_dir(self.plan, name), ANALYSIS_DONE)):
            return None
        return self.json("analysis", name, file)


def _value(ours=None, text=None, mark="", p=None, missing=None, note=None) -> dict:
    out = {"ours": ours, "ours_text": text, "mark": mark or "", "p_value": p, "missing": missing}
    return {**out, "note": note} if note else out


def _analysis_value(run: RunData, name: str, file: str, pick, what: str) -> dict:
    """A number of an analysis' JSON rows: ``pick(rows)`` -> value dict, or None when the rows
    hold no such number (``what`` says which, for the table)."""
    if not run.result:
        return _value(missing="not run")
    why = run.unavailable(name)
    if why:
        return _value(text=f"unavailable: {why}")
    rows = run.analysis(name, file)
    if rows is None:
        return _value(missing=f"{name} not run")
    found = pick(rows)
    return found if found is not None else _value(text=f"not in {name}'s output: {what}")


def _bleu(col: Column, params: dict, run: RunData, ref: Optional[RunData]) -> dict:
    value = run.result.get("bleu")
    sig = run.json("significance.json") or {}
    if ref is not None and ref.plan is not run.plan and sig.get("baseline") == ref.plan.row:
        return _value(value, mark=sig.get("mark", ""), p=sig.get("p_value"))
    return _value(value)


def _result_number(key):
    def read(col, params, run, ref):
        return _value(run.result.get(key))
    return read


def _params(col, params, run, ref):
    n = run.result.get("params")
    return _value(n / 1e6 if n else None)


def _decode_seconds(result: dict) -> Optional[float]:
    if result.get("decode_seconds") is not None:
        return result["decode_seconds"]
    if result.get("decode_sentences") and result.get("decode_sents_per_s"):
        return result["decode_sentences"] / result["decode_sents_per_s"]
    return None


def _decode_speed(col, params, run, ref):
    key = "decode_tokens_per_s" if params.get("unit") == "tokens/s" else "decode_sents_per_s"
    return _value(run.result.get(key))


def _decode_time(col, params, run, ref):
    return _value(_decode_seconds(run.result))


def _decode_speedup(col, params, run, ref):
    own = _decode_seconds(run.result)
    base = _decode_seconds(ref.result) if ref is not None else own
    return _value(base / own if own and base else None)


def _adversarial(col, params, run, ref):
    scores = run.result.get("adversarial") or {}
    lang = params["shuffled"]
    if lang == "extra":
        return _value(next(iter(scores.values())) if len(scores) == 1 else None)
    if scores and lang not in scores:
        return _value(text=f"unavailable: the data has no {lang} source (shuffled: {', '.join(scores)})")
    return _value(scores.get(lang))


def _meteor(col, params, run, ref):
    if not run.result:
        return _value(missing="not run")
    found = run.json("meteor.json")
    if found is None:
        return _value(missing="METEOR not computed")
    if "score" not in found:
        return _value(text=f"unavailable: {found.get('unavailable', '?')}")
    return _value(found["score"], note=found.get("implementation"))


def _layer_dependency(col, params, run, ref):
    layer = params["layer"]
    wanted = "none" if layer == "none" else f"f^{layer}"

    def pick(rows):
        for r in rows:
            if r.get("model") == run.plan.row and r.get("masked layer") == wanted:
                if layer == "none":
                    return _value(r.get("BLEU"))
                return {**_value(r.get("delta"), mark=r.get("mark", ""), p=r.get("p")), "tested_delta": r.get("delta")}
        return None

    return _analysis_value(run, "layer_dependency", "masking.json", pick, f"masked layer {wanted}")


def _decoders(col, params, run, ref):
    wanted = str(params["decoder"])

    def pick(rows):
        own = [r for r in rows if r.get("model") == run.plan.row]
        if wanted == "aux":
            aux = [r for r in own if str(r.get("decoder", "")).startswith("aux")]
            found = aux if len(aux) == 1 else []
        else:
            found = [r for r in own if r.get("decoder") == wanted]
        if not found:
            return None
        r = found[0]
        found = _value(r.get("BLEU"), mark=r.get("mark", "") if r.get("decoder") != "main" else "", p=r.get("p"))
        return {**found, "tested_delta": r.get("delta")} if r.get("decoder") != "main" else found

    return _analysis_value(run, "decoders", "decoders.json", pick, f"decoder {wanted}")


def _probing(col, params, run, ref):
    task, category = params["task"], params.get("category")

    def pick(rows):
        for r in rows:
            if r.get("task") == task and (category is None or r.get("category") == category):
                return _value(r.get(run.plan.row))
        return _value(text=f"unavailable: no {task if task != '#AVG' else category + ' #AVG'} task (the seven "
                           "parser-based tasks need SentEval's files: --senteval DIR)")

    return _analysis_value(run, "probing", "probing.json", pick, task)


def _at_layer(layer, key):
    """A reader of an analysis' rows: ``key`` of the row of ``layer`` (None when there is none)."""
    def pick(rows):
        row = next((r for r in rows if r.get("layer") == layer), None)
        return _value(row.get(key)) if row is not None else None
    return pick


def _word_translation(col, params, run, ref):
    part = params["part"]
    if part in ("last layer", "model"):
        def pick(rows):
            return _value(rows[0 if part == "last layer" else 1].get("accuracy")) if len(rows) == 2 else None

        return _analysis_value(run, "word_translation", "last_layer.json", pick, part)
    layer = params.get("layer")
    return _analysis_value(run, "word_translation", "word_translation.json", _at_layer(layer, part), f"layer {layer}")


def _translate_from_layer(col, params, run, ref):
    layer, metric = params["layer"], params["metric"]
    return _analysis_value(run, "translate_from_layer", "translate_from_layer.json", _at_layer(layer, metric),
                           f"layer {layer}")


# column source -> (column, its parameters for the row, the run, the reference row's run) -> value
READERS = {
    "bleu": _bleu,
    "params": _params,
    "train_speed": _result_number("train_ups"),
    "train_time": _result_number("train_seconds"),
    "decode_speed": _decode_speed,
    "decode_time": _decode_time,
    "decode_speedup": _decode_speedup,
    "adversarial": _adversarial,
    "meteor": _meteor,
    "layer_dependency": _layer_dependency,
    "decoders": _decoders,
    "probing": _probing,
    "word_translation": _word_translation,
    "translate_from_layer": _translate_from_layer,
}


def run_values(table: Table, row: Row, run: Optional[RunData], ref: Optional[RunData]) -> Dict[str, dict]:
    """Our number of every column of ``row`` read from one run (its model's), without the
    printed-difference columns (``delta``: :func:`build_rows` computes them). ``ref``: the run
    of the row's reference row, for the columns relative to it (significance, speed-up)."""
    out = {}
    for col in table.columns:
        if col.source == "delta":
            continue
        if run is None:
            out[col.name] = _value(missing="not planned")
        else:
            out[col.name] = READERS[col.source](col, col.at(row), run, ref)
    return out


# ---- the table ---------------------------------------------------------------------------

def paper_number(col: Column, printed: Optional[str]) -> Optional[float]:
    return parse_duration(printed) if col.source == "train_time" else printed_value(printed)


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


def _digits(table: Table, col: Column) -> int:
    """Decimals of our numbers: the paper's (the most it prints in the column), at least 2
    (1 for #Params and seconds), so that small differences at small scale stay visible."""
    if col.source == "delta":
        return _digits(table, table.column(col.params["of"]))
    found = [_decimals(cells.get(col.name)) for r in table.rows for cells in r.paper.values()]
    least = 1 if col.source in ("params", "decode_time") and has_paper_numbers(table, col) else 2
    return max([d for d in found if d is not None] + [least])


def _ours_text(table: Table, col: Column, cell: dict, ref_cell: Optional[dict], printed: Optional[str]) -> str:
    if cell["ours_text"]:
        return cell["ours_text"]
    value = cell["ours"]
    if value is None:
        return "–"
    if col.source in ("train_time",):
        return format_duration(value)
    digits = _digits(table, col)
    if col.source == "params" and str(printed or "").strip().startswith(("+", "-", "−")):
        base = (ref_cell or {}).get("ours")
        return _fmt(value - base, digits, signed=True) if base is not None else "–"
    return _fmt(value, digits, signed=col.source == "delta")


def default_rows(table: Table, plans: List[RunPlan]) -> List[Row]:
    """Every own row whose model has a run among ``plans``."""
    owners = {p.row for p in plans}
    return [r for r in table.rows if r.runnable and table.owner(r).id in owners]


def build_rows(table: Table, plans: List[RunPlan], rows: Optional[List[Row]] = None,
               analyses: Optional[List[AnalysisPlan]] = None) -> List[dict]:
    """One record per (data set, row): per column the paper's printed cell and our number,
    differences and ratios to the row's reference row, marks; cited rows with the paper's only."""
    rows = rows if rows is not None else default_rows(table, plans)
    keys = [k for k in table.datasets if any(p.dataset == k for p in plans)]
    on = row_datasets(table, rows, keys)
    by_run: Dict[str, Dict[str, AnalysisPlan]] = {}
    for ap in analyses or []:
        by_run.setdefault(ap.run.run_dir, {})[ap.name] = ap
    runs = {(p.dataset, p.row): RunData(p, by_run.get(p.run_dir) if analyses is not None else None) for p in plans}
    memo: Dict[tuple, Dict[str, dict]] = {}

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
                memo[key][col.name] = _value(mine["ours"] - other["ours"] if both else None)
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


def _record(table: Table, row: Row, dataset: str, ours, run_of) -> dict:
    ref = table.reference(row)
    paper, ref_paper = row.paper.get(dataset, {}), (ref.paper.get(dataset, {}) if ref else {})
    mine, theirs = ours(row, dataset), ours(ref, dataset)
    run = run_of(row, dataset)
    cells, missing = {}, []
    for col in table.columns:
        printed = paper.get(col.name)
        value = dict(mine.get(col.name) or _value(text="cited" if row.cited else None))
        ref_value = theirs.get(col.name) if ref else None
        cell = {"source": col.source, "paper": printed, "paper_value": paper_number(col, printed),
                "paper_mark": printed_mark(printed), **value,
                "ours_text": _ours_text(table, col, value, ref_value, printed) if not row.cited else "–"}
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
        if value.get("missing") and not row.cited:
            missing.append(f"{col.name}: {value['missing']}")
        cells[col.name] = cell
    result = run.result if run is not None else {}
    bleu_col = next((c for c in table.columns if c.source == "bleu"), None)
    head = cells.get(bleu_col.name, {}) if bleu_col else {}
    plan = run.plan if run is not None else None
    return {
        "table": table.id, "dataset": dataset, "row": row.id, "label": display_label(table, row), "group": row.group,
        "cited": row.cited, "reference": ref.id if ref else None,
        "reference_label": display_label(table, ref) if ref else None,
        "model_row": table.owner(row).id if row.runnable else None,
        "run_dir": plan.run_dir if plan else None,
        "status": "cited" if row.cited else ("done" if result else ("not run" if plan else "not planned")),
        "missing": missing,
        "bleu": head.get("ours"), "delta": head.get("delta"), "mark": head.get("mark", ""),
        "p_value": head.get("p_value"), "paper_bleu": head.get("paper_value"),
        "paper_delta": head.get("paper_delta"), "paper_mark": head.get("paper_mark", ""),
        "samples": (run.json("significance.json") or {}).get("samples") if run is not None else None,
        "params_m": result["params"] / 1e6 if result.get("params") else None,
        "model_bleu": result.get("bleu"),  # the BLEU of the row's model (its evaluation), in every table
        "adversarial": result.get("adversarial", {}),
        "paper_adversarial": {k: printed_value(v) for k, v in paper.items() if k.startswith("adv")},
        "budget": plan.budget if plan else "",
        "data": (plan.data_key + (" (substitute)" if "in place of" in plan.substitution else "")) if plan else "",
        "columns": cells,
    }


def complete(records: List[dict]) -> bool:
    """Every own row ran and every number it should have is there."""
    return all(r["status"] in ("done", "cited") and not r["missing"] for r in records)


# ---- several seeds -----------------------------------------------------------------------

def marks_of(table: Table) -> str:
    """The significance marks of the table's paper (fairseq_ext.tools.significance.MARKS)."""
    from fairseq_ext.tools.significance import MARKS

    prefix = table.id.split("-")[0]
    return prefix if prefix in MARKS else "thesis"


def build_seed_rows(table: Table, plans_by_seed: Dict[int, List[RunPlan]], rows: Optional[List[Row]] = None,
                    analyses_by_seed: Optional[Dict[int, List[AnalysisPlan]]] = None) -> List[dict]:
    """One record per (data set, row) of a table trained with several seeds: each seed's
    records (:func:`build_rows` of that seed's runs, every row against the reference row's
    run of the same seed), combined per column into the mean ± sd over the seeds that have a
    number (``n``), Δ and ratio the mean of the per-seed ones, and where a per-seed test stands
    behind the column the mark of :func:`fairseq_ext.tools.seeds.across_seeds` (``p_value`` is
    its largest per-seed p, ``p_t`` the paired t-test over seeds). A seed that did not run or
    lacks a number is named in the record's ``missing``."""
    seeds = list(plans_by_seed)
    by_seed = {s: {(r["dataset"], r["row"]): r for r in
                   build_rows(table, plans, rows, (analyses_by_seed or {}).get(s) if analyses_by_seed else None)}
               for s, plans in plans_by_seed.items()}
    marks = marks_of(table)
    return [_combine(table, key, {s: by_seed[s][key] for s in seeds if key in by_seed[s]}, by_seed, marks)
            for key in by_seed[seeds[0]]]


def _combine(table: Table, key: tuple, records: Dict[int, dict], by_seed: Dict[int, dict], marks: str) -> dict:
    seeds = list(records)
    first = records[seeds[0]]
    out = {**first, "seeds": seeds, "seeds_done": [], "n": 0}
    if first["cited"]:
        return out
    dataset, _ = key
    refs = {s: by_seed[s].get((dataset, first["reference"])) if first["reference"] else None for s in seeds}
    done = [s for s in seeds if records[s]["status"] == "done"]
    missing = [f"seed {s}: {records[s]['status']}" for s in seeds if s not in done]
    missing += [f"seed {s}: {m}" for s in done for m in records[s]["missing"]]
    columns = {}
    for col in table.columns:
        cells = {s: records[s]["columns"][col.name] for s in seeds}
        ref_cells = {s: refs[s]["columns"][col.name] for s in seeds if refs[s] is not None}
        columns[col.name] = cell = _combine_cell(table, col, cells, ref_cells, marks)
        untested = sorted(set(cell.get("per_seed", {})) - set(cell.get("tested_seeds", cell.get("per_seed", {}))))
        missing += [f"seed {s}: {col.name}: no test against the reference row" for s in untested]
    head = next((columns[c.name] for c in table.columns if c.source == "bleu"), {})

    def mean(values):
        values = [v for v in values if v is not None]
        return stats.mean_sd(values)[0] if values else None

    langs = list(dict.fromkeys(lang for s in done for lang in records[s]["adversarial"]))
    out.update({
        "status": "done" if done else first["status"], "missing": missing, "seeds_done": done, "n": len(done),
        "run_dir": records[done[0]]["run_dir"] if done else first["run_dir"],
        "bleu": head.get("ours"), "bleu_sd": head.get("sd"), "delta": head.get("delta"),
        "delta_sd": head.get("delta_sd"), "mark": head.get("mark", ""), "p_value": head.get("p_value"),
        "p_t": head.get("p_t"), "rule": head.get("rule"),
        "params_m": mean(records[s]["params_m"] for s in done),
        "model_bleu": mean(records[s]["model_bleu"] for s in done),
        "adversarial": {lang: mean(records[s]["adversarial"].get(lang) for s in done) for lang in langs},
        "per_seed": {s: {"run_dir": records[s]["run_dir"], "status": records[s]["status"], "bleu": records[s]["bleu"],
                         "delta": records[s]["delta"], "mark": records[s]["mark"], "p_value": records[s]["p_value"]}
                     for s in seeds},
        "columns": columns,
    })
    return out


def _combine_cell(table: Table, col: Column, cells: Dict[int, dict], ref_cells: Dict[int, dict], marks: str) -> dict:
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
        digits = _digits(table, col)
        if col.source == "train_time":
            cell["ours_text"] = format_duration(cell["ours"]) + (
                f" ± {format_duration(cell['sd'])}" if cell["sd"] is not None else "")
        elif col.source == "delta" or (col.source == "params"
                                       and str(first["paper"] or "").strip().startswith(("+", "-", "−"))):
            base = [ref_cells[s]["ours"] for s in values if s in ref_cells and ref_cells[s].get("ours") is not None]
            ref_mean = {"ours": stats.mean_sd(base)[0]} if base else None
            text = _ours_text(table, col, {"ours": cell["ours"], "ours_text": None}, ref_mean, first["paper"])
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


# ---- scale -------------------------------------------------------------------------------

def _shape(plan: RunPlan, result: dict) -> dict:
    from fairseq_ext.reproduce.params import shape

    known = result.get("model") or {}
    return known if all(known.get(k) is not None for k in ("encoder_layers", "encoder_embed_dim")) \
        else shape(plan.model_flags)


def _shape_text(s: dict) -> str:
    return (f"{s.get('encoder_layers')}+{s.get('decoder_layers')} layers, d_model {s.get('encoder_embed_dim')}, "
            f"FFN {s.get('encoder_ffn_embed_dim')}, {s.get('encoder_attention_heads')} heads")


def scale(table: Table, plans: List[RunPlan], records: Optional[List[dict]] = None) -> Dict[str, dict]:
    """Per data set, what our numbers were made with: the data actually used, the test set and
    its size, the models' sizes, the updates, decoding, BLEU flavour, and whether it is the
    smoke scale."""
    out = {}
    for dataset in table.datasets:
        group = [p for p in plans if p.dataset == dataset]
        if not group:
            continue
        first = group[0]
        env = read_prep_env(first.data_dir)
        results = {p.run_dir: RunData(p).result for p in group}
        done = [r for r in results.values() if r]
        shapes: Dict[str, List[str]] = {}
        for p in group:
            named = shapes.setdefault(_shape_text(_shape(p, results[p.run_dir])), [])
            if p.row not in named:  # a row's runs of several seeds: named once
                named.append(p.row)
        seeds = sorted({run_seed(p) for p in group if run_seed(p) is not None}, key=int)
        params = sorted(r["params"] / 1e6 for r in done if r.get("params"))
        updates = sorted({r["updates"] for r in done if r.get("updates") is not None})
        planned = sorted({r["planned_updates"] for r in done if r.get("planned_updates")})
        signature = ""
        bleu_json = os.path.join(first.run_dir, "eval-test", "bleu.json")
        if os.path.exists(bleu_json):
            with open(bleu_json, encoding="utf-8") as f:
                signature = json.load(f).get(first.bleu, {}).get("signature", "")
        sentences = sorted({r["decode_sentences"] for r in done if r.get("decode_sentences")})
        out[dataset] = {
            "paper": table.datasets[dataset].get("task", dataset),
            "data": first.data_key,
            "substitute": "in place of" in first.substitution,
            "substitution": first.substitution,
            "test_set": env.get("test_set", ""),
            "test_sentences": int(env["test_pairs"]) if env.get("test_pairs", "").isdigit() else
            (sentences[0] if sentences else None),
            "train_pairs": int(env["train_pairs"]) if env.get("train_pairs", "").isdigit() else None,
            "models": {text: rows for text, rows in shapes.items()},
            "params_m": [round(params[0], 2), round(params[-1], 2)] if params else None,
            "budget": describe_budget(first.budget if first.budget not in ("smoke", "paper") else ""),
            "updates": [updates[0], updates[-1]] if updates else None,
            "planned_updates": planned[-1] if len(planned) == 1 else None,
            "device": "CPU" if first.cpu else "GPU",
            "seed": run_seed(first),
            "seeds": [int(x) for x in seeds],
            "decoding": " ".join(first.generate),
            "bleu": first.bleu,
            "signature": signature,
            "smoke": first.smoke,
            "scale": first.scale,
        }
    return out


def run_seed(plan: RunPlan) -> Optional[str]:
    """The seed of a run (its training command's --seed)."""
    return plan.train[plan.train.index("--seed") + 1] if "--seed" in plan.train else None


def scale_lines(s: dict) -> List[str]:
    data = (f"{s['data']}, a substitute ({s['substitution']})" if s["substitute"]
            else s["data"] + (f" ({s['substitution']})" if s["substitution"] else ""))
    test = (f"test set {s['test_set']}, " if s["test_set"] else "") + f"{s['test_sentences']:,} test sentences" \
        if s["test_sentences"] else "test set not prepared yet"
    train = (f"; {s['train_pairs']:,} training pairs" + (" (the --smoke cut)" if s["smoke"] else "")) \
        if s["train_pairs"] else ""
    models = "; ".join(text + (f" ({', '.join(rows)})" if len(s["models"]) > 1 else "")
                       for text, rows in s["models"].items())
    params = ""
    if s["params_m"]:
        low, high = s["params_m"]
        params = f"; {low:.2f}M parameters" if low == high else f"; {low:.2f}M to {high:.2f}M parameters"
    done = ""
    if s["updates"]:
        low, high = s["updates"]
        done = f"{low:,}" if low == high else f"{low:,} to {high:,}"
        done = f" ({done}" + (f" of {s['planned_updates']:,}" if s["planned_updates"] else "") + " updates done)"
    lines = [f"paper: {s['paper']}",
             f"ours: {data}; {test}{train}",
             f"model: {models}{params}",
             f"training: {s['budget']} per row{done}, {s['device']}, " + _seeds_text(s),
             f"decoding: {s['decoding'] or 'fairseq defaults'}; BLEU {s['bleu']}"
             + (f" (sacreBLEU {s['signature']})" if s["signature"] else "")]
    if s["smoke"]:
        lines.append("smoke scale: a check that every step runs end to end, on small substitute data and "
                     "narrow models; no number here is evidence for or against the paper")
    elif s.get("scale") == "cpu":
        lines.append("CPU scale (--cpu-scale): the paper's depth and technique at the quickstart's width and "
                     "schedule, on the substitute data in full; the models translate, but they are small and "
                     "short-trained, so a difference here is a first look, not a test of the paper's number")
    return lines


def _seeds_text(s: dict) -> str:
    several = s.get("seeds") or []
    if len(several) < 2:
        return f"seed {s['seed']}"
    return f"seeds {', '.join(str(x) for x in several)} (each row once per seed)"


def scale_summary(s: dict) -> str:
    """The scale in one sentence (the LaTeX caption)."""
    parts = [f"Ours: {s['data']}" + (" (substitute)" if s["substitute"] else ""),
             f"{s['test_sentences']:,} test sentences" if s["test_sentences"] else "test set not prepared",
             "; ".join(s["models"]), s["budget"] + " per row",
             _seeds_text(s) if len(s.get("seeds") or []) > 1 else "", s["decoding"], f"BLEU {s['bleu']}"]
    return ", ".join(p for p in parts if p) + (". Smoke scale: a pipeline check, not evidence." if s["smoke"] else
                                               ". CPU scale: small, short-trained models." if s.get("scale") == "cpu"
                                               else ".")


# ---- Markdown ----------------------------------------------------------------------------

def _layout(table: Table, records: List[dict]) -> List[tuple]:
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


def has_paper_numbers(table: Table, col: Column) -> bool:
    """Whether any row of the table prints a number in this column."""
    return col.printed and any(printed_text(cells.get(col.name)) not in ("", "–")
                               for r in table.rows for cells in r.paper.values())


def _header(col: Column, kind: str, smoke: bool, table: Optional[Table] = None) -> str:
    name = col.name + ("" if col.printed else " [not in the paper's table]")
    alone = table is not None and not has_paper_numbers(table, col)
    return {"paper": f"{name}: paper", "ours": f"{name}: ours" if alone else "ours", "delta_paper": "Δ paper",
            "delta_ours": "Δ ours", "sig": "sig. (pipeline check)" if smoke else "sig.", "ratio_paper": "ratio paper",
            "ratio_ours": "ratio ours"}[kind]


def _cell_text(table: Table, col: Column, cell: dict, kind: str, record: dict) -> str:
    if kind == "paper":
        return printed_text(cell["paper"]) if col.printed else "–"
    if kind == "ours":
        return cell["ours_text"]
    if kind.startswith("delta"):
        value = cell.get("paper_delta" if kind == "delta_paper" else "delta")
        spread = cell.get("delta_sd") if kind == "delta_ours" else None
        digits = _digits(table, col)
        return _fmt(value, digits, signed=True) + (f" ± {spread:.{digits}f}" if spread is not None else "")
    if kind == "sig":
        if not cell.get("mark") and cell.get("p_value") is None:
            return ""
        p = cell.get("p_value")
        if "tested_seeds" in cell:  # over seeds: the largest per-seed p, the t-test beside it
            p_t = cell.get("p_t")
            return ((cell.get("mark") or "") + f" p_max={p:.3f}" + (f" p_t={p_t:.3f}" if p_t is not None else "")
                    + (f" (n={len(cell['tested_seeds'])})" if len(cell["tested_seeds"]) < len(record["seeds"]) else ""))
        return (cell.get("mark") or "") + (f" p={p:.3f}" if p is not None else "")
    value = cell.get("paper_ratio" if kind == "ratio_paper" else "ratio")
    spread = cell.get("ratio_sd") if kind == "ratio_ours" else None
    return _fmt(value) + (f" ± {spread:.2f}" if spread is not None else "")


def seed_count(record: dict) -> str:
    """The n column of a table of several seeds: the seeds a row ran, of those asked for."""
    if record["cited"]:
        return "–"
    n, total = len(record["seeds_done"]), len(record["seeds"])
    return str(n) if n == total else f"{n} of {total}"


def _md_escape(text: str) -> str:
    return str(text).replace("|", "\\|")


def markdown(table: Table, records: List[dict], scales: Optional[Dict[str, dict]] = None) -> str:
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
        layout = _layout(table, rows)
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
            cells += [_cell_text(table, c, r["columns"][c.name], k, r) for c, k in layout]
            out.write("| " + " | ".join(_md_escape(c) for c in cells) + " |\n")
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
    out.write("\n".join(legend(table, records, smoke)) + "\n")
    return out.getvalue()


def legend(table: Table, records: List[dict], smoke: bool = False) -> List[str]:
    from fairseq_ext.tools.significance import MARKS

    marks = MARKS.get(table.id.split("-")[0], MARKS["thesis"])
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
        lines.append("vs: the row's reference row (the paper's own comparison); Δ ours and ratio ours are "
                     "against that row's run; Δ paper and ratio paper are computed from the paper's printed "
                     "numbers; a difference column the paper prints is shown as printed, ours beside it against "
                     "the same row.")
    several = next((r["seeds"] for r in records if "seeds" in r), None)
    if several:
        lines.append(
            f"Seeds: {len(several)} ({', '.join(str(s) for s in several)}), each row trained once per seed and paired "
            "with its reference row by seed number. ours: the mean ± sample sd over the seeds that have the number "
            "(n: the seeds a row ran); Δ ours and ratio ours: the mean ± sd of the per-seed differences and ratios "
            "to the reference row's run of the same seed. sig.: a mark only where the per-seed test is significant "
            "at every seed with one sign of the difference (an intersection-union test, "
            "fairseq_ext.tools.seeds); p_max: the largest per-seed p; p_t: a paired t-test over seeds, shown "
            "beside the mark, not as it (p_t in the CSV too; every seed's p and mark in the JSON).")
    sources = {c.source for c in table.columns}
    tests = [s for s in TESTS if s in sources and any(has_test(c) for c in table.columns if c.source == s)]
    for source in tests:
        text = TESTS[source].format(samples=samples)
        lines.append(f"sig. ({source}): {text}; marks as this paper's: {marks_text}; p: the test's p-value. "
                     "A mark says the difference is significant, its sign the direction."
                     + (" At smoke scale this is a check that the test runs, not evidence: the models are "
                        "undertrained and narrow, the data a small substitute." if smoke else ""))
    notes = dict.fromkeys(cell["note"] for r in records for cell in r["columns"].values() if cell.get("note"))
    lines += [f"ours, {note}" for note in notes]
    reasons = list(dict.fromkeys(NO_TEST[s] for s in NO_TEST if s in sources))
    if reasons:
        lines.append("No sig. column: " + "; ".join(reasons) + ".")
    if any(shows_ratio(c) for c in table.columns):
        lines.append("ratio: the row's value / its reference row's (speeds: above 1 is faster; times: above 1 is "
                     "slower). Our speeds and times are of this machine, the paper's of its GPUs: compare the "
                     "ratios.")
    untrained = list(dict.fromkeys(r["label"] for r in records if r.get("model_bleu") is not None
                                   and r["model_bleu"] < 1.0))
    if untrained:
        lines.append(f"Our models of {', '.join(untrained)} score BLEU < 1 in their own evaluation: they do not "
                     "translate yet at this budget, and no difference between their numbers means anything.")
    incomplete = [r for r in records if r["missing"] or r["status"] not in ("done", "cited")]
    if incomplete:
        lines.append("Incomplete: " + "; ".join(
            f"{r['label']} ({r['dataset']}): " + (", ".join(r["missing"]) if r["missing"] else r["status"])
            for r in incomplete) + ".")
    return lines


# ---- LaTeX -------------------------------------------------------------------------------

_LATEX_SPECIAL = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                  "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}
_LATEX_UNICODE = {"Δ": r"\(\Delta\)", "∆": r"\(\Delta\)", "±": r"\(\pm\)", "−": "-", "→": r"\(\rightarrow\)",
                  "↔": r"\(\leftrightarrow\)", "×": r"\(\times\)", "–": "--", "’": "'", "ρ": r"\(\rho\)"}
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


def latex(table: Table, records: List[dict], scales: Optional[Dict[str, dict]] = None) -> str:
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
        layout = [(c, k) for c, k in _layout(table, rows) if k != "sig"]  # marks go on our numbers
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
            caption += (" Ours: mean ± sd over the seeds (n per row); a mark only where the paired bootstrap "
                        "is significant at every seed with one sign.")
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
                    cells.append(latex_escape(_cell_text(table, col, cell, kind, r)))
            out.write(" & ".join(cells) + " \\\\\n")
        out.write("\\bottomrule\n\\end{tabular}\n\\end{table}\n\n")
    return out.getvalue()


# ---- files -------------------------------------------------------------------------------

def _flat(record: dict) -> dict:
    out = {k: v for k, v in record.items() if k not in ("columns", "adversarial", "paper_adversarial", "missing",
                                                        "per_seed")}
    if "seeds" in record:
        out["seeds"] = " ".join(str(x) for x in record["seeds"])
        out["seeds_done"] = " ".join(str(x) for x in record["seeds_done"])
    out["missing"] = "; ".join(record["missing"])
    for name, cell in record["columns"].items():
        for key in ("paper", "ours", "ours_text", "sd", "n", "mark", "p_value", "p_t", "paper_delta", "delta",
                    "delta_sd", "paper_ratio", "ratio"):
            if key in cell:
                out[f"{name} | {key}"] = cell[key]
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
                import hashlib

                text = f"{len(names)}-{hashlib.sha1(text.encode()).hexdigest()[:8]}"
            parts.append(f"{kind}-{text}")
    if partial:
        parts.append("partial")
    return ".".join(parts)


def write_reports(table: Table, records: List[dict], out_dir: str, name: str = "table",
                  scales: Optional[Dict[str, dict]] = None) -> Dict[str, str]:
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
