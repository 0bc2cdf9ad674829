"""Checkpoints of the first release (before the code was split into one file per concern
and the presets were renamed) still load, under their old --arch names, and give the same
outputs. The fixtures were written by tests/fixtures/make_checkpoints_v0_1.py with that
release's code; each holds a batch and the log-probabilities the model gave on it then."""
import glob
import os
from types import SimpleNamespace

import pytest
import torch
from fairseq import checkpoint_utils

from fairseq_ext.models.multilayer_transformer import MultilayerTransformerModel
from model_utils import FIXTURES, full_and_incremental, make_dictionary

CHECKPOINTS = sorted(glob.glob(os.path.join(FIXTURES, "checkpoints_v0_1", "*.pt")))


def test_fixtures_are_there():
    assert len(CHECKPOINTS) == 9


@pytest.mark.parametrize("path", CHECKPOINTS, ids=lambda p: os.path.basename(p)[:-3])
def test_old_checkpoint_loads_and_translates_identically(path):
    dictionary = make_dictionary()
    task = SimpleNamespace(source_dictionary=dictionary, target_dictionary=dictionary)
    task.build_model = lambda cfg, from_checkpoint=False: MultilayerTransformerModel.build_model(cfg, task)
    (model,), _ = checkpoint_utils.load_model_ensemble([path], task=task)
    model.eval()
    fixture = checkpoint_utils.load_checkpoint_to_cpu(path)["extra_state"]["fixture"]
    src, lengths, prev = fixture["src"], fixture["lengths"], fixture["prev"]
    full, incremental = full_and_incremental(model, src, lengths, prev)
    # a few float32 ulps of log-probabilities of magnitude ~10: the computation may be
    # reordered (the n sources' projections are one batched matmul since then)
    torch.testing.assert_close(full, fixture["log_probs"], rtol=0, atol=1e-5)
    torch.testing.assert_close(incremental, fixture["log_probs"], rtol=0, atol=1e-5)
