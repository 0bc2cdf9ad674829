"""One self-contained HTML page from several analyses: tables, figures inline, the commands.

Run a chosen set of analyses on one or more checkpoints, then write ``OUT/report.html``::

    python -m fairseq_ext.analysis.report --checkpoint base.pt m00.pt --names baseline M-00 \\
        --data data-bin/multi30k-en-de --split test --out analysis/report \\
        --run length_buckets attention_stats layer_dependency \\
        --args length_buckets="--generate-args '--beam 5'" --args attention_stats="--max-sentences 500"

or collect analyses that were run before (each command's ``--out`` directory)::

    python -m fairseq_ext.analysis.report --from analysis/len analysis/attn --out analysis/report

Every analysis runs as its own command (``python -m fairseq_ext.analysis.NAME``, the same
command a user would type) with ``--out OUT/NAME``; the ones that read one checkpoint
(their ``Analysis.single``) run once per checkpoint, into ``OUT/NAME/<name>``. Each is given only the
options its own parser accepts (``--names`` and ``--cpu`` are left out where it takes
none). ``word_order`` gets every checkpoint with its name and pairs each model with its
counterpart trained without encoder positions from their configurations (``--args
word_order='--pairs base:base-nopos'`` names the pairs instead). An analysis that needs a
technique (its ``Analysis.needs``) runs on the models that have it, read from their
checkpoints' configurations: ``layer_dependency`` on joint attention over several layers,
``decoders`` on auxiliary decoders, ``aif_dependency`` on AIF, ``dc_divergence`` on Dual
Contextual layers; its section names the models left out and why (none left: a failure).
The analyses, their titles and their page order come from
:mod:`fairseq_ext.analysis.registry`. An analysis that fails is
reported on the page with its error and the others still run (the exit status is then 1).
The page holds every table an analysis wrote (its ``NAME.json`` rows), every PNG (base64,
so the one file can be sent on), the command that produced each directory
(``command.txt``, which every analysis writes next to its tables) and the environment
(fairseq_ext version, torch, fairseq, date). Nothing on the page is loaded from elsewhere.
"""
import argparse
import functools
import os
import shlex
import subprocess
import sys
from typing import Callable, Dict, List, Optional, Sequence, Set, Tuple

from fairseq_ext.analysis import AnalysisError, registry
from fairseq_ext.analysis.figures import names_for
from fairseq_ext.analysis.report_page import collect, models_html, section_html, write_page
from fairseq_ext.common import checkpoints
from fairseq_ext.common.command_line import setup_cli
from fairseq_ext.models.multilayer_transformer_config import MultilayerOptions

# the report's options every analysis must take; the others (--names, --cpu) only name the
# checkpoints or choose the device, so an analysis that takes neither still analyses the same
REQUIRED_OPTIONS = ("--checkpoint", "--data", "--split", "--out")


def analysis_options(name: str) -> Set[str]:
    """The option strings (``--checkpoint``, ``--names``, ...) analysis ``name`` accepts: its
    own parser's, not a list kept here."""
    return registry.get(name).option_strings()


def analysis_commands(name: str, paths: Sequence[str], names: Sequence[str], data: str, split: str,
                      out: str, cpu: bool, extra: Sequence[str]) -> List[Tuple[List[str], str]]:
    """[(argv, output directory)] of ``name`` on the checkpoints ``paths``, with only the
    options the analysis accepts (:func:`analysis_options`): ``--names`` and ``--cpu`` are
    left out where it takes none; one that takes no ``--checkpoint``, ``--data``, ``--split``
    or ``--out`` is an AnalysisError."""
    analysis = registry.get(name)
    accepted = analysis_options(name)
    missing = [o for o in REQUIRED_OPTIONS if o not in accepted]
    if missing:
        raise AnalysisError(f"{analysis.module} takes no {', '.join(missing)}: the report cannot run it")

    def given(option: str, *values: str) -> List[str]:
        return [option, *values] if option in accepted else []

    base = [sys.executable, "-m", analysis.module]
    tail = ["--data", data, "--split", split] + (given("--cpu") if cpu else []) + list(extra)
    target = os.path.join(out, name)
    if analysis.single:
        return [(base + ["--checkpoint", c, *given("--names", n), "--out", os.path.join(target, n)] + tail,
                 os.path.join(target, n)) for c, n in zip(paths, names)]
    return [(base + ["--checkpoint", *paths, *given("--names", *names), "--out", target] + tail, target)]


def _has(analysis: registry.Analysis, options_of: Callable[[str], MultilayerOptions], checkpoint: str) -> bool:
    try:
        options = options_of(checkpoint)
    except AttributeError:  # a model of fairseq's own architectures has none of the plugin's techniques
        return False
    return analysis.applies_to(options)


def applicable(name: str, paths: Sequence[str], names: Sequence[str],
               options_of: Optional[Callable[[str], MultilayerOptions]] = None) -> Tuple[List[str], List[str], str]:
    """(checkpoints, names) of the models ``name`` can analyse (its ``Analysis.needs`` of
    each model's typed options), and a sentence naming the others and what they lack ("" when
    it analyses all of them). A report over a baseline and the techniques runs layer masking
    on the joint-attention models only, the auxiliary decoders' analyses on the MS models
    only, and says so on the page. ``options_of``: a checkpoint's options (default: read from
    the file)."""
    analysis = registry.get(name)
    if analysis.needs is None:
        return list(paths), list(names), ""
    options_of = options_of or checkpoints.options
    kept, kept_names, left = [], [], []
    for checkpoint, n in zip(paths, names):
        if _has(analysis, options_of, checkpoint):
            kept.append(checkpoint)
            kept_names.append(n)
        else:
            left.append(n)
    note = f"not run on {', '.join(left)}: {analysis.lacks}" if left else ""
    return kept, kept_names, note


def run_analysis(argv: List[str], out: str) -> Optional[str]:
    """Run one analysis command; its output goes to OUT/log.txt. The error tail, or None."""
    os.makedirs(out, exist_ok=True)
    shown = ["python", *argv[1:]]
    with open(os.path.join(out, "command.txt"), "w", encoding="utf-8") as f:
        f.write(" ".join(shlex.quote(a) for a in shown) + "\n")
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    print("$ " + " ".join(shlex.quote(a) for a in shown), flush=True)
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=os.getcwd())
    with open(os.path.join(out, "log.txt"), "w", encoding="utf-8") as f:
        f.write(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        return "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
    return None


def parse_extra(values: Sequence[str]) -> Dict[str, List[str]]:
    known = registry.analyses()
    extra: Dict[str, List[str]] = {}
    for value in values or []:
        name, sep, args = value.partition("=")
        if not sep or name not in known:
            raise AnalysisError(f"--args {value!r}: expected NAME=ARGS with NAME one of {', '.join(known)}")
        extra.setdefault(name, []).extend(shlex.split(args))
    return extra


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", nargs="+", choices=list(registry.analyses()),
                    help="analyses to run (page order: as listed)")
    ap.add_argument("--checkpoint", nargs="+",
                    help="checkpoint(s) for --run (with --from alone: the models the page describes)")
    ap.add_argument("--names", nargs="+", help="a name per checkpoint")
    ap.add_argument("--data", help="binarized data directory for --run")
    ap.add_argument("--split", default="test")
    ap.add_argument("--cpu", action="store_true")
    ap.add_argument("--args", action="append", metavar="NAME=ARGS",
                    help="extra arguments of one analysis, e.g. attention_stats='--max-sentences 500' (repeatable)")
    ap.add_argument("--from", dest="from_dirs", nargs="+", default=[], metavar="DIR",
                    help="output directories of analyses run before, added to the page")
    ap.add_argument("--title", default="fairseq_ext analysis report")
    ap.add_argument("--out", required=True, help="directory of report.html (and of the analyses run here)")
    return ap


def main(argv=None):
    setup_cli()
    args = build_parser().parse_args(argv)
    if not args.run and not args.from_dirs:
        raise AnalysisError("nothing to report: give --run NAME... (with --checkpoint and --data) or --from DIR...")
    if args.run and (not args.checkpoint or not args.data):
        raise AnalysisError("--run needs --checkpoint and --data")
    for d in args.from_dirs:
        if not os.path.isdir(d):
            raise AnalysisError(f"--from {d}: not a directory")
        if not any(collect(d).values()):
            raise AnalysisError(f"--from {d} holds no analysis output (no table, PNG figure or command.txt of an "
                                "analysis): give the --out of an earlier analysis")
    extra = parse_extra(args.args)
    names = names_for(args.checkpoint, args.names) if args.checkpoint else []
    known = registry.analyses()

    sections, titles, failed = [], [], 0
    # each checkpoint read once for all the analyses that ask what it has
    options_of = functools.lru_cache(maxsize=None)(lambda c: checkpoints.options(c))

    def add(out: str, title: str, reference: str, error: Optional[str], note: str = ""):
        anchor = os.path.relpath(out, args.out).replace(os.sep, "-")
        sections.append(section_html(anchor, title, reference, os.path.relpath(out, args.out), collect(out), error,
                                     note))
        titles.append((anchor, title))

    for name in args.run or []:
        analysis = known[name]
        try:
            chosen, chosen_names, note = applicable(name, args.checkpoint, names, options_of)
            if not chosen:
                raise AnalysisError(f"no model to analyse: {note}")
            commands = analysis_commands(name, chosen, chosen_names, args.data, args.split, args.out, args.cpu,
                                         extra.get(name, []))
        except AnalysisError as e:  # on the page like an analysis that failed; the others still run
            failed += 1
            add(os.path.join(args.out, name), analysis.title, analysis.reference, str(e))
            continue
        if note:
            print(f"{name}: {note}", flush=True)
        for command, out in commands:
            error = run_analysis(command, out)
            failed += error is not None
            add(out, analysis.title + (f": {os.path.basename(out)}" if analysis.single else ""), analysis.reference,
                error, note)
    for d in args.from_dirs:
        found = collect(d)
        analysis = next((a for a in known.values() if any(f"{a.module} " in c + " " for c in found["commands"])),
                        None)
        if analysis is None:
            title, reference = os.path.basename(os.path.abspath(d)), ""
        else:
            title, reference = analysis.title, analysis.reference
        if analysis is not None and analysis.single:  # one directory per model: the title names it, as for --run
            title += f": {os.path.basename(os.path.abspath(d))}"
        anchor = f"from-{len(titles)}"
        sections.append(section_html(anchor, title, reference, d, found))
        titles.append((anchor, title))
    # the models' table: of the checkpoints analysed here, or named beside --from alone
    models = models_html(args.checkpoint, names, args.data, args.split) if args.checkpoint else ""
    path = write_page(sections, titles, os.path.join(args.out, "report.html"), args.title, models)
    print(f"written: {path}" + (f" ({failed} analysis run(s) failed: see the page)" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
