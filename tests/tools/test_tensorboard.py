"""Watching training with TensorBoard (docs/training.md, "Watch training"): with tensorboardX
installed (Makefile setup, setup.py), fairseq-train with the plugin and ``--tensorboard-logdir``
writes event files holding the scalars it logs, the multi-output criterion's per-decoder
losses among them, and neither fairseq-train nor fairseq-generate starts with fairseq's
"Please install tensorboardX" line. The event files are read back record by record with
tensorboardX's own protobuf classes and checksum."""
import glob
import math
import os
import re
import struct
import subprocess

import pytest

from model_utils import TINY_TRAIN_FLAGS, USER_DIR, clean_env, make_tiny_parallel_data

pytestmark = pytest.mark.slow

MAX_UPDATE = 4
# what fairseq logs when tensorboardX (fairseq.tasks.text_to_speech, imported by every fairseq
# command) or any SummaryWriter (fairseq.logging.progress_bar) cannot be imported
COMPLAINTS = ("Please install tensorboardX", "tensorboard not found")


def read_events(path):
    """The Event protos of one TFRecord event file: each record is a little-endian uint64
    length, its masked CRC32C, the serialized Event and that one's masked CRC32C."""
    from tensorboardX.proto.event_pb2 import Event
    from tensorboardX.record_writer import masked_crc32c

    with open(path, "rb") as f:
        data = f.read()
    events, offset = [], 0
    while offset < len(data):
        header = data[offset : offset + 8]
        (length,) = struct.unpack("<Q", header)
        assert struct.unpack("<I", data[offset + 8 : offset + 12])[0] == masked_crc32c(header), path
        body = data[offset + 12 : offset + 12 + length]
        assert struct.unpack("<I", data[offset + 12 + length : offset + 16 + length])[0] == masked_crc32c(body), path
        events.append(Event.FromString(body))
        offset += 16 + length
    return events


def scalars(logdir, tag):
    """{scalar name: {step: value}} of fairseq's writer for ``tag`` (its subdirectory:
    train_inner, train, valid)."""
    files = glob.glob(os.path.join(logdir, tag, "events.out.tfevents.*"))
    assert files, f"no event file in {os.path.join(logdir, tag)}: {sorted(os.listdir(logdir))}"
    found = {}
    for path in files:
        for event in read_events(path):
            for value in event.summary.value:
                if value.HasField("simple_value"):
                    found.setdefault(value.tag, {})[event.step] = value.simple_value
    return found


def logged_train_losses(log):
    """{num_updates: loss} of fairseq-train's train_inner lines (--log-format simple)."""
    return {int(m.group(2)): float(m.group(1))
            for m in re.finditer(r"\| train_inner \| .* loss=([0-9.]+), .*num_updates=(\d+),", log)}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """fairseq-train with an auxiliary decoder on encoder layer 1 and the multi-output criterion,
    MAX_UPDATE updates logged one by one into a TensorBoard logdir: (bin dir, checkpoint,
    logdir, the command's stdout + stderr)."""
    root = tmp_path_factory.mktemp("tensorboard")
    bin_dir = make_tiny_parallel_data(str(root), num_train=61)
    logdir = root / "tb"
    train = subprocess.run(
        ["fairseq-train", bin_dir, "--user-dir", USER_DIR, "--arch", "multilayer_transformer", *TINY_TRAIN_FLAGS,
         "--aux-decoder-layers", "1", "--criterion", "multi_output_label_smoothed_cross_entropy",
         "--label-smoothing", "0.1", "--max-update", str(MAX_UPDATE), "--log-interval", "1",
         "--save-dir", str(root / "ckpt"), "--tensorboard-logdir", str(logdir)],
        capture_output=True, text=True, env=clean_env())
    assert train.returncode == 0, train.stderr[-3000:]
    return bin_dir, root / "ckpt" / "checkpoint_last.pt", str(logdir), train.stdout + train.stderr


def test_training_writes_the_logged_scalars_without_a_complaint(trained):
    _, _, logdir, log = trained
    for complaint in COMPLAINTS:
        assert complaint not in log
    assert sorted(os.listdir(logdir)) == ["train", "train_inner", "valid"]

    inner = scalars(logdir, "train_inner")
    for name in ("loss", "nll_loss", "ppl", "lr", "gnorm", "main_loss", "aux1_loss", "aux1_nll_loss"):
        assert sorted(inner.get(name, {})) == list(range(1, MAX_UPDATE + 1)), (name, sorted(inner))
    # the scalar of every update is the train loss fairseq-train printed for it (3 decimals)
    printed = logged_train_losses(log)
    assert sorted(printed) == list(range(1, MAX_UPDATE + 1)), log[-3000:]
    for step, loss in printed.items():
        assert inner["loss"][step] == pytest.approx(loss, abs=6e-4), step
        assert math.isfinite(inner["aux1_loss"][step]) and inner["aux1_loss"][step] > 0

    for tag in ("train", "valid"):
        per_epoch = scalars(logdir, tag)
        for name in ("loss", "nll_loss", "ppl", "main_loss", "aux1_loss", "aux1_nll_loss"):
            assert MAX_UPDATE in per_epoch.get(name, {}), (tag, name, sorted(per_epoch))
    assert MAX_UPDATE in scalars(logdir, "train")["lr"]


def test_generate_does_not_complain(trained):
    bin_dir, checkpoint, _, _ = trained
    gen = subprocess.run(["fairseq-generate", bin_dir, "--user-dir", USER_DIR, "--path", str(checkpoint),
                          "--beam", "2", "--batch-size", "8", "--cpu"], capture_output=True, text=True, env=clean_env())
    assert gen.returncode == 0, gen.stderr[-3000:]
    assert "BLEU4" in gen.stdout
    for complaint in COMPLAINTS:
        assert complaint not in gen.stdout + gen.stderr
