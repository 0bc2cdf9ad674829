"""Resumption (fairseq_ext/guards/resume.py): the state rank 0 loads reaches the other ranks
(fairseq's broadcast of a DictConfig under weights_only=True), checkpoint copies are atomic
so that a crash during a save keeps the previous checkpoint, fairseq-train resumes from the
newest intact checkpoint, and it never starts silently from scratch."""
import argparse
import io
import os
import re
import shutil
import signal
import subprocess
import sys

import pytest
import torch
from fairseq import checkpoint_utils
from fairseq.distributed import utils as distributed_utils

from fairseq_ext.guards import resume
from model_utils import TINY_TRAIN_FLAGS, USER_DIR, clean_env, full_disk


# --- what rank 0 broadcasts to the other ranks ---------------------------------------------
def test_encode_decode_round_trip_of_a_dictconfig():
    from omegaconf import DictConfig, OmegaConf

    cfg = OmegaConf.create({"model": argparse.Namespace(arch="multilayer_transformer", dropout=0.1),
                            "optimization": {"lr": [0.25], "max_update": 4}, "task": {"data": "${common.x}"},
                            "common": {"x": "bin"}}, flags={"allow_objects": True})
    placeholder = distributed_utils._TensorPlaceholder(index=3)
    obj = {"cfg": cfg, "model": {"w": placeholder}, "history": [{"num_updates": 4}], "pair": (1, placeholder)}
    encoded = resume.encode_for_broadcast(obj)
    buffer = io.BytesIO()
    torch.save(encoded, buffer)
    received = torch.load(io.BytesIO(buffer.getvalue()), map_location="cpu", weights_only=True)
    decoded = resume.decode_broadcast(received)
    assert isinstance(decoded["cfg"], DictConfig) and decoded["cfg"]._get_flag("allow_objects")
    assert decoded["cfg"].model == cfg.model and decoded["cfg"].optimization == cfg.optimization
    assert OmegaConf.to_container(decoded["cfg"].task, resolve=False) == {"data": "${common.x}"}  # unresolved
    assert decoded["cfg"].task.data == "bin"
    assert decoded["model"]["w"] == placeholder and decoded["pair"] == (1, placeholder)
    assert decoded["history"] == obj["history"]
    with pytest.raises(Exception, match="Unsupported global"):  # fairseq's own payload fails to load
        buffer = io.BytesIO()
        torch.save(obj, buffer)
        torch.load(io.BytesIO(buffer.getvalue()), map_location="cpu", weights_only=True)


def simulate_broadcast(monkeypatch, state):
    """fairseq's broadcast_object, run as rank 0 and then as rank 1 of a world of two: the
    tensors rank 0 broadcasts are recorded and handed to rank 1's receiving broadcasts."""
    sent = []
    monkeypatch.setattr(distributed_utils, "get_rank", lambda group: 0)
    monkeypatch.setattr(distributed_utils, "broadcast", lambda tensor, src, group: sent.append(tensor.clone()))
    kept = distributed_utils.broadcast_object(state, src_rank=0, group=None, dist_device=torch.device("cpu"))
    assert kept is not None
    replay = iter(sent)
    monkeypatch.setattr(distributed_utils, "get_rank", lambda group: 1)
    monkeypatch.setattr(distributed_utils, "broadcast",
                        lambda tensor, src, group: tensor.copy_(next(replay).reshape(tensor.shape)))
    return distributed_utils.broadcast_object(None, src_rank=0, group=None, dist_device=torch.device("cpu"))


def test_rank_1_receives_the_checkpoint_rank_0_loaded(tiny_trained, monkeypatch):
    _, checkpoint = tiny_trained
    state = checkpoint_utils.load_checkpoint_to_cpu(checkpoint)  # what Trainer.load_checkpoint broadcasts
    assert type(state["cfg"]).__name__ == "DictConfig"
    received = simulate_broadcast(monkeypatch, state)
    assert type(received["cfg"]) is type(state["cfg"])
    assert received["cfg"].model.arch == state["cfg"].model.arch == "multilayer_transformer"
    assert received["cfg"] == state["cfg"]
    assert received["optimizer_history"] == state["optimizer_history"]
    assert received["extra_state"]["train_iterator"] == state["extra_state"]["train_iterator"]
    for key, value in state["model"].items():
        assert torch.equal(received["model"][key], value)
    # with fairseq's own broadcast, rank 1 cannot load what rank 0 sent
    monkeypatch.setattr(distributed_utils, "_broadcast_object_slow", distributed_utils._broadcast_object_slow.__wrapped__)
    with pytest.raises(Exception, match="Unsupported global"):
        simulate_broadcast(monkeypatch, state)


# --- crash-safe copies ----------------------------------------------------------------------
def test_checkpoint_copies_are_atomic(tmp_path, monkeypatch):
    src, dst = tmp_path / "checkpoint_1_5.pt", tmp_path / "checkpoint_last.pt"
    src.write_bytes(b"new" * 1000)
    src.chmod(0o644)
    dst.write_bytes(b"old checkpoint")

    def killed_mid_copy(a, b):
        with open(b, "wb") as f:
            f.write(b"ne")
        raise KeyboardInterrupt  # as a SIGINT would

    monkeypatch.setattr(resume.shutil, "copyfile", killed_mid_copy)
    with pytest.raises(KeyboardInterrupt):
        checkpoint_utils.PathManager.copy(str(src), str(dst), overwrite=True)
    assert dst.read_bytes() == b"old checkpoint"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint_1_5.pt", "checkpoint_last.pt"]
    monkeypatch.undo()
    assert not checkpoint_utils.PathManager.copy(str(src), str(dst), overwrite=False)  # fairseq's semantics
    assert checkpoint_utils.PathManager.copy(str(src), str(dst), overwrite=True)
    assert dst.read_bytes() == src.read_bytes()
    assert dst.stat().st_mode & 0o777 == 0o644  # not mkstemp's 0600
    assert checkpoint_utils.PathManager.isfile(str(dst))  # every other attribute is fairseq's


SIGKILL_DURING_SAVE = """
import os, shutil, signal, sys
import fairseq_ext  # noqa: F401  (what --user-dir fairseq_ext does)
from fairseq import checkpoint_utils

def copy_then_die(src, dst):  # the copy is half done when the process is killed
    with open(src, "rb") as f, open(dst, "wb") as g:
        g.write(f.read(1000))
        g.flush()
    os.kill(os.getpid(), signal.SIGKILL)

shutil.copyfile = copy_then_die
save_dir = sys.argv[1]
checkpoint_utils.PathManager.copy(os.path.join(save_dir, "checkpoint_1_4.pt"),
                                  os.path.join(save_dir, "checkpoint_last.pt"), overwrite=True)
"""


def test_sigkill_during_the_copy_to_checkpoint_last_keeps_the_old_one(tmp_path, tiny_trained):
    """fairseq's save_checkpoint: write checkpoint_1_4.pt (atomically), copy it to
    checkpoint_last.pt; the process is SIGKILLed halfway through the copy."""
    _, checkpoint = tiny_trained
    shutil.copy(checkpoint, tmp_path / "checkpoint_last.pt")  # the previous save
    (tmp_path / "checkpoint_1_4.pt").write_bytes(b"PK" + os.urandom(5000))
    result = subprocess.run([sys.executable, "-c", SIGKILL_DURING_SAVE, str(tmp_path)], env=clean_env(),
                            capture_output=True, text=True, cwd=os.path.dirname(USER_DIR))
    assert result.returncode == -signal.SIGKILL, result.stderr[-2000:]
    assert (tmp_path / "checkpoint_last.pt").read_bytes() == open(checkpoint, "rb").read()
    assert resume.is_intact(str(tmp_path / "checkpoint_last.pt"))
    # what the kill left is a hidden temporary file, which resuming ignores
    leftovers = [p.name for p in tmp_path.iterdir() if p.name not in ("checkpoint_last.pt", "checkpoint_1_4.pt")]
    assert len(leftovers) == 1 and leftovers[0].startswith(".checkpoint_last.pt.") and leftovers[0].endswith(".tmp")


@pytest.mark.slow
def test_a_save_onto_a_full_disk_is_one_line_and_leaves_no_partial_file(tiny_trained, tmp_path):
    """fairseq's save tries three times, logs the traceback, raises it and leaves NAME.tmp behind."""
    bin_dir, _ = tiny_trained
    save_dir = tmp_path / "ckpt"
    result = subprocess.run(["fairseq-train", bin_dir, "--user-dir", USER_DIR, "--arch", "multilayer_transformer",
                             *TINY_TRAIN_FLAGS, "--max-update", "1", "--save-dir", str(save_dir)], capture_output=True,
                            text=True, env={**clean_env(), **full_disk(save_dir)}, timeout=300)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and re.fullmatch(rf"fairseq-train: error: cannot write {save_dir}/checkpoint_\w+\.pt: no "
                                             r"space left on device \(nothing partial left behind\)", errors[0]), errors
    assert os.listdir(tmp_path) == []  # the save dir it made is gone too


def with_updates(checkpoint, path, updates):
    state = torch.load(checkpoint, map_location="cpu")
    state["optimizer_history"][-1]["num_updates"] = updates
    torch.save(state, path)


def test_newest_intact_checkpoint(tmp_path, tiny_trained):
    _, checkpoint = tiny_trained
    for name in ("checkpoint1.pt", "checkpoint_2_10.pt", "checkpoint2.pt", "checkpoint_3_12.pt", "checkpoint_best.pt"):
        shutil.copy(checkpoint, tmp_path / name)
    (tmp_path / "checkpoint_3_12.pt").write_bytes(open(checkpoint, "rb").read()[:1000])  # truncated
    (tmp_path / "checkpoint_last.pt").write_bytes(b"")
    # all record the same updates: the newest by name
    assert resume.newest_intact_checkpoint(str(tmp_path)) == str(tmp_path / "checkpoint2.pt")
    assert not resume.is_intact(str(tmp_path / "checkpoint_3_12.pt"))
    # by the updates recorded in each file: checkpoint_best.pt may be the newest (--no-epoch-checkpoints)
    with_updates(checkpoint, tmp_path / "checkpoint_best.pt", 20)
    assert resume.newest_intact_checkpoint(str(tmp_path)) == str(tmp_path / "checkpoint_best.pt")
    with_updates(checkpoint, tmp_path / "checkpoint.best_loss_3.210.pt", 30)
    assert resume.newest_intact_checkpoint(str(tmp_path)) == str(tmp_path / "checkpoint.best_loss_3.210.pt")
    # suffixes (--checkpoint-suffix) are kept apart
    with_updates(checkpoint, tmp_path / "checkpoint_4_40-x.pt", 40)
    assert resume.newest_intact_checkpoint(str(tmp_path)) == str(tmp_path / "checkpoint.best_loss_3.210.pt")
    assert resume.newest_intact_checkpoint(str(tmp_path), "-x") == str(tmp_path / "checkpoint_4_40-x.pt")


def test_what_counts_as_intact(tmp_path, tiny_trained):
    _, checkpoint = tiny_trained
    data = open(checkpoint, "rb").read()
    cases = {"empty.pt": b"", "half.pt": data[: len(data) // 2], "almost.pt": data[:-10],
             "zeros.pt": bytes(len(data)), "whole.pt": data}
    for name, content in cases.items():
        (tmp_path / name).write_bytes(content)
    torch.save({"optimizer_history": [{"num_updates": 7}]}, tmp_path / "legacy.pt",
               _use_new_zipfile_serialization=False)  # torch < 1.6's format: not judged, loaded
    verdict = {name: resume.is_intact(str(tmp_path / name)) for name in [*cases, "legacy.pt"]}
    assert verdict == {"empty.pt": False, "half.pt": False, "almost.pt": False, "zeros.pt": False,
                       "whole.pt": True, "legacy.pt": True}
    assert resume.recorded_updates(str(tmp_path / "whole.pt")) == 2
    assert resume.recorded_updates(str(tmp_path / "legacy.pt")) == 7
    assert resume.recorded_updates(str(tmp_path / "half.pt")) is None


def checkpoint_cfg(save_dir, **overrides):
    from fairseq.dataclass.configs import CheckpointConfig
    from omegaconf import OmegaConf

    return OmegaConf.merge(OmegaConf.structured(CheckpointConfig), {"save_dir": str(save_dir), **overrides})


def test_check_restore_without_training(tmp_path, tiny_trained, caplog):
    """What the patched load_checkpoint decides, for each case, before fairseq loads anything."""
    _, checkpoint = tiny_trained
    data = open(checkpoint, "rb").read()
    save_dir = tmp_path / "ckpt"
    save_dir.mkdir()
    assert resume.check_restore(checkpoint_cfg(save_dir)) is None  # fresh dir: from scratch
    (save_dir / "checkpoint_last.pt").write_bytes(data)
    assert resume.check_restore(checkpoint_cfg(save_dir)) is None  # intact: fairseq's choice
    (save_dir / "checkpoint_last.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(resume.ResumeError, match="has no intact checkpoint to resume from"):
        resume.check_restore(checkpoint_cfg(save_dir))
    (save_dir / "checkpoint_1_2.pt").write_bytes(data)
    assert resume.check_restore(checkpoint_cfg(save_dir)) == str(save_dir / "checkpoint_1_2.pt")
    # explicit files: missing, a directory, unreadable (fairseq: "No existing checkpoint found"
    # and training from scratch, or a bare EOFError / RuntimeError), intact
    typo = str(tmp_path / "checkpoint_1_3.pt")
    with pytest.raises(resume.ResumeError, match=f"^--restore-file {re.escape(typo)} does not exist"):
        resume.check_restore(checkpoint_cfg(save_dir, restore_file=typo), strict=True)
    # plain fairseq-train: fairseq's meaning (train from scratch), said in one warning
    caplog.clear()
    assert resume.check_restore(checkpoint_cfg(save_dir, restore_file=typo), strict=False) is None
    assert [r.getMessage() for r in caplog.records if r.name == resume.logger.name] == [
        f"--restore-file {typo} does not exist: training starts from scratch, as fairseq does "
        "(fairseq-ext train refuses a missing --restore-file)"]
    with pytest.raises(resume.ResumeError, match="is a directory, not a checkpoint file"):
        resume.check_restore(checkpoint_cfg(save_dir, restore_file=str(save_dir)))
    broken = str(save_dir / "checkpoint_last.pt")
    with pytest.raises(resume.ResumeError, match=f"^--restore-file {re.escape(broken)} is unreadable .*the intact "
                                                 f"checkpoint of {re.escape(str(save_dir))} with the most updates is "
                                                 f"{re.escape(str(save_dir / 'checkpoint_1_2.pt'))}$"):
        resume.check_restore(checkpoint_cfg(save_dir, restore_file=broken))
    assert resume.check_restore(checkpoint_cfg(save_dir, restore_file=str(save_dir / "checkpoint_1_2.pt"))) is None
    # --continue-once only counts on a first launch (no checkpoint_last.pt)
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    with pytest.raises(resume.ResumeError, match=f"^--continue-once {re.escape(broken)} is unreadable"):
        resume.check_restore(checkpoint_cfg(fresh, continue_once=broken))
    assert resume.check_restore(checkpoint_cfg(fresh, continue_once=str(save_dir / "checkpoint_1_2.pt"))) is None


# --- resuming end to end --------------------------------------------------------------------
def train(bin_dir, save_dir, *flags, cwd=None):
    """Plain fairseq-train with the plugin loaded through --user-dir."""
    return subprocess.run(["fairseq-train", bin_dir, "--user-dir", USER_DIR, "--arch", "multilayer_transformer",
                           *TINY_TRAIN_FLAGS, "--save-dir", str(save_dir), *flags],
                          capture_output=True, text=True, env=clean_env(), timeout=300, cwd=cwd)


@pytest.fixture
def crashed_save_dir(tiny_trained, tmp_path):
    """A save dir whose checkpoint_last.pt a crash truncated, with an intact checkpoint_1_2.pt."""
    bin_dir, checkpoint = tiny_trained
    save_dir = tmp_path / "ckpt"
    save_dir.mkdir()
    shutil.copy(checkpoint, save_dir / "checkpoint_1_2.pt")
    return bin_dir, save_dir, open(checkpoint, "rb").read()


@pytest.mark.slow
@pytest.mark.parametrize("kept,finetune", [(0, False), (0.5, False), (0.5, True)])
def test_truncated_last_checkpoint_resumes_from_the_newest_intact_one(crashed_save_dir, tiny_trained, kept, finetune):
    bin_dir, save_dir, data = crashed_save_dir
    (save_dir / "checkpoint_last.pt").write_bytes(data[: int(len(data) * kept)])
    # --finetune-from-model only applies to a first launch: fairseq resumes from checkpoint_last.pt
    flags = ["--finetune-from-model", tiny_trained[1]] if finetune else []
    result = train(bin_dir, save_dir, "--max-update", "4", *flags)
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-3000:]
    warning = (f"WARNING | fairseq_ext.guards.resume | {save_dir}/checkpoint_last.pt is unreadable (empty or truncated, "
               f"e.g. by a crash during a save): resuming from {save_dir}/checkpoint_1_2.pt")
    assert log.count(warning) == 1, log[-3000:]
    assert f"Loaded checkpoint {save_dir}/checkpoint_1_2.pt (epoch 1 @ 2 updates)" in log
    assert resume.is_intact(str(save_dir / "checkpoint_last.pt"))
    assert torch.load(save_dir / "checkpoint_last.pt")["optimizer_history"][-1]["num_updates"] == 4


@pytest.mark.slow
def test_nothing_intact_and_restore_file_typos_are_refused(crashed_save_dir, tmp_path):
    bin_dir, save_dir, data = crashed_save_dir
    (save_dir / "checkpoint_1_2.pt").write_bytes(data[:100])
    (save_dir / "checkpoint_last.pt").write_bytes(b"")
    result = train(bin_dir, save_dir, "--max-update", "4")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert f"fairseq-train: error: {save_dir}/checkpoint_last.pt is unreadable" in result.stderr
    assert (save_dir / "checkpoint_last.pt").read_bytes() == b""  # nothing trained, nothing overwritten
    typo = tmp_path / "ckpt" / "checkpont_best.pt"
    # fairseq-ext train: refused, nothing trained (plain fairseq-train: tested below)
    train_sh = os.path.join(os.path.dirname(USER_DIR), "scripts", "train.sh")
    result = subprocess.run(["bash", train_sh, bin_dir, str(tmp_path / "other"), "--", "--arch",
                             "multilayer_transformer", *TINY_TRAIN_FLAGS, "--max-update", "4", "--restore-file",
                             str(typo)], capture_output=True, text=True, env=clean_env(), timeout=300)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert f"fairseq-train: error: --restore-file {typo} does not exist" in result.stderr
    assert not (tmp_path / "other" / "checkpoint_last.pt").exists()
    # a path relative to --save-dir instead of the working directory: named, with the fix
    result = subprocess.run(["bash", train_sh, bin_dir, str(save_dir), "--", "--arch", "multilayer_transformer",
                             *TINY_TRAIN_FLAGS, "--max-update", "4", "--restore-file", "checkpoint_1_2.pt"],
                            capture_output=True, text=True, env=clean_env(), timeout=300, cwd=tmp_path)
    assert result.returncode == 1
    assert (f"fairseq-train: error: --restore-file checkpoint_1_2.pt does not exist; fairseq would train from "
            f"scratch (did you mean {save_dir}/checkpoint_1_2.pt?") in result.stderr


@pytest.mark.slow
def test_plain_fairseq_train_keeps_fairseqs_meaning_of_a_missing_restore_file(tiny_trained, tmp_path):
    """fairseq's own tests (test_binaries.py, TestActivationCheckpointing) name a --restore-file
    that does not exist to start from scratch: with the plugin loaded that still trains, with
    one warning naming the file."""
    bin_dir, _ = tiny_trained
    missing = tmp_path / "not-there.pt"
    result = train(bin_dir, tmp_path / "fresh", "--max-update", "2", "--restore-file", str(missing))
    assert result.returncode == 0, result.stderr[-2000:]
    log = result.stdout + result.stderr
    assert log.count(f"--restore-file {missing} does not exist: training starts from scratch") == 1
    assert resume.is_intact(str(tmp_path / "fresh" / "checkpoint_last.pt"))


@pytest.mark.slow
def test_a_fresh_save_dir_still_trains_from_scratch(tiny_trained, tmp_path):
    bin_dir, _ = tiny_trained
    result = train(bin_dir, tmp_path / "fresh", "--max-update", "2")
    assert result.returncode == 0, result.stderr[-2000:]
    assert resume.is_intact(str(tmp_path / "fresh" / "checkpoint_last.pt"))


@pytest.mark.slow
def test_train_sh_says_it_once_before_starting_several_processes(crashed_save_dir, tmp_path):
    """With --nproc 2 every rank would refuse and torchrun print a traceback after them:
    train.sh runs the plugin's check once, first."""
    bin_dir, save_dir, data = crashed_save_dir
    train_sh = os.path.join(os.path.dirname(USER_DIR), "scripts", "train.sh")
    flags = ["--arch", "multilayer_transformer", *[f for f in TINY_TRAIN_FLAGS if f != "--cpu"], "--max-update", "4"]
    typo = tmp_path / "checkpoint_typo.pt"
    (save_dir / "checkpoint_1_2.pt").write_bytes(data[:100])
    (save_dir / "checkpoint_last.pt").write_bytes(data[:-1])
    for extra, message in [(["--restore-file", str(typo)], f"--restore-file {typo} does not exist"),
                           ([], f"{save_dir}/checkpoint_last.pt is unreadable")]:
        result = subprocess.run(["bash", train_sh, bin_dir, str(save_dir), "--nproc", "2", "--", *flags, *extra],
                                capture_output=True, text=True, env=clean_env(), timeout=120)
        assert result.returncode == 1
        assert result.stderr.startswith(f"fairseq-train: error: {message}"), result.stderr[-2000:]
        assert len(result.stderr.splitlines()) == 1 and "world size" not in result.stderr  # torchrun not started

