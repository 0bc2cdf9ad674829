"""The tests of every row's BLEU against its reference row's, with the table's BLEU flavour and
its paper's marks (:mod:`fairseq_ext.reproduce.marks` puts them on the table).

- :func:`per_run`: per data set and seed, sacreBLEU's paired bootstrap (``bootstrap``) or
  compare-mt's subsample bootstrap as the thesis ran it (``thesis``), written into the tested
  row's run directory as ``significance.json`` and reused while its inputs are the same.
- :func:`pooled_ar`: the stratified approximate randomization over every seed a row shares
  with its reference row (``ar``), written as ``significance-ar.json`` beside the row's run
  of its first seed and reused the same way."""
import hashlib
import json
import os
from typing import Dict, List, Optional

from fairseq_ext.common.data_text import read_lines
from fairseq_ext.reproduce.planning import RunPlan
from fairseq_ext.reproduce.tables import Row, Table
from fairseq_ext.tools import statistics
from fairseq_ext.tools.significance import paired_significance

FLAVOUR_FILES = {"detok": ("hyp.detok", "ref.detok"), "tok": ("hyp.tok", "ref.tok")}


def _digest(paths: List[str]) -> str:
    h = hashlib.sha1()
    for path in paths:
        with open(path, "rb") as f:
            h.update(f.read())
    return h.hexdigest()


def per_run(table: Table, plans: List[RunPlan], test: str = "bootstrap", n_samples: int = 1000,
            seed: int = 12345, rows: Optional[List[Row]] = None) -> Dict[str, dict]:
    """The ``test`` (``bootstrap`` or ``thesis``) of the BLEU of every row against its reference
    row (``compare_with``, else the baseline), per data set, with the table's BLEU flavour;
    writes ``significance.json`` into the row's run directory (skipped when one of the same
    test on the same hypotheses is there) and returns {run_dir: {...}}."""
    if not any(c.source == "bleu" for c in table.columns):
        return {}
    by_key = {(p.dataset, p.row): p for p in plans}
    rows = rows if rows is not None else [r for r in table.rows if r.runnable]
    groups: Dict[str, tuple] = {}  # reference run -> (its plan, [plans tested against it])
    for row in rows:
        ref = table.reference(row)
        if ref is None:
            continue
        for dataset in table.datasets:
            plan = by_key.get((dataset, table.owner(row).id))
            base = by_key.get((dataset, table.owner(ref).id))
            if plan is None or base is None or plan is base:
                continue
            entry = groups.setdefault(base.run_dir, (base, []))
            if plan not in entry[1]:
                entry[1].append(plan)
    out = {}
    for base, tested in groups.values():
        level = "tok" if base.bleu.startswith("tok") else "detok"
        hyp_name, ref_name = FLAVOUR_FILES[level]
        base_dir = os.path.join(base.run_dir, "eval-test")
        if not os.path.exists(os.path.join(base_dir, hyp_name)):
            continue
        todo = {}
        for p in tested:
            hyp = os.path.join(p.run_dir, "eval-test", hyp_name)
            if not os.path.exists(hyp):
                continue
            digest = _digest([os.path.join(base_dir, ref_name), os.path.join(base_dir, hyp_name), hyp])
            known = os.path.join(p.run_dir, "significance.json")
            if os.path.exists(known):
                with open(known, encoding="utf-8") as f:
                    old = json.load(f)
                if (old.get("baseline"), old.get("flavour"), old.get("samples"), old.get("inputs"),
                        old.get("test", "bootstrap")) == (base.row, base.bleu, n_samples, digest, test):
                    out[p.run_dir] = old
                    continue
            todo[p.row] = (p, digest)
        if not todo:
            continue
        refs = read_lines(os.path.join(base_dir, ref_name))
        hyps = {name: read_lines(os.path.join(p.run_dir, "eval-test", hyp_name)) for name, (p, _) in todo.items()}
        run_test = _thesis if test == "thesis" else _bootstrap
        result = run_test(refs, read_lines(os.path.join(base_dir, hyp_name)), hyps, base.bleu, n_samples, seed,
                          table.marks)
        for name, (p, digest) in todo.items():
            entry = {"baseline": base.row, "flavour": base.bleu, "samples": n_samples, "inputs": digest,
                     "test": test, "baseline_bleu": result["baseline"].get("bleu"), **result[name]}
            out[p.run_dir] = entry
            with open(os.path.join(p.run_dir, "significance.json"), "w", encoding="utf-8") as f:
                json.dump(entry, f, indent=1)
    return out


def _bootstrap(refs, baseline, systems, flavour, n_samples, seed, marks) -> dict:
    return paired_significance(refs, baseline, systems, flavour=flavour, method="bs", n_samples=n_samples,
                               seed=seed, marks=marks)


def _thesis(refs, baseline, systems, flavour, n_samples, seed, marks) -> dict:
    """compare-mt's subsample bootstrap (:func:`statistics.subsample_bootstrap`) of each
    system against the baseline, on sacreBLEU's statistics in ``flavour``."""
    base = statistics.sentence_stats(refs, baseline, flavour)
    out = {"baseline": {"bleu": round(float(statistics.corpus_bleu(base.sum(0))), 2)}}
    for name, hyps in systems.items():
        stats = statistics.sentence_stats(refs, hyps, flavour)
        found = statistics.subsample_bootstrap(base, stats, n_samples, seed=seed)
        out[name] = {"bleu": round(float(statistics.corpus_bleu(stats.sum(0))), 2),
                     "p_value": round(found["p_value"], 4), "mark": statistics.mark(found["p_value"], marks),
                     "better": found["better"], "better_in": found["better_in"]}
    return out


def _texts(plan: RunPlan) -> tuple:
    """The reference and hypothesis files of a run in its BLEU flavour's level."""
    hyp_name, ref_name = FLAVOUR_FILES["tok" if plan.bleu.startswith("tok") else "detok"]
    where = os.path.join(plan.run_dir, "eval-test")
    return os.path.join(where, ref_name), os.path.join(where, hyp_name)


def pooled_ar(reference: Dict[int, RunPlan], system: Dict[int, RunPlan], shuffles: int = 10000,
              seed: int = 12345, statistic: str = "concatenated") -> dict:
    """The stratified approximate randomization of ``system``'s runs against ``reference``'s
    (seed -> run of the same seed; :func:`statistics.stratified_ar`), with MultEval's
    s_sel of each; cached in ``significance-ar.json`` of the system's run of its first seed.
    Returns the result, or {"missing": why} when a run has no translations."""
    seeds = sorted(set(reference) & set(system))
    files = {}
    for s in seeds:
        for who, plan in (("reference", reference[s]), ("system", system[s])):
            ref_file, hyp_file = _texts(plan)
            if not (os.path.exists(ref_file) and os.path.exists(hyp_file)):
                return {"missing": f"seed {s} of the {who} row has no {os.path.relpath(hyp_file, plan.run_dir)}"}
            files[who, s] = (ref_file, hyp_file)
    flavour = system[seeds[0]].bleu
    key = {"reference": reference[seeds[0]].row, "flavour": flavour, "shuffles": shuffles, "seed": seed,
           "statistic": statistic, "seeds": seeds, "inputs": _digest([f for pair in files.values() for f in pair])}
    cache = os.path.join(system[seeds[0]].run_dir, "significance-ar.json")
    if os.path.exists(cache):
        with open(cache, encoding="utf-8") as f:
            old = json.load(f)
        if all(old.get(k) == v for k, v in key.items()):
            return old
    stats = {who: {s: statistics.sentence_stats(read_lines(files[who, s][0]), read_lines(files[who, s][1]),
                                                      flavour) for s in seeds} for who in ("reference", "system")}
    result = statistics.stratified_ar(stats["reference"], stats["system"], shuffles, seed, statistic)
    result.update({f"s_sel_{who}": statistics.selection_sd(stats[who], seed=seed) for who in stats})
    entry = {**key, **result}
    with open(cache, "w", encoding="utf-8") as f:
        json.dump(entry, f, indent=1)
    return entry
