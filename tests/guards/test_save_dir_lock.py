"""One training run per --save-dir (fairseq_ext/guards/resume.py): a fairseq-train
started while another run writes its save dir stops with one line naming that run, before it
writes anything; a lock file left by a killed run blocks nobody."""
import os
import signal
import subprocess
import sys

import pytest
from fairseq.distributed import utils as distributed_utils

from fairseq_ext.errors import SaveDirBusyError
from fairseq_ext.guards import resume
from fairseq_ext.standalone.outputs import lock_path
from model_utils import REPO, TINY_TRAIN_FLAGS, USER_DIR, clean_env


def checkpoint_cfg(save_dir, **overrides):
    from fairseq.dataclass.configs import CheckpointConfig
    from omegaconf import OmegaConf

    return OmegaConf.merge(OmegaConf.structured(CheckpointConfig), {"save_dir": str(save_dir), **overrides})


HOLD = ("import sys, time; from fairseq_ext.standalone.outputs import OutputLock; "
        "OutputLock(sys.argv[1]).acquire(); print('held', flush=True); time.sleep(120)")


def holder(directory):
    """Another process holding ``directory``'s lock, until killed."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(directory)], stdout=subprocess.PIPE, text=True,
                            env=clean_env())
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_the_save_dir_is_held_by_rank_0_only_and_not_with_no_save(tmp_path, monkeypatch):
    other = holder(tmp_path / "busy")
    try:
        with pytest.raises(SaveDirBusyError) as e:
            resume.hold_save_dir(checkpoint_cfg(tmp_path / "busy"))
        assert str(e.value).startswith(f"--save-dir {tmp_path / 'busy'} is being written by another command "
                                       f"(pid {other.pid} on ")
        assert str(e.value).endswith("; wait for it to finish, or write elsewhere; two training runs need two save dirs")
        resume.hold_save_dir(checkpoint_cfg(tmp_path / "busy", no_save=True))  # writes nothing there
        monkeypatch.setattr(distributed_utils, "get_global_rank", lambda: 1)
        resume.hold_save_dir(checkpoint_cfg(tmp_path / "busy"))  # rank 0's to hold
    finally:
        other.kill()
        other.wait()
    # the killed holder left its file, not its lock
    assert os.path.exists(lock_path(tmp_path / "busy"))
    monkeypatch.undo()
    monkeypatch.setattr(resume, "_HELD", {})
    resume.hold_save_dir(checkpoint_cfg(tmp_path / "busy"))
    lock = resume._HELD[os.path.realpath(tmp_path / "busy")]
    assert open(lock_path(tmp_path / "busy")).read().startswith(f"pid {os.getpid()} on ")
    lock.release()
    assert not os.path.exists(lock_path(tmp_path / "busy"))


def train(bin_dir, save_dir, *flags):
    return subprocess.run(["fairseq-train", bin_dir, "--user-dir", USER_DIR, "--arch", "multilayer_transformer",
                           *TINY_TRAIN_FLAGS, "--save-dir", str(save_dir), *flags],
                          capture_output=True, text=True, env=clean_env(), timeout=300)


@pytest.mark.slow
def test_a_second_fairseq_train_into_one_save_dir_is_refused(tiny_trained, tmp_path):
    bin_dir, _ = tiny_trained
    save_dir = tmp_path / "ckpt"
    other = holder(save_dir)
    try:
        result = train(bin_dir, save_dir, "--max-update", "2")
    finally:
        other.kill()
        other.wait()
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if "error" in line]
    assert errors == [f"fairseq-train: error: --save-dir {save_dir} is being written by another command (pid "
                      f"{other.pid} on " + errors[0].split(f"(pid {other.pid} on ", 1)[-1]], errors
    assert "two training runs need two save dirs" in errors[0]
    assert not (save_dir / "checkpoint_last.pt").exists()
    # the holder is gone: the same command trains, and leaves no lock file behind
    result = train(bin_dir, save_dir, "--max-update", "2")
    assert result.returncode == 0, result.stderr[-2000:]
    assert (save_dir / "checkpoint_last.pt").exists() and not os.path.exists(lock_path(save_dir))


@pytest.mark.slow
def test_the_rerun_of_a_killed_two_process_run_is_refused_in_one_line(tiny_trained, tmp_path):
    """A SIGKILL of torchrun leaves its two fairseq-train processes training, rank 0 holding the save dir: the rerun
    says so in one line before it starts a process, not among rank 1's and torchrun's tracebacks."""
    bin_dir, _ = tiny_trained
    save_dir = tmp_path / "ckpt"
    command = ["bash", os.path.join(REPO, "scripts", "train.sh"), bin_dir, str(save_dir), "--nproc", "2", "--",
               "--arch", "multilayer_transformer", *[f for f in TINY_TRAIN_FLAGS if f != "--cpu"], "--max-update",
               "100000"]
    first = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                             env=dict(clean_env(), FAIRSEQ_EXT_TEST_FRESH_PYTHON="1"),  # its process tree, as a user's
                             start_new_session=True)
    workers = []
    try:
        assert any("begin training epoch 1" in line for line in first.stdout)  # rank 0 holds the save dir
        workers = subprocess.run(["pgrep", "-P", str(first.pid)], capture_output=True, text=True).stdout.split()
        os.kill(first.pid, signal.SIGKILL)  # torchrun (train.sh execs it): its workers, each in its own session, go on
        first.wait()
        for worker in workers:  # stopped, still holding the lock, so that the rerun has the cores
            os.killpg(int(worker), signal.SIGSTOP)
        rerun = subprocess.run(command, capture_output=True, text=True, env=clean_env(), timeout=300)
    finally:
        for group in [first.pid] + [int(w) for w in workers]:
            try:
                os.killpg(group, signal.SIGKILL)
            except ProcessLookupError:
                pass
    said = [line for line in rerun.stderr.splitlines() if not line.startswith("[train.sh] ")]
    assert rerun.returncode == 1 and len(said) == 1 and rerun.stdout == "", rerun.stderr[-3000:]
    assert said[0].startswith(f"fairseq-train: error: --save-dir {save_dir} is being written by another command "
                              "(pid ") and said[0].endswith("; two training runs need two save dirs"), said
