"""The papers' results tables as configured in ``configs/tables/``: data sets, trainings,
tables and their rows, and the plan of commands that reproduces one row on one data set.

``configs/tables/setups.yaml`` holds the data sets (recipe, local copies, substitute) and the
trainings (fairseq-train config, generate arguments, checkpoint averaging); each
``configs/tables/<id>.yaml`` holds one table: its data sets, the baseline row, and per row
the flags and the paper's printed numbers. This module only reads and checks them.
"""
import os
import shlex
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import yaml

from fairseq_ext.errors import FairseqExtError

from fairseq_ext.resources import TABLE_DIR as CONFIG_DIR

# metrics the runner measures itself (everything else comes from an analysis command)
MEASURED = ("BLEU", "#Params", "Train (steps/s)", "Decode")


class TableConfigError(FairseqExtError):
    pass


@dataclass
class Row:
    id: str
    label: str
    flags: List[str]  # empty for cited systems
    cited: Optional[str]
    paper: Dict[str, Dict[str, str]]  # dataset -> metric -> printed
    note: str = ""
    group: str = ""
    params_check: str = ""  # why the printed #Params is known not to match (fairseq_ext.reproduce.params)
    multi_source: bool = False  # reads every source of a multi-source data set (--task multi_source_translation)

    @property
    def runnable(self) -> bool:
        return self.cited is None


@dataclass
class Table:
    id: str
    paper: str
    source: str
    caption: str
    datasets: Dict[str, dict]  # key -> {task, bleu, training}
    baseline: Optional[str]
    metrics: List[str]
    rows: List[Row]
    analyses: List[str] = field(default_factory=list)
    path: str = ""
    adversarial: str = ""  # "extra" | "all": the sources replaced in turn (multi-source paper, Table 2)

    def row(self, row_id: str) -> Row:
        for r in self.rows:
            if r.id == row_id:
                return r
        raise TableConfigError(f"{self.id}: no row {row_id!r} (rows: {', '.join(r.id for r in self.rows)})")

    def select(self, spec: Optional[str]) -> List[Row]:
        """Rows named in ``spec`` (comma list of ids or labels; default: every own row),
        with the baseline added when it is not among them (significance needs it)."""
        own = [r for r in self.rows if r.runnable]
        if not spec:
            return own
        wanted = []
        for name in [s.strip() for s in spec.split(",") if s.strip()]:
            match = [r for r in self.rows if name in (r.id, r.label)]
            if not match:
                raise TableConfigError(f"--rows: {self.id} has no row {name!r} "
                                       f"(rows: {', '.join(r.id for r in own)})")
            if not match[0].runnable:
                raise TableConfigError(f"--rows: {name!r} of {self.id} is a number quoted from another paper")
            wanted.append(match[0])
        if self.baseline and self.baseline not in [r.id for r in wanted]:
            wanted.insert(0, self.row(self.baseline))
        return wanted


def _read_yaml(path):
    try:
        with open(path, encoding="utf-8") as f:
            return yaml.safe_load(f)
    except (OSError, yaml.YAMLError) as e:
        raise TableConfigError(f"{path}: {e}") from None


def load_setups(config_dir: str = CONFIG_DIR) -> dict:
    setups = _read_yaml(os.path.join(config_dir, "setups.yaml"))
    for key in ("datasets", "trainings", "smoke"):
        if key not in setups:
            raise TableConfigError(f"{config_dir}/setups.yaml: no '{key}' section")
    for name, ds in setups["datasets"].items():
        sub = ds.get("substitute")
        if sub is not None and sub not in setups["datasets"]:
            raise TableConfigError(f"setups.yaml: data set {name}: substitute {sub!r} is not a data set")
        if ds.get("recipe") is None and sub is None:
            raise TableConfigError(f"setups.yaml: data set {name} has neither a recipe nor a substitute")
    return setups


def table_ids(config_dir: str = CONFIG_DIR) -> List[str]:
    names = [f[:-5] for f in os.listdir(config_dir) if f.endswith(".yaml") and f != "setups.yaml"]

    def order(name):
        prefix, _, number = name.partition("-")
        papers = ["thesis", "mlmha", "mma", "ms", "wt"]
        parts = [int(p) if p.isdigit() else p for p in number.split(".")]
        return (papers.index(prefix) if prefix in papers else len(papers), parts)

    return sorted(names, key=order)


def load_table(table_id: str, config_dir: str = CONFIG_DIR, setups: Optional[dict] = None) -> Table:
    """A table of configs/tables by id, or any table file by path (e.g. configs/benchmarks/*.yaml)."""
    if table_id.endswith(".yaml") and os.path.exists(table_id):
        path = table_id
        table_id = os.path.basename(table_id)[:-5]
    else:
        path = os.path.join(config_dir, f"{table_id}.yaml")
    if not os.path.exists(path):
        raise TableConfigError(f"no table {table_id!r} (configs/tables/{table_id}.yaml); "
                               f"tables: {', '.join(table_ids(config_dir))}")
    raw = _read_yaml(path)
    setups = setups if setups is not None else load_setups(config_dir)
    rows = []
    for r in raw.get("rows", []):
        flags = shlex.split(r.get("flags", "") or "")
        rows.append(Row(id=str(r["id"]), label=str(r.get("label", r["id"])), flags=flags, cited=r.get("cited"),
                        paper=r.get("paper") or {}, note=r.get("note", ""), group=r.get("group", ""),
                        params_check=r.get("params_check", ""), multi_source=bool(r.get("multi_source", False))))
    table = Table(id=raw["id"], paper=raw.get("paper", ""), source=raw.get("source", ""),
                  caption=raw.get("caption", ""), datasets=raw["datasets"], baseline=raw.get("baseline"),
                  metrics=raw.get("metrics", []), rows=rows, analyses=raw.get("analyses", []), path=path,
                  adversarial=raw.get("adversarial", ""))
    if table.id != table_id:
        raise TableConfigError(f"{path}: id {table.id!r} differs from the file name")
    for key, ds in table.datasets.items():
        data = ds.get("data", key)
        if data not in setups["datasets"]:
            raise TableConfigError(f"{path}: data set {data!r} is not in setups.yaml")
        if any(r.multi_source for r in rows) and not setups["datasets"][data].get("sources"):
            raise TableConfigError(f"{path}: rows read several sources but data set {data} has no 'sources'")
        if ds.get("training") not in setups["trainings"]:
            raise TableConfigError(f"{path}: data set {key}: training {ds.get('training')!r} is not in setups.yaml")
        if ds.get("bleu") not in ("detok-cased", "detok-lc", "tok-cased", "tok-lc"):
            raise TableConfigError(f"{path}: data set {key}: bleu {ds.get('bleu')!r} is not a flavour")
    ids = [r.id for r in rows]
    if len(set(ids)) != len(ids):
        raise TableConfigError(f"{path}: duplicate row ids")
    if table.baseline is not None and table.baseline not in ids:
        raise TableConfigError(f"{path}: baseline {table.baseline!r} is not a row")
    for r in rows:
        if r.runnable and "--arch" not in r.flags:
            raise TableConfigError(f"{path}: row {r.id} has no --arch in its flags")
    return table


def load_tables(config_dir: str = CONFIG_DIR) -> List[Table]:
    setups = load_setups(config_dir)
    return [load_table(t, config_dir, setups) for t in table_ids(config_dir)]
