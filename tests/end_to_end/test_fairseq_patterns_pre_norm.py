"""fairseq's own ways of using a model, for every row of the strategy table and every option set
in pre-norm layers with activation checkpointing: train (``fairseq-train`` in this process,
as fairseq's tests do, validating each epoch), resume from ``checkpoint_last.pt``, generate in several
of fairseq-generate's modes (beam search, scoring the reference and an ensemble of two checkpoints for
every option set; n-best, sampling and a forced prefix in turn, each for a third of them) and average
checkpoints."""
import os

import pytest
import torch

from fairseq_ext.average_checkpoints import cli_main as average_checkpoints
from fairseq_ext.guards.checkpoint_safety import load_checkpoint_state
from joint_attention_reference import PRE_NORM
from joint_attention_reference import PRE_NORM_OPTION_SETS as OPTION_SETS
from model_utils import USER_DIR, generate_in_process, train_in_process

pytestmark = pytest.mark.slow

MODEL = ["--encoder-layers", "3", "--decoder-layers", "2", "--encoder-embed-dim", "16", "--decoder-embed-dim", "16",
         "--encoder-ffn-embed-dim", "32", "--decoder-ffn-embed-dim", "32", "--encoder-attention-heads", "4",
         "--decoder-attention-heads", "4", "--dropout", "0.1"]
GENERATION_MODES = {
    "beam": [],
    "score-reference": ["--score-reference"],
}
# the same beam search or its sampling and prefix variants: an option set runs one of them
IN_TURN = {
    "nbest": ["--nbest", "2"],
    "sampling": ["--sampling", "--sampling-topk", "3", "--beam", "1", "--seed", "3"],
    "prefix": ["--prefix-size", "1"],
}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    from fairseq_compat.sdist_test_helpers import create_dummy_data, preprocess_translation_data

    root = str(tmp_path_factory.mktemp("patterns"))
    create_dummy_data(root, num_examples=29, maxlen=9)
    preprocess_translation_data(root)
    return root


def fairseq_train(data_dir, save_dir, flags, max_update):
    train_in_process([
        data_dir, "--user-dir", USER_DIR, "--arch", "multilayer_transformer", *MODEL, *PRE_NORM,
        "--checkpoint-activations", *flags, "--criterion", "multi_output_label_smoothed_cross_entropy",
        "--label-smoothing", "0.1", "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "200",
        "--required-batch-size-multiple", "1", "--max-update", str(max_update), "--save-dir", save_dir,
        "--no-progress-bar", "--num-workers", "0",
        "--cpu", "--seed", "1", "--source-lang", "in", "--target-lang", "out"])


def fairseq_generate(data_dir, path, flags):
    return generate_in_process([
        data_dir, "--user-dir", USER_DIR, "--path", path, "--beam", "3", "--batch-size", "5", "--max-len-b", "6",
        "--gen-subset", "valid", "--num-workers", "0", "--cpu", "--source-lang", "in", "--target-lang", "out",
        *flags])


def hypotheses(output):
    return [line for line in output.splitlines() if line.startswith("H-")]


@pytest.mark.parametrize("option_set", list(OPTION_SETS))
def test_fairseq_patterns_with_pre_norm_and_checkpointing(option_set, data_dir, tmp_path):
    save = str(tmp_path / "ckpt")
    flags = list(OPTION_SETS[option_set])
    fairseq_train(data_dir, save, flags, max_update=4)
    last = os.path.join(save, "checkpoint_last.pt")
    assert load_checkpoint_state(last)["optimizer_history"][-1]["num_updates"] == 4
    first = {k: v.clone() for k, v in load_checkpoint_state(last)["model"].items()}
    fairseq_train(data_dir, save, flags, max_update=6)  # resumes: two more updates
    resumed = load_checkpoint_state(last)
    assert resumed["optimizer_history"][-1]["num_updates"] == 6
    assert any(not torch.equal(first[k], v) for k, v in resumed["model"].items())

    in_turn = list(IN_TURN.items())[list(OPTION_SETS).index(option_set) % len(IN_TURN)]
    for mode, mode_flags in [*GENERATION_MODES.items(), in_turn]:
        lines = hypotheses(fairseq_generate(data_dir, last, mode_flags))
        per_sentence = 2 if mode == "nbest" else 1
        assert len(lines) == 29 * per_sentence, (mode, len(lines))  # every validation sentence
    earlier = os.path.join(save, "checkpoint1.pt")  # the first epoch's
    ensemble = earlier + ":" + last
    assert len(hypotheses(fairseq_generate(data_dir, ensemble, []))) == 29

    averaged = str(tmp_path / "averaged.pt")
    average_checkpoints(["--inputs", earlier, last, "--output", averaged])
    assert len(hypotheses(fairseq_generate(data_dir, averaged, []))) == 29
