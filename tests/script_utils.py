"""Shared helpers of the tests that run the package's scripts and recipes: the paths of
scripts/ and of the text tools the recipes run as files, the local corpus copies (and the
markers that skip a test without them), a command run with this environment's tools, and
(gzipped) text files written and read line by line, and the cache of what several test
files build once (:func:`built_once`)."""
import gzip
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from filelock import FileLock

from model_utils import DATA, REPO

REPO = Path(REPO)
SCRIPTS = REPO / "scripts"
PACKAGE = REPO / "fairseq_ext"
TOOLS = PACKAGE / "standalone"  # the helpers the recipes run as files
MULTI30K = Path(DATA) / "multi30k"
ENVI = Path(DATA) / "iwslt15-en-vi"
# the Multi30k slice of the data-safety and quickstart tests (conftest.m30k_small): line
# counts that are not multiples of 8
M30K_SMALL = (("train", 61), ("val", 13), ("test_2016_flickr", 13))
# conftest's raw_text_model: its source and target positions, and a sentence it translates
RAW_TEXT_POSITIONS = 128
SENTENCE = "A man in a red shirt is riding a bike down the street."

needs_multi30k = pytest.mark.skipif(not (MULTI30K / "train.en.gz").exists(),
                                    reason=f"no local Multi30k copy in {MULTI30K}")


def skip_without_multi30k():
    """Skip the test (or fixture) calling it where there is no local Multi30k copy, as needs_multi30k does."""
    if not (MULTI30K / "train.en.gz").exists():
        pytest.skip(f"no local Multi30k copy in {MULTI30K}")


needs_envi = pytest.mark.skipif(not (ENVI / "train.en.gz").exists(),
                                reason=f"no local IWSLT'15 En-Vi copy in {ENVI}")


def run(cmd, cwd=None, env_extra=None, stdin=None, timeout=900):
    """The one way the tests run a command: this environment's tools first on PATH (the venv
    running pytest provides fairseq-*, subword-nmt, sacremoses), $PYTHON this Python, no
    weights-only override (model_utils.clean_env), output captured as text."""
    from model_utils import clean_env

    env = clean_env()
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env["PYTHON"] = sys.executable
    env.update(env_extra or {})
    return subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout, input=stdin)


def write_lines(path, lines, gz=False):
    path = Path(str(path) + (".gz" if gz else ""))
    path.parent.mkdir(parents=True, exist_ok=True)
    opener = gzip.open if gz else open
    with opener(path, "wt", encoding="utf-8") as f:
        f.writelines(line + "\n" for line in lines)
    return path


def head_gz(path, n, skip=0):
    out = []
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for i, line in enumerate(f):
            if i >= skip + n:
                break
            if i >= skip:
                out.append(line.rstrip("\n"))
    return out


def built_once(tmp_path_factory, name, build):
    """The directory NAME, made by ``build(directory)`` once per test run and shared by every
    test file and every pytest-xdist worker that asks for it: the first to ask builds it
    under a lock (the others wait and reuse it); a build that failed is tried again."""
    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # the run's, not the worker's
    target = root / f"shared-{name}"
    with FileLock(f"{target}.lock"):
        if not (target / ".built").is_file():
            shutil.rmtree(target, ignore_errors=True)
            target.mkdir(parents=True)
            build(target)
            (target / ".built").touch()
    return target


def fairseq_ext(*args, stdin=None):
    """``fairseq-ext ARGS`` with this environment's Python (``python -m fairseq_ext``)."""
    return run([sys.executable, "-m", "fairseq_ext", *args], stdin=stdin)
