"""Our numbers of one run, per column, and the scale they were made at.

- Records: :class:`Value` (our number of one column of one row), :class:`Cell` (one column of one
  row: the paper's cell and ours, Δ and ratio to the reference row, marks), :class:`Record` (one
  row on one data set): typed dictionaries the table's JSON and CSV write as they are; a key that
  does not apply is absent, not None.
- Readers: a run directory's files, each read once (:class:`RunData`), and per column source the
  reader of its number (:data:`READERS`).
- Scale: per data set, what our numbers were made with (lines under the heading, the LaTeX caption)."""
import json
import os
from typing import Dict, List, Optional, TypedDict

from fairseq_ext.common.data_text import read_prep_env
from fairseq_ext.reproduce.params import shape
from fairseq_ext.reproduce.planning import ANALYSIS_DONE, AnalysisPlan, RunPlan, analysis_dir, describe_budget
from fairseq_ext.reproduce.tables import Row, Table


# Our number of one column of one row, as a reader of a run gives it. ours_text: a reader's text in place of a number,
# else None (in a Cell: ours as shown); mark: of the test behind the number ("" when none); missing: what did not run
# yet, for the table's "Incomplete" line; optional: note (how the number was made, METEOR's implementation, said under
# the table) and tested_delta (the difference an analysis' own test is of, tested against 0).
Value = TypedDict("Value", {"ours": Optional[float], "ours_text": Optional[str], "mark": str,
                            "p_value": Optional[float], "missing": Optional[str], "note": str,
                            "tested_delta": Optional[float]}, total=False)
# One column of one row: the paper's printed cell (as printed, its number, its marks) beside ours (a Value's keys).
# paper_delta / delta: the row's printed number / our run's minus its reference row's; paper_ratio / ratio: the same as
# ratios (speeds and times). Seeds: ours is the mean ± sd over the seeds with a number (n; per_seed: seed -> number),
# delta_*/ratio_* the mean, sd and count of the per-seed differences and ratios, p_t the paired t-test over seeds (shown
# beside the mark, not as it), rule how the mark over seeds was decided (statistics.across_seeds), and timing_noise a
# speed or time shown as — (sd in % of the mean, and whose); one seed's speeds and times are not_comparable (shown as
# n.c., the number in the JSON). The test behind the marks (fairseq_ext.reproduce.marks): its --test value and name, the
# stratified approximate randomization's result (ar), the rows tested against the same reference row (comparisons) and
# the Holm-adjusted p (--correction holm).
Cell = TypedDict("Cell", {
    **Value.__annotations__, "source": str, "paper": Optional[str], "paper_value": Optional[float],
    "paper_mark": str, "paper_delta": Optional[float], "delta": Optional[float], "paper_ratio": Optional[float],
    "ratio": Optional[float], "sd": Optional[float], "n": int, "per_seed": Dict[int, float],
    "delta_sd": Optional[float], "delta_n": int, "ratio_sd": Optional[float], "ratio_n": int, "p_t": Optional[float],
    "rule": str, "tested_seeds": List[int], "per_seed_marks": Dict[int, str], "per_seed_p": Dict[int, float],
    "test": str, "test_name": str, "correction": str, "shuffles": int, "ar": dict, "comparisons": int,
    "p_holm": Optional[float], "timing_noise": Dict[str, object], "not_comparable": bool, "ar_statistic": str},
    total=False)
# One row of the table on one data set (a cited row: the paper's numbers only). label: with the row's id where another
# row of the table has the same label; cited: where a row quoted from another paper comes from; reference: the row it is
# compared with (Δ, ratio, significance); model_row: the row that trains the model it reports on; status: "done", "not
# run", "not planned" or "cited"; missing: the numbers it lacks, "column: why"; bleu to paper_mark: the BLEU column's
# numbers, repeated at the top for the CSV's readers; samples: of its bootstrap; model_bleu: the BLEU of its model's own
# evaluation; adversarial: shuffled source -> BLEU. Seeds: seeds (asked for), seeds_done (finished), seeds_counted (it
# and its reference row finished: behind every number), the BLEU column's n, sd, Δ sd, p_t and rule, per_seed (each
# seed's run_dir, status, bleu, delta, mark and p_value). The test behind the BLEU marks: test, test_name, correction,
# shuffles.
Record = TypedDict("Record", {
    "table": str, "dataset": str, "row": str, "label": str, "group": str, "cited": Optional[str],
    "reference": Optional[str], "reference_label": Optional[str], "model_row": Optional[str],
    "run_dir": Optional[str], "status": str, "missing": List[str], "bleu": Optional[float], "delta": Optional[float],
    "mark": str, "p_value": Optional[float], "paper_bleu": Optional[float], "paper_delta": Optional[float],
    "paper_mark": str, "samples": Optional[int], "params_m": Optional[float], "model_bleu": Optional[float],
    "adversarial": Dict[str, Optional[float]], "paper_adversarial": Dict[str, Optional[float]], "budget": str,
    "data": str, "columns": Dict[str, Cell], "seeds": List[int], "seeds_done": List[int],
    "seeds_counted": List[int], "test": str, "test_name": str, "correction": str, "shuffles": int,
    "ar_statistic": str, "n": int,
    "bleu_sd": Optional[float], "delta_sd": Optional[float], "p_t": Optional[float], "rule": Optional[str],
    "per_seed": Dict[int, dict]}, total=False)


class RunData:
    """The files of one run directory, each read once; ``analyses``: name -> the run's planned analysis."""

    def __init__(self, plan: RunPlan, analyses: Optional[Dict[str, AnalysisPlan]] = None):
        self.plan = plan
        self.analyses = analyses
        self._cache = {}

    def json(self, *parts):
        path = os.path.join(self.plan.run_dir, *parts)
        if path not in self._cache:
            try:
                with open(path, encoding="utf-8") as f:
                    self._cache[path] = json.load(f)
            except (FileNotFoundError, ValueError, UnicodeDecodeError):  # or cut short by a kill: not finished
                self._cache[path] = None
        return self._cache[path]

    @property
    def result(self) -> dict:
        return self.json("result.json") or {}

    def unavailable(self, name: str) -> str:
        ap = (self.analyses or {}).get(name)
        return ap.unavailable if ap is not None and ap.command is None else ""

    def analysis(self, name: str, file: str):
        """The JSON an analysis of this run wrote (None until it finished)."""
        if not os.path.exists(os.path.join(analysis_dir(self.plan, name), ANALYSIS_DONE)):
            return None
        return self.json("analysis", name, file)


def make_value(ours=None, text=None, mark="", p=None, missing=None, note=None, **extra) -> Value:
    out = Value(ours=ours, ours_text=text, mark=mark or "", p_value=p, missing=missing, **extra)
    return Value(**out, note=note) if note else out


def _analysis_value(run: RunData, name: str, file: str, pick, what: str) -> Value:
    """``pick(rows)`` of an analysis' JSON rows, or a text saying it holds no ``what``."""
    why = run.unavailable(name)
    if why:
        return make_value(text=f"unavailable: {why}")
    rows = run.analysis(name, file)
    if rows is None:
        return make_value(missing=f"{name} not run")
    found = pick(rows)
    return found if found is not None else make_value(text=f"not in {name}'s output: {what}")


def _bleu(params: dict, run: RunData, ref: Optional[RunData]) -> Value:
    value = run.result.get("bleu")
    sig = run.json("significance.json") or {}
    if ref is not None and ref.plan is not run.plan and sig.get("baseline") == ref.plan.row:
        return make_value(value, mark=sig.get("mark", ""), p=sig.get("p_value"))
    return make_value(value)


def _decode_seconds(result: dict) -> Optional[float]:
    if result.get("decode_seconds") is not None:
        return result["decode_seconds"]
    if result.get("decode_sentences") and result.get("decode_sents_per_s"):
        return result["decode_sentences"] / result["decode_sents_per_s"]
    return None


def _decode_speedup(params, run, ref):
    own = _decode_seconds(run.result)
    base = _decode_seconds(ref.result) if ref is not None else own
    return make_value(base / own if own and base else None)


def _adversarial(params, run, ref):
    scores = run.result.get("adversarial") or {}
    lang = params["shuffled"]
    if lang == "extra":
        return make_value(next(iter(scores.values())) if len(scores) == 1 else None)
    if scores and lang not in scores:
        return make_value(text=f"unavailable: the data has no {lang} source (shuffled: {', '.join(scores)})")
    return make_value(scores.get(lang))


def _meteor(params, run, ref):
    found = run.json("meteor.json")
    if found is None:
        return make_value(missing="METEOR not computed")
    if "score" not in found:
        return make_value(text=f"unavailable: {found.get('unavailable', '?')}")
    return make_value(found["score"], note=found.get("implementation"))


def _chrf(params, run, ref):
    """chrF2 of the row's evaluation (eval-test/metrics.json; an older evaluation has none)."""
    found = (run.json("eval-test", "metrics.json") or {}).get("chrF2")
    return make_value(found["score"]) if found else make_value(None)


def _comet(params, run, ref):
    found = run.json("comet.json")
    return make_value(found["score"]) if found else make_value(missing="COMET not computed")


def _layer_dependency(params, run, ref):
    layer = params["layer"]
    wanted = "none" if layer == "none" else f"f^{layer}"

    def pick(rows):
        for r in rows:
            if r.get("model") == run.plan.row and r.get("masked layer") == wanted:
                if layer == "none":
                    return make_value(r.get("BLEU"))
                return make_value(r.get("delta"), mark=r.get("mark", ""), p=r.get("p"), tested_delta=r.get("delta"))
        return None

    return _analysis_value(run, "layer_dependency", "masking.json", pick, f"masked layer {wanted}")


def _decoders(params, run, ref):
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
        if r.get("decoder") == "main":
            return make_value(r.get("BLEU"), p=r.get("p"))
        return make_value(r.get("BLEU"), mark=r.get("mark", ""), p=r.get("p"), tested_delta=r.get("delta"))

    return _analysis_value(run, "decoders", "decoders.json", pick, f"decoder {wanted}")


def _probing(params, run, ref):
    task, category = params["task"], params.get("category")

    def pick(rows):
        for r in rows:
            if r.get("task") == task and (category is None or r.get("category") == category):
                return make_value(r.get(run.plan.row))
        return make_value(text=f"unavailable: no {task if task != '#AVG' else category + ' #AVG'} task (the seven "
                           "parser-based tasks need SentEval's files: --senteval DIR)")

    return _analysis_value(run, "probing", "probing.json", pick, task)


def _at_layer(layer, key):
    """A reader of an analysis' rows: ``key`` of the row of ``layer``."""
    def pick(rows):
        row = next((r for r in rows if r.get("layer") == layer), None)
        return make_value(row.get(key)) if row is not None else None
    return pick


def _word_translation(params, run, ref):
    part, layer = params["part"], params.get("layer")
    if part in ("last layer", "model"):
        def pick(rows):
            return make_value(rows[0 if part == "last layer" else 1].get("accuracy")) if len(rows) == 2 else None

        return _analysis_value(run, "word_translation", "last_layer.json", pick, part)
    return _analysis_value(run, "word_translation", "word_translation.json", _at_layer(layer, part), f"layer {layer}")


def _translate_from_layer(params, run, ref):
    layer = params["layer"]
    return _analysis_value(run, "translate_from_layer", "translate_from_layer.json", _at_layer(layer, params["metric"]),
                           f"layer {layer}")


# column source -> (the column's parameters for the row, the run, the reference row's run) -> value
READERS = {
    "bleu": _bleu,
    "params": lambda params, run, ref: make_value(run.result["params"] / 1e6 if run.result.get("params") else None),
    "train_speed": lambda params, run, ref: make_value(run.result.get("train_ups")),
    "train_time": lambda params, run, ref: make_value(run.result.get("train_seconds")),
    "decode_speed": lambda params, run, ref: make_value(run.result.get(
        "decode_tokens_per_s" if params.get("unit") == "tokens/s" else "decode_sents_per_s")),
    "decode_time": lambda params, run, ref: make_value(_decode_seconds(run.result)),
    "decode_speedup": _decode_speedup, "adversarial": _adversarial, "meteor": _meteor, "chrf": _chrf, "comet": _comet,
    "layer_dependency": _layer_dependency, "decoders": _decoders, "probing": _probing,
    "word_translation": _word_translation, "translate_from_layer": _translate_from_layer,
}
# the sources read from files a run writes after its result.json: "not run" until it has one
AFTER_RESULT = ("meteor", "chrf", "comet")


def run_values(table: Table, row: Row, run: Optional[RunData], ref: Optional[RunData]) -> Dict[str, Value]:
    """Our number of every column of ``row`` but the ``delta`` ones (rows.build_rows) from its model's
    run; ``ref``: the reference row's run (significance, speed-up)."""
    out = {}
    for col in table.columns:
        if col.source == "delta":
            continue
        if run is None:
            out[col.name] = make_value(missing="not planned")
        elif not run.result and (col.analysis or col.source in AFTER_RESULT):
            out[col.name] = make_value(missing="not run")
        else:
            out[col.name] = READERS[col.source](col.at(row), run, ref)
    return out


# The scale of one data set's runs (the first run's, where they differ: its data, budget, device and decoding are the
# table's): the paper's task, the data used (substitute: why and what), the test set, the models' shape in words -> the
# rows of that shape, the least and most parameters (millions) and updates done, the budget in words, the seed as text
# (the table JSON's format), sacreBLEU's signature, the scale ("smoke", "cpu" or "").
Scale = TypedDict("Scale", {
    "paper": str, "data": str, "substitute": bool, "substitution": str, "test_set": str,
    "test_sentences": Optional[int], "train_pairs": Optional[int], "models": Dict[str, List[str]],
    "params_m": Optional[List[float]], "budget": str, "updates": Optional[List[int]], "planned_updates": Optional[int],
    "device": str, "seed": str, "seeds": List[int], "decoding": str, "bleu": str, "signature": str, "smoke": bool,
    "scale": str})


def _shape(plan: RunPlan, result: dict) -> dict:
    known = result.get("model") or {}
    return known if all(known.get(k) is not None for k in ("encoder_layers", "encoder_embed_dim")) \
        else shape(plan.model_flags)


def _shape_text(s: dict) -> str:
    return (f"{s.get('encoder_layers')}+{s.get('decoder_layers')} layers, d_model {s.get('encoder_embed_dim')}, "
            f"FFN {s.get('encoder_ffn_embed_dim')}, {s.get('encoder_attention_heads')} heads")


def scales(table: Table, plans: List[RunPlan]) -> Dict[str, Scale]:
    """Per data set, what our numbers were made with."""
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
        params = sorted(r["params"] / 1e6 for r in done if r.get("params"))
        updates = sorted({r["updates"] for r in done if r.get("updates") is not None})
        planned = sorted({r["planned_updates"] for r in done if r.get("planned_updates")})
        signature = (RunData(first).json("eval-test", "bleu.json") or {}).get(first.bleu, {}).get("signature", "")
        sentences = sorted({r["decode_sentences"] for r in done if r.get("decode_sentences")})
        trained_on = sorted({(r.get("rate") or r.get("converted_from") or {}).get("device") for r in done} - {None})
        out[dataset] = Scale(
            paper=table.datasets[dataset].get("task", dataset), data=first.data_key,
            substitute="in place of" in first.substitution, substitution=first.substitution,
            test_set=env.get("test_set", ""),
            test_sentences=int(env["test_pairs"]) if env.get("test_pairs", "").isdigit() else
            (sentences[0] if sentences else None),
            train_pairs=int(env["train_pairs"]) if env.get("train_pairs", "").isdigit() else None,
            models=shapes, params_m=[round(params[0], 2), round(params[-1], 2)] if params else None,
            budget=describe_budget(first.budget if first.budget not in ("smoke", "paper") else ""),
            updates=[updates[0], updates[-1]] if updates else None,
            planned_updates=planned[-1] if len(planned) == 1 else None,
            device=", ".join(trained_on) or ("CPU" if first.cpu else "GPU"),
            seed=str(first.seed), seeds=sorted({p.seed for p in group}), decoding=" ".join(first.generate),
            bleu=first.bleu, signature=signature, smoke=first.smoke, scale=first.scale)
    return out


def scale_lines(s: Scale) -> List[str]:
    data = (f"{s['data']}, a substitute ({s['substitution']})" if s["substitute"]
            else s["data"] + (f" ({s['substitution']})" if s["substitution"] else ""))
    test = (f"test set {s['test_set']}, " if s["test_set"] else "") + f"{s['test_sentences']:,} test sentences" \
        if s["test_sentences"] else "test set not prepared yet"
    train = (f"; {s['train_pairs']:,} training pairs" + (" (the --smoke cut)" if s["smoke"] else "")) \
        if s["train_pairs"] else ""
    models = "; ".join(text + (f" ({', '.join(rows)})" if len(s["models"]) > 1 else "")
                       for text, rows in s["models"].items())
    params = done = ""
    if s["params_m"]:
        low, high = s["params_m"]
        params = f"; {low:.2f}M parameters" if low == high else f"; {low:.2f}M to {high:.2f}M parameters"
    if s["updates"]:
        low, high = s["updates"]
        done = (f" ({low:,}" if low == high else f" ({low:,} to {high:,}") \
            + (f" of {s['planned_updates']:,}" if s["planned_updates"] else "") + " updates done)"
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


def _seeds_text(s: Scale) -> str:
    several = s.get("seeds") or []
    return f"seeds {', '.join(str(x) for x in several)} (each row once per seed)" if len(several) > 1 \
        else f"seed {s['seed']}"


def scale_summary(s: Scale) -> str:
    """The scale in one sentence (the LaTeX caption)."""
    parts = [f"Ours: {s['data']}" + (" (substitute)" if s["substitute"] else ""),
             f"{s['test_sentences']:,} test sentences" if s["test_sentences"] else "test set not prepared",
             "; ".join(s["models"]), s["budget"] + " per row",
             _seeds_text(s) if len(s.get("seeds") or []) > 1 else "", s["decoding"], f"BLEU {s['bleu']}"]
    return ", ".join(p for p in parts if p) + (". Smoke scale: a pipeline check, not evidence." if s["smoke"] else
                                               ". CPU scale: small, short-trained models." if s.get("scale") == "cpu"
                                               else ".")
