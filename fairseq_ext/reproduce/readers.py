"""Our numbers of one run, per column: the files of one run directory, each read once
(:class:`RunData`: result.json, significance.json, meteor.json, analysis/NAME/), and per column
source the reader of its number (:data:`READERS`), each giving a
:class:`~fairseq_ext.reproduce.records.Value`."""
import json
import os
from typing import Dict, Optional

from fairseq_ext.reproduce.columns import Column
from fairseq_ext.reproduce.planning import ANALYSIS_DONE, AnalysisPlan, RunPlan, analysis_dir
from fairseq_ext.reproduce.records import Value
from fairseq_ext.reproduce.tables import Row, Table


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
                try:
                    with open(path, encoding="utf-8") as f:
                        self._cache[path] = json.load(f)
                except (ValueError, UnicodeDecodeError):  # cut short by a kill: a run not finished
                    pass
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


def make_value(ours=None, text=None, mark="", p=None, missing=None, note=None) -> Value:
    out = Value(ours=ours, ours_text=text, mark=mark or "", p_value=p, missing=missing)
    return Value(**out, note=note) if note else out


def _analysis_value(run: RunData, name: str, file: str, pick, what: str) -> Value:
    """A number of an analysis' JSON rows: ``pick(rows)`` -> value dict, or None when the rows
    hold no such number (``what`` says which, for the table)."""
    if not run.result:
        return make_value(missing="not run")
    why = run.unavailable(name)
    if why:
        return make_value(text=f"unavailable: {why}")
    rows = run.analysis(name, file)
    if rows is None:
        return make_value(missing=f"{name} not run")
    found = pick(rows)
    return found if found is not None else make_value(text=f"not in {name}'s output: {what}")


def _bleu(col: Column, params: dict, run: RunData, ref: Optional[RunData]) -> Value:
    value = run.result.get("bleu")
    sig = run.json("significance.json") or {}
    if ref is not None and ref.plan is not run.plan and sig.get("baseline") == ref.plan.row:
        return make_value(value, mark=sig.get("mark", ""), p=sig.get("p_value"))
    return make_value(value)


def _result_number(key):
    def read(col, params, run, ref):
        return make_value(run.result.get(key))
    return read


def _params(col, params, run, ref):
    n = run.result.get("params")
    return make_value(n / 1e6 if n else None)


def _decode_seconds(result: dict) -> Optional[float]:
    if result.get("decode_seconds") is not None:
        return result["decode_seconds"]
    if result.get("decode_sentences") and result.get("decode_sents_per_s"):
        return result["decode_sentences"] / result["decode_sents_per_s"]
    return None


def _decode_speed(col, params, run, ref):
    key = "decode_tokens_per_s" if params.get("unit") == "tokens/s" else "decode_sents_per_s"
    return make_value(run.result.get(key))


def _decode_time(col, params, run, ref):
    return make_value(_decode_seconds(run.result))


def _decode_speedup(col, params, run, ref):
    own = _decode_seconds(run.result)
    base = _decode_seconds(ref.result) if ref is not None else own
    return make_value(base / own if own and base else None)


def _adversarial(col, params, run, ref):
    scores = run.result.get("adversarial") or {}
    lang = params["shuffled"]
    if lang == "extra":
        return make_value(next(iter(scores.values())) if len(scores) == 1 else None)
    if scores and lang not in scores:
        return make_value(text=f"unavailable: the data has no {lang} source (shuffled: {', '.join(scores)})")
    return make_value(scores.get(lang))


def _meteor(col, params, run, ref):
    if not run.result:
        return make_value(missing="not run")
    found = run.json("meteor.json")
    if found is None:
        return make_value(missing="METEOR not computed")
    if "score" not in found:
        return make_value(text=f"unavailable: {found.get('unavailable', '?')}")
    return make_value(found["score"], note=found.get("implementation"))


def _chrf(col, params, run, ref):
    """chrF2 of the row's evaluation: what fairseq-ext evaluate wrote beside bleu.json, on the
    text of the data set's BLEU flavour (an evaluation older than metrics.json has none)."""
    if not run.result:
        return make_value(missing="not run")
    found = (run.json("eval-test", "metrics.json") or {}).get("chrF2")
    return make_value(found["score"]) if found else make_value(None)


def _comet(col, params, run, ref):
    if not run.result:
        return make_value(missing="not run")
    found = run.json("comet.json")
    return make_value(found["score"]) if found else make_value(missing="COMET not computed")


def _layer_dependency(col, params, run, ref):
    layer = params["layer"]
    wanted = "none" if layer == "none" else f"f^{layer}"

    def pick(rows):
        for r in rows:
            if r.get("model") == run.plan.row and r.get("masked layer") == wanted:
                if layer == "none":
                    return make_value(r.get("BLEU"))
                return {**make_value(r.get("delta"), mark=r.get("mark", ""), p=r.get("p")), "tested_delta": r.get("delta")}
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
        found = make_value(r.get("BLEU"), mark=r.get("mark", "") if r.get("decoder") != "main" else "", p=r.get("p"))
        return {**found, "tested_delta": r.get("delta")} if r.get("decoder") != "main" else found

    return _analysis_value(run, "decoders", "decoders.json", pick, f"decoder {wanted}")


def _probing(col, params, run, ref):
    task, category = params["task"], params.get("category")

    def pick(rows):
        for r in rows:
            if r.get("task") == task and (category is None or r.get("category") == category):
                return make_value(r.get(run.plan.row))
        return make_value(text=f"unavailable: no {task if task != '#AVG' else category + ' #AVG'} task (the seven "
                           "parser-based tasks need SentEval's files: --senteval DIR)")

    return _analysis_value(run, "probing", "probing.json", pick, task)


def _at_layer(layer, key):
    """A reader of an analysis' rows: ``key`` of the row of ``layer`` (None when there is none)."""
    def pick(rows):
        row = next((r for r in rows if r.get("layer") == layer), None)
        return make_value(row.get(key)) if row is not None else None
    return pick


def _word_translation(col, params, run, ref):
    part = params["part"]
    if part in ("last layer", "model"):
        def pick(rows):
            return make_value(rows[0 if part == "last layer" else 1].get("accuracy")) if len(rows) == 2 else None

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
    "chrf": _chrf,
    "comet": _comet,
    "layer_dependency": _layer_dependency,
    "decoders": _decoders,
    "probing": _probing,
    "word_translation": _word_translation,
    "translate_from_layer": _translate_from_layer,
}


def run_values(table: Table, row: Row, run: Optional[RunData], ref: Optional[RunData]) -> Dict[str, Value]:
    """Our number of every column of ``row`` read from one run (its model's), without the
    printed-difference columns (``delta``: :func:`fairseq_ext.reproduce.records.build_rows`
    computes them). ``ref``: the run of the row's reference row, for the columns relative to
    it (significance, speed-up)."""
    out = {}
    for col in table.columns:
        if col.source == "delta":
            continue
        if run is None:
            out[col.name] = make_value(missing="not planned")
        else:
            out[col.name] = READERS[col.source](col, col.at(row), run, ref)
    return out
