"""Warm start (fairseq_ext/models/warm_start.py): a stock fairseq Transformer's weights, or
another option set's, loaded into any option set of the same sizes. Where the technique
allows it the new model computes exactly what the loaded one computed; fairseq-train's
--finetune-from-model and fairseq-ext train --init-from take that path, a plain resume does not."""
import os
import re
import subprocess

import pytest
import torch

from fairseq_ext.models.warm_start import warm_start_state
from joint_attention_reference import OPTION_SETS
from model_utils import SMALL, TINY_TRAIN_FLAGS, USER_DIR, build, build_stock, clean_env, make_dictionary, random_batch

# the option sets whose warm start from the stock model starts from its outputs (docs/training.md)
EXACT = ("none", "s-agg", "iter-s-agg", "m-00", "m-01", "m-10", "m-11", "parallel", "dc", "ms", "aif",
         "pre-classifier")


def outputs(model, batch):
    with torch.no_grad():
        return model.eval()(*batch)[0]


@pytest.mark.parametrize("name", sorted(OPTION_SETS))
def test_a_stock_checkpoint_loads_into_every_option_set(name):
    dictionary = make_dictionary()
    stock, _ = build_stock("transformer_iwslt_de_en", *SMALL, dictionary=dictionary, seed=3)
    model, _ = build("multilayer_transformer_iwslt", *SMALL, *OPTION_SETS[name], dictionary=dictionary, seed=5)
    state, summary = warm_start_state(model, stock.state_dict())
    model.load_state_dict(state, strict=True)
    loaded = stock.state_dict()
    mine = model.state_dict()
    assert all(torch.equal(mine[k], loaded[k]) for k in loaded if k in mine and mine[k].shape == loaded[k].shape)
    assert summary.startswith(f"{sum(k in mine and mine[k].shape == v.shape for k, v in loaded.items())} tensors taken")
    batch = random_batch(dictionary)
    gap = float((outputs(model, batch) - outputs(stock, batch)).abs().max())
    if name in EXACT:
        assert gap < 1e-5, summary
    else:  # the technique changes what the decoder reads: no identity start (and the test would see one)
        assert gap > 1e-3, summary


def test_another_option_set_of_ours_loads_and_a_new_aif_starts_closed():
    dictionary = make_dictionary()
    m10, _ = build("multilayer_transformer_iwslt", *SMALL, "--joint-attention", "m-10", dictionary=dictionary, seed=3)
    fused, _ = build("multilayer_transformer_iwslt", *SMALL, "--joint-attention", "m-10", "--aux-decoder-layers", "1",
                     "--aux-fusion", dictionary=dictionary, seed=5)
    state, summary = warm_start_state(fused, m10.state_dict())
    fused.load_state_dict(state)
    batch = random_batch(dictionary)
    torch.testing.assert_close(outputs(fused, batch), outputs(m10, batch), atol=1e-5, rtol=0)
    # the auxiliary decoder is a copy of the main one, but for its stock cross-attention (the main
    # decoder's is MLMHA's), AIF is closed
    new = summary.split("new with their own initialisation (")[1]
    assert all(part.startswith("decoder.aux_decoders.*.layers.*.encoder_attn") for part in new.rstrip(")").split(", "))
    aux = dict(fused.decoder.aux_decoders[0].named_parameters())
    same = [k for k, p in fused.decoder.named_parameters() if k in aux and aux[k].shape == p.shape]
    assert len(same) > 20 and all(torch.equal(fused.decoder.get_parameter(k), aux[k]) for k in same)


@pytest.mark.slow
def test_fairseq_trains_on_from_a_checkpoint_of_other_options(tiny_trained, tmp_path):
    """fairseq-ext train --init-from (fairseq's --finetune-from-model): the warm start's line in
    the log, and training goes on; a plain --restore-file of the same checkpoint into M-10 is
    still refused (a resume must match the run)."""
    bin_dir, checkpoint = tiny_trained
    flags = ["--arch", "multilayer_transformer", *TINY_TRAIN_FLAGS, "--joint-attention", "m-10", "--max-update", "2"]
    res = subprocess.run(["fairseq-ext", "train", bin_dir, str(tmp_path / "m10"), "--init-from", checkpoint, "--",
                          *flags], capture_output=True, text=True, env=clean_env(), timeout=600)
    log = res.stdout + res.stderr
    assert res.returncode == 0, log[-3000:]
    assert f"warm start from {checkpoint}: " in log and "new with their own initialisation" in log
    assert os.path.exists(tmp_path / "m10" / "checkpoint_last.pt")
    plain = subprocess.run(["fairseq-train", bin_dir, "--user-dir", USER_DIR,
                            *flags, "--save-dir", str(tmp_path / "resume"), "--restore-file", checkpoint],
                           capture_output=True, text=True, env=clean_env(), timeout=600)
    assert plain.returncode != 0 and "warm start" not in plain.stdout + plain.stderr
    # a model of another width: refused in one line before training, not trained from scratch
    wide = subprocess.run(["fairseq-ext", "train", bin_dir, str(tmp_path / "wide"), "--init-from", checkpoint, "--",
                           *flags, "--encoder-embed-dim", "64", "--decoder-embed-dim", "64"],
                          capture_output=True, text=True, env=clean_env(), timeout=600)
    assert wide.returncode != 0 and "Traceback" not in wide.stderr, wide.stderr[-3000:]
    assert re.search(rf"error: warm start from {re.escape(checkpoint)}: the checkpoint's \S+ is \(\d+, 32\) but the "
                     r"model's is \(\d+, 64\)", wide.stderr), wide.stderr[-3000:]
    assert not os.path.exists(tmp_path / "wide" / "checkpoint_last.pt")


@pytest.mark.slow
def test_a_refused_warm_start_leaves_no_save_dir(tiny_trained, tmp_path):
    """fairseq-train makes --save-dir and its missing parents before it loads the checkpoint: a warm start refused
    there leaves none of them behind."""
    bin_dir, checkpoint = tiny_trained
    flags = ["--arch", "multilayer_transformer", *TINY_TRAIN_FLAGS, "--max-update", "2", "--encoder-embed-dim", "64",
             "--decoder-embed-dim", "64", "--save-dir", str(tmp_path / "new" / "ckpt")]
    for warm in (["--finetune-from-model", checkpoint], ["--restore-file", checkpoint, "--reset-optimizer"]):
        res = subprocess.run(["fairseq-train", bin_dir, "--user-dir", USER_DIR, *flags, *warm], capture_output=True,
                             text=True, env=clean_env(), timeout=600)
        errors = [line for line in res.stderr.splitlines() if "error" in line.lower()]
        assert res.returncode == 1 and len(errors) == 1 and f"warm start from {checkpoint}: " in errors[0], errors
        assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("flags", [[], ["--joint-attention", "m-10"], ["--encoder-self-attention", "dc"]])
def test_a_checkpoint_of_another_width_or_dictionary_is_refused_naming_the_tensor(flags):
    """Stock --finetune-from-model refuses both; a warm start that took the few tensors whose
    shapes still fit would train the rest from scratch, silently."""
    from fairseq_ext.errors import CheckpointError

    dictionary = make_dictionary()
    model, _ = build("multilayer_transformer_iwslt", *SMALL, *flags, dictionary=dictionary, seed=5)
    wide_flags = list(SMALL)  # every width doubled: 64 and 128 for 32 and 64
    for i, flag in enumerate(SMALL):
        if flag.endswith("embed-dim"):
            wide_flags[i + 1] = str(2 * int(SMALL[i + 1]))
    wide, _ = build_stock("transformer_iwslt_de_en", *wide_flags, dictionary=dictionary, seed=3)
    with pytest.raises(CheckpointError, match=r"the checkpoint's encoder.embed_tokens.weight is \(\d+, 64\) but the "
                                             r"model's is \(\d+, 32\) \(\d+ more tensors differ\)"):
        warm_start_state(model, wide.state_dict())
    other_dict, _ = build_stock("transformer_iwslt_de_en", *SMALL, dictionary=make_dictionary(len(dictionary) + 40),
                                seed=3)
    with pytest.raises(CheckpointError, match=r"the checkpoint's encoder.embed_tokens.weight is \(\d+, \d+\) but "
                                             r"the model's is .*: a model of another size or dictionary"):
        warm_start_state(model, other_dict.state_dict())
    stock, _ = build_stock("transformer_iwslt_de_en", *SMALL, dictionary=dictionary, seed=3)
    crafted = {**stock.state_dict(), "encoder.layers.0.fc1.weight": "not a tensor"}
    with pytest.raises(CheckpointError, match="the checkpoint's encoder.layers.0.fc1.weight is a str, not a tensor"):
        warm_start_state(model, crafted)


def test_a_warm_start_starts_its_clock_at_zero():
    """fairseq's Trainer.load_checkpoint keeps the loaded run's training time even with its meters
    reset (--finetune-from-model): --stop-time-hours then stopped a warm start early, and its
    closing line counted the baseline's minutes. A plain resume keeps counting."""
    import time

    from fairseq_ext.guards.training_checks import _warm_starting

    class Trainer:
        _previous_training_time, _start_time = 0, 0.0

    def original(self, filename, reset_optimizer=False, reset_lr_scheduler=False, optimizer_overrides=None,
                 reset_meters=False):
        self._previous_training_time, self._start_time = 470.0, time.time() - 5
        return {"epoch": 3}

    load = _warm_starting(original)
    for reset_optimizer, reset_meters, kept in ((True, True, 0), (False, False, 470.0), (True, False, 470.0)):
        trainer = Trainer()
        assert load(trainer, "ckpt.pt", reset_optimizer, False, None, reset_meters=reset_meters) == {"epoch": 3}
        assert trainer._previous_training_time == kept
        assert (time.time() - trainer._start_time < 4) == (kept == 0)  # a new clock, or fairseq's
