"""Issue 8, items 3 and 6: resuming with several processes, after a crash during a save,
and never silently from scratch (fairseq_ext/resume.py)."""
import io
import os
import shutil
import subprocess

import pytest
import torch
from fairseq import checkpoint_utils
from fairseq.distributed import utils as distributed_utils

from fairseq_ext import resume
from model_utils import TINY_TRAIN_FLAGS, USER_DIR, clean_env


# --- item 3: what rank 0 broadcasts to the other ranks -------------------------------------
def test_broadcast_payload_loads_with_weights_only(tiny_trained):
    _, checkpoint = tiny_trained
    state = checkpoint_utils.load_checkpoint_to_cpu(checkpoint)  # what rank 0 broadcasts
    tensors = []
    obj = distributed_utils._split_tensors_from_obj(state, tensors)
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    with pytest.raises(Exception, match="Unsupported global"):  # fairseq's own payload: the bug
        torch.load(io.BytesIO(buffer.getvalue()), map_location="cpu")
    buffer = io.BytesIO()
    torch.save({"payload": resume.encode_for_broadcast(obj)}, buffer)
    received = torch.load(io.BytesIO(buffer.getvalue()), map_location="cpu")  # weights_only=True
    rebuilt = distributed_utils._put_tensors_in_obj(resume.decode_broadcast(received["payload"]), tensors)
    assert type(rebuilt["cfg"]) is type(state["cfg"])
    assert rebuilt["cfg"].model.arch == state["cfg"].model.arch == "multilayer_transformer"
    assert rebuilt["cfg"].optimization.lr == state["cfg"].optimization.lr
    assert rebuilt["optimizer_history"] == state["optimizer_history"]
    for key, value in state["model"].items():
        assert torch.equal(rebuilt["model"][key], value)


# --- item 6: crash-safe copies --------------------------------------------------------------
def test_checkpoint_copies_are_atomic(tmp_path, monkeypatch):
    src, dst = tmp_path / "checkpoint_1_5.pt", tmp_path / "checkpoint_last.pt"
    src.write_bytes(b"new" * 1000)
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
    assert checkpoint_utils.PathManager.copy(str(src), str(dst), overwrite=True)
    assert dst.read_bytes() == src.read_bytes()


def test_newest_intact_checkpoint(tmp_path, tiny_trained):
    _, checkpoint = tiny_trained
    for name in ("checkpoint1.pt", "checkpoint_2_10.pt", "checkpoint2.pt", "checkpoint_3_12.pt", "checkpoint_best.pt"):
        shutil.copy(checkpoint, tmp_path / name)
    (tmp_path / "checkpoint_3_12.pt").write_bytes(open(checkpoint, "rb").read()[:1000])  # truncated
    assert resume.newest_intact_checkpoint(str(tmp_path)) == str(tmp_path / "checkpoint2.pt")
    assert not resume.is_intact(str(tmp_path / "checkpoint_3_12.pt"))


# --- item 6: resuming end to end ------------------------------------------------------------
def train(bin_dir, save_dir, *flags):
    return subprocess.run(["fairseq-train", bin_dir, "--user-dir", USER_DIR, "--arch", "multilayer_transformer",
                           *TINY_TRAIN_FLAGS, "--save-dir", str(save_dir), *flags],
                          capture_output=True, text=True, env=clean_env(), timeout=300)


@pytest.fixture
def crashed_save_dir(tiny_trained, tmp_path):
    """A save dir whose checkpoint_last.pt a crash truncated, with an intact checkpoint_1_2.pt."""
    bin_dir, checkpoint = tiny_trained
    save_dir = tmp_path / "ckpt"
    save_dir.mkdir()
    shutil.copy(checkpoint, save_dir / "checkpoint_1_2.pt")
    return bin_dir, save_dir, open(checkpoint, "rb").read()


@pytest.mark.slow
@pytest.mark.parametrize("kept", [0, 0.5])
def test_truncated_last_checkpoint_resumes_from_the_newest_intact_one(crashed_save_dir, kept):
    bin_dir, save_dir, data = crashed_save_dir
    (save_dir / "checkpoint_last.pt").write_bytes(data[: int(len(data) * kept)])
    result = train(bin_dir, save_dir, "--max-update", "4")
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-3000:]
    assert f"{save_dir}/checkpoint_last.pt is unreadable" in log
    assert f"resuming from {save_dir}/checkpoint_1_2.pt" in log
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
    typo = tmp_path / "ckpt" / "checkpont_best.pt"
    result = train(bin_dir, tmp_path / "other", "--max-update", "4", "--restore-file", str(typo))
    assert result.returncode == 1
    assert f"fairseq-train: error: --restore-file {typo} does not exist" in result.stderr
    assert not (tmp_path / "other" / "checkpoint_last.pt").exists()


@pytest.mark.slow
def test_a_fresh_save_dir_still_trains_from_scratch(tiny_trained, tmp_path):
    bin_dir, _ = tiny_trained
    result = train(bin_dir, tmp_path / "fresh", "--max-update", "2")
    assert result.returncode == 0, result.stderr[-2000:]
    assert resume.is_intact(str(tmp_path / "fresh" / "checkpoint_last.pt"))
