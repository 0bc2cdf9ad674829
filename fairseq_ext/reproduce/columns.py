"""A table's columns: where the numbers of each column come from (its source, one of
:data:`SOURCES`), the parameters a source takes, and the checks of those parameters.

A column is ``{name, source, ...parameters}``: ``name`` is the printed column (the key of the
rows' ``paper`` cells), ``source`` one of :data:`SOURCES`; a row may give the parameters of its
analysis columns that differ per row under ``analysis:`` (such as the layer).
"""
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from fairseq_ext.errors import FairseqExtError


class TableConfigError(FairseqExtError):
    pass


@dataclass(frozen=True)
class Source:
    """Where the numbers of a column come from: the parameters it takes (on the column, or per
    row under ``analysis:``), those it needs, and the analysis command it reads, if any."""
    params: Tuple[str, ...] = ()
    required: Tuple[str, ...] = ()
    analysis: Optional[str] = None  # fairseq_ext.analysis.NAME, run after the rows train
    choices: Tuple[Tuple[str, Tuple[object, ...]], ...] = ()  # parameter -> allowed values


PROBING_TASKS = ("SentLen", "WC", "TDep", "BShift", "ToCo", "Tense", "SubjN", "ObjN", "SoMo", "CoIn", "#AVG")
WORD_TRANSLATION_PARTS = ("encoder", "decoder", "-self attention", "-cross attention", "last layer", "model")

# One table from a column source to what it takes; the report reads each
# (fairseq_ext.reproduce.readers.READERS) and the runner starts the analyses
# (fairseq_ext.reproduce.analyses.ANALYSIS_COMMANDS).
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
    # sacreBLEU's chrF2 of the row's evaluation (eval-test/metrics.json), on the text of the data
    # set's BLEU flavour; no paper prints it: every table gets it beside its BLEU (with_chrf)
    "chrf": Source(),
    # COMET's system score of the row's translations (comet.json; fairseq-ext reproduce --comet-model)
    "comet": Source(),
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
        out = []
        for name in raw.get("metrics", []):
            if name not in DEFAULT_COLUMNS:
                raise TableConfigError(f"{path}: metric {name!r} needs a 'columns:' entry (name, source); "
                                       f"sources: {', '.join(SOURCES)}")
            out.append(Column(name=name, source=DEFAULT_COLUMNS[name]))
        return out
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


CHRF_COLUMN = "chrF"


def with_chrf(columns: List[Column]) -> List[Column]:
    """The columns with ours chrF (sacreBLEU's chrF2, not printed by any of the papers) after
    the first BLEU column and the paper's difference columns of it, unless the table names a
    chrf column itself."""
    if any(c.source == "chrf" for c in columns):
        return columns
    bleu = next((c for c in columns if c.source == "bleu"), None)
    if bleu is None:
        return columns
    at = max(i for i, c in enumerate(columns)
             if c is bleu or (c.source == "delta" and c.params.get("of") == bleu.name))
    return _ours_after(columns, at, CHRF_COLUMN, "chrf")


COMET_COLUMN = "COMET"


def with_comet(columns: List[Column]) -> List[Column]:
    """The columns with ours COMET after chrF (after BLEU where there is none): what
    ``--comet-model`` adds to a table that has a BLEU column."""
    if any(c.source == "comet" for c in columns):
        return columns
    at = next((i for i, c in enumerate(columns) if c.source == "chrf"), None)
    if at is None:
        at = next((i for i, c in enumerate(columns) if c.source == "bleu"), None)
    return columns if at is None else _ours_after(columns, at, COMET_COLUMN, "comet")


def _ours_after(columns: List[Column], at: int, name: str, source: str) -> List[Column]:
    """``columns`` with a column of ours (not printed by the paper) after position ``at``."""
    return columns[: at + 1] + [Column(name=name, source=source, printed=False)] + columns[at + 1:]


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
