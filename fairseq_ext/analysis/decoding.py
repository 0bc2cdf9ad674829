"""Decoding for the analyses that score translations: ``fairseq-ext evaluate``'s tool on a
checkpoint (BLEU is the BLEU that command reports; model overrides allowed), its output lines,
decodings of one checkpoint compared with a baseline decoding (sacreBLEU's paired test), and
the command of an analysis made of such comparisons, one table and one figure."""
import os
import shlex
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from fairseq_ext.analysis import AnalysisError, command
from fairseq_ext.analysis.figures import names_for
from fairseq_ext.analysis.table_files import write_table
from fairseq_ext.common import checkpoints, data_text
from fairseq_ext.tools.evaluate import EvaluationError
from fairseq_ext.tools.evaluate import evaluate as run_evaluation
from fairseq_ext.tools.significance import paired_significance


def evaluate(checkpoint: str, data: str, split: str, out: str, overrides: Optional[dict] = None,
             generate_args: Sequence[str] = (), cpu: bool = False, src: Optional[str] = None,
             tgt: Optional[str] = None) -> dict:
    """``fairseq-ext evaluate`` on ``checkpoint`` (:func:`fairseq_ext.tools.evaluate.evaluate`:
    decoding with the model's own forward and fairseq's SequenceGenerator, BPE removed and
    detokenized as everywhere else); returns {"dir": out, "bleu": {flavour: score},
    "headline": flavour}. The languages are :func:`fairseq_ext.common.checkpoints.languages`';
    on data without prep.env also the subword kind is passed. Without DATA/text/ (the recipes'
    references) evaluation scores against fairseq's T- lines, and warns."""
    src, tgt = checkpoints.languages(checkpoint, data, split, src, tgt)
    bpe = None if os.path.exists(os.path.join(data, "prep.env")) else checkpoints.subword_kind(data, tgt)
    try:
        result = run_evaluation(checkpoint, data, split=split, out=out, src=src, tgt=tgt, bpe=bpe,
                                generate_args=generate_args, model_overrides=overrides,
                                cpu=cpu or not torch.cuda.is_available())
    except EvaluationError as e:
        raise AnalysisError(f"evaluation failed for {checkpoint} {overrides or ''}: {e}") from None
    return {"dir": out, "bleu": result["bleu"], "headline": result["headline"]}


def lines(evaluation: dict, flavour: str, kind: str = "hyp") -> List[str]:
    """The hypotheses (``kind`` "hyp") or references ("ref") of an evaluation as ``flavour``
    scores them: tokenized for the tok-* flavours, else detokenized."""
    level = "tok" if flavour.startswith("tok") else "detok"
    return data_text.read_lines(os.path.join(evaluation["dir"], f"{kind}.{level}"))


def compare_decodings(checkpoint: str, data: str, split: str, out: str, runs: Dict[str, Optional[dict]],
                      generate_args: Sequence[str] = (), flavour: Optional[str] = None, samples: int = 1000,
                      cpu: bool = False, marks: str = "thesis", src: Optional[str] = None,
                      tgt: Optional[str] = None) -> Tuple[str, dict]:
    """Decode ``checkpoint`` once per run (``runs``: name -> model overrides, into OUT/NAME),
    the first run the baseline, and test every other run against it (paired bootstrap on
    the same references). Returns (the flavour: ``flavour`` or the baseline's headline, the
    :func:`~fairseq_ext.tools.significance.paired_significance` result by run name)."""
    evaluations = {}
    for run, overrides in runs.items():
        evaluations[run] = evaluate(checkpoint, data, split, os.path.join(out, run), overrides=overrides,
                                    generate_args=generate_args, cpu=cpu, src=src, tgt=tgt)
        flavour = flavour or evaluations[run]["headline"]
    baseline, *others = evaluations
    sig = paired_significance(lines(evaluations[baseline], flavour, "ref"), lines(evaluations[baseline], flavour),
                              {run: lines(evaluations[run], flavour) for run in others}, flavour=flavour,
                              n_samples=samples, marks=marks)
    return flavour, sig


def significance_rows(sig: dict, flavour: str, cells: Dict[str, dict]) -> List[dict]:
    """A table row per run of :func:`compare_decodings` (``cells``: run -> the row's leading
    cells, the baseline first): its BLEU, then the difference to the baseline's, its p-value
    and mark (none for the baseline)."""
    base = sig["baseline"]["bleu"]
    rows = []
    for k, (run, lead) in enumerate(cells.items()):
        if k == 0:
            rows.append({**lead, "BLEU": base, "delta": None, "p": None, "mark": "", "flavour": flavour})
            continue
        s = sig[run]
        rows.append({**lead, "BLEU": s["bleu"], "delta": round(s["bleu"] - base, 2), "p": s["p_value"],
                     "mark": s["mark"], "flavour": flavour})
    return rows


def comparison_command(doc: str, rows_of: Callable[..., List[dict]], table: str, title: str,
                       plot: Callable, add_arguments: Optional[Callable] = None,
                       options_of: Optional[Callable] = None) -> Tuple[Callable, Callable]:
    """(build_parser, main) of an analysis that compares decodings of each checkpoint: its
    parser is the common arguments and :func:`~fairseq_ext.analysis.command.evaluation_arguments`;
    its run writes ``rows_of(name, checkpoint, data, split, out, generate_args, flavour,
    samples, cpu, marks, src, tgt)`` of every checkpoint as the table OUT/TABLE (titled
    ``title``) and draws ``plot(rows, OUT/TABLE.png, figures, marks)`` (``marks``: --marks, the key
    to the marks in the caption). ``add_arguments(parser)`` adds the analysis' own options;
    ``options_of(args)`` gives rows_of and plot the keyword arguments made of them."""
    def build_parser():
        ap = command.parser(doc)
        command.evaluation_arguments(ap)
        if add_arguments is not None:
            add_arguments(ap)
        return ap

    def execute(args, figures):
        rows, extra = [], (options_of(args) if options_of is not None else {})
        for name, ckpt in zip(names_for(args.checkpoint, args.names), args.checkpoint):
            rows += rows_of(name, ckpt, args.data, args.split, args.out, shlex.split(args.generate_args),
                            args.flavour, args.samples, args.cpu, args.marks, args.src, args.tgt, **extra)
        write_table(rows, args.out, table, title)
        plot(rows, os.path.join(args.out, f"{table}.png"), figures, args.marks, **extra)

    def main(argv=None):
        return command.run(build_parser, execute, argv)

    build_parser.__doc__ = "This command's options (the report reads them to give it only what it takes)."
    return build_parser, main
