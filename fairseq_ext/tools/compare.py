"""Compare two systems (``fairseq-ext significance``, or python -m fairseq_ext.tools.compare): paired bootstrap
resampling (Koehn, 2004) of system B against system A with sacreBLEU (--paired-bs, 1000 samples as in the papers;
--paired-ar for approximate randomization), in the BLEU flavour of the compared files, plus compare-mt's (Neubig et al.,
2019) analyses: BLEU by reference-length bucket (<10, 10-20, ..., >=50, as the thesis reports), word accuracy, n-grams.
The p-value and mark come from sacreBLEU, the scorer of the BLEU they qualify (:mod:`fairseq_ext.tools.significance`);
compare-mt's own BLEU treats a zero n-gram precision as 1 and can disagree (docs/evaluation.md of the source
repository).

The two ways to name the systems, the files written to --out and compare-mt's shim: docs/evaluation.md.
"""
import argparse
import filecmp
import functools
import json
import os
import shutil
import subprocess
import sys
from typing import List, Optional, Sequence

from fairseq_ext.common.command_line import CommandParser, log_line, run_main
from fairseq_ext.errors import CommandError
from fairseq_ext.standalone import compare_mt_shim, corpus, evaluations, outputs
from fairseq_ext.tools import comet as comet_metric
from fairseq_ext.tools.significance import paired_significance, table_lines
from fairseq_ext.tools.statistics import mark

PROG = outputs.SIGNIFICANCE
# every metric evaluate prints, each tested by sacreBLEU in the same call (its p-value and mark)
METRICS = ("BLEU", "chrF2", "chrF2++", "TER")
COMMAND = "fairseq-ext significance"
SHIM = os.path.abspath(compare_mt_shim.__file__)
_log = functools.partial(log_line, COMMAND)


class CompareError(CommandError):
    pass


def build_parser() -> CommandParser:
    parser = CommandParser(
        prog=COMMAND, usage=f"{COMMAND} (--eval-a DIR --eval-b DIR | --ref REF --sys-a HYP --sys-b HYP) --out DIR "
                            "[options] [-- compare-mt options]",
        description=__doc__.split("\n\n")[0], epilog="Further arguments after -- go to compare-mt unchanged.")
    add = parser.add_argument
    add("--eval-a", default="", metavar="DIR", help="output directory of fairseq-ext evaluate (system A)")
    add("--eval-b", default="", metavar="DIR", help="the same for system B (same data and split)")
    add("--ref", default="", metavar="FILE", help="reference")
    add("--sys-a", default="", metavar="FILE", help="system A's output")
    add("--sys-b", default="", metavar="FILE", help="system B's output")
    add("--src", default="", metavar="FILE", help="source sentences (optional; enables source-side analyses)")
    add("--level", default="tok", help="with --eval-*: compare tokenized (tok, default) or detokenized (detok) text")
    add("--names", default="A B", help='system names in the report (default "A B")')
    add("--samples", default="1000", help="bootstrap samples (default 1000)")
    add("--seed", default="1", help="random seed (default 1)")
    add("--lc", action="store_true", help="case-insensitive BLEU (e.g. IWSLT'14 De-En)")
    add("--paired-ar", dest="method", action="store_const", const="ar", default="bs",
        help="approximate randomization instead of the paired bootstrap")
    add("--paired-bs", dest="method", action="store_const", const="bs", help="the paired bootstrap (default)")
    add("--out", default="", metavar="DIR",
        help="report directory (created; significance.txt/.json, index.html, report.txt)")
    comet_metric.add_arguments(parser)
    add("--comet-splits", type=int, default=300, metavar="N",
        help="with --comet-model: comet-compare's bootstrap splits (default 300)")
    add("--cpu", action="store_true", help="with --comet-model: COMET on the CPU even where there is a GPU")
    return parser


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    argv = list(argv)
    ours, theirs = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    opts = build_parser().parse_args(ours)
    opts.compare_mt_args = theirs
    return opts


def check(opts: argparse.Namespace) -> argparse.Namespace:
    """The options checked, and with --eval-*, the files of the evaluations filled in."""
    if not opts.out:
        raise CompareError("--out DIR is required", usage=True)
    if len(opts.names.split()) != 2:
        raise CompareError('--names takes two names, e.g. --names "baseline mlmha"')
    for flag, value, least in (("--samples", opts.samples, 1), ("--seed", opts.seed, 0)):
        try:
            number = int(value)
        except ValueError:
            raise CompareError(f"{flag} takes an integer, not {value!r}") from None
        if number < least:  # --samples 0: sacreBLEU draws no sample and reports p = 1 with a bs:1000 signature
            raise CompareError(f"{flag} must be at least {least}, not {value}")
    if opts.level not in ("tok", "detok"):
        raise CompareError("--level must be tok or detok")
    if opts.eval_a or opts.eval_b:
        if not (opts.eval_a and opts.eval_b):
            raise CompareError("give both --eval-a and --eval-b")
        if opts.sys_a or opts.sys_b:
            raise CompareError("use either --eval-a/--eval-b or --sys-a/--sys-b, not both")
        for directory in (opts.eval_a, opts.eval_b):
            try:
                evaluations.check_evaluation(directory)
            except outputs.OutputError as e:
                raise CompareError(str(e)) from None
        opts.sys_a = os.path.join(opts.eval_a, f"hyp.{opts.level}")
        opts.sys_b = os.path.join(opts.eval_b, f"hyp.{opts.level}")
        opts.ref = opts.ref or os.path.join(opts.eval_a, f"ref.{opts.level}")
        if not opts.src and os.path.isfile(os.path.join(opts.eval_a, "src.tok")):
            opts.src = os.path.join(opts.eval_a, "src.tok")
        ref_b = os.path.join(opts.eval_b, f"ref.{opts.level}")
        if os.path.isfile(ref_b) and not (os.path.isfile(opts.ref) and filecmp.cmp(opts.ref, ref_b, shallow=False)):
            raise CompareError(f"{opts.eval_a} and {opts.eval_b} were scored against different references "
                               "(not the same data/split?)")
    if not (opts.ref and opts.sys_a and opts.sys_b):
        raise CompareError("need --ref, --sys-a and --sys-b (or --eval-a/--eval-b)", usage=True)
    opts.comet = comet_metric.from_args(opts)
    if opts.comet is not None:
        opts.comet_files = comet_files(opts)
    return opts


def comet_files(opts: argparse.Namespace) -> Optional[List[str]]:
    """With --eval-*, the files COMET reads: the data's raw source (as the evaluation recorded it), the evaluations'
    detokenized translations and reference. None with --sys-*: COMET reads the compared files themselves, with --src."""
    if not opts.eval_a:
        if not opts.src:
            raise CompareError("--comet-model needs --src: COMET reads the source sentences")
        return None
    record = evaluations.read_evaluation_complete(opts.eval_a)
    raw_src = os.path.join(record.get("data", ""), "text", f"{record.get('split', '')}.raw.{record.get('src', '')}")
    if not (record.get("src") and os.path.isfile(raw_src)):
        raise CompareError(f"--comet-model: no raw source for {opts.eval_a} ({raw_src}); pass --ref, --sys-a, "
                           "--sys-b and --src as raw text instead")
    return [raw_src, *(os.path.join(d, "hyp.detok") for d in (opts.eval_a, opts.eval_b)),
            os.path.join(opts.eval_a, "ref.detok")]


def run(opts: argparse.Namespace, log=_log) -> dict:
    """Compare, and move the report into ``opts.out``; returns significance.json's content."""
    name_a, name_b = opts.names.split()
    samples, seed = int(opts.samples), int(opts.seed)
    # --out: replaced when the report is complete; never one that holds the compared files
    inputs = [opts.ref, opts.sys_a, opts.sys_b, opts.src, opts.eval_a, opts.eval_b]
    staged = outputs.StagedOutput(opts.out, prog=PROG, inputs=inputs, force=True, log=log,
                                  keep_on_failure=["compare-mt.log", "sacrebleu.log"])
    with staged:
        names = ["ref", "sys-a", "sys-b", "src"][:4 if opts.src else 3]
        files = [_read_once(path, os.path.join(staged.work, f"{name}.piped"))
                 for name, path in zip(names, [opts.ref, opts.sys_a, opts.sys_b, opts.src])]
        corpus.check_parallel(files)
        # compare-mt reads copies cleaned by the one reader (UTF-8 checked, BOM and CRs removed)
        texts, clean = [], []
        for name, path in zip(names, files):
            texts.append(list(corpus.read_lines(path)))
            clean.append(os.path.join(staged.work, name))
            corpus.write_lines(clean[-1], texts[-1])
        out = staged.stage
        flavour = f"{opts.level}-{'lc' if opts.lc else 'cased'}"
        title = "bootstrap" if opts.method == "bs" else "approximate randomization"
        log(f"sacreBLEU paired {title}, {samples} samples, BLEU, chrF2, chrF2++ and TER ({flavour})")
        try:
            result = paired_significance(texts[0], texts[1], {name_b: texts[2]}, flavour=flavour,
                                         method=opts.method, n_samples=samples, seed=seed, metrics=METRICS)
        except (ValueError, RuntimeError) as e:
            with open(os.path.join(out, "sacrebleu.log"), "w", encoding="utf-8") as f:
                f.write(f"{e}\n")
            sys.stderr.write("".join(f"{e}\n".splitlines(keepends=True)[-5:]))
            raise CompareError(f"the sacreBLEU paired test failed (log: {staged.out}/sacrebleu.log)") from None
        lines = table_lines(result, method=opts.method, n_samples=samples, flavour=flavour, baseline_name=name_a)
        if opts.comet is not None:
            log(f"COMET ({opts.comet.name}): comet-compare, paired t-test and {opts.comet_splits} bootstrap splits")
            if opts.comet_files is None:  # the files read above (a pipe can be read only once)
                src, sys_a, sys_b, ref = texts[3], texts[1], texts[2], texts[0]
            else:
                src, sys_a, sys_b, ref = (list(corpus.read_lines(path)) for path in opts.comet_files)
            found = comet_metric.compare(opts.comet, src, sys_a, sys_b, ref, num_splits=opts.comet_splits)
            result[name_b]["comet"] = {**found, "mark": mark(found["p_value"])}
            lines += [""] + comet_lines(result[name_b]["comet"], name_a, name_b)
        with open(os.path.join(out, "significance.json"), "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1, ensure_ascii=False)
        corpus.write_lines(os.path.join(out, "significance.txt"), lines)
        print("\n".join(lines), flush=True)

        ci = ",case_insensitive=True" if opts.lc else ""
        args = [*clean[:3], "--sys_names", name_a, name_b,
                "--compare_scores", f"score_type=bleu,bootstrap={samples},prob_thresh=0.05{ci}", "score_type=length",
                "--compare_sentence_buckets",
                f"bucket_type=length,statistic_type=score,score_measure=bleu,bucket_cutoffs=10:20:30:40:50{ci}",
                "--output_directory", out, "--seed", str(seed), "--report_title", f"{name_a} vs {name_b}"]
        if opts.src:
            args += ["--src_file", clean[3]]
        log(f"compare-mt: paired bootstrap, {samples} samples ({os.path.basename(opts.sys_a)} vs "
            f"{os.path.basename(opts.sys_b)})")
        with open(os.path.join(out, "report.txt"), "wb") as stdout, \
                open(os.path.join(out, "compare-mt.log"), "wb") as stderr:
            code = subprocess.run([sys.executable, SHIM, *args, *opts.compare_mt_args], stdout=stdout,
                                  stderr=stderr, env=dict(os.environ, MPLBACKEND="Agg")).returncode
        if code != 0:
            # compare-mt's analyses are extras (its figures fail on some inputs, e.g. 3 sentences):
            # the sacreBLEU result stands, and the failure is one line
            with open(os.path.join(out, "compare-mt.log"), encoding="utf-8", errors="replace") as f:
                last = ([line.strip()[:200] for line in f if line.strip()] or ["no message"])[-1]
            log(f"WARNING: compare-mt failed ({last}); the sacreBLEU result is kept, compare-mt's analyses are "
                f"missing (log: {staged.out}/compare-mt.log)")
        staged.finish()
    extras = (f"; compare-mt's analyses (length buckets, word accuracy): {staged.out}/report.txt, "
              f"{staged.out}/index.html") if code == 0 else ""
    log(f"significance: {staged.out}/significance.txt{extras}")
    return result


def comet_lines(found: dict, name_a: str, name_b: str) -> List[str]:
    """comet-compare's result as significance.txt prints it."""
    return [f"COMET (comet-compare: paired t-test over the segment scores; bootstrap, {found['num_splits']} splits "
            f"of {found['sample_ratio']:.0%} of the sentences), p against {name_a}",
            f"{'system':<20} {'COMET':>8} {'wins':>6} {'p':>8}  mark",
            f"{name_a:<20} {found['baseline_mean']:>8.4f} {found['baseline_wins']:>6.0%}",
            f"{name_b:<20} {found['system_mean']:>8.4f} {found['system_wins']:>6.0%} {found['p_value']:>8.4f}  "
            f"{found['mark']}",
            f"ties: {found['ties']:.0%} of the splits; COMET: the mean over the bootstrap splits; "
            f"signature: {found['signature']}"]


def _read_once(path: str, copy: str) -> str:
    """``path``, or for a pipe (``--ref <(...)``), which can be read only once, a copy of its
    bytes at ``copy`` (with its .gz suffix): the files are read twice, checked and then scored."""
    if os.path.isfile(path) or not os.path.exists(path) or os.path.isdir(path):
        return path  # a file; or what the checks refuse, named as the user gave it
    copy += ".gz" if path.endswith(".gz") else ""
    with open(path, "rb") as source, open(copy, "wb") as target:
        shutil.copyfileobj(source, target)
    return copy


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    return run_main(COMMAND, lambda: run(check(parse_args(argv))),
                       (CommandError, outputs.OutputError, corpus.TextError, comet_metric.CometError),
                       lambda: build_parser().format_usage())


if __name__ == "__main__":
    sys.exit(main())
