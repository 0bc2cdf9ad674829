"""The analyses a table's columns read beyond a run's result: per analysis
(``python -m fairseq_ext.analysis.NAME``) the command that runs it on one trained model, with
the table's and the reduced scale's arguments, or why it cannot run here; and METEOR."""
import os
import shlex
from typing import List

from fairseq_ext.analysis import registry
from fairseq_ext.reproduce.planning import (AnalysisPlan, Options, RunPlan, analysis_dir, local_copy,
                                            scale_settings)
from fairseq_ext.reproduce.tables import Table


def _option(flags: List[str], name: str, default: str) -> str:
    return flags[flags.index(name) + 1] if name in flags and flags.index(name) + 1 < len(flags) else default


def _analysis_command(name: str, plan: RunPlan, out: str, names: bool = True) -> List[str]:
    cmd = ["python", "-m", registry.get(name).module, "--checkpoint", plan.checkpoint]
    cmd += ["--names", plan.row] if names else []
    cmd += ["--data", plan.data_dir, "--split", "test", "--out", out]
    return cmd + (["--cpu"] if plan.cpu else [])


def _bootstrap_analysis(name, table, plan, out, setups, opts, samples):
    """layer_dependency, decoders: decodings of the test set with their paired bootstrap."""
    return _analysis_command(name, plan, out) + [
        f"--generate-args={' '.join(plan.generate)}", "--flavour", plan.bleu, "--samples", str(samples),
        "--marks", table.marks], ""


def training_text(plan: RunPlan, setups: dict, opts: Options):
    """(the source side of the data set's training text in its local copy, whether it is
    Moses-tokenized already), or (None, why not)."""
    cfg = setups["datasets"][plan.data_key]
    pattern = cfg.get("train_text")
    local = local_copy(plan.data_key, setups, opts)
    if not pattern or not local:
        return None, f"no local copy of {plan.data_key}'s training text"
    recipe = shlex.split(cfg.get("recipe") or "")
    src = (cfg.get("sources") or [None])[0] or _option(recipe, "--src", "")
    path = os.path.join(local, pattern.format(src=src))
    if not os.path.exists(path):
        return None, f"{path} does not exist"
    return path, bool(cfg.get("train_text_tokenized"))


def _probing(name, table, plan, out, setups, opts, samples):
    """probing: SentEval's ten tasks (--senteval), else SentLen, WC and BShift generated from the
    data set's training text (the other seven need SentEval's files)."""
    if opts.senteval:
        tasks = ["--senteval", opts.senteval]
    else:
        corpus, tokenized_or_why = training_text(plan, setups, opts)
        if corpus is None:
            return None, (f"probing needs SentEval's probing files (--senteval DIR) or a local copy of the training "
                          f"text to generate SentLen, WC and BShift from ({tokenized_or_why})")
        tasks = ["--corpus", corpus] + (["--corpus-tokenized"] if tokenized_or_why else [])
    return _analysis_command(name, plan, out) + tasks, ""


def _word_translation(name, table, plan, out, setups, opts, samples):
    return _analysis_command(name, plan, out, names=False), ""


def _translate_from_layer(name, table, plan, out, setups, opts, samples):
    """translate_from_layer: FULL with the row's own beam and length penalty."""
    return _analysis_command(name, plan, out, names=False) + [
        "--beam", _option(plan.generate, "--beam", "4"), "--lenpen", _option(plan.generate, "--lenpen", "1.0")], ""


# analysis -> (name, table, run plan, output, setups, options, bootstrap samples) -> (command or None, why not)
ANALYSIS_COMMANDS = {
    "layer_dependency": _bootstrap_analysis,
    "decoders": _bootstrap_analysis,
    "probing": _probing,
    "word_translation": _word_translation,
    "translate_from_layer": _translate_from_layer,
}


def plan_analyses(table: Table, plans: List[RunPlan], setups: dict, opts: Options,
                  samples: int = 1000) -> List[AnalysisPlan]:
    """What the table's columns read beyond a run's result: each analysis once per trained
    model, with the table's and (--smoke) the smoke scale's arguments, and METEOR."""
    out = []
    wanted = list(table.analyses)
    if any(c.source == "meteor" for c in table.columns):
        wanted.append("meteor")
    if opts.comet is not None and any(c.source == "comet" for c in table.columns):
        wanted.append("comet")
    for plan in plans:
        for name in wanted:
            if name == "meteor":
                out.append(AnalysisPlan(name, plan, os.path.join(plan.run_dir, "meteor.json")))
                continue
            if name == "comet":
                out.append(AnalysisPlan(name, plan, os.path.join(plan.run_dir, "comet.json"), comet=opts.comet))
                continue
            directory = analysis_dir(plan, name)
            cmd, why = ANALYSIS_COMMANDS[name](name, table, plan, directory, setups, opts, samples)
            if cmd is not None:
                reduced = (scale_settings(setups, opts).get("analysis_args") or {}).get(name, "")
                cmd += shlex.split(reduced) + shlex.split(table.analysis_args.get(name, ""))
            out.append(AnalysisPlan(name, plan, directory, cmd, why))
    return out
