"""The models a row's flags build: their size (:func:`shape`, for the report's scale lines)
and their parameter count, checked against the #Params column of the row's table: the model a
row's flags build must have the paper's parameter count, up to the printing precision.

Vocabularies are only approximately known (\"shared BPE ~32k\"), so the check compares each
row's difference to the table's baseline row (vocabulary-independent while the embedding
width is the same) with the paper's printed difference, within 0.1M (two numbers printed to
0.1M) plus 1%.

    python -m fairseq_ext.reproduce.params            # every table with a #Params column
"""
import functools
import logging
import sys
from typing import List, Tuple

from fairseq_ext.common.checkpoints import SHAPE_KEYS
from fairseq_ext.model_builder import build_model, make_dictionary, parse_model_args
from fairseq_ext.reproduce.tables import Table, load_tables, printed_as_difference, printed_value


VOCAB = 32000  # any: the deltas do not depend on it


def _arch(flags) -> Tuple[str, List[str]]:
    """(the --arch preset, the other flags)."""
    at = flags.index("--arch")
    return flags[at + 1], [*flags[:at], *flags[at + 2:]]


def count(flags: List[str], vocab: int = VOCAB) -> int:
    return _count(tuple(flags), vocab)


@functools.lru_cache(maxsize=None)  # rows repeat across a table's data sets and across tables
def _count(flags: tuple, vocab: int) -> int:
    arch, args = _arch(flags)
    model, _ = build_model(arch, "--share-all-embeddings", *args, dictionary=_dictionary(vocab - 4), seed=None,
                           device="meta")
    return sum(p.numel() for p in model.parameters())


_dictionary = functools.lru_cache(maxsize=None)(make_dictionary)


@functools.lru_cache(maxsize=None)
def _shape(flags: tuple) -> dict:
    arch, args = _arch(flags)
    parsed = parse_model_args(arch, *args)
    return {k: getattr(parsed, k, None) for k in SHAPE_KEYS}


def shape(flags: List[str]) -> dict:
    """Layers, widths and heads of the model ``flags`` build (its --arch preset applied), as
    fairseq-train's parser resolves them."""
    return dict(_shape(tuple(flags)))


def _params_cell(cells: dict):
    """(value in M, whether it is printed as a difference such as "+0"), or (None, False)."""
    for name, value in cells.items():
        if name.startswith("#Params"):
            return printed_value(value), printed_as_difference(value)
    return None, False


def check_table(table: Table):
    """[(row id, data set, paper delta M, our delta M, ok, known)] for the rows with a printed
    count; ``known`` is the row's ``params_check`` note (a mismatch the paper explains)."""
    out = []
    if table.baseline is None:
        return out
    base = table.row(table.baseline)
    for dataset in table.datasets:
        paper_base, _ = _params_cell(base.paper.get(dataset, {}))
        if paper_base is None:
            continue
        ours_base = count(base.flags)
        for row in table.rows:
            if not row.runnable or row.id == table.baseline:
                continue
            paper, is_delta = _params_cell(row.paper.get(dataset, {}))
            if paper is None:
                continue
            ours = (count(row.flags) - ours_base) / 1e6
            delta = paper if is_delta else paper - paper_base
            ok = abs(ours - delta) <= 0.1 + 0.01 * abs(delta)
            out.append((row.id, dataset, round(delta, 2), round(ours, 2), ok, row.params_check))
    return out


def main():
    logging.disable(logging.WARNING)
    bad = 0
    for table in load_tables():
        for row, dataset, paper, ours, ok, known in check_table(table):
            bad += not ok and not known
            status = "ok " if ok else ("known" if known else "BAD")
            print(f"{status:<5} {table.id:<11} {row:<32} {dataset:<14} paper {paper:+7.2f}M  ours {ours:+7.2f}M"
                  + (f"  ({known})" if known and not ok else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
