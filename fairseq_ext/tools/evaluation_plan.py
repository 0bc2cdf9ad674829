"""An evaluation resolved before anything runs: the options of ``fairseq-ext evaluate`` checked
against the files and DATA/prep.env, in the order the errors should come (:func:`plan`), and
where its result goes (CKPT_DIR/eval-SET unless --out; a default directory that holds another
data set's evaluation is refused, not replaced)."""
import glob
import os
import re
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Dict, List, Optional, Sequence

from fairseq_ext.common.data_text import FLAVOURS, REMOVE_BPE, headline_for, read_prep_env
from fairseq_ext.errors import CommandError
from fairseq_ext.recipes.helpers import evaluations, outputs
from fairseq_ext.tools import comet as comet_metric


class EvaluationError(CommandError):
    """An evaluation that cannot run or failed; the message is the one-line error.
    ``usage``: the usage goes with it (a required option is missing)."""


@dataclass
class Options:
    checkpoint: str = ""
    data: str = ""
    split: str = "test"
    out: str = ""
    src: str = ""
    tgt: str = ""
    bpe: str = ""
    ref_detok: str = ""
    ref_tok: str = ""
    headline: str = ""
    unshuffled: str = ""
    comet_model: Optional[str] = None
    comet_python: Optional[str] = None
    comet_batch_size: int = 16
    generate_args: List[str] = field(default_factory=list)


def generate_value(args: Sequence[str], name: str) -> str:
    """The value of fairseq-generate option ``name`` in ``args`` (the last one; "" if absent)."""
    value = ""
    for i, arg in enumerate(args):
        if arg == name:
            value = args[i + 1] if i + 1 < len(args) else ""
        elif arg.startswith(name + "="):
            value = arg.split("=", 1)[1]
    return value


def has_option(args: Sequence[str], name: str) -> bool:
    return any(a == name or a.startswith(name + "=") for a in args)


@dataclass
class Plan:
    """An evaluation with everything resolved (what the options and prep.env say)."""
    opts: Options
    checkpoints: List[str]
    data: str
    prep: Dict[str, str]
    src: str
    tgt: str
    remove_bpe: List[str]
    headline: str
    note: str
    shuffle: str
    shuffle_seed: str
    unshuffled: str
    out: str
    comet: Optional[comet_metric.Comet] = None  # --comet-model: COMET's settings, checked


def result_key(prep: Dict[str, str], split: str) -> str:
    """What names an evaluation's default directory (CKPT_DIR/eval-KEY): the test or valid set
    the recipe recorded for ``split`` in prep.env (test_2016_flickr, tst2013, newstest2014),
    else the split, so that two test sets binarized as split ``test`` do not share a directory."""
    name = prep.get(f"{split}_set", "") if split in ("valid", "test") else ""
    return re.sub(r"[^A-Za-z0-9._+-]", "_", name) if name else split


def check_default_out(out: str, data: str, split: str) -> str:
    """``out``, the default directory of an evaluation, unless it holds the evaluation of other
    data (an EvaluationError naming both: a result is never replaced by another data set's)."""
    done = os.path.join(out, evaluations.EVAL_COMPLETE)
    if os.path.isfile(done):
        fields = evaluations.read_evaluation_complete(out)
        if fields.get("data") not in (None, data) or fields.get("split") not in (None, split):
            raise EvaluationError(f"refusing to replace {out}: it holds the evaluation of '{fields.get('split')}' of "
                                  f"{fields.get('data')}, not of '{split}' of {data}; pass --out DIR for this one")
    return out


def plan(opts: Options) -> Plan:
    """Check the options against the files, in the order the errors should come."""
    if not opts.checkpoint:
        raise EvaluationError("--checkpoint is required", usage=True)
    if not opts.data:
        raise EvaluationError("--data is required", usage=True)
    checkpoints = opts.checkpoint.split(":")
    for c in checkpoints:
        if not os.path.isfile(c):
            raise EvaluationError(f"checkpoint not found: {c}")
    if not os.path.isdir(opts.data):
        raise EvaluationError(f"data directory not found: {opts.data}")
    data = os.path.realpath(opts.data)
    prep = read_prep_env(data)
    src = opts.src or prep.get("src", "")
    tgt = opts.tgt or prep.get("tgt", "")
    bpe = opts.bpe or prep.get("bpe", "") or "subword_nmt"
    if not tgt:
        raise EvaluationError(f"cannot tell the target language: no {data}/prep.env; pass --tgt (and --src)")
    if not glob.glob(os.path.join(glob.escape(data), glob.escape(opts.split) + ".*.idx")):
        raise EvaluationError(f"no binarized split '{opts.split}' in {data}")
    if bpe not in REMOVE_BPE:
        raise EvaluationError("--bpe must be subword_nmt, sentencepiece or none")
    headline, note = opts.headline, ""
    if not headline:
        headline, note = headline_for(prep.get("recipe", ""), src, tgt, lowercase=prep.get("lowercase") == "1")
    elif headline not in FLAVOURS:
        raise EvaluationError(f"--headline must be one of {', '.join(FLAVOURS)}, not '{headline}'")
    for name, path in (("--ref-detok", opts.ref_detok), ("--ref-tok", opts.ref_tok)):
        if path and not os.path.isfile(path):
            raise EvaluationError(f"{name} {path}: no such file")

    args = opts.generate_args
    shuffle = generate_value(args, "--shuffle-source")
    seed = generate_value(args, "--shuffle-seed") or "1"
    out, unshuffled = opts.out, opts.unshuffled
    ckpt_dir = os.path.dirname(checkpoints[0])
    default = os.path.join(ckpt_dir, f"eval-{result_key(prep, opts.split)}")
    if shuffle:
        if not prep.get("extra_src") and not generate_value(args, "--extra-source-langs"):
            raise EvaluationError(f"--shuffle-source {shuffle}: {data} is not multi-source data "
                                  "(no extra_src in its prep.env)")
        out = out or check_default_out(f"{default}-shuffle-{shuffle}", data, opts.split)
        plain = default
        if not unshuffled and os.path.isfile(os.path.join(plain, evaluations.EVAL_COMPLETE)):
            with open(os.path.join(plain, evaluations.EVAL_COMPLETE), encoding="utf-8", errors="replace") as f:
                if f"checkpoint={opts.checkpoint}" in f.read().splitlines():
                    unshuffled = plain
        if unshuffled:
            try:
                evaluations.check_evaluation(unshuffled)
            except outputs.OutputError as e:
                raise EvaluationError(str(e)) from None
            if not os.path.isfile(os.path.join(unshuffled, "bleu.json")):
                raise EvaluationError(f"--unshuffled {unshuffled}: no bleu.json")
    elif unshuffled:
        raise EvaluationError("--unshuffled is for the adversarial evaluation (--shuffle-source L)")
    out = out or check_default_out(default, data, opts.split)
    try:
        comet = comet_metric.from_args(SimpleNamespace(
            comet_model=opts.comet_model, comet_python=opts.comet_python, comet_batch_size=opts.comet_batch_size,
            cpu=has_option(args, "--cpu")))
    except comet_metric.CometError as e:
        raise EvaluationError(str(e)) from None
    return Plan(opts=opts, checkpoints=checkpoints, data=data, prep=prep, src=src, tgt=tgt,
                remove_bpe=REMOVE_BPE[bpe], headline=headline, note=note, shuffle=shuffle, shuffle_seed=seed,
                unshuffled=unshuffled, out=out, comet=comet)


