"""Where the package's own files are, wherever it is installed (paths relative to this package,
never to a checkout): the bash recipes (``recipes/``), the configs (``configs/``, package data),
and the one environment variable that names a directory of local copies of the corpora.
"""
import os
import sys
from typing import List, Optional

from fairseq_ext.errors import FairseqExtError

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
RECIPE_DIR = os.path.join(PACKAGE_DIR, "recipes")
CONFIG_DIR = os.path.join(PACKAGE_DIR, "configs")
TABLE_DIR = os.path.join(CONFIG_DIR, "tables")

# a directory of local copies of the corpora, one subdirectory per corpus as the release
# names it (multi30k/, iwslt15-en-vi/, ...): used when no --from is given, before a download
DATA_ENV = "FAIRSEQ_EXT_DATA"

# `fairseq-ext prepare NAME` -> recipes/prepare-NAME.sh
DATA_RECIPES = ("multi30k", "iwslt14", "iwslt15-en-vi", "iwslt-fr-ro", "wmt14-en-de")


def command_environment() -> dict:
    """The environment of a command the package starts: this Python for the recipes' helpers
    (``PYTHON``), and its environment's commands (fairseq-train, ...) first on PATH."""
    env = dict(os.environ)
    env["PYTHON"] = sys.executable
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    return env


def user_dir() -> str:
    """The directory to pass to fairseq's ``--user-dir``: this package."""
    return PACKAGE_DIR


def recipe_path(name: str) -> str:
    """``recipes/NAME`` (``train.sh``, ``prepare-multi30k.sh``, ...)."""
    path = os.path.join(RECIPE_DIR, name)
    if not os.path.isfile(path):
        raise FairseqExtError(f"no recipe {name} in {RECIPE_DIR} (is the package installed with its data files?)")
    return path


def config_names() -> List[str]:
    """The training configs the package ships: ``configs/NAME.args``."""
    return sorted(f[:-len(".args")] for f in os.listdir(CONFIG_DIR) if f.endswith(".args"))


def config_path(name: str, option: str = "--config") -> str:
    """A training config: an existing file as given, else ``configs/NAME`` or
    ``configs/NAME.args`` of the package. ``option`` names the flag in the error."""
    if os.path.isfile(name):
        return os.path.abspath(name)
    base = name[len("configs/"):] if name.startswith("configs/") else name
    for candidate in (base, base + ".args"):
        path = os.path.join(CONFIG_DIR, candidate)
        if os.path.isfile(path):
            return path
    raise FairseqExtError(f"{option} {name}: no such file, and not a config of the package "
                          f"({', '.join(config_names())})")


def local_data(name: str) -> Optional[str]:
    """``$FAIRSEQ_EXT_DATA/NAME`` when that directory exists, else None."""
    root = os.environ.get(DATA_ENV)
    if not root:
        return None
    path = os.path.join(os.path.expanduser(root), name)
    return path if os.path.isdir(path) else None
