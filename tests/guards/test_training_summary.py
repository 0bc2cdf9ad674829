"""fairseq-train's closing line (fairseq_ext.guards.training_summary): how many of the
planned updates ran, and when the time cap cut the run, the command that continues it, which
does continue it from checkpoint_last.pt."""
import os
import subprocess

import pytest

from model_utils import TINY_TRAIN_FLAGS, USER_DIR, clean_env, make_tiny_parallel_data


@pytest.fixture(scope="module")
def tiny_bin(tmp_path_factory):
    return make_tiny_parallel_data(str(tmp_path_factory.mktemp("summary")), num_train=61)


def train(bin_dir, save_dir, *flags):
    cmd = ["fairseq-train", bin_dir, "--user-dir", USER_DIR, "--arch", "multilayer_transformer", *TINY_TRAIN_FLAGS,
           "--save-dir", str(save_dir), *flags]
    res = subprocess.run(cmd, capture_output=True, text=True, env=clean_env())
    assert res.returncode == 0, res.stderr[-2000:]
    ended = [line.split("| fairseq_ext.training | ", 1)[1] for line in (res.stdout + res.stderr).splitlines()
             if "| fairseq_ext.training | " in line]
    assert len(ended) == 1, res.stdout[-2000:]  # one closing line, from the one process
    return ended[0]


def test_a_finished_run_says_so(tiny_bin, tmp_path):
    line = train(tiny_bin, tmp_path / "a", "--max-update", "4")
    assert line.startswith("training ended: 4 of 4 updates, ") and f"finished (--max-update 4); checkpoints in " \
        f"{tmp_path / 'a'}" in line


def test_a_run_limited_by_epochs_has_no_planned_update_count(tiny_bin, tmp_path):
    line = train(tiny_bin, tmp_path / "e", "--max-epoch", "1")
    assert line.startswith("training ended: ") and " of ? updates, " in line and "finished (--max-epoch 1)" in line


def test_the_time_cap_is_named_with_the_command_that_continues_and_it_does(tiny_bin, tmp_path):
    save = tmp_path / "cut"
    line = train(tiny_bin, save, "--max-update", "5", "--stop-time-hours", "0.00001")
    assert line.startswith("training ended: 1 of 5 updates, ")
    assert "stopped by the time cap (--stop-time-hours 1e-05 = 0.0 min) before 5 updates: the model is undertrained" \
        in line
    assert line.endswith(f"run the same command again with --stop-time-hours 0 (no cap) or a larger cap (it counts "
                         f"the training time of every resume: {line.split('resume: ')[1].split(' h ')[0]} h so far); "
                         f"it resumes from {save / 'checkpoint_last.pt'}")
    # what the line says to do: the same command without the cap goes on from update 1 to 5
    line = train(tiny_bin, save, "--max-update", "5", "--stop-time-hours", "0")
    assert line.startswith("training ended: 5 of 5 updates, ") and "finished" in line


def test_no_save_has_nothing_to_resume_from(tiny_bin, tmp_path):
    line = train(tiny_bin, tmp_path / "n", "--max-update", "5", "--stop-time-hours", "0.00001", "--no-save")
    assert "there is no checkpoint to resume from" in line and "--stop-time-hours 0" not in line


def test_only_fairseq_train_is_wrapped():
    """The guard wraps fairseq_cli.train only where fairseq-train runs: importing the plugin
    elsewhere does not import (and so configure the logging of) fairseq_cli.train."""
    code = "import sys, fairseq_ext; print('fairseq_cli.train' in sys.modules)"
    res = subprocess.run([os.environ.get("PYTHON", "python"), "-c", code], capture_output=True, text=True,
                         env=clean_env())
    assert res.stdout.strip() == "False", res.stderr[-2000:]


def test_fairseq_train_starts_without_a_page_of_deprecation_warnings(tiny_bin, tmp_path):
    """fairseq 0.12's own calls into hydra and torch draw ten lines of deprecation warnings at
    every start; the plugin silences exactly those (fairseq_ext.FAIRSEQ_DEPRECATIONS)."""
    cmd = ["fairseq-train", tiny_bin, "--user-dir", USER_DIR, "--arch", "multilayer_transformer", *TINY_TRAIN_FLAGS,
           "--save-dir", str(tmp_path / "w"), "--max-update", "1"]
    res = subprocess.run(cmd, capture_output=True, text=True, env=clean_env())
    assert res.returncode == 0, res.stderr[-2000:]
    out = res.stdout + res.stderr
    assert "Warning" not in out and "deprecat" not in out.lower(), [line for line in out.splitlines() if "arn" in line]
