"""The marks of the BLEU column: the test of every row's BLEU against its reference row's (``--test``), Holm's
correction over the comparisons with one reference row (``--correction``), and the legend's sentences on them.
:func:`per_run` (``bootstrap``, ``thesis``) writes ``significance.json`` into each tested run; :func:`pooled_ar`
(``ar``, over seeds) writes ``significance-ar.json`` beside the row's run of its first seed; both reused while their
inputs are the same."""
import hashlib
import json
import os
from typing import Dict, List, Optional

from fairseq_ext.common.data_text import read_lines
from fairseq_ext.reproduce.planning import RunPlan, write_json
from fairseq_ext.reproduce.readers import Record
from fairseq_ext.reproduce.rows import has_test
from fairseq_ext.reproduce.tables import Row, Table
from fairseq_ext.tools.significance import paired_significance
from fairseq_ext.tools.statistics import MARKS, mark, paired_t, seeds_text
from fairseq_ext.tools import statistics


def _digest(paths: List[str]) -> str:
    h = hashlib.sha1()
    for path in paths:
        with open(path, "rb") as f:
            h.update(f.read())
    return h.hexdigest()


def per_run(table: Table, plans: List[RunPlan], test: str = "bootstrap", n_samples: int = 1000,
            seed: int = 12345, rows: Optional[List[Row]] = None) -> Dict[str, dict]:
    """The ``test`` (``bootstrap`` or ``thesis``) of every row's BLEU against its reference row's, per data set, into
    the row's ``significance.json`` (kept for the same test and hypotheses); {run_dir: {...}}."""
    if not any(c.source == "bleu" for c in table.columns):
        return {}
    by_key = {(p.dataset, p.row): p for p in plans}
    rows = rows if rows is not None else [r for r in table.rows if r.runnable]
    groups: Dict[str, tuple] = {}  # reference run -> (its plan, [plans tested against it])
    for row, ref in [(r, table.reference(r)) for r in rows]:
        for dataset in table.datasets if ref is not None else []:
            plan, base = (by_key.get((dataset, table.owner(r).id)) for r in (row, ref))
            if plan is not None and base is not None and plan is not base \
                    and plan not in groups.setdefault(base.run_dir, (base, []))[1]:
                groups[base.run_dir][1].append(plan)
    out = {}
    for base, tested in groups.values():
        ref_file, base_hyp = texts(base.run_dir, base.bleu)
        if not os.path.exists(base_hyp):
            continue
        todo = {}
        for p in tested:
            hyp = texts(p.run_dir, p.bleu)[1]
            if not os.path.exists(hyp):
                continue
            key = {"baseline": base.row, "flavour": base.bleu, "samples": n_samples,
                   "inputs": _digest([ref_file, base_hyp, hyp]), "test": test}
            old = _cached(os.path.join(p.run_dir, "significance.json"), key)
            if old is not None:
                out[p.run_dir] = old
            else:
                todo[p.row] = (p, key)
        if not todo:
            continue
        refs = read_lines(ref_file)
        hyps = {name: read_lines(texts(p.run_dir, p.bleu)[1]) for name, (p, _) in todo.items()}
        if test == "thesis":
            result = _thesis(refs, read_lines(base_hyp), hyps, base.bleu, n_samples, seed, table.marks)
        else:
            result = paired_significance(refs, read_lines(base_hyp), hyps, flavour=base.bleu, method="bs",
                                         n_samples=n_samples, seed=seed, marks=table.marks)
        for name, (p, key) in todo.items():
            out[p.run_dir] = entry = {**key, "baseline_bleu": result["baseline"].get("bleu"), **result[name]}
            write_json(os.path.join(p.run_dir, "significance.json"), entry)
    return out


def _cached(path: str, key: dict) -> Optional[dict]:
    """The JSON record at ``path`` when it holds ``key``'s values (no ``test``: the bootstrap), else None."""
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        old = json.load(f)
    return old if all(old.get(k, "bootstrap" if k == "test" else None) == v for k, v in key.items()) else None


def _thesis(refs, baseline, systems, flavour, n_samples, seed, marks) -> dict:
    """compare-mt's subsample bootstrap of each system against the baseline (sacreBLEU's statistics)."""
    base = statistics.sentence_stats(refs, baseline, flavour)
    out = {"baseline": {"bleu": round(float(statistics.corpus_bleu(base.sum(0))), 2)}}
    for name, hyps in systems.items():
        stats = statistics.sentence_stats(refs, hyps, flavour)
        found = statistics.subsample_bootstrap(base, stats, n_samples, seed=seed)
        out[name] = {"bleu": round(float(statistics.corpus_bleu(stats.sum(0))), 2),
                     "p_value": round(found["p_value"], 4), "mark": statistics.mark(found["p_value"], marks),
                     "better": found["better"], "better_in": found["better_in"]}
    return out


def texts(run_dir: str, flavour: str) -> tuple:
    """The reference and hypothesis files of a run at its BLEU flavour's level (tok or detok)."""
    level = "tok" if flavour.startswith("tok") else "detok"
    return tuple(os.path.join(run_dir, "eval-test", f"{name}.{level}") for name in ("ref", "hyp"))


def pooled_ar(reference: Dict[int, RunPlan], system: Dict[int, RunPlan], shuffles: int = 10000,
              seed: int = 12345, statistic: str = "concatenated") -> dict:
    """The stratified approximate randomization of ``system``'s runs against ``reference``'s (seed ->
    run), with MultEval's s_sel of each, cached; {"missing": why} when a run has no translations."""
    seeds = sorted(set(reference) & set(system))
    files = {}
    for s in seeds:
        for who, plan in (("reference", reference[s]), ("system", system[s])):
            ref_file, hyp_file = texts(plan.run_dir, plan.bleu)
            if not (os.path.exists(ref_file) and os.path.exists(hyp_file)):
                return {"missing": f"seed {s} of the {who} row has no {os.path.relpath(hyp_file, plan.run_dir)}"}
            files[who, s] = (ref_file, hyp_file)
    flavour = system[seeds[0]].bleu
    key = {"reference": reference[seeds[0]].row, "flavour": flavour, "shuffles": shuffles, "seed": seed,
           "statistic": statistic, "shuffle": "multeval", "seeds": seeds,  # not the earlier shuffle's results
           "inputs": _digest([f for pair in files.values() for f in pair])}
    cache = os.path.join(system[seeds[0]].run_dir, "significance-ar.json")
    if (old := _cached(cache, key)) is not None:
        return old
    stats = {who: {s: statistics.sentence_stats(read_lines(files[who, s][0]), read_lines(files[who, s][1]),
                                                      flavour) for s in seeds} for who in ("reference", "system")}
    result = statistics.stratified_ar(stats["reference"], stats["system"], shuffles, seed, statistic)
    result.update({f"s_sel_{who}": statistics.selection_sd(stats[who], seed=seed) for who in stats})
    write_json(cache, {**key, **result})
    return {**key, **result}


TESTS = ("bootstrap", "thesis", "ar")
CORRECTIONS = ("none", "holm")


def test_text(test: str, several: bool, samples: int, shuffles: int, statistic: str = "concatenated") -> str:
    """What the BLEU column's marks come from, a clause of the legend."""
    if test == "ar":
        what = ("the difference of the corpus BLEU of each row's runs concatenated (MultEval's)"
                if statistic == "concatenated" else
                "the difference of the mean over seeds of per-run corpus BLEU (--ar-statistic mean; not MultEval's)")
        return (f"stratified approximate randomization (Clark et al. 2011, as MultEval runs it; {shuffles} shuffles) "
                "of the row against its reference row (column 'vs') over the seeds both ran: each shuffle, as "
                "MultEval's, makes two pseudo-rows of the two rows' translations of every sentence of every seed, "
                "exchanged with probability 0.5 and permuted at random across the seeds sentence by sentence (the "
                f"second pseudo-row by the inverse permutation); the statistic is {what} (same flavour), two-sided, "
                "p = (c + 1) / (shuffles + 1), c: the shuffles with a larger |difference| (p = 1 for no difference)")
    if test == "thesis":
        text = (f"compare-mt's paired bootstrap as the thesis ran it ({samples} subsamples of half the sentences, "
                "one-sided: p = 1 - the share of subsamples in which the better row wins; sacreBLEU's BLEU in the "
                "table's flavour) of the row's BLEU against its reference row's (column 'vs')")
    else:
        text = (f"sacreBLEU paired bootstrap ({samples} samples, two-sided, full-size resamples) of the row's BLEU "
                "against its reference row's (column 'vs'), same flavour")
    if several:
        text += ("; over seeds a mark only where this test is significant at every seed with one sign of the "
                 "difference (an intersection-union test, fairseq_ext.tools.statistics), p_max its largest p")
    return text


def test_name(test: str, several: bool) -> str:
    """The test's short name (the JSON's ``test_name``, the LaTeX caption)."""
    name = {"bootstrap": "sacreBLEU paired bootstrap", "thesis": "compare-mt subsample bootstrap (the thesis')",
            "ar": "stratified approximate randomization"}[test]
    return name + (" at every seed" if several and test != "ar" else "")


def _bleu_column(table: Table):
    return next((c for c in table.columns if c.source == "bleu" and has_test(c)), None)


def mark_pooled(table: Table, records: List[Record], by_seed: Dict[int, List[RunPlan]], shuffles: int,
                seed: int = 12345, statistic: str = "concatenated") -> None:
    """Every row's BLEU mark from the stratified approximate randomization over the seeds it counts."""
    col = _bleu_column(table)
    if col is None:
        return
    plans = {(s, p.dataset, p.row): p for s, ps in by_seed.items() for p in ps}
    for record in records:
        if record["cited"] or not record["reference"] or record["status"] != "done":
            continue
        row, ref = table.row(record["row"]), table.row(record["reference"])
        pairs = {s: (plans.get((s, record["dataset"], table.owner(ref).id)),
                     plans.get((s, record["dataset"], table.owner(row).id)))
                 for s in record.get("seeds_counted", list(by_seed))}
        pairs = {s: pair for s, pair in pairs.items() if None not in pair and pair[0] is not pair[1]}
        if not pairs:
            continue
        found = pooled_ar({s: a for s, (a, _) in pairs.items()}, {s: b for s, (_, b) in pairs.items()}, shuffles,
                          seed, statistic)
        cell = record["columns"][col.name]
        if "missing" in found:
            why = f"no stratified approximate randomization ({found['missing']})"
            cell.update(mark="", p_value=None, rule=f"no mark: {why}.")
            record["missing"].append(f"{col.name}: {why}")
            record["mark"], record["p_value"], record["rule"] = cell["mark"], cell["p_value"], cell.get("rule")
            continue
        p, runs = found["p_value"], found["runs"]
        cell.update(mark=mark(p, table.marks), p_value=round(p, 4), tested_seeds=runs,
                    ar={k: found[k] for k in ("runs", "shuffles", "seed", "statistic", "delta", "count",
                                              "reference_concatenated", "system_concatenated", "reference_mean",
                                              "system_mean", "s_dev_reference", "s_dev_system", "s_sel_reference",
                                              "s_sel_system")})
        if len(runs) > 1:  # JSON made the seeds strings
            bleu = [{int(k): v for k, v in found[f"{who}_bleu"].items()} for who in ("reference", "system")]
            cell["p_t"] = paired_t(*([b[s] for s in runs] for b in bleu))
        cell["rule"] = (f"{cell['mark'] or 'no mark'}: stratified approximate randomization over {seeds_text(runs)} "
                        f"({shuffles} shuffles): Δ of the {statistic} BLEU {found['delta']:+.2f}, p = {p:.4g}.")
        record["p_t"] = cell.get("p_t")
        record["mark"], record["p_value"], record["rule"] = cell["mark"], cell["p_value"], cell.get("rule")


def label(table: Table, records: List[Record], test: str, several: bool, shuffles: int,
          correction: str, statistic: str = "concatenated") -> None:
    """The test behind the BLEU marks (``test``, ``test_name``, ``shuffles``, ``ar_statistic``,
    ``correction``) on every tested record and its BLEU cell, the number of rows tested against
    its reference row (``comparisons``) and with ``holm`` ``p_holm`` and a mark as strong as it allows."""
    col = _bleu_column(table)
    if col is None:
        return
    for record in records:
        if record["reference"] and not record["cited"]:
            info = {"test": test, "test_name": test_name(test, several), "correction": correction}
            if test == "ar":
                info.update(shuffles=shuffles, ar_statistic=statistic)
            record.update(info)
            record["columns"][col.name].update(info)
    families: Dict[tuple, List[Record]] = {}
    for r in records:
        if r["reference"] and not r["cited"] and r["columns"][col.name].get("p_value") is not None:
            families.setdefault((r["dataset"], r["reference"]), []).append(r)
    for family in families.values():
        adjusted = statistics.holm([r["columns"][col.name]["p_value"] for r in family])
        for r, p in zip(family, adjusted):
            cell = r["columns"][col.name]
            cell["comparisons"] = len(family)
            if correction == "holm":
                cell["p_holm"] = round(p, 4)
                cell["mark"] = r["mark"] = _weaker(cell.get("mark", ""), mark(p, table.marks), table.marks)


def _weaker(a: str, b: str, marks: str) -> str:
    strength = {m: i for i, (_, m) in enumerate(MARKS[marks])}
    return "" if not a or not b else a if strength[a] >= strength[b] else b


def comparisons_text(table: Table, records: List[Record], correction: str) -> Optional[str]:
    """The legend's sentence on how many rows are tested against each reference row."""
    col = _bleu_column(table)
    if col is None:
        return None
    counts = {f"{r['reference_label']} ({r['dataset']})": r["columns"][col.name]["comparisons"] for r in records
              if r["columns"][col.name].get("comparisons")}
    if not counts:
        return None
    listed = "; ".join(f"{n} against {name}" for name, n in counts.items())
    if correction == "holm":
        return f"Comparisons: {listed}; marks Holm-corrected within each (p_holm: the adjusted p; --correction holm)."
    return (f"Comparisons: {listed}; marks not corrected for multiplicity (--correction holm corrects them, "
            "Holm's step-down method within each).")
