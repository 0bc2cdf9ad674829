"""The report's one self-contained HTML page: what an analysis wrote in its directory (tables,
PNG figures, its command), each directory as a section, the models analysed and the
environment; every value escaped, every figure inline, nothing loaded from elsewhere."""
import base64
import datetime
import html
import importlib.metadata
import json
import os
import shlex
import sys
from typing import List, Optional, Sequence, Tuple

import fairseq
import torch

from fairseq_ext.common import checkpoints, data_text

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


def _cell(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1e-2 and value != 0 else f"{value:.2f}"
    return "–" if value is None else str(value)


def html_table(rows: List[dict]) -> str:
    """``rows`` (a table an analysis wrote as JSON) as an HTML table, every value escaped."""
    columns: List[str] = []
    for row in rows:
        columns += [c for c in row if c not in columns]
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(_cell(r.get(c)))}</td>" for c in columns) + "</tr>"
                   for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _title_of(md_path: str) -> Optional[str]:
    try:
        with open(md_path, encoding="utf-8") as f:
            first = f.readline().strip()
    except OSError:
        return None
    return first[4:] if first.startswith("### ") else None


def collect(directory: str) -> dict:
    """What an analysis wrote in ``directory`` (recursively): its tables (a ``.json`` list of
    rows beside a ``.md`` of the same stem), its PNG figures and its command."""
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
                except (ValueError, UnicodeDecodeError):  # not a table an analysis wrote
                    continue
                if isinstance(rows, list) and all(isinstance(r, dict) for r in rows):
                    tables.append({"name": rel, "title": _title_of(os.path.join(root, stem + ".md")) or stem,
                                   "rows": rows})
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
    for command in found["commands"]:
        parts.append(f"<pre>{html.escape(command)}</pre>")
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


def package_version() -> str:
    """The installed fairseq_ext's version (the package, wherever it is installed), or
    "unknown" when it runs from a directory that was never installed."""
    try:
        return importlib.metadata.version("fairseq_ext")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def environment() -> List[Tuple[str, str]]:
    return [("date", datetime.datetime.now().isoformat(timespec="seconds")), ("fairseq_ext", package_version()),
            ("torch", torch.__version__), ("fairseq", fairseq.__version__),
            ("command", " ".join(shlex.quote(a) for a in ["python", "-m", "fairseq_ext.analysis.report",
                                                          *sys.argv[1:]]))]


def write_page(sections: List[str], titles: List[Tuple[str, str]], path: str, heading: str,
               models: str = "") -> str:
    env = "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(v)}</td></tr>" for k, v in environment())
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
    """The page's account of what was analysed: one row per model (its shape, technique,
    parameters, updates) and the data (the test set, its size, the training pairs)."""
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
    return ('<h2 id="models">The models</h2>\n'
            f'<p>Data: {html.escape("; ".join(said))}. Each section shows the command that made it, with '
            'its decoding settings and BLEU flavour.</p>\n' + html_table(rows))
