"""The paired bootstrap of every row's BLEU against its reference row's (sacreBLEU's, with the
table's BLEU flavour and its paper's marks), per data set and seed, written into the tested
row's run directory as ``significance.json`` and reused while its inputs are the same."""
import hashlib
import json
import os
from typing import Dict, List, Optional

from fairseq_ext.common.data_text import read_lines
from fairseq_ext.reproduce.planning import RunPlan
from fairseq_ext.reproduce.tables import Row, Table
from fairseq_ext.tools.significance import paired_significance

FLAVOUR_FILES = {"detok": ("hyp.detok", "ref.detok"), "tok": ("hyp.tok", "ref.tok")}


def _digest(paths: List[str]) -> str:
    h = hashlib.sha1()
    for path in paths:
        with open(path, "rb") as f:
            h.update(f.read())
    return h.hexdigest()


def bootstrap(table: Table, plans: List[RunPlan], n_samples: int = 1000, seed: int = 12345,
              rows: Optional[List[Row]] = None) -> Dict[str, dict]:
    """Paired bootstrap of the BLEU of every row against its reference row (``compare_with``,
    else the baseline), per data set, with the table's BLEU flavour; writes
    ``significance.json`` into the row's run directory (skipped when one of the same test on
    the same hypotheses is there) and returns {run_dir: {...}}."""
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
                if (old.get("baseline"), old.get("flavour"), old.get("samples"), old.get("inputs")) == \
                        (base.row, base.bleu, n_samples, digest):
                    out[p.run_dir] = old
                    continue
            todo[p.row] = (p, digest)
        if not todo:
            continue
        refs = read_lines(os.path.join(base_dir, ref_name))
        result = paired_significance(refs, read_lines(os.path.join(base_dir, hyp_name)),
                                     {name: read_lines(os.path.join(p.run_dir, "eval-test", hyp_name))
                                      for name, (p, _) in todo.items()},
                                     flavour=base.bleu, method="bs", n_samples=n_samples, seed=seed,
                                     marks=table.marks)
        for name, (p, digest) in todo.items():
            entry = {"baseline": base.row, "flavour": base.bleu, "samples": n_samples, "inputs": digest,
                     "baseline_bleu": result["baseline"].get("bleu"), **result[name]}
            out[p.run_dir] = entry
            with open(os.path.join(p.run_dir, "significance.json"), "w", encoding="utf-8") as f:
                json.dump(entry, f, indent=1)
    return out
