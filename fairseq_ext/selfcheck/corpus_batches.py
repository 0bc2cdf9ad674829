"""The sentence lengths of a corpus and the batches fairseq cuts from them, for
``fairseq-ext benchmark --mode updates``: token ids random in the benchmark's dictionary, the
lengths real (a binarized data dir, text files) or a fixed synthetic distribution; training
batches as fairseq-train makes them at ``--max-tokens``, decoding batches as fairseq-generate
makes them."""
import glob
import gzip
import os
import re

import numpy as np
import torch

# without --data: sentence lengths like IWSLT'15 En-Vi's tokenized training text (log word counts
# of train.en: mean 2.87, sd 0.61; train.vi / train.en: 1.22), each + 1 for </s>
SYNTHETIC = {"sentences": 20000, "log_mean": 2.87, "log_sd": 0.61, "tgt_ratio": 1.22, "ratio_log_sd": 0.15}


def corpus_lengths(data, split: str, seed: int):
    """(source sizes, target sizes, description): per sentence pair, the token counts fairseq-train
    batches by (with </s>). ``data``: None (the synthetic distribution), [DIR] (a binarized data dir:
    the sizes of its ``split``), or [SRC, TGT] (text files, .gz allowed: whitespace word counts + 1)."""
    if not data:
        rng = np.random.default_rng(seed)
        n = SYNTHETIC["sentences"]
        words = np.clip(np.rint(np.exp(rng.normal(SYNTHETIC["log_mean"], SYNTHETIC["log_sd"], n))), 1, 148)
        ratio = SYNTHETIC["tgt_ratio"] * np.exp(rng.normal(0, SYNTHETIC["ratio_log_sd"], n))
        tgt = np.clip(np.rint(words * ratio), 1, 148)
        return (words + 1).astype(np.int64), (tgt + 1).astype(np.int64), {
            "kind": "synthetic", "what": f"no --data: {n} synthetic sentence lengths like IWSLT'15 En-Vi's "
                                        f"tokenized text (log words ~ N({SYNTHETIC['log_mean']}, "
                                        f"{SYNTHETIC['log_sd']}), target {SYNTHETIC['tgt_ratio']}x), + 1 for </s>"}
    if len(data) == 1:
        folder = data[0]
        if not os.path.isdir(folder):
            raise ValueError(f"--data {folder}: not a directory (give a binarized data dir, or SRC TGT text files)")
        pairs = sorted({m.groups() for f in glob.glob(os.path.join(folder, f"{split}.*-*.*.idx"))
                        if (m := re.fullmatch(rf"{re.escape(split)}\.([^.-]+)-([^.-]+)\.[^.]+\.idx",
                                              os.path.basename(f)))})
        if len(pairs) != 1:
            found = ": " + ", ".join("-".join(p) for p in pairs) if pairs else ""
            raise ValueError(f"--data {folder}: {'no' if not pairs else 'more than one'} binarized {split} split "
                             f"({split}.SRC-TGT.SRC.idx){found}")
        from fairseq.data import data_utils

        src_lang, tgt_lang = pairs[0]
        sizes = []
        for lang in (src_lang, tgt_lang):
            dataset = data_utils.load_indexed_dataset(os.path.join(folder, f"{split}.{src_lang}-{tgt_lang}.{lang}"))
            if dataset is None:
                raise ValueError(f"--data {folder}: cannot read {split}.{src_lang}-{tgt_lang}.{lang}")
            sizes.append(np.asarray(dataset.sizes, dtype=np.int64))
        return sizes[0], sizes[1], {"kind": "binarized", "what": f"{folder}: the {split} split's {src_lang}-{tgt_lang} "
                                                                 "sizes (fairseq's tokens, </s> included)"}
    if len(data) == 2:
        counts = []
        for path in data:
            if not os.path.isfile(path):
                raise ValueError(f"--data {path}: no such file")
            with (gzip.open if path.endswith(".gz") else open)(path, "rt", encoding="utf-8") as f:
                counts.append(np.fromiter((len(line.split()) + 1 for line in f), dtype=np.int64))
        if len(counts[0]) != len(counts[1]):
            raise ValueError(f"--data {data[0]} {data[1]}: {len(counts[0])} and {len(counts[1])} lines")
        return counts[0], counts[1], {"kind": "text", "what": f"{data[0]} / {data[1]}: whitespace word counts + 1 "
                                                              "for </s>, a proxy for fairseq's tokens (BPE makes "
                                                              "sentences longer)"}
    raise ValueError("--data: one binarized data dir, or two text files SRC TGT")


class RandomTokens:
    """A sentence per size: token ids uniform over the dictionary's words, </s> last; the same ids
    for an index every time (a generator seeded by it), so that nothing is held in memory."""

    def __init__(self, sizes, dictionary, seed: int):
        self.sizes, self.seed = sizes, seed
        self.low, self.high, self.eos = dictionary.nspecial, len(dictionary), dictionary.eos()

    def __len__(self):
        return len(self.sizes)

    def __getitem__(self, index):
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + int(index))
        tokens = torch.randint(self.low, self.high, (int(self.sizes[index]),), generator=g)
        tokens[-1] = self.eos
        return tokens


def pair_dataset(src_sizes, tgt_sizes, dictionary, seed: int, shuffle: bool = True):
    """fairseq's LanguagePairDataset (padding and input feeding as the translation task sets
    them) over random tokens of these sizes."""
    from fairseq.data import LanguagePairDataset

    return LanguagePairDataset(RandomTokens(src_sizes, dictionary, seed), src_sizes, dictionary,
                               RandomTokens(tgt_sizes, dictionary, seed + 1), tgt_sizes, dictionary,
                               left_pad_source=True, left_pad_target=False, shuffle=shuffle)


def train_batches(trainer, dataset, max_tokens: int, count: int, seed: int, multiple: int):
    """The first ``count`` batches fairseq-train makes of ``dataset`` at ``max_tokens`` (epochs
    repeated as fairseq-train does when one is shorter), collated on the CPU; and what the
    batching left out. The arguments are those of fairseq's ``Trainer.get_train_iterator``:
    pairs longer than the model's or task's positions or than max_tokens are ignored. fairseq
    0.12's batch_by_size drops a last batch whose size is not a multiple of ``multiple``; the
    plugin's guard (fairseq_ext.guards.batching, on in fairseq-train with the plugin too) keeps
    it, and ``dropped_by_batch_by_size`` counts what is missing all the same."""
    from fairseq import utils

    task = trainer.task
    max_positions = utils.resolve_max_positions(task.max_positions(), trainer.model.max_positions(), max_tokens)
    src, tgt = dataset.src_sizes, dataset.tgt_sizes
    too_long = int(((src > max_positions[0]) | (tgt > max_positions[1])).sum())
    if too_long == len(src):
        raise ValueError(f"--max-tokens {max_tokens}: no sentence pair of the data fits (every one is longer "
                         f"than {tuple(max_positions)} tokens)")
    itr = task.get_batch_iterator(dataset, max_tokens=max_tokens, max_positions=max_positions,
                                  ignore_invalid_inputs=True, required_batch_size_multiple=multiple, seed=seed,
                                  epoch=1, disable_iterator_cache=True)
    batched = sum(len(b) for b in itr.frozen_batches)
    info = {"max_tokens": max_tokens, "max_positions": list(max_positions), "sentences": len(src),
            "too_long": too_long, "dropped_by_batch_by_size": len(src) - too_long - batched,
            "batches_in_epoch": len(itr.frozen_batches), "required_batch_size_multiple": multiple}
    samples = []
    while len(samples) < count:
        for sample in itr.next_epoch_itr(shuffle=True):
            samples.append(sample)
            if len(samples) == count:
                break
    return samples, info


def decode_steps(spec: str, src_sizes, tgt_sizes) -> int:
    """Forced decoding steps of a batch: ``target`` its sentences' mean target length (</s> not
    counted), ``N`` a fixed number, ``Ax`` A times their mean source length."""
    if spec == "target":
        steps = float(tgt_sizes.mean()) - 1
    elif spec.endswith("x"):
        steps = float(spec[:-1]) * (float(src_sizes.mean()) - 1)
    else:
        steps = int(spec)
    return max(1, round(steps))


def decode_batches(trainer, src_sizes, tgt_sizes, dictionary, cli, device):
    """``--decode-sentences`` pairs of the corpus drawn at random, batched as fairseq-generate
    batches a test set (fairseq's order by length, ``--decode-batch`` sentences a batch):
    [((src_tokens, src_lengths, None), forced steps)]."""
    max_positions = trainer.task.max_positions()
    fits = np.flatnonzero((src_sizes <= max_positions[0]) & (tgt_sizes <= max_positions[1] - 1))
    chosen = np.random.default_rng(cli.seed).choice(fits, min(cli.decode_sentences, len(fits)), replace=False)
    dataset = pair_dataset(src_sizes[chosen], tgt_sizes[chosen], dictionary, cli.seed + 7, shuffle=False)
    itr = trainer.task.get_batch_iterator(dataset, max_sentences=cli.decode_batch, disable_iterator_cache=True)
    batches = []
    for sample in itr.next_epoch_itr(shuffle=False):
        ids = sample["id"].numpy()
        steps = decode_steps(cli.decode_len, dataset.src_sizes[ids], dataset.tgt_sizes[ids])
        net = sample["net_input"]
        batches.append(((net["src_tokens"].to(device), net["src_lengths"].to(device), None), steps))
    return batches
