"""Every command's --help, as a newcomer reads it: it exits 0 and names the command as it was
typed (`fairseq-ext train`, `fairseq-ext prepare multi30k`, `scripts/train.sh`), never a file
inside the package nor a line of the script's code; train's --config takes the names of the
configs the package ships, and those names are listed. The recipes' help runs as the command
a user types; the Python commands' help runs through the same ``fairseq_ext.cli.main`` in this
process (tests/tools/test_installed_package.py runs the installed console scripts)."""
import os
import signal
import sys

import pytest

from fairseq_ext import cli
from model_utils import REPO
from script_utils import run

COMMANDS = [("prepare", "multi30k"), ("prepare", "iwslt15-en-vi"), ("prepare", "wmt14-en-de"), ("prepare", "iwslt14"),
            ("prepare", "iwslt-fr-ro"), ("train",), ("evaluate",), ("significance",), ("report",), ("reproduce",),
            ("translate",), ("score",), ("benchmark",), ("selfcheck",), ("selfcheck-pack",), ("config-dir",),
            ("average-checkpoints",), ("strip-aux",), ("analyze", "length_buckets")]


def help_of(command, capsys, monkeypatch):
    """The exit status and the text of ``fairseq-ext COMMAND --help``: a subprocess for the bash
    recipes (the command becomes bash), ``cli.main`` in this process for the Python commands
    (which names the command in sys.argv[0] and sets a SIGTERM handler: both put back)."""
    if command[0] in ("prepare", "train"):
        res = run([sys.executable, "-m", "fairseq_ext", *command, "--help"])
        return res.returncode, res.stdout + res.stderr
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    handler = signal.getsignal(signal.SIGTERM)
    try:
        code = cli.main([*command, "--help"])
    except SystemExit as e:
        code = e.code
    finally:
        signal.signal(signal.SIGTERM, handler)
    out = capsys.readouterr()
    return code or 0, out.out + out.err


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_help_names_the_command_as_typed(command, capsys, monkeypatch):
    code, text = help_of(command, capsys, monkeypatch)
    assert code == 0, text[-2000:]
    first = text.strip().splitlines()[0]
    assert f"fairseq-ext {' '.join(command)}" in first, first
    # the package's command names, not its files (a checkout's scripts/NAME.sh may be named beside them)
    words = [w for w in text.split() if ".sh" in w and not w.strip("(),;`").startswith(("scripts/", "PACK/"))]
    assert "set -euo pipefail" not in text and "fairseq-ext-average" not in text and not words, words


def test_train_help_from_a_checkout_and_its_config_names(tmp_path):
    res = run(["bash", os.path.join(REPO, "scripts", "train.sh"), "--help"])
    assert res.returncode == 0 and res.stdout.startswith("Usage: scripts/train.sh DATA_BIN SAVE_DIR")
    shipped = sorted(f[:-5] for f in os.listdir(os.path.join(REPO, "fairseq_ext", "configs")) if f.endswith(".args"))
    assert f"ships ({', '.join(shipped)})" in " ".join(res.stdout.split())
    # scripts/train.sh reads a config by its name as fairseq-ext train does, and names the choices otherwise
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "dict.en.txt").write_text("a 1\n")
    res = run(["bash", os.path.join(REPO, "scripts", "train.sh"), tmp_path / "bin", tmp_path / "ckpt", "--config",
               "iwslts", "--", "--arch", "transformer"])
    assert res.returncode == 1
    assert res.stderr.strip().endswith(f"--config iwslts: no such file, and not a config of the package "
                                       f"({', '.join(shipped)})"), res.stderr
