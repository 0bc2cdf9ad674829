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
import base64
import datetime
import functools
import html
import importlib.metadata
import json
import os
import shlex
import subprocess
import sys
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import fairseq
import torch

from fairseq_ext.analysis import AnalysisError, command, registry
from fairseq_ext.analysis.figures import names_for
from fairseq_ext.common import checkpoints, data_text
from fairseq_ext.common.command_line import setup_cli
from fairseq_ext.models.multilayer_transformer_config import MultilayerOptions

# the report's options every analysis must take; the others (--names, --cpu) only name the
# checkpoints or choose the device, so an analysis that takes neither still analyses the same
REQUIRED_OPTIONS = ("--checkpoint", "--data", "--split", "--out")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
STYLE = """
body { font-family: system-ui, sans-serif; max-width: 70em; margin: 2em auto; padding: 0 1em; color: #222; }
h1 { font-size: 1.6em; } h2 { border-bottom: 1px solid #ccc; padding-bottom: .2em; margin-top: 2em; }
h3 { font-size: 1.05em; margin-top: 1.5em; }
table { border-collapse: collapse; margin: .5em 0 1em; font-size: .9em; }
th, td { border: 1px solid #ccc; padding: .25em .6em; text-align: right; }
th { background: #f3f3f3; } td:first-child, th:first-child { text-align: left; }
pre { background: #f6f6f6; padding: .6em; overflow-x: auto; font-size: .85em; white-space: pre-wrap; }
img { max-width: 100%; border: 1px solid #eee; margin: .3em 0 1em; }
.failed { color: #a00; } .ref { color: #666; font-size: .9em; } .note { color: #555; font-style: italic; }
nav a { margin-right: 1em; }
"""


def analysis_commands(name: str, paths: Sequence[str], names: Sequence[str], data: str, split: str,
                      out: str, cpu: bool, extra: Sequence[str]) -> List[Tuple[List[str], str]]:
    """[(argv, output directory)] of ``name`` on ``paths``, with only the options its parser accepts
    (one that takes none of REQUIRED_OPTIONS is an AnalysisError)."""
    analysis = registry.get(name)
    accepted = analysis.option_strings()
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


def applicable(name: str, paths: Sequence[str], names: Sequence[str],
               options_of: Optional[Callable[[str], MultilayerOptions]] = None) -> Tuple[List[str], List[str], str]:
    """(checkpoints, names) of the models ``name`` can analyse, and a sentence naming the others
    and what they lack ("" for none). ``options_of``: a checkpoint's options."""
    analysis = registry.get(name)
    options_of = options_of or checkpoints.options
    kept, left = [], []
    for checkpoint, n in zip(paths, names):
        try:
            applies = analysis.applies_to(options_of(checkpoint)) if analysis.needs is not None else True
        except AttributeError:  # a model of fairseq's own architectures has none of the plugin's techniques
            applies = False
        (kept if applies else left).append((checkpoint, n))
    note = f"not run on {', '.join(n for _, n in left)}: {analysis.lacks}" if left else ""
    return [c for c, _ in kept], [n for _, n in kept], note


def run_analysis(argv: List[str], out: str) -> Optional[str]:
    """Run one analysis command; its output goes to OUT/log.txt. The error tail, or None."""
    os.makedirs(out, exist_ok=True)
    shown = " ".join(shlex.quote(a) for a in ["python", *argv[1:]])
    with open(os.path.join(out, "command.txt"), "w", encoding="utf-8") as f:
        f.write(shown + "\n")
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    print("$ " + shown, flush=True)
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=os.getcwd())
    with open(os.path.join(out, "log.txt"), "w", encoding="utf-8") as f:
        f.write(proc.stdout + proc.stderr)
    return "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:]) if proc.returncode != 0 else None


def parse_extra(values: Sequence[str]) -> Dict[str, List[str]]:
    known = registry.analyses()
    extra: Dict[str, List[str]] = {}
    for value in values or []:
        name, sep, args = value.partition("=")
        if not sep or name not in known:
            raise AnalysisError(f"--args {value!r}: expected NAME=ARGS with NAME one of {', '.join(known)}")
        extra.setdefault(name, []).extend(shlex.split(args))
    return extra


def html_table(rows: List[dict]) -> str:
    def cell(value) -> str:
        if isinstance(value, float):
            return f"{value:.4g}" if abs(value) < 1e-2 and value != 0 else f"{value:.2f}"
        return "–" if value is None else str(value)

    columns = list(dict.fromkeys(c for row in rows for c in row))
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(cell(r.get(c)))}</td>" for c in columns) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def collect(directory: str) -> dict:
    """The tables (a ``.json`` list of rows beside a ``.md``, titled by its "### " line), PNG figures
    and commands an analysis wrote in ``directory`` (recursively)."""
    tables, figures, commands = [], [], []
    for root, dirs, files in os.walk(directory):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(root, name)
            rel = os.path.relpath(path, directory)
            stem, ext = os.path.splitext(name)
            if ext == ".json" and stem + ".md" in files:
                try:
                    with open(path, encoding="utf-8") as f:
                        rows = json.load(f)
                    with open(os.path.join(root, stem + ".md"), encoding="utf-8") as f:
                        first = f.readline().strip()
                except (OSError, ValueError):  # not a table an analysis wrote
                    continue
                if isinstance(rows, list) and all(isinstance(r, dict) for r in rows):
                    tables.append({"name": rel, "title": first[4:] if first.startswith("### ") else stem, "rows": rows})
            elif ext == ".png":
                with open(path, "rb") as f:
                    data = f.read()
                if data.startswith(PNG_MAGIC):
                    figures.append({"name": rel, "png": data})
            elif name == "command.txt":
                with open(path, encoding="utf-8") as f:
                    commands.append(f.read().strip())
    return {"tables": tables, "figures": figures, "commands": commands}


def section_html(anchor: str, title: str, reference: str, directory: str, found: dict,
                 error: Optional[str] = None, note: str = "") -> str:
    parts = [f'<h2 id="{html.escape(anchor)}">{html.escape(title)}</h2>']
    if reference:
        parts.append(f'<p class="ref">{html.escape(reference)} · <code>{html.escape(directory)}</code></p>')
    if note:
        parts.append(f'<p class="note">{html.escape(note)}</p>')
    parts += [f"<pre>{html.escape(command)}</pre>" for command in found["commands"]]
    if error:
        parts.append(f'<p class="failed">failed:</p><pre class="failed">{html.escape(error)}</pre>')
    for table in found["tables"]:
        parts.append(f"<h3>{html.escape(table['title'])} <span class=\"ref\">({html.escape(table['name'])})"
                     f"</span></h3>{html_table(table['rows'])}")
    for fig in found["figures"]:
        data = base64.b64encode(fig["png"]).decode("ascii")
        parts.append(f"<h3>{html.escape(fig['name'])}</h3>"
                     f'<img alt="{html.escape(fig["name"])}" src="data:image/png;base64,{data}">')
    if not (found["tables"] or found["figures"] or error):
        parts.append("<p>(no table or figure in this directory)</p>")
    return "\n".join(parts)


def write_page(sections: List[str], titles: List[Tuple[str, str]], path: str, heading: str, models: str = "") -> str:
    """The page: the environment (date, versions, the command), the models, the sections."""
    try:
        version = importlib.metadata.version("fairseq_ext")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    invoked = " ".join(shlex.quote(a) for a in ["python", "-m", "fairseq_ext.analysis.report", *sys.argv[1:]])
    env = "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(v)}</td></tr>" for k, v in (
        ("date", datetime.datetime.now().isoformat(timespec="seconds")), ("fairseq_ext", version),
        ("torch", torch.__version__), ("fairseq", fairseq.__version__), ("command", invoked)))
    nav = "".join(f'<a href="#{html.escape(a)}">{html.escape(t)}</a>' for a, t in titles)
    page = (f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{html.escape(heading)}</title>"
            f"<style>{STYLE}</style></head><body>\n<h1>{html.escape(heading)}</h1>\n<nav>{nav}</nav>\n"
            f"<table>{env}</table>\n" + (models + "\n" if models else "") + "\n".join(sections)
            + "\n</body></html>\n")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(page)
    return path


def models_html(paths: Sequence[str], names: Sequence[str], data: str, split: str) -> str:
    """What was analysed: a row per model (shape, technique, parameters, updates) and the data."""
    rows = []
    for checkpoint, name in zip(paths, names):
        try:
            about = checkpoints.describe_row(checkpoint)
        except Exception as e:  # a checkpoint that cannot be read fails its analyses; the page still says which
            about = {"layers": f"unreadable: {e}"}
        rows.append({"model": name, **about, "checkpoint": checkpoint})
    env = data_text.read_prep_env(data) if data else {}
    said = [os.path.basename(os.path.normpath(data)) + f", split {split}"]
    if env.get("test_set") and split == "test":
        said.append(f"test set {env['test_set']}" + (f" ({int(env['test_pairs']):,} sentences)"
                                                         if env.get("test_pairs", "").isdigit() else ""))
    if env.get("train_pairs", "").isdigit():
        said.append(f"{int(env['train_pairs']):,} training pairs")
    if env.get("src") and env.get("tgt"):
        said.append(f"{env['src']}→{env['tgt']}")
    return (f'<h2 id="models">The models</h2>\n<p>Data: {html.escape("; ".join(said))}. Each section shows the command '
            'that made it, with its decoding settings and BLEU flavour.</p>\n' + html_table(rows))


def build_parser() -> argparse.ArgumentParser:
    ap = command.doc_parser(__doc__)
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
    options_of = functools.lru_cache(maxsize=None)(checkpoints.options)

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
        for cmd, out in commands:
            error = run_analysis(cmd, out)
            failed += error is not None
            add(out, analysis.title + (f": {os.path.basename(out)}" if analysis.single else ""), analysis.reference,
                error, note)
    for d in args.from_dirs:
        found = collect(d)
        analysis = next((a for a in known.values() if any(f"{a.module} " in c + " " for c in found["commands"])), None)
        title = os.path.basename(os.path.abspath(d)) if analysis is None else analysis.title
        if analysis is not None and analysis.single:  # one directory per model: the title names it, as for --run
            title += f": {os.path.basename(os.path.abspath(d))}"
        titles.append((f"from-{len(titles)}", title))
        sections.append(section_html(titles[-1][0], title, "" if analysis is None else analysis.reference, d, found))
    models = models_html(args.checkpoint, names, args.data, args.split) if args.checkpoint else ""
    path = write_page(sections, titles, os.path.join(args.out, "report.html"), args.title, models)
    print(f"written: {path}" + (f" ({failed} analysis run(s) failed: see the page)" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
