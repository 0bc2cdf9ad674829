"""Translate a split of a data-bin directory with a checkpoint and score it with sacreBLEU
(``fairseq-ext evaluate``, scripts/evaluate.sh).

    fairseq-ext evaluate --checkpoint checkpoints/x/checkpoint_best.pt \\
        --data data-bin/iwslt15.en-vi [--split test] [--out DIR] [fairseq-generate options]

1. fairseq-generate --user-dir fairseq_ext --gen-subset SPLIT, subword units removed
   (--remove-bpe for subword-nmt, --remove-bpe sentencepiece for SentencePiece); every
   option not listed in --help goes to fairseq-generate unchanged (--beam 6 --lenpen 1.1
   --model-overrides "{...}" --cpu --max-tokens ...); defaults: --beam 5 --batch-size 128.
2. hypotheses detokenized with sacremoses (Moses detokenizer, XML escapes undone);
3. sacreBLEU, case-sensitive and -lc, on detokenized text (13a) and on Moses-tokenized text
   (--tokenize none, multi-bleu style), each printed with its signature; then the flavour
   the papers report for this task.

References come from DATA/text/SPLIT.{raw,tok}.TGT written by the data recipes (so the
<unk>s of fairseq's own T- lines do not count against the system); without them the T-
lines are used, with a warning. The default --out is CKPT_DIR/eval-SET, SET the test or
valid set prep.env names for the split (eval-test_2016_flickr, eval-newstest2014; eval-SPLIT
without one), so that two test sets binarized as split 'test' keep their own results; a
default directory that holds the evaluation of other data is refused, not replaced.
Files written to --out:
  generate-SPLIT.txt   fairseq-generate output (+ .log, .cmd)
  hyp.tok / ref.tok    tokenized text          hyp.detok / ref.detok  detokenized text
  src.tok              source side             bleu.txt / bleu.json   the scores
  .evaluation-complete what was evaluated; significance reads only directories with it
  .fairseq_ext-output  the marker: --out is replaced only when it holds one (or is empty)
Multi-source data (prepare-multi30k.sh --extra-src): the task and its extra sources come from
prep.env. Adversarial evaluation (multi-source paper, Table 2): --shuffle-source L
[--shuffle-seed N] replaces every sentence of source L by another sentence of the split
(inside the task, so fairseq-generate does it); default --out CKPT_DIR/eval-SET-shuffle-L,
and with an unshuffled evaluation of the same checkpoint (--unshuffled DIR, default
CKPT_DIR/eval-SET when it holds one) the BLEU drop is printed and written to
adversarial.json.

--out holds one complete evaluation or none: everything is written into a temporary
directory beside --out (outputs.StagedOutput), renamed into place only when the evaluation
succeeded. A rerun removes the previous evaluation when it starts, so after a failed rerun
--out holds no result, only the generate log and command to debug with (and significance
refuses it): a stale result never passes for the new one.
"""
import glob
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence

from fairseq_ext.common.data_text import FLAVOURS, REMOVE_BPE, headline_for, read_prep_env
from fairseq_ext.recipes.helpers import bleu, corpus, outputs

# the name evaluation writes and speaks under (markers, log lines, errors): directories written
# by scripts/evaluate.sh stay its own
PROG = outputs.EVALUATE

USAGE = """Usage: {prog} --checkpoint CKPT --data DATA_BIN [--split test] [--out DIR] [options] [fairseq-generate options]

  --checkpoint PATH    model checkpoint (several joined with ':' = ensemble)
  --data DIR           binarized data (prepare-*.sh output)
  --split NAME         valid | test | ... (default test)
  --out DIR            where outputs go (default: CKPT_DIR/eval-SET, SET the test or valid set
                       prep.env names for the split, e.g. eval-test_2016_flickr, else eval-SPLIT)
  --src L, --tgt L     languages (default: from DATA/prep.env, else fairseq's guess / required for --tgt)
  --bpe KIND           subword_nmt | sentencepiece | none (default: from DATA/prep.env)
  --ref-detok FILE     detokenized reference (default DATA/text/SPLIT.raw.TGT)
  --ref-tok FILE       tokenized reference (default DATA/text/SPLIT.tok.TGT)
  --headline FLAVOUR   detok-cased | detok-lc | tok-cased | tok-lc: the score to report
                       (default: the one the papers report for the recipe in prep.env)
  --shuffle-source L   adversarial evaluation of a multi-source model: source L's sentences
                       replaced by other sentences of the split (--shuffle-seed N, default 1)
  --unshuffled DIR     the plain evaluation to report the BLEU drop against
                       (default: CKPT_DIR/eval-SET when it evaluated the same checkpoint)
Anything else is passed to fairseq-generate, e.g. --beam 6 --lenpen 1.1 --cpu
  --model-overrides "{{'max_source_positions': 1024}}"  (also after a lone --)"""

# our options (aliases included) -> the Options field they set
VALUE_OPTIONS = {"--checkpoint": "checkpoint", "--path": "checkpoint", "--data": "data", "--split": "split",
                 "--gen-subset": "split", "--out": "out", "--src": "src", "--source-lang": "src", "-s": "src",
                 "--tgt": "tgt", "--target-lang": "tgt", "-t": "tgt", "--bpe": "bpe", "--ref-detok": "ref_detok",
                 "--ref-tok": "ref_tok", "--headline": "headline", "--unshuffled": "unshuffled"}
# the name each field's "needs a value" error gives
CANONICAL = {"checkpoint": "--checkpoint", "data": "--data", "split": "--split", "out": "--out", "src": "--src",
             "tgt": "--tgt", "bpe": "--bpe", "ref_detok": "--ref-detok", "ref_tok": "--ref-tok",
             "headline": "--headline", "unshuffled": "--unshuffled"}


class EvaluationError(Exception):
    """An evaluation that cannot run or failed; the message is the one-line error.
    ``usage``: the usage goes with it (a required option is missing)."""

    def __init__(self, message: str, usage: bool = False):
        super().__init__(message)
        self.usage = usage


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
    generate_args: List[str] = field(default_factory=list)
    help: bool = False


def parse_args(argv: Sequence[str]) -> Options:
    """Our options; everything else is kept, in order, for fairseq-generate."""
    opts = Options()
    argv = list(argv)
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in VALUE_OPTIONS:
            name = VALUE_OPTIONS[arg]
            if i + 1 >= len(argv):
                raise EvaluationError(f"{CANONICAL[name]} needs a value")
            setattr(opts, name, argv[i + 1])
            i += 2
        elif arg in ("--remove-bpe", "--user-dir"):
            raise EvaluationError(f"{arg} is set by {PROG} itself (use --bpe to choose the subword kind)")
        elif arg in ("-h", "--help"):
            opts.help = True
            return opts
        elif arg == "--":
            opts.generate_args += argv[i + 1:]
            break
        else:
            opts.generate_args.append(arg)
            i += 1
    return opts


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


def result_key(prep: Dict[str, str], split: str) -> str:
    """What names an evaluation's default directory (CKPT_DIR/eval-KEY): the test or valid set
    the recipe recorded for ``split`` in prep.env (test_2016_flickr, tst2013, newstest2014),
    else the split, so that two test sets binarized as split ``test`` do not share a directory."""
    name = prep.get(f"{split}_set", "") if split in ("valid", "test") else ""
    return re.sub(r"[^A-Za-z0-9._+-]", "_", name) if name else split


def check_default_out(out: str, data: str, split: str) -> str:
    """``out``, the default directory of an evaluation, unless it holds the evaluation of other
    data (an EvaluationError naming both: a result is never replaced by another data set's)."""
    done = os.path.join(out, outputs.EVAL_COMPLETE)
    if os.path.isfile(done):
        fields = outputs.read_evaluation_complete(out)
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
        if not unshuffled and os.path.isfile(os.path.join(plain, outputs.EVAL_COMPLETE)):
            with open(os.path.join(plain, outputs.EVAL_COMPLETE), encoding="utf-8", errors="replace") as f:
                if f"checkpoint={opts.checkpoint}" in f.read().splitlines():
                    unshuffled = plain
        if unshuffled:
            try:
                outputs.check_evaluation(unshuffled)
            except outputs.OutputError as e:
                raise EvaluationError(str(e)) from None
            if not os.path.isfile(os.path.join(unshuffled, "bleu.json")):
                raise EvaluationError(f"--unshuffled {unshuffled}: no bleu.json")
    elif unshuffled:
        raise EvaluationError("--unshuffled is for the adversarial evaluation (--shuffle-source L)")
    out = out or check_default_out(default, data, opts.split)
    return Plan(opts=opts, checkpoints=checkpoints, data=data, prep=prep, src=src, tgt=tgt,
                remove_bpe=REMOVE_BPE[bpe], headline=headline, note=note, shuffle=shuffle, shuffle_seed=seed,
                unshuffled=unshuffled, out=out)


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
    """``arg`` as bash's ``printf %q`` writes it (generate-SPLIT.cmd reads as the recipes
    wrote it): special characters escaped by a backslash; an empty or unprintable one quoted."""
    if not arg or not arg.isprintable():
        return shlex.quote(arg)
    out = []
    for i, c in enumerate(arg):
        if c in _SHELL_SPECIAL or (c == "#" and i == 0) or (c == "~" and (i == 0 or arg[i - 1] in "=:")):
            out.append("\\")
        out.append(c)
    return "".join(out)


def _write_lines(path: str, lines: Sequence[str]) -> None:
    with corpus.open_text(path) as f:
        f.writelines(line + "\n" for line in lines)


def _read(path: str) -> List[str]:
    return list(corpus.read_lines(path))


def _text(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def _log(message: str) -> None:
    print(f"[{PROG}] {message}", file=sys.stderr, flush=True)


def _warn(message: str) -> None:
    print(f"[{PROG}] WARNING: {message}", file=sys.stderr, flush=True)


def run(p: Plan, log: Callable[[str], None] = _log, echo: Callable[[str], None] = print) -> dict:
    """Run the evaluation ``p``: translate, detokenize, score, and move the result into
    ``p.out``. ``log``: progress lines; ``echo``: the scores (bleu.txt's lines). Returns
    bleu.json's content, with ``dir`` and ``sentences``."""
    from fairseq_ext import resources

    env = resources.command_environment()  # fairseq-generate of this Python's environment
    env["FSX_PROG"] = PROG
    if shutil.which("fairseq-generate", path=env["PATH"]) is None:
        raise EvaluationError("'fairseq-generate' not found on PATH (run 'make setup', or activate .venv)")
    split, tgt = p.opts.split, p.tgt
    # --out: replaced (it must be a directory evaluation wrote, or empty), never one that holds
    # the data, a checkpoint or a reference
    inputs = [p.data, *p.checkpoints, p.opts.ref_detok, p.opts.ref_tok]
    staged = outputs.StagedOutput(p.out, prog=PROG, inputs=inputs, force=True, log=log,
                                  keep_on_failure=[f"generate-{split}.log", f"generate-{split}.cmd"])
    with staged:
        staged.discard_old()
        out = staged.stage
        # the references first (read as every tool reads text: UTF-8 checked, BOM and CRs
        # removed), so that an unreadable one fails before the decoding, not after it
        ref_tok = p.opts.ref_tok or os.path.join(p.data, "text", f"{split}.tok.{tgt}")
        ref_detok = p.opts.ref_detok or os.path.join(p.data, "text", f"{split}.raw.{tgt}")
        if os.path.isfile(ref_tok):
            _write_lines(os.path.join(out, "ref.tok"), _read(ref_tok))
        if os.path.isfile(ref_detok):
            _write_lines(os.path.join(out, "ref.detok"), _read(ref_detok))

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
        _write_lines(os.path.join(out, "hyp.tok"), lines["hyp"])
        _write_lines(os.path.join(out, "src.tok"), lines["src"])
        detok = corpus.moses_detokenizer(tgt)
        _write_lines(os.path.join(out, "hyp.detok"), [detok(h) for h in lines["hyp"]])
        if not os.path.isfile(os.path.join(out, "ref.tok")):
            _warn(f"no {ref_tok}: using fairseq's target lines as the tokenized reference (their <unk>s count as errors)")
            _write_lines(os.path.join(out, "ref.tok"), lines["ref"])
        if not os.path.isfile(os.path.join(out, "ref.detok")):
            _warn(f"no {ref_detok}: detokenizing the tokenized reference for detokenized BLEU")
            _write_lines(os.path.join(out, "ref.detok"), [detok(r) for r in _read(os.path.join(out, "ref.tok"))])
        for name, path in (("ref.tok", ref_tok), ("ref.detok", ref_detok)):
            m = outputs.count_lines(os.path.join(out, name))
            if m != n:
                raise EvaluationError(f"the reference {path} has {m} lines but fairseq-generate translated {n} "
                                      f"sentences of '{split}' (wrong --split or --ref-*?)")

        log(f"sacreBLEU on {n} sentences of '{split}'")
        scores = bleu.score(*(os.path.join(out, f) for f in ("hyp.detok", "ref.detok", "hyp.tok", "ref.tok")))
        text = bleu.report(scores, p.headline, p.note)
        with open(os.path.join(out, "bleu.json"), "w", encoding="utf-8") as f:
            json.dump(scores, f, indent=2)
        marks = []
        if p.shuffle:
            marks = [f"shuffle_source={p.shuffle}", f"shuffle_seed={p.shuffle_seed}"]
            if p.unshuffled:
                text.append(_adversarial(scores, p, os.path.join(out, "adversarial.json")))
        for line in text:
            echo(line)
        with open(os.path.join(out, "bleu.txt"), "w", encoding="utf-8") as f:
            f.writelines(line + "\n" for line in text)

        # success: the completion marker last, then the whole directory into place
        outputs.write_evaluation_complete(out, [f"checkpoint={p.opts.checkpoint}", f"data={p.data}",
                                                f"split={split}", f"sentences={n}", *marks])
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


def evaluate(checkpoint: str, data: str, *, split: str = "test", out: Optional[str] = None, src: Optional[str] = None,
             tgt: Optional[str] = None, bpe: Optional[str] = None, headline: Optional[str] = None,
             generate_args: Sequence[str] = (), model_overrides: Optional[dict] = None, cpu: bool = False,
             quiet: bool = True) -> dict:
    """Evaluate ``checkpoint`` on ``split`` of ``data`` into ``out`` (default
    CKPT_DIR/eval-SET), as ``fairseq-ext evaluate`` does. Returns {"dir": out, "bleu":
    {flavour: score}, "headline": flavour, "sentences": n}. ``quiet``: no progress lines and no
    scores printed (warnings still are). Raises EvaluationError."""
    argv = ["--checkpoint", checkpoint, "--data", data, "--split", split]
    for flag, value in (("--out", out), ("--src", src), ("--tgt", tgt), ("--bpe", bpe), ("--headline", headline)):
        if value:
            argv += [flag, value]
    argv += list(generate_args)
    if model_overrides:
        argv += ["--model-overrides", repr(model_overrides)]
    if cpu:
        argv.append("--cpu")
    opts = parse_args(argv)
    silent = (lambda message: None) if quiet else _log
    with _program_name():
        try:
            scores = run(plan(opts), log=silent, echo=silent if quiet else print)
        except outputs.OutputError as e:
            raise EvaluationError(str(e)) from None
        except SystemExit as e:  # a text helper's one-line error, already printed
            raise EvaluationError(f"evaluation of {checkpoint} failed (exit status {e.code}; see the error above)") \
                from None
    return {"dir": scores["dir"], "bleu": {k: v["score"] for k, v in scores.items() if isinstance(v, dict)},
            "headline": scores.get("headline", "detok-cased"), "sentences": scores["sentences"]}


class _program_name:
    """FSX_PROG for the text helpers' one-line errors ("[evaluate.sh] error: ...")."""

    def __enter__(self):
        self.old = os.environ.get("FSX_PROG")
        os.environ["FSX_PROG"] = PROG

    def __exit__(self, *exc):
        if self.old is None:
            os.environ.pop("FSX_PROG", None)
        else:
            os.environ["FSX_PROG"] = self.old
        return False


def _die(message: str) -> int:
    print(f"[{PROG}] error: {message}", file=sys.stderr, flush=True)
    return 1


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    usage = USAGE.format(prog=PROG)
    # as the recipes: an interrupt or a kill removes the temporary directory
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with _program_name():
        try:
            opts = parse_args(argv)
            if opts.help:
                print(usage)
                return 0
            run(plan(opts), echo=lambda line: print(line, flush=True))
        except EvaluationError as e:
            if e.usage:
                print(usage, file=sys.stderr)
            return _die(str(e))
        except outputs.OutputError as e:
            return _die(str(e))
        except KeyboardInterrupt:
            return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
