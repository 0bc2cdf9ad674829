"""Decoding for the analyses that score translations: ``fairseq-ext evaluate`` on a checkpoint,
its output lines, and the command of an analysis that compares decodings with a baseline."""
import os
import shlex
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from fairseq_ext.analysis import AnalysisError, command
from fairseq_ext.analysis.figures import names_for
from fairseq_ext.common import checkpoints, data_text
from fairseq_ext.tools.evaluate import EvaluationError
from fairseq_ext.tools.evaluate import evaluate as run_evaluation
from fairseq_ext.tools.significance import paired_significance


def evaluate(checkpoint: str, data: str, split: str, out: str, overrides: Optional[dict] = None,
             generate_args: Sequence[str] = (), cpu: bool = False, src: Optional[str] = None,
             tgt: Optional[str] = None) -> dict:
    """``fairseq-ext evaluate`` on ``checkpoint`` (model ``overrides`` allowed): {"dir": out,
    "bleu": {flavour: score}, "headline": flavour}. On data without prep.env the subword kind is passed."""
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
    """An evaluation's hypotheses (``kind`` "hyp") or references ("ref") as ``flavour`` scores them."""
    level = "tok" if flavour.startswith("tok") else "detok"
    return data_text.read_lines(os.path.join(evaluation["dir"], f"{kind}.{level}"))


def comparison_command(doc: str, runs_of: Callable[..., Dict[str, Tuple[Optional[dict], dict]]], table: str,
                       title: str, plot: Callable, add_arguments: Optional[Callable] = None,
                       options_of: Optional[Callable] = None) -> Tuple[Callable, Callable]:
    """(build_parser, main) of an analysis that decodes each checkpoint once per run of ``runs_of(name, checkpoint)``
    (run -> (model overrides, the row's leading cells), the first the baseline) into OUT/NAME/RUN, tests every other run
    against the baseline (paired bootstrap), writes the table OUT/TABLE and draws
    ``plot(rows, OUT/TABLE.png, figures, marks)``. ``add_arguments(parser)`` adds the analysis' own options;
    ``options_of(args)``: the keyword arguments of runs_of and plot."""
    def build_parser():
        ap = command.parser(doc)
        command.evaluation_arguments(ap)
        if add_arguments is not None:
            add_arguments(ap)
        return ap

    def execute(args, figures):
        rows, extra = [], (options_of(args) if options_of is not None else {})
        for name, ckpt in zip(names_for(args.checkpoint, args.names), args.checkpoint):
            runs, flavour = runs_of(name, ckpt, **extra), args.flavour
            evaluations = {}
            for run, (overrides, _) in runs.items():
                evaluations[run] = evaluate(ckpt, args.data, args.split, os.path.join(args.out, name, run),
                                            overrides=overrides, generate_args=shlex.split(args.generate_args),
                                            cpu=args.cpu, src=args.src, tgt=args.tgt)
                flavour = flavour or evaluations[run]["headline"]
            (baseline, (_, lead)), *others = runs.items()
            hyps = {run: lines(evaluation, flavour) for run, evaluation in evaluations.items()}
            sig = paired_significance(lines(evaluations[baseline], flavour, "ref"), hyps.pop(baseline), hyps,
                                      flavour=flavour, n_samples=args.samples, marks=args.marks)
            base = sig["baseline"]["bleu"]
            rows.append({**lead, "BLEU": base, "delta": None, "p": None, "mark": "", "flavour": flavour})
            rows += [{**lead, "BLEU": sig[run]["bleu"], "delta": round(sig[run]["bleu"] - base, 2),
                      "p": sig[run]["p_value"], "mark": sig[run]["mark"], "flavour": flavour}
                     for run, (_, lead) in others]
        command.write_table(rows, args.out, table, title)
        plot(rows, os.path.join(args.out, f"{table}.png"), figures, args.marks, **extra)

    return build_parser, command.main(build_parser, execute)
