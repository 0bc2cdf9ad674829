"""The papers' results tables of ``configs/tables/`` (setups.yaml and one ``<id>.yaml`` a table;
the format: docs/reproduction.md), read and checked (every error names the file, the row or
column, and the key); and the text of a table cell, the paper's read and ours written."""
import os
import re
import shlex
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import yaml

from fairseq_ext.errors import FairseqExtError
from fairseq_ext.resources import CONFIG_DIR as SHIPPED_CONFIG_DIR
from fairseq_ext.resources import TABLE_DIR as CONFIG_DIR
from fairseq_ext.tools.statistics import MARKS


_NUMBER = re.compile(r"([-−+])?\s*(\d+(?:\.\d+)?|\.\d+)")
_DURATION = re.compile(r"(\d+)\s*h\s*(\d+)\s*min")
MARK_CHARS = "†‡*"


def printed_value(printed: Optional[str]) -> Optional[float]:
    """The first number of a printed cell ("28.24(-0.13)†" -> 28.24, "+ 18.11" -> 18.11,
    "−0.22" -> -0.22, "38.3 ± .8" -> 38.3); None for "-"."""
    m = _NUMBER.search(str(printed)) if printed is not None else None
    return None if not m else -float(m.group(2)) if m.group(1) in ("-", "−") else float(m.group(2))


def printed_mark(printed: Optional[str]) -> str:
    return "".join(c for c in str(printed or "") if c in MARK_CHARS)


def printed_text(printed: Optional[str]) -> str:
    """A printed cell as the paper prints it, spaces normalised ("+ 18.11" -> "+18.11")."""
    return "–" if printed is None else re.sub(r"^([-+−]) (?=\d)", r"\1", re.sub(r"\s+", " ", str(printed)).strip())


def printed_decimals(printed: Optional[str]) -> Optional[int]:
    """The decimals of a printed cell's first number (None when it prints none)."""
    m = _NUMBER.search(str(printed or ""))
    return None if not m else len(m.group(2).split(".")[1]) if "." in m.group(2) else 0


def printed_as_difference(printed: Optional[str]) -> bool:
    """Whether a cell prints a difference to another row ("+0.3", "−1.2"), not a value."""
    return str(printed or "").strip().startswith(("+", "-", "−"))


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


def format_number(value: Optional[float], digits: int = 2, signed: bool = False) -> str:
    return "–" if value is None else f"{value:+.{digits}f}" if signed else f"{value:.{digits}f}"


class TableConfigError(FairseqExtError):
    pass


@dataclass(frozen=True)
class Source:
    """A column source: the parameters it takes (on the column or a row's ``analysis:``), those it
    needs, and the analysis command it reads."""
    params: Tuple[str, ...] = ()
    required: Tuple[str, ...] = ()
    analysis: Optional[str] = None  # fairseq_ext.analysis.NAME, run after the rows train
    choices: Tuple[Tuple[str, Tuple[object, ...]], ...] = ()  # parameter -> allowed values


PROBING_TASKS = ("SentLen", "WC", "TDep", "BShift", "ToCo", "Tense", "SubjN", "ObjN", "SoMo", "CoIn", "#AVG")
WORD_TRANSLATION_PARTS = ("encoder", "decoder", "-self attention", "-cross attention", "last layer", "model")

# column source -> what it takes (read by readers.READERS; analyses started by planning.ANALYSIS_COMMANDS)
SOURCES: Dict[str, Source] = {
    "bleu": Source(),  # the row's evaluation, the data set's BLEU flavour
    "params": Source(),  # trainable parameters of the checkpoint, in millions
    "train_speed": Source(params=("ratio",)),  # updates per second
    "train_time": Source(params=("ratio",)),  # wall-clock training time
    "decode_speed": Source(params=("unit", "ratio"), choices=(("unit", ("tokens/s", "sentences/s")),)),
    "decode_time": Source(params=("ratio",)),  # seconds to translate the test set
    "decode_speedup": Source(),  # the reference row's decoding time / the row's
    "delta": Source(params=("of", "against_column"), required=("of",)),  # a printed difference column
    "adversarial": Source(params=("shuffled",), required=("shuffled",)),  # BLEU with one source shuffled
    "meteor": Source(),  # fairseq_ext.tools.meteor on the row's detokenized hypotheses
    "chrf": Source(),  # chrF2 of the row's evaluation; printed by no paper, every table gets it (with_chrf)
    "comet": Source(),  # COMET's system score of the row's translations (--comet-model)
    "layer_dependency": Source(params=("layer",), required=("layer",), analysis="layer_dependency"),
    "decoders": Source(params=("decoder",), required=("decoder",), analysis="decoders"),
    "probing": Source(params=("task", "category"), required=("task",), analysis="probing",
                      choices=(("task", PROBING_TASKS), ("category", ("Surface", "Syntactic", "Semantic")))),
    "word_translation": Source(params=("part", "layer"), required=("part",), analysis="word_translation",
                               choices=(("part", WORD_TRANSLATION_PARTS),)),
    "translate_from_layer": Source(params=("metric", "layer"), required=("metric", "layer"),
                                   analysis="translate_from_layer", choices=(("metric", ("BLEU-1", "BLEU")),)),
}

# a table file without `columns:` (e.g. configs/benchmarks/*.yaml) names measured metrics only
DEFAULT_COLUMNS = {"BLEU": "bleu", "#Params": "params", "#Params (M)": "params", "Train (steps/s)": "train_speed",
                   "Decode": "decode_speed", "Decode (sentences/s)": "decode_speed",
                   "Decode (tokens/s)": "decode_speed"}

COLUMN_KEYS = {"name", "source", "printed"}


@dataclass
class Column:
    name: str  # the printed column (a key of the rows' paper cells)
    source: str  # a key of SOURCES
    params: Dict[str, object] = field(default_factory=dict)
    printed: bool = True  # False: a column of ours the paper's table does not print (context)

    @property
    def analysis(self) -> Optional[str]:
        return SOURCES[self.source].analysis

    def at(self, row: "Row") -> Dict[str, object]:
        """The column's parameters for ``row`` (the row's ``analysis:`` values win)."""
        own = {k: v for k, v in row.analysis.items() if k in SOURCES[self.source].params}
        return {**self.params, **own}


def read_columns(raw: dict, path: str) -> List[Column]:
    """The table's columns: ``columns:``, or (a file without it) ``metrics:`` of measured names."""
    if "columns" not in raw:
        for name in raw.get("metrics", []):
            if name not in DEFAULT_COLUMNS:
                raise TableConfigError(f"{path}: metric {name!r} needs a 'columns:' entry (name, source); "
                                       f"sources: {', '.join(SOURCES)}")
        return [Column(name=name, source=DEFAULT_COLUMNS[name]) for name in raw.get("metrics", [])]
    if "metrics" in raw:
        raise TableConfigError(f"{path}: 'metrics' and 'columns' both given: 'columns' lists the printed columns")
    out = []
    for i, c in enumerate(raw["columns"] or []):
        where = f"{path}: columns[{i}]"
        if not isinstance(c, dict) or "name" not in c or "source" not in c:
            raise TableConfigError(f"{where}: expected a mapping with 'name' and 'source'")
        where = f"{path}: column {c['name']!r}"
        source = SOURCES.get(c["source"])
        if source is None:
            raise TableConfigError(f"{where}: source {c['source']!r} is not one of {', '.join(SOURCES)}")
        params = {k: v for k, v in c.items() if k not in COLUMN_KEYS}
        for key in params:
            if key not in source.params:
                raise TableConfigError(f"{where}: key {key!r} is not a parameter of source {c['source']} "
                                       f"({', '.join(source.params) or 'it takes none'})")
        printed = c.get("printed", True)
        if not isinstance(printed, bool):
            raise TableConfigError(f"{where}: key 'printed' must be true or false")
        out.append(Column(name=str(c["name"]), source=c["source"], params=params, printed=printed))
    names = [c.name for c in out]
    if len(set(names)) != len(names):
        raise TableConfigError(f"{path}: duplicate column names")
    return out


def with_chrf(columns: List[Column]) -> List[Column]:
    """Ours chrF (chrF2, printed by none of the papers) after the first BLEU column and its
    difference columns, unless the table names one."""
    if any(c.source == "chrf" for c in columns):
        return columns
    bleu = next((c for c in columns if c.source == "bleu"), None)
    if bleu is None:
        return columns
    at = max(i for i, c in enumerate(columns) if c is bleu or (c.source == "delta" and c.params.get("of") == bleu.name))
    return columns[: at + 1] + [Column(name="chrF", source="chrf", printed=False)] + columns[at + 1:]


def with_comet(columns: List[Column]) -> List[Column]:
    """Ours COMET after chrF (else BLEU), what ``--comet-model`` adds."""
    if any(c.source == "comet" for c in columns):
        return columns
    at = next((i for source in ("chrf", "bleu") for i, c in enumerate(columns) if c.source == source), None)
    return columns if at is None else columns[: at + 1] + [Column("COMET", "comet", printed=False)] + columns[at + 1:]


def check_params(where: str, column: Column, params: Dict[str, object], path: str) -> None:
    source = SOURCES[column.source]
    for key in source.required:
        if key not in params:
            raise TableConfigError(f"{path}: {where}: column {column.name!r} (source {column.source}) needs "
                                   f"'{key}' on the column or in the row's 'analysis:'")
    for key, allowed in source.choices:
        if key in params and params[key] not in allowed:
            raise TableConfigError(f"{path}: {where}: column {column.name!r}: {key} {params[key]!r} is not one of "
                                   f"{', '.join(map(str, allowed))}")
    if "layer" in params and not (isinstance(params["layer"], int) and params["layer"] >= 0
                                  or params["layer"] in ("none", "FULL")):
        raise TableConfigError(f"{path}: {where}: column {column.name!r}: layer {params['layer']!r} is not a "
                               "layer number (0 = embeddings), 'none' or 'FULL'")
    if column.source == "decoders" and not str(params["decoder"]).startswith(("main", "aux")):
        raise TableConfigError(f"{path}: {where}: column {column.name!r}: decoder {params['decoder']!r} is not "
                               "main, aux (the row's one auxiliary decoder) or aux<l>")
    if "ratio" in params and not isinstance(params["ratio"], bool):
        raise TableConfigError(f"{path}: {where}: column {column.name!r}: ratio must be true or false")


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
        """The marks of the paper the id names ("mma-3"; a key of statistics.MARKS), else the thesis'."""
        paper = self.id.split("-")[0]
        return paper if paper in MARKS else "thesis"

    @property
    def marks_are_the_papers(self) -> bool:
        """Whether :attr:`marks` are the ones this table prints (not for a paper without marks, nor
        for ``paper_significance: none...`` or ``± values printed``)."""
        printed = (self.paper_significance or "").strip()
        return self.id.split("-")[0] in MARKS and not printed.startswith(("none", "±"))

    def column(self, name: str) -> Column:
        found = next((c for c in self.columns if c.name == name), None)
        if found is None:
            raise TableConfigError(f"{self.id}: no column {name!r}")
        return found

    def row(self, row_id: str) -> Row:
        found = next((r for r in self.rows if r.id == row_id), None)
        if found is None:
            raise TableConfigError(f"{self.id}: no row {row_id!r} (rows: {', '.join(r.id for r in self.rows)})")
        return found

    def reference(self, row: Row) -> Optional[Row]:
        """Its ``compare_with``, else the baseline; None for the baseline, without one, and for a row
        on the reference's own model measured the same way (thesis-4.6's second baseline row)."""
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
                raise TableConfigError(f"--rows: {self.id} has no row {name!r} (rows: {', '.join(r.id for r in own)})")
            if not match[0].runnable:
                raise TableConfigError(f"--rows: {name!r} of {self.id} is a number quoted from another paper")
            wanted.append(match[0])
        return wanted

    def select(self, spec: Optional[str]) -> List[Row]:
        """Rows named in ``spec`` (default: every own row) with the baseline, their reference rows
        and the rows whose model they report on."""
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
        where = f"{path}: row {r.id}"
        if r.runnable and "--arch" not in r.flags:
            raise TableConfigError(f"{where} has no --arch in its flags")
        for dataset, cells in r.paper.items():
            if dataset not in table.datasets:
                raise TableConfigError(f"{where}: paper: {dataset!r} is not a data set of the table")
            for name in cells:
                if name not in names:
                    raise TableConfigError(f"{where}: paper: {dataset}: {name!r} is not a column "
                                           f"(columns: {', '.join(sorted(names))})")
        if r.compare_with is not None and r.compare_with not in ids:
            raise TableConfigError(f"{where}: compare_with {r.compare_with!r} is not a row")
        if r.compare_with == r.id:
            raise TableConfigError(f"{where}: compare_with names the row itself")
        if r.model is not None:
            if r.model not in ids:
                raise TableConfigError(f"{where}: model {r.model!r} is not a row")
            owner = table.row(r.model)
            if owner.model is not None or not owner.runnable or not r.runnable:
                raise TableConfigError(f"{where}: model {r.model!r} must be an own row that trains its own model")
            if owner.flags != r.flags:
                raise TableConfigError(f"{where}: model {r.model!r} has other flags: a row reports on another row's "
                                       "model only when both are the same model")
        for key in r.analysis:
            if key not in analysis_params:
                raise TableConfigError(f"{where}: analysis: {key!r} is not a parameter of the table's columns "
                                       f"({', '.join(sorted(analysis_params)) or 'none'})")
        for c in table.columns if r.runnable else []:
            check_params(f"row {r.id}", c, c.at(r), path)
    printed = {name for r in table.rows for cells in r.paper.values() for name in cells}
    for c in table.columns:
        for key in ("of", "against_column"):
            if key in c.params and c.params[key] not in names:
                raise TableConfigError(f"{path}: column {c.name!r}: {key} {c.params[key]!r} is not a column")
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
    shipped = [f"configs/{sub}/{f}" for sub in sorted(os.listdir(SHIPPED_CONFIG_DIR)) if sub != "tables"
               and os.path.isdir(os.path.join(SHIPPED_CONFIG_DIR, sub))
               for f in sorted(os.listdir(os.path.join(SHIPPED_CONFIG_DIR, sub))) if f.endswith(".yaml")]
    raise TableConfigError(f"no table file {path} (a path, or configs/... of the package: {', '.join(shipped)})")


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
    # a file in the older form (`metrics:`, not `columns:`) is read as before: its unknown keys ignored
    strict = "columns" in raw
    for key in raw:
        if strict and key not in TABLE_KEYS:
            raise TableConfigError(f"{path}: unknown key {key!r} ({', '.join(sorted(TABLE_KEYS))})")
    setups = setups if setups is not None else load_setups(config_dir)
    rows = [_row(r, path, strict) for r in raw.get("rows", [])]
    analysis_args = raw.get("analysis_args") or {}
    table = Table(id=raw["id"], paper=raw.get("paper", ""), source=raw.get("source", ""),
                  caption=raw.get("caption", ""), datasets=raw["datasets"], baseline=raw.get("baseline"),
                  columns=with_chrf(read_columns(raw, path)), rows=rows, path=path,
                  adversarial=raw.get("adversarial", ""), analysis_args={k: str(v) for k, v in analysis_args.items()},
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
