"""Batching (fairseq_ext/guards/batching.py): with the plugin, fairseq sees every sentence in
validation, fairseq-generate, fairseq-interactive and fairseq-validate (fairseq 0.12's
batch_by_size drops a final batch whose size is not a multiple of
--required-batch-size-multiple)."""
import os
import random
import re
import subprocess

import numpy as np
import pytest
from fairseq.data import data_utils

import fairseq_ext  # noqa: F401  (installs the guards)
from model_utils import USER_DIR, clean_env


@pytest.mark.parametrize("seed", range(40))
def test_batches_cover_every_index_and_keep_fairseqs_batches(seed):
    rng = np.random.RandomState(seed)
    n = int(rng.randint(1, 700))
    lengths = rng.randint(1, 80, size=n)
    indices = np.argsort(lengths, kind="mergesort")
    max_tokens = [None, 150, 1000][seed % 3]
    max_sentences = [5, 13, None][seed % 3 if max_tokens else 0]
    mult = [1, 8, 3][seed % 3]
    kwargs = dict(num_tokens_vec=lengths[indices], max_tokens=max_tokens, max_sentences=max_sentences,
                  required_batch_size_multiple=mult)
    stock = data_utils.batch_by_size.__wrapped__(indices, lambda i: lengths[i], **kwargs)
    ours = data_utils.batch_by_size(indices, lambda i: lengths[i], **kwargs)
    assert np.array_equal(np.concatenate(ours), indices)  # every sentence, in order
    assert len(ours) - len(stock) in (0, 1)
    for a, b in zip(stock, ours):  # fairseq's own batches are untouched
        assert np.array_equal(a, b)
    for batch in ours:
        if max_sentences:
            assert len(batch) <= max_sentences
        if max_tokens:
            assert len(batch) * lengths[batch].max() <= max_tokens


def test_stock_batch_by_size_drops_sentences():
    """What the guard prevents, measured on fairseq's own function: 5 of 13 sentences lost."""
    lengths = np.full(13, 5)
    indices = np.arange(13)
    stock = data_utils.batch_by_size.__wrapped__(indices, lambda i: 5, num_tokens_vec=lengths, max_sentences=8,
                                                 required_batch_size_multiple=8)
    assert sum(len(b) for b in stock) == 8  # 5 of 13 lost
    ours = data_utils.batch_by_size(indices, lambda i: 5, num_tokens_vec=lengths, max_sentences=8,
                                    required_batch_size_multiple=8)
    assert sum(len(b) for b in ours) == 13


def _write_split(raw, name, count, seed):
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(24)]
    with open(f"{raw}/{name}.src", "w") as fs, open(f"{raw}/{name}.tgt", "w") as ft:
        for _ in range(count):
            sent = [rng.choice(words) for _ in range(rng.randint(1, 12))]
            fs.write(" ".join(sent) + "\n")
            ft.write(" ".join(reversed(sent)) + "\n")


@pytest.fixture(scope="module")
def odd_splits(tiny_trained, tmp_path_factory):
    """valid = 461 and test = 13 sentences, binarized with the tiny checkpoint's dictionaries."""
    bin_dir, checkpoint = tiny_trained
    root = tmp_path_factory.mktemp("odd")
    raw = root / "raw"
    raw.mkdir()
    _write_split(raw, "valid", 461, 1)
    _write_split(raw, "test", 13, 2)
    out = root / "bin"
    subprocess.run(["fairseq-preprocess", "--source-lang", "src", "--target-lang", "tgt", "--validpref",
                    f"{raw}/valid", "--testpref", f"{raw}/test", "--destdir", str(out), "--srcdict",
                    f"{bin_dir}/dict.src.txt", "--tgtdict", f"{bin_dir}/dict.tgt.txt", "--workers", "1"],
                   check=True, capture_output=True, env=clean_env())
    return str(out), checkpoint


@pytest.mark.parametrize("split,count", [("valid", 461), ("test", 13)])
@pytest.mark.parametrize("batching", [("--batch-size", "5"), ("--batch-size", "8"), ("--max-tokens", "37")])
def test_task_batches_see_every_sentence(odd_splits, split, count, batching):
    """What validation and generation iterate: every id, with fairseq's default multiple 8."""
    from fairseq import options, tasks
    bin_dir, _ = odd_splits
    parser = options.get_generation_parser()
    args = options.parse_args_and_arch(parser, [bin_dir, "--user-dir", USER_DIR, "--cpu", *batching])
    task = tasks.setup_task(args)
    task.load_dataset(split)
    dataset = task.dataset(split)
    itr = task.get_batch_iterator(dataset, max_tokens=args.max_tokens, max_sentences=args.batch_size,
                                  required_batch_size_multiple=args.required_batch_size_multiple)
    seen = sorted(i for batch in itr.next_epoch_itr(shuffle=False) for i in batch["id"].tolist())
    assert seen == list(range(count))


@pytest.mark.slow
@pytest.mark.parametrize("split,count", [("valid", 461), ("test", 13)])
def test_stock_fairseq_generate_translates_every_sentence(odd_splits, split, count):
    bin_dir, checkpoint = odd_splits
    result = subprocess.run(["fairseq-generate", bin_dir, "--user-dir", USER_DIR, "--cpu", "--path", checkpoint,
                             "--gen-subset", split, "--beam", "2", "--batch-size", "6", "--max-len-b", "5"],
                            capture_output=True, text=True, env=clean_env())
    assert result.returncode == 0, result.stderr[-2000:]
    ids = sorted(int(m) for m in re.findall(r"^H-(\d+)\t", result.stdout, flags=re.M))
    assert ids == list(range(count))


@pytest.mark.slow
def test_fairseq_interactive_and_validate_see_every_sentence(odd_splits, tmp_path):
    bin_dir, checkpoint = odd_splits
    lines = [" ".join(f"w{(i * 7 + j) % 24}" for j in range(1 + i % 9)) for i in range(13)]
    result = subprocess.run(["fairseq-interactive", bin_dir, "--user-dir", USER_DIR, "--cpu", "--path", checkpoint,
                             "--buffer-size", "13", "--batch-size", "5", "--beam", "2", "--max-len-b", "5",
                             "--source-lang", "src", "--target-lang", "tgt"],
                            input="\n".join(lines) + "\n", capture_output=True, text=True, env=clean_env())
    assert result.returncode == 0, result.stderr[-2000:]
    assert len(re.findall(r"^H-\d+\t", result.stdout, flags=re.M)) == 13
    result = subprocess.run(["fairseq-validate", bin_dir, "--user-dir", USER_DIR, "--cpu", "--path", checkpoint,
                             "--task", "translation", "--valid-subset", "valid", "--batch-size", "5"],
                            capture_output=True, text=True, env=clean_env())
    assert result.returncode == 0, result.stderr[-2000:]
    log = result.stdout + result.stderr
    assert re.search(r"valid on 'valid' subset .*\| bsz 461$", log, flags=re.M), log[-2000:]  # sentences seen
