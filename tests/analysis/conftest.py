"""Fixtures of the analysis tests shared by several of their files."""
import os

import pytest

from model_utils import make_tiny_parallel_data, train_tiny
from script_utils import built_once


@pytest.fixture(scope="session")
def map_models(tmp_path_factory):
    """Three tiny checkpoints on one synthetic task: hierarchical joint attention over both
    encoder layers (standard encoder self-attention), the same without encoder positions,
    and an MMA encoder with one head of each type (G, L, F, B): (bin_dir, {name: checkpoint})."""
    runs = (("hier", ["--joint-attention", "hierarchical"]),
            ("hier_nopos", ["--joint-attention", "hierarchical", "--no-encoder-positional-embeddings"]),
            ("mma", ["--encoder-attention-heads", "4", "--encoder-self-attention", "mma", "--mma-heads", "G,L,F,B",
                     "--mma-window", "1"]))

    def build(root):
        bin_dir = make_tiny_parallel_data(str(root), num_train=121)
        with open(os.path.join(bin_dir, "prep.env"), "w") as f:  # what evaluate.sh reads
            f.write("recipe=tiny\nsrc=src\ntgt=tgt\nbpe=none\n")
        for name, extra in runs:
            train_tiny(bin_dir, root / name, *extra)

    root = built_once(tmp_path_factory, "map_models", build)
    return str(root / "bin"), {name: str(root / name / "checkpoint_last.pt") for name, _ in runs}
