"""Translate a split of a data-bin directory with a checkpoint and score it with sacreBLEU.

The steps, the files written to --out and the rule that --out holds one complete evaluation or
none: docs/evaluation.md.
"""
import argparse
import ast
import functools
import glob
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from fairseq_ext import resources
from fairseq_ext.common.command_line import CommandParser, log_line, run_main
from fairseq_ext.common.data_text import FLAVOURS, REMOVE_BPE, env_headline, read_lines, read_prep_env
from fairseq_ext.errors import CommandError, DataError
from fairseq_ext.standalone import bleu, corpus, evaluations, moses, outputs
from fairseq_ext.tools import comet as comet_metric

# the name evaluation writes under (the markers of its directories)
PROG = outputs.EVALUATE
COMMAND = "fairseq-ext evaluate"
# fairseq-generate options that evaluation sets itself
OWN_GENERATE_OPTIONS = ("--remove-bpe", "--user-dir")
# the errors of an evaluation's steps, each its one-line message
ERRORS = (outputs.OutputError, DataError, corpus.TextError, comet_metric.CometError)
_log = functools.partial(log_line, COMMAND)


class EvaluationError(CommandError):
    pass


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
    """An evaluation resolved before anything runs: the options checked against the files."""
    opts: argparse.Namespace
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
    """The KEY of an evaluation's default directory CKPT_DIR/eval-KEY: the test or valid set
    prep.env records for ``split`` (two test sets binarized as ``test`` keep apart), else the split."""
    name = prep.get(f"{split}_set", "") if split in ("valid", "test") else ""
    return re.sub(r"[^A-Za-z0-9._+-]", "_", name) if name else split


def check_default_out(out: str, data: str, split: str) -> str:
    """``out``, the default directory of an evaluation, unless it holds the evaluation of other data."""
    if os.path.isfile(os.path.join(out, evaluations.EVAL_COMPLETE)):
        fields = evaluations.read_evaluation_complete(out)
        if fields.get("data") not in (None, data) or fields.get("split") not in (None, split):
            raise EvaluationError(f"refusing to replace {out}: it holds the evaluation of '{fields.get('split')}' of "
                                  f"{fields.get('data')}, not of '{split}' of {data}; pass --out DIR for this one")
    return out


def plan(opts: argparse.Namespace) -> Plan:
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
    if opts.headline and opts.headline not in FLAVOURS:
        raise EvaluationError(f"--headline must be one of {', '.join(FLAVOURS)}, not '{opts.headline}'")
    headline, note = env_headline({**prep, "src": src, "tgt": tgt}, opts.headline)
    for name, path in (("--ref-detok", opts.ref_detok), ("--ref-tok", opts.ref_tok)):
        if path and not os.path.isfile(path):
            raise EvaluationError(f"{name} {path}: no such file")

    args = opts.generate_args
    shuffle = generate_value(args, "--shuffle-source")
    out, unshuffled = opts.out, opts.unshuffled
    default = os.path.join(os.path.dirname(checkpoints[0]), f"eval-{result_key(prep, opts.split)}")
    if shuffle:
        if not prep.get("extra_src") and not generate_value(args, "--extra-source-langs"):
            raise EvaluationError(f"--shuffle-source {shuffle}: {data} is not multi-source data "
                                  "(no extra_src in its prep.env)")
        out = out or check_default_out(f"{default}-shuffle-{shuffle}", data, opts.split)
        if not unshuffled and os.path.isfile(os.path.join(default, evaluations.EVAL_COMPLETE)) \
                and evaluations.read_evaluation_complete(default).get("checkpoint") == opts.checkpoint:
            unshuffled = default
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
    comet = comet_metric.from_args(argparse.Namespace(**vars(opts), cpu=has_option(args, "--cpu")))
    return Plan(opts=opts, checkpoints=checkpoints, data=data, prep=prep, src=src, tgt=tgt, remove_bpe=REMOVE_BPE[bpe],
                headline=headline, note=note, shuffle=shuffle,
                shuffle_seed=generate_value(args, "--shuffle-seed") or "1", unshuffled=unshuffled, out=out, comet=comet)


def build_parser() -> CommandParser:
    parser = CommandParser(
        prog=COMMAND, usage=f"{COMMAND} --checkpoint CKPT --data DATA_BIN [--split test] [--out DIR] [options] "
                            "[fairseq-generate options]",
        description=__doc__.split("\n\n")[0],
        epilog="Anything else is passed to fairseq-generate, e.g. --beam 6 --lenpen 1.1 --cpu\n"
               "  --model-overrides \"{'max_source_positions': 1024}\"  (also after a lone --)")
    add = parser.add_argument
    add("--checkpoint", "--path", dest="checkpoint", default="", metavar="PATH",
        help="model checkpoint (several joined with ':' = ensemble)")
    add("--data", default="", metavar="DIR",
        help="binarized data (fairseq-ext prepare output, or any fairseq-preprocess output)")
    add("--split", "--gen-subset", dest="split", default="test", metavar="NAME",
        help="valid | test | ... (default test)")
    add("--out", default="", metavar="DIR",
        help="where outputs go (default: CKPT_DIR/eval-SET, SET the test or valid set prep.env names for the "
             "split, e.g. eval-test_2016_flickr, else eval-SPLIT)")
    add("--src", "--source-lang", "-s", dest="src", default="", metavar="L",
        help="source language (default: from DATA/prep.env, else fairseq's guess)")
    add("--tgt", "--target-lang", "-t", dest="tgt", default="", metavar="L",
        help="target language (default: from DATA/prep.env; required without it)")
    add("--bpe", default="", metavar="KIND", help="subword_nmt | sentencepiece | none (default: from DATA/prep.env)")
    add("--ref-detok", default="", metavar="FILE", help="detokenized reference (default DATA/text/SPLIT.raw.TGT)")
    add("--ref-tok", default="", metavar="FILE", help="tokenized reference (default DATA/text/SPLIT.tok.TGT)")
    add("--headline", default="", metavar="FLAVOUR",
        help=f"{' | '.join(FLAVOURS)}: the score to report (default: the one the papers report for the recipe "
             "in prep.env)")
    add("--unshuffled", default="", metavar="DIR",
        help="the plain evaluation to report the BLEU drop against (default: CKPT_DIR/eval-SET when it evaluated the "
             "same checkpoint); with --shuffle-source L, the adversarial evaluation of a multi-source model (source "
             "L's sentences replaced by other sentences of the split, --shuffle-seed N, default 1)")
    comet_metric.add_arguments(parser)
    return parser


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """Our options, and as ``generate_args`` everything else, in order, for fairseq-generate
    (all of it after a lone ``--``, ours included)."""
    known, rest = build_parser().parse_known_args(list(argv))
    for arg in rest[:rest.index("--")] if "--" in rest else rest:
        if arg.split("=", 1)[0] in OWN_GENERATE_OPTIONS:
            raise EvaluationError(f"{arg} is set by {COMMAND} itself (use --bpe to choose the subword kind)")
    if "--" in rest:
        rest.remove("--")
    known.generate_args = rest
    return known


def comet_of(p: Plan, out: str, split: str, flavour: str) -> dict:
    """COMET on the raw source (else the detokenized source of fairseq's S- lines), the
    detokenized translations and reference, all three lowercased for a lowercased flavour."""
    raw_src = os.path.join(p.data, "text", f"{split}.raw.{p.src}")
    hyp, ref = read_lines(os.path.join(out, "hyp.detok")), read_lines(os.path.join(out, "ref.detok"))
    if p.src and os.path.isfile(raw_src) and evaluations.count_lines(raw_src) == len(hyp):
        src = read_lines(raw_src)
    else:
        _log(f"WARNING: no {raw_src} with {len(hyp)} lines: COMET reads the detokenized source of fairseq's S- lines")
        detok = moses.moses_detokenizer(p.src or "en")
        src = [detok(line) for line in read_lines(os.path.join(out, "src.tok"))]
    return comet_metric.score(p.comet, src, hyp, ref, lowercase=flavour.endswith("-lc"))


def generate_command(p: Plan, user_dir: str) -> List[str]:
    """The fairseq-generate command line of an evaluation."""
    args = p.opts.generate_args
    defaults = [] if has_option(args, "--beam") else ["--beam", "5"]
    if not has_option(args, "--batch-size") and not has_option(args, "--max-tokens"):
        defaults += ["--batch-size", "128"]
    langs = (["--source-lang", p.src] if p.src else []) + ["--target-lang", p.tgt]
    # multi-source data (prepare-multi30k.sh --extra-src): the task and its extra sources
    if p.prep.get("extra_src") and not has_option(args, "--task"):
        langs += ["--task", "multi_source_translation", "--extra-source-langs", p.prep["extra_src"]]
    return ["fairseq-generate", p.data, "--user-dir", user_dir, "--path", p.opts.checkpoint,
            "--gen-subset", p.opts.split, *langs, *p.remove_bpe, *defaults, *args]


# the characters bash's printf %q escapes with a backslash (lib/sh/shquote.c)
_SHELL_SPECIAL = set(" \t'\"\\|&;()<>!{}*[?]^$`,")


def shell_quote(arg: str) -> str:
    """``arg`` as bash's ``printf %q`` writes it (generate-SPLIT.cmd reads as the recipes wrote it)."""
    if not arg or not arg.isprintable():
        return shlex.quote(arg)
    out = []
    for i, c in enumerate(arg):
        if c in _SHELL_SPECIAL or (c == "#" and i == 0) or (c == "~" and (i == 0 or arg[i - 1] in "=:")):
            out.append("\\")
        out.append(c)
    return "".join(out)


def _text(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def run(p: Plan, log: Callable[[str], None] = _log, echo: Callable[[str], None] = print) -> dict:
    """Run the evaluation ``p`` into ``p.out``. ``log``: progress lines; ``echo``: the scores
    (bleu.txt's lines). Returns bleu.json's content, with ``dir`` and ``sentences``."""
    env = resources.command_environment()  # fairseq-generate of this Python's environment
    if shutil.which("fairseq-generate", path=env["PATH"]) is None:
        raise EvaluationError("'fairseq-generate' not found on PATH (run 'make setup', or activate .venv)")
    split, tgt = p.opts.split, p.tgt
    # --out: replaced (a directory evaluation wrote, or empty), never one holding an input
    inputs = [p.data, *p.checkpoints, p.opts.ref_detok, p.opts.ref_tok]
    staged = outputs.StagedOutput(p.out, prog=PROG, inputs=inputs, force=True, log=log,
                                  keep_on_failure=[f"generate-{split}.log", f"generate-{split}.cmd"])
    with staged:
        staged.discard_old()
        out = staged.stage
        # the references first, so that an unreadable one fails before the decoding
        ref_tok = p.opts.ref_tok or os.path.join(p.data, "text", f"{split}.tok.{tgt}")
        ref_detok = p.opts.ref_detok or os.path.join(p.data, "text", f"{split}.raw.{tgt}")
        for path, name in ((ref_tok, "ref.tok"), (ref_detok, "ref.detok")):
            if os.path.isfile(path):
                corpus.write_lines(os.path.join(out, name), read_lines(path))

        gen = os.path.join(out, f"generate-{split}.txt")
        gen_log = os.path.join(out, f"generate-{split}.log")
        cmd = generate_command(p, resources.user_dir())
        log(f"translating '{split}' of {p.data} with {p.opts.checkpoint}")
        with open(os.path.join(out, f"generate-{split}.cmd"), "w", encoding="utf-8") as f:
            f.write("".join(shell_quote(c) + " " for c in cmd) + "\n")
        with open(gen, "wb") as stdout, open(gen_log, "wb") as stderr:
            code = subprocess.run(cmd, stdout=stdout, stderr=stderr, env=env).returncode
        if code != 0:
            sys.stderr.write("".join(_text(gen_log).splitlines(keepends=True)[-20:]))
            raise EvaluationError(f"fairseq-generate failed (full log: {staged.out}/generate-{split}.log)")
        translated = [line for path in (gen, gen_log) for line in _text(path).splitlines() if "Translated" in line]
        if translated:  # fairseq's summary: sentences, tokens, speed, beam
            print(translated[-1].rsplit("| ", 1)[-1], file=sys.stderr, flush=True)

        lines = corpus.parse_generate(gen)
        n = len(lines["hyp"])
        corpus.write_lines(os.path.join(out, "hyp.tok"), lines["hyp"])
        corpus.write_lines(os.path.join(out, "src.tok"), lines["src"])
        detok = moses.moses_detokenizer(tgt)
        corpus.write_lines(os.path.join(out, "hyp.detok"), [detok(h) for h in lines["hyp"]])
        if not os.path.isfile(os.path.join(out, "ref.tok")):
            _log(f"WARNING: no {ref_tok}: using fairseq's target lines as the tokenized reference (their <unk>s "
                 "count as errors)")
            corpus.write_lines(os.path.join(out, "ref.tok"), lines["ref"])
        if not os.path.isfile(os.path.join(out, "ref.detok")):
            _log(f"WARNING: no {ref_detok}: detokenizing the tokenized reference for detokenized BLEU")
            ref_lines = read_lines(os.path.join(out, "ref.tok"))
            corpus.write_lines(os.path.join(out, "ref.detok"), [detok(r) for r in ref_lines])
        for name, path in (("ref.tok", ref_tok), ("ref.detok", ref_detok)):
            m = evaluations.count_lines(os.path.join(out, name))
            if m != n:
                raise EvaluationError(f"the reference {path} has {m} lines but fairseq-generate translated {n} "
                                      f"sentences of '{split}' (wrong --split or --ref-*?)")

        log(f"sacreBLEU on {n} sentences of '{split}'")
        scores = bleu.score(*(os.path.join(out, f) for f in ("hyp.detok", "ref.detok", "hyp.tok", "ref.tok")))
        text = bleu.report(scores, p.headline, p.note)
        with open(os.path.join(out, "bleu.json"), "w", encoding="utf-8") as f:
            json.dump(scores, f, indent=2)
        # chrF, chrF++ and TER on the reported flavour's text, before the reported BLEU line
        metrics = bleu.more_metrics(scores, scores.get("headline", "detok-cased"))
        if p.comet is not None:
            log(f"COMET ({p.comet.name}) on {n} sentences")
            metrics["COMET"] = comet_of(p, out, split, scores.get("headline", "detok-cased"))
        with open(os.path.join(out, "metrics.json"), "w", encoding="utf-8") as f:
            json.dump(metrics, f, indent=2)
        text = text[:-1] + bleu.metric_lines(metrics) + text[-1:]
        marks = []
        if p.shuffle:
            marks = [f"shuffle_source={p.shuffle}", f"shuffle_seed={p.shuffle_seed}"]
            if p.unshuffled:
                text.append(_adversarial(scores, p, os.path.join(out, "adversarial.json")))
        for line in text:
            echo(line)
        corpus.write_lines(os.path.join(out, "bleu.txt"), text)

        # success: the completion marker last, then the whole directory into place
        evaluations.write_evaluation_complete(out, [f"checkpoint={p.opts.checkpoint}", f"data={p.data}",
                                                f"split={split}", f"src={p.src}", f"tgt={p.tgt}",
                                                f"sentences={n}", *marks])
        staged.finish()
    return {**scores, "dir": staged.out, "sentences": n}


def _adversarial(scores: dict, p: Plan, path: str) -> str:
    """The BLEU drop against the unshuffled evaluation, written to adversarial.json."""
    flavour = p.headline
    adv = scores[flavour]["score"]
    with open(os.path.join(p.unshuffled, "bleu.json"), encoding="utf-8") as f:
        plain = json.load(f)
    if flavour not in plain:
        raise EvaluationError(f"--unshuffled {p.unshuffled}: no {flavour} BLEU in its bleu.json")
    plain = plain[flavour]["score"]
    res = {"shuffle_source": p.shuffle, "shuffle_seed": int(p.shuffle_seed), "flavour": flavour, "bleu": adv,
           "unshuffled_bleu": plain, "drop": round(plain - adv, 2), "unshuffled": os.path.abspath(p.unshuffled)}
    with open(path, "w", encoding="utf-8") as f:
        json.dump(res, f, indent=2)
    return (f"adversarial [{flavour}, {p.shuffle} shuffled, seed {p.shuffle_seed}]: {adv:.2f}, "
            f"unshuffled {plain:.2f}, drop {plain - adv:.2f}")


def _without_overrides(generate_args: Sequence[str]) -> Tuple[List[str], dict]:
    """``generate_args`` without their ``--model-overrides`` (fairseq-generate would keep only
    the last of two), and the overrides it held (a literal dict)."""
    args, given = list(generate_args), {}
    while "--model-overrides" in args:
        i = args.index("--model-overrides")
        if i + 1 >= len(args):
            raise EvaluationError("--model-overrides needs a value")
        try:
            given.update(ast.literal_eval(args[i + 1]))
        except (ValueError, SyntaxError, TypeError):
            raise EvaluationError(f"--model-overrides {args[i + 1]!r}: not a literal dict") from None
        del args[i:i + 2]
    return args, given


def evaluate(checkpoint: str, data: str, *, split: str = "test", out: Optional[str] = None, src: Optional[str] = None,
             tgt: Optional[str] = None, bpe: Optional[str] = None, headline: Optional[str] = None,
             generate_args: Sequence[str] = (), model_overrides: Optional[dict] = None, cpu: bool = False,
             quiet: bool = True) -> dict:
    """Evaluate ``checkpoint`` on ``split`` of ``data``, as ``fairseq-ext evaluate`` does: {"dir",
    "bleu": {flavour: score}, "headline", "sentences"}; EvaluationError. ``quiet``: only warnings printed."""
    argv = ["--checkpoint", checkpoint, "--data", data, "--split", split]
    for flag, value in (("--out", out), ("--src", src), ("--tgt", tgt), ("--bpe", bpe), ("--headline", headline)):
        if value:
            argv += [flag, value]
    generate_args, given = _without_overrides(generate_args)
    argv += generate_args
    if model_overrides or given:  # one --model-overrides: the caller's on top of those in generate_args
        argv += ["--model-overrides", repr({**given, **(model_overrides or {})})]
    if cpu:
        argv.append("--cpu")
    silent = (lambda message: None) if quiet else _log
    try:
        scores = run(plan(parse_args(argv)), log=silent, echo=silent if quiet else print)
    except ERRORS as e:
        raise EvaluationError(str(e)) from None
    return {"dir": scores["dir"], "bleu": {k: v["score"] for k, v in scores.items() if isinstance(v, dict)},
            "headline": scores.get("headline", "detok-cased"), "sentences": scores["sentences"]}


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    return run_main(COMMAND, lambda: run(plan(parse_args(argv)), echo=lambda line: print(line, flush=True)),
                       (CommandError, *ERRORS), lambda: build_parser().format_usage())


if __name__ == "__main__":
    sys.exit(main())
