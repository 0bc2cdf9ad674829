"""``make setup`` and the torch build of its environment: another build given to make reinstalls
torch; a plain ``make`` afterwards keeps it (``make test`` after a CUDA set-up must not go back to
the CPU build). Run with echo for the venv's python, so nothing is installed."""
import os
import shutil
import subprocess
import time

import pytest

from model_utils import REPO


def make_setup(venv, *assignments):
    res = subprocess.run(["make", "-s", "setup", f"VENV={venv}", "PY=echo", "PYTHON=true", *assignments],
                         cwd=REPO, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    time.sleep(1.1)  # the next record must be newer than this stamp when it changes (1 s mtimes)
    return [line for line in res.stdout.splitlines() if "torch" in line and not line.startswith("#")]


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_make_setup_installs_the_torch_build_asked_for_and_keeps_it(tmp_path):
    venv = tmp_path / "venv"
    cuda = ["TORCH_SPEC=torch==2.13.0", "PIP_EXTRA=--index-url https://download.pytorch.org/whl/cu126"]
    first = make_setup(venv)
    assert any(line.endswith("pip install -q torch==2.13.0") for line in first), first
    assert make_setup(venv) == []  # set up already: nothing to do
    switched = make_setup(venv, *cuda)
    assert "-m pip uninstall -q -y torch" in switched  # pip would take 2.13.0+cpu for torch==2.13.0
    assert "-m pip install -q --index-url https://download.pytorch.org/whl/cu126 torch==2.13.0" in switched
    assert make_setup(venv) == []  # a plain make (make test) keeps the CUDA build
    assert make_setup(venv, *cuda) == []
    assert "cu126" in (venv / ".fairseq_ext-torch").read_text()
    assert os.path.exists(venv / ".fairseq_ext-setup-done")
