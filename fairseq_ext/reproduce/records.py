"""The typed shape of the report's records, as the table's JSON, CSV, Markdown and LaTeX read
them: a :class:`Value` (our number of one column of one row, as read from a run), a
:class:`Cell` (one column of one row: the paper's printed cell and ours, the differences and
ratios to the reference row, the marks) and a :class:`Record` (one row on one data set).

They are dictionaries, typed: the table's JSON and CSV write them as they are, their keys in
this order, and a key that does not apply to a column (a Δ where the paper prints its own
difference column, a ratio of a column that is not a speed) is absent, not None. The keys of a
table trained with several seeds (:mod:`fairseq_ext.reproduce.seed_rows`) are the optional ones
marked "seeds".
"""
from typing import Dict, List, Optional, TypedDict


class _ValueExtras(TypedDict, total=False):
    note: str  # how the number was made (METEOR's implementation), said under the table
    tested_delta: Optional[float]  # the difference an analysis' own test is of (tested against 0)


class Value(_ValueExtras):
    """Our number of one column of one row, as a reader of a run gives it."""
    ours: Optional[float]
    ours_text: Optional[str]  # a reader's text in place of a number, else None; in a Cell, ours as shown
    mark: str  # the significance mark of the test behind the number ("" when none)
    p_value: Optional[float]
    missing: Optional[str]  # what did not run yet, for the table's "Incomplete" line


class _CellExtras(Value, total=False):
    paper_delta: Optional[float]  # the row's printed number minus its reference row's
    delta: Optional[float]  # ours minus the reference row's run's
    paper_ratio: Optional[float]  # the same, as a ratio (speeds and times)
    ratio: Optional[float]
    # seeds: mean (ours) ± sd over the seeds with a number (n, per_seed: seed -> number); the
    # mean, sd and count of the per-seed differences and ratios; the test over seeds
    sd: Optional[float]
    n: int
    per_seed: Dict[int, float]
    delta_sd: Optional[float]
    delta_n: int
    ratio_sd: Optional[float]
    ratio_n: int
    p_t: Optional[float]  # seeds: the paired t-test over seeds (shown beside the mark, not as it)
    rule: str  # seeds: how the mark over seeds was decided (fairseq_ext.tools.statistics.across_seeds)
    tested_seeds: List[int]
    per_seed_marks: Dict[int, str]
    per_seed_p: Dict[int, float]
    # the test behind the marks (fairseq_ext.reproduce.marks): its --test value and name, the
    # stratified approximate randomization's result (ar), the rows tested against the same
    # reference row (comparisons) and the Holm-adjusted p (--correction holm)
    test: str
    test_name: str
    correction: str
    shuffles: int
    ar: dict
    comparisons: int
    p_holm: Optional[float]
    timing_noise: Dict[str, object]  # seeds: a speed or time shown as —: sd in % of the mean, and whose


class Cell(_CellExtras):
    """One column of one row: the paper's printed cell (as printed, its number, its marks)
    beside ours."""
    source: str  # the column's source (fairseq_ext.reproduce.columns.SOURCES)
    paper: Optional[str]
    paper_value: Optional[float]
    paper_mark: str


class _RecordExtras(TypedDict, total=False):
    seeds: List[int]  # seeds: those asked for
    seeds_done: List[int]  # seeds: those whose run finished
    seeds_counted: List[int]  # seeds: those it and its reference row finished, behind every number
    test: str  # the test behind the BLEU marks (--test), its name, the correction, the shuffles
    test_name: str
    correction: str
    shuffles: int
    n: int
    bleu_sd: Optional[float]
    delta_sd: Optional[float]
    p_t: Optional[float]
    rule: Optional[str]
    per_seed: Dict[int, dict]  # seeds: each seed's run directory, status, BLEU, Δ, mark and p


class Record(_RecordExtras):
    """One row of the table on one data set (a cited row: the paper's numbers only)."""
    table: str
    dataset: str
    row: str
    label: str  # with the row's id where another row of the table has the same label
    group: str
    cited: Optional[str]  # where a row quoted from another paper comes from
    reference: Optional[str]  # the row it is compared with (Δ, ratio, significance)
    reference_label: Optional[str]
    model_row: Optional[str]  # the row that trains the model it reports on
    run_dir: Optional[str]
    status: str  # "done", "not run", "not planned" or "cited"
    missing: List[str]  # the numbers it lacks, "column: why"
    # the BLEU column's numbers, repeated at the top for the CSV's readers
    bleu: Optional[float]
    delta: Optional[float]
    mark: str
    p_value: Optional[float]
    paper_bleu: Optional[float]
    paper_delta: Optional[float]
    paper_mark: str
    samples: Optional[int]  # the bootstrap samples of its significance test
    params_m: Optional[float]
    model_bleu: Optional[float]  # the BLEU of the row's model (its evaluation), in every table
    adversarial: Dict[str, Optional[float]]  # shuffled source -> BLEU
    paper_adversarial: Dict[str, Optional[float]]
    budget: str
    data: str
    columns: Dict[str, Cell]
