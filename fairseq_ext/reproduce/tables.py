"""The papers' results tables as configured in ``configs/tables/``: data sets, trainings,
tables, their printed columns and rows, read and checked.

``configs/tables/setups.yaml`` holds the data sets (recipe, local copies, substitute) and the
trainings (fairseq-train config, generate arguments, checkpoint averaging); each
``configs/tables/<id>.yaml`` holds one table: its data sets, the baseline row, its columns
(``columns:``: per printed column, where our number comes from) and per row the flags, the
row it is compared with and the paper's printed numbers. This module only reads and checks
them; every error names the file, the row or column, and the key.

A table's columns and what they read are :mod:`fairseq_ext.reproduce.columns`. A row may
carry ``compare_with`` (the row its delta and significance are against; default the table's
baseline), ``model`` (another row whose trained model it reports on: the rows of an analysis
of one model, such as the layers of the word-translation paper's Table 1) and ``analysis``
(parameters of its analysis columns that differ per row, such as the layer).
"""
import os
import shlex
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import yaml

from fairseq_ext.reproduce.columns import SOURCES, Column, TableConfigError, check_params, read_columns, with_chrf
from fairseq_ext.resources import CONFIG_DIR as SHIPPED_CONFIG_DIR
from fairseq_ext.resources import TABLE_DIR as CONFIG_DIR
from fairseq_ext.tools.statistics import MARKS

TABLE_KEYS = {"id", "paper", "source", "caption", "datasets", "baseline", "columns", "metrics", "rows",
              "paper_significance", "paper_notes", "adversarial", "analysis_args"}
ROW_KEYS = {"id", "label", "group", "cited", "flags", "paper", "note", "paper_note", "params_check",
            "multi_source", "compare_with", "model", "analysis", "ours_only"}


@dataclass
class Row:
    id: str
    label: str
    flags: List[str]  # empty for cited systems
    cited: Optional[str]
    paper: Dict[str, Dict[str, str]]  # dataset -> column -> printed
    note: str = ""
    group: str = ""
    params_check: str = ""  # why the printed #Params is known not to match (fairseq_ext.reproduce.params)
    multi_source: bool = False  # reads every source of a multi-source data set (--task multi_source_translation)
    compare_with: Optional[str] = None  # the row of its delta and significance (default: the table's baseline)
    model: Optional[str] = None  # the row whose trained model this row reports on (default: its own)
    analysis: Dict[str, object] = field(default_factory=dict)  # per-row parameters of the analysis columns
    ours_only: bool = False  # a reference row of ours that the paper does not print (no paper numbers)

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
    columns: List[Column]
    rows: List[Row]
    path: str = ""
    adversarial: str = ""  # "extra" | "all": the sources replaced in turn (multi-source paper, Table 2)
    analysis_args: Dict[str, str] = field(default_factory=dict)  # analysis -> more arguments of its command
    paper_significance: str = ""

    @property
    def metrics(self) -> List[str]:
        """The printed columns, in the paper's order."""
        return [c.name for c in self.columns if c.printed]

    @property
    def analyses(self) -> List[str]:
        """The analysis commands the columns read (fairseq_ext.analysis.NAME), in column order."""
        return list(dict.fromkeys(c.analysis for c in self.columns if c.analysis))

    @property
    def marks(self) -> str:
        """The significance marks of the table's paper (a key of
        :data:`fairseq_ext.tools.statistics.MARKS`): the paper its id names ("mma-3"), else
        the thesis' marks."""
        paper = self.id.split("-")[0]
        return paper if paper in MARKS else "thesis"

    @property
    def marks_are_the_papers(self) -> bool:
        """Whether :attr:`marks` are the ones this table prints: not for a paper without marks
        (the multi-source paper's tables get the thesis' marks), nor for a table its paper
        prints without any (``paper_significance: none...``, ``± values printed``)."""
        printed = (self.paper_significance or "").strip()
        return self.id.split("-")[0] in MARKS and not printed.startswith(("none", "±"))

    def column(self, name: str) -> Column:
        for c in self.columns:
            if c.name == name:
                return c
        raise TableConfigError(f"{self.id}: no column {name!r}")

    def row(self, row_id: str) -> Row:
        for r in self.rows:
            if r.id == row_id:
                return r
        raise TableConfigError(f"{self.id}: no row {row_id!r} (rows: {', '.join(r.id for r in self.rows)})")

    def reference(self, row: Row) -> Optional[Row]:
        """The row ``row`` is compared with: its ``compare_with``, else the baseline (None for
        the baseline itself, for a row that reports on the reference's own model measured the
        same way, such as thesis-4.6's second baseline row, and in a table without a baseline;
        rows on the layers of one model, wt-2's, compare as configured)."""
        if row.compare_with:
            reference = self.row(row.compare_with)
        elif self.baseline and row.id != self.baseline and row.runnable:
            reference = self.row(self.baseline)
        else:
            return None
        if self.owner(reference).id == self.owner(row).id and reference.analysis == row.analysis:
            return None  # one model measured alike: a difference of 0, a test of a system against itself
        return reference

    def owner(self, row: Row) -> Row:
        """The row whose training ``row`` reports on (itself unless it names a ``model``)."""
        return self.row(row.model) if row.model else row

    def named(self, spec: str) -> List[Row]:
        """The own rows named in ``spec`` (comma list of ids or labels)."""
        own = [r for r in self.rows if r.runnable]
        wanted = []
        for name in [s.strip() for s in spec.split(",") if s.strip()]:
            match = [r for r in self.rows if name in (r.id, r.label)]
            if not match:
                raise TableConfigError(f"--rows: {self.id} has no row {name!r} "
                                       f"(rows: {', '.join(r.id for r in own)})")
            if not match[0].runnable:
                raise TableConfigError(f"--rows: {name!r} of {self.id} is a number quoted from another paper")
            wanted.append(match[0])
        return wanted

    def select(self, spec: Optional[str]) -> List[Row]:
        """Rows named in ``spec`` (comma list of ids or labels; default: every own row), with
        the rows they need added: the baseline, each row's reference row (delta, significance)
        and the row whose model it reports on."""
        if not spec:
            return [r for r in self.rows if r.runnable]
        wanted = self.named(spec)
        needed = [self.row(self.baseline)] if self.baseline else []
        for r in list(wanted):
            ref = self.reference(r)
            needed += ([ref] if ref is not None and ref.runnable else []) + [self.owner(r)]
        chosen = {r.id for r in wanted + needed}
        return [r for r in self.rows if r.id in chosen]  # in the table's order


def _read_yaml(path):
    try:
        with open(path, encoding="utf-8") as f:
            return yaml.safe_load(f)
    except (OSError, yaml.YAMLError) as e:
        raise TableConfigError(f"{path}: {e}") from None


def load_setups(config_dir: str = CONFIG_DIR) -> dict:
    setups = _read_yaml(os.path.join(config_dir, "setups.yaml"))
    for key in ("datasets", "trainings", "smoke", "cpu"):
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





def _row(r: dict, path: str, strict: bool = True) -> Row:
    if not isinstance(r, dict) or "id" not in r:
        raise TableConfigError(f"{path}: a row without an 'id'")
    for key in r:
        if strict and key not in ROW_KEYS:
            raise TableConfigError(f"{path}: row {r['id']}: unknown key {key!r} ({', '.join(sorted(ROW_KEYS))})")
    analysis = r.get("analysis") or {}
    if not isinstance(analysis, dict):
        raise TableConfigError(f"{path}: row {r['id']}: 'analysis' must be a mapping of column parameters")
    return Row(id=str(r["id"]), label=str(r.get("label", r["id"])), flags=shlex.split(r.get("flags", "") or ""),
               cited=r.get("cited"), paper=r.get("paper") or {}, note=r.get("note", ""), group=r.get("group", ""),
               params_check=r.get("params_check", ""), multi_source=bool(r.get("multi_source", False)),
               compare_with=r.get("compare_with"), model=r.get("model"), analysis=dict(analysis),
               ours_only=bool(r.get("ours_only", False)))


def _check_rows(table: Table, path: str) -> None:
    ids = [r.id for r in table.rows]
    if len(set(ids)) != len(ids):
        raise TableConfigError(f"{path}: duplicate row ids")
    if table.baseline is not None and table.baseline not in ids:
        raise TableConfigError(f"{path}: baseline {table.baseline!r} is not a row")
    names = {c.name for c in table.columns}
    analysis_params = {p for c in table.columns for p in SOURCES[c.source].params}
    for r in table.rows:
        where = f"row {r.id}"
        if r.runnable and "--arch" not in r.flags:
            raise TableConfigError(f"{path}: {where} has no --arch in its flags")
        for dataset, cells in r.paper.items():
            if dataset not in table.datasets:
                raise TableConfigError(f"{path}: {where}: paper: {dataset!r} is not a data set of the table")
            for name in cells:
                if name not in names:
                    raise TableConfigError(f"{path}: {where}: paper: {dataset}: {name!r} is not a column "
                                           f"(columns: {', '.join(sorted(names))})")
        if r.compare_with is not None:
            if r.compare_with not in ids:
                raise TableConfigError(f"{path}: {where}: compare_with {r.compare_with!r} is not a row")
            if r.compare_with == r.id:
                raise TableConfigError(f"{path}: {where}: compare_with names the row itself")
        if r.model is not None:
            if r.model not in ids:
                raise TableConfigError(f"{path}: {where}: model {r.model!r} is not a row")
            owner = table.row(r.model)
            if owner.model is not None or not owner.runnable or not r.runnable:
                raise TableConfigError(f"{path}: {where}: model {r.model!r} must be an own row that trains its "
                                       "own model")
            if owner.flags != r.flags:
                raise TableConfigError(f"{path}: {where}: model {r.model!r} has other flags: a row reports on "
                                       "another row's model only when both are the same model")
        for key in r.analysis:
            if key not in analysis_params:
                raise TableConfigError(f"{path}: {where}: analysis: {key!r} is not a parameter of the table's "
                                       f"columns ({', '.join(sorted(analysis_params)) or 'none'})")
        if r.runnable:
            for c in table.columns:
                check_params(where, c, c.at(r), path)
    for c in table.columns:
        for key in ("of", "against_column"):
            if key in c.params and c.params[key] not in names:
                raise TableConfigError(f"{path}: column {c.name!r}: {key} {c.params[key]!r} is not a column")
    printed = {name for r in table.rows for cells in r.paper.values() for name in cells}
    for c in table.columns:
        if c.printed and c.name not in printed and table.rows and any(r.paper for r in table.rows):
            raise TableConfigError(f"{path}: column {c.name!r}: no row prints a number in it "
                                   "(a column of ours only: 'printed: false')")


def shipped_table_file(path: str) -> str:
    """A table file by path; ``configs/...`` (as docs write it, e.g. configs/benchmarks/cpu-multi30k.yaml)
    is also found in the installed package when there is no such file here."""
    if os.path.exists(path):
        return path
    parts = os.path.normpath(path).split(os.sep)
    if parts[0] == "configs" and len(parts) > 1:
        shipped = os.path.join(SHIPPED_CONFIG_DIR, *parts[1:])
        if os.path.exists(shipped):
            return shipped
    raise TableConfigError(f"no table file {path} (a path, or configs/... of the package: "
                           f"{', '.join(_shipped_files())})")


def _shipped_files() -> List[str]:
    out = []
    for sub in sorted(os.listdir(SHIPPED_CONFIG_DIR)):
        full = os.path.join(SHIPPED_CONFIG_DIR, sub)
        if os.path.isdir(full) and sub != "tables":
            out += [f"configs/{sub}/{f}" for f in sorted(os.listdir(full)) if f.endswith(".yaml")]
    return out


def load_table(table_id: str, config_dir: str = CONFIG_DIR, setups: Optional[dict] = None) -> Table:
    """A table of configs/tables by id, or any table file by path (e.g. configs/benchmarks/*.yaml)."""
    if table_id.endswith(".yaml"):
        path = shipped_table_file(table_id)
        table_id = os.path.basename(table_id)[:-5]
    else:
        path = os.path.join(config_dir, f"{table_id}.yaml")
    if not os.path.exists(path):
        raise TableConfigError(f"no table {table_id!r} (configs/tables/{table_id}.yaml); "
                               f"tables: {', '.join(table_ids(config_dir))}")
    raw = _read_yaml(path)
    if not isinstance(raw, dict) or "id" not in raw or "datasets" not in raw:
        raise TableConfigError(f"{path}: expected a mapping with 'id', 'datasets' and 'rows'")
    # a file in the older form (`metrics:` instead of `columns:`) is read as before: unknown
    # keys of it are ignored
    strict = "columns" in raw
    for key in raw:
        if strict and key not in TABLE_KEYS:
            raise TableConfigError(f"{path}: unknown key {key!r} ({', '.join(sorted(TABLE_KEYS))})")
    setups = setups if setups is not None else load_setups(config_dir)
    rows = [_row(r, path, strict) for r in raw.get("rows", [])]
    analysis_args = raw.get("analysis_args") or {}
    table = Table(id=raw["id"], paper=raw.get("paper", ""), source=raw.get("source", ""),
                  caption=raw.get("caption", ""), datasets=raw["datasets"], baseline=raw.get("baseline"),
                  columns=with_chrf(read_columns(raw, path)), rows=rows, path=path, adversarial=raw.get("adversarial", ""),
                  analysis_args={k: str(v) for k, v in analysis_args.items()},
                  paper_significance=str(raw.get("paper_significance", "") or ""))
    if table.id != table_id:
        raise TableConfigError(f"{path}: id {table.id!r} differs from the file name")
    for name in table.analysis_args:
        if name not in table.analyses:
            raise TableConfigError(f"{path}: analysis_args: {name!r} is not an analysis of the table's columns "
                                   f"({', '.join(table.analyses) or 'none'})")
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
    _check_rows(table, path)
    return table


def load_tables(config_dir: str = CONFIG_DIR) -> List[Table]:
    setups = load_setups(config_dir)
    return [load_table(t, config_dir, setups) for t in table_ids(config_dir)]
