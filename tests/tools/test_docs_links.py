"""The documentation holds together: every relative link of README.md, docs/*.md and
scripts/README.md leads to an existing file (and an ``#anchor`` to an existing heading, by
GitHub's slug rules), README.md stays a first read, and the pages speak of the software
only, not of how it was developed."""
import glob
import os
import re
from urllib.parse import unquote

import pytest

from model_utils import REPO

README = os.path.join(REPO, "README.md")
DOCS = sorted(glob.glob(os.path.join(REPO, "docs", "*.md")))
PAGES = [README, *DOCS, os.path.join(REPO, "scripts", "README.md")]
README_MAX_LINES = 520
# phrases about the development of the package, not about the package
FORBIDDEN = ("was lent", "no gpu was lent", "session", "issue #", "the tool answered", "../shared")

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
# [text](target) and ![alt](target); the text may hold one level of brackets
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1")


def rel(path):
    return os.path.relpath(path, REPO)


def prose_lines(path):
    """(line number, text) of the lines outside fenced code blocks."""
    in_fence = False
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if FENCE.match(line):
                in_fence = not in_fence
                continue
            if not in_fence:
                yield number, line.rstrip("\n")


def slug(heading):
    """GitHub's anchor of a heading: lowercase, markup and punctuation other than '-' and '_'
    removed, spaces made '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path):
    seen = {}
    out = set()
    for _, line in prose_lines(path):
        m = HEADING.match(line)
        if not m:
            continue
        base = slug(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(path):
    for number, line in prose_lines(path):
        for m in LINK.finditer(INLINE_CODE.sub("", line)):
            yield number, m.group(1)


def test_slug_follows_github():
    assert slug("Trust: checkpoints, dropped sentences, errors") == "trust-checkpoints-dropped-sentences-errors"
    assert slug("Reproducing the papers' tables") == "reproducing-the-papers-tables"
    assert slug("Self-attention variants (thesis Ch. 5, MMA paper, word-translation paper)") == \
        "self-attention-variants-thesis-ch-5-mma-paper-word-translation-paper"
    assert slug("Evaluation: `fairseq-ext evaluate`") == "evaluation-fairseq-ext-evaluate"
    assert slug("What `make quickstart` does") == "what-make-quickstart-does"


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_relative_links_resolve(page):
    assert os.path.isfile(page), f"{rel(page)} is missing"
    broken = []
    for number, target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:, ...
            continue
        path, _, anchor = target.partition("#")
        path = unquote(path)
        dest = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
        where = f"{rel(page)}:{number}: ({target})"
        if not os.path.exists(dest):
            broken.append(f"{where} no such file {rel(dest)}")
            continue
        if anchor and dest.endswith(".md") and os.path.isfile(dest):
            if unquote(anchor).lower() not in anchors(dest):
                broken.append(f"{where} {rel(dest)} has no heading #{anchor}")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_readme_is_a_first_read():
    with open(README, encoding="utf-8") as f:
        lines = f.read().splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines (at most {README_MAX_LINES}): move detail to docs/")


def test_docs_exist_and_readme_links_them():
    assert DOCS, "no docs/*.md"
    linked = {os.path.normpath(os.path.join(REPO, target.partition("#")[0]))
              for _, target in links(README) if target.startswith("docs/")}
    missing = [rel(d) for d in DOCS if d not in linked]
    assert not missing, f"README.md does not link {missing}"


@pytest.mark.parametrize("page", [README, *DOCS], ids=rel)
def test_no_development_history(page):
    with open(page, encoding="utf-8") as f:
        text = f.read().lower()
    found = [(phrase, text[:text.index(phrase)].count("\n") + 1) for phrase in FORBIDDEN if phrase in text]
    assert not found, f"{rel(page)}: " + ", ".join(f"{p!r} (line {n})" for p, n in found)


def test_design_layout_names_every_module():
    """docs/design.md's Layout names every module of the package (its file name)."""
    with open(os.path.join(REPO, "docs", "design.md"), encoding="utf-8") as f:
        layout = f.read().split("## Layout", 1)[1]
    package = os.path.join(REPO, "fairseq_ext")
    missing = sorted(os.path.relpath(p, package) for p in glob.glob(os.path.join(package, "**", "*.py"), recursive=True)
                     if os.path.basename(p) not in ("__init__.py", "__main__.py") and os.path.basename(p) not in layout)
    assert not missing, f"docs/design.md's Layout does not name {missing}"
