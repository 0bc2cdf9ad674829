"""``multi_source_translation``: translation from several parallel source sentences
(e.g. Multi30k en + fr -> de), the setting of Libovický et al. (2018) for the serial,
parallel, flat and hierarchical input combination strategies (its Sec. 3).

Data: the primary pair binarized as usual (``train.en-de.en/.de``) and, for every extra
source language x, ``train.x-de.x`` (its ``.de`` side is the same target and is not read),
all with one joined dictionary (``dict.en.txt`` = ``dict.fr.txt`` = ``dict.de.txt``);
see docs/architectures.md (Multi-source translation) for the two fairseq-preprocess calls.

    fairseq-train data-bin/multi30k.en+fr-de --user-dir fairseq_ext --task multi_source_translation \\
        -s en -t de --extra-source-langs fr --arch multilayer_transformer_iwslt --joint-attention serial ...

Batches carry the extra sources as ``net_input["extra_src_tokens"]`` (B x (n-1) x J,
left-padded, aligned with ``src_tokens``); the model encodes every source and its decoder
combines them with the chosen strategy.
"""
import logging
import os
from dataclasses import dataclass, field
from typing import List, Optional

import numpy as np
import torch
from fairseq.data import BaseWrapperDataset, FairseqDataset, data_utils
from fairseq.tasks import register_task
from fairseq.tasks.translation import TranslationConfig, TranslationTask

from fairseq_ext import keys

logger = logging.getLogger(__name__)


@dataclass
class MultiSourceTranslationConfig(TranslationConfig):
    extra_source_langs: str = field(
        default="", metadata={"help": "comma list of the extra source languages, e.g. fr or fr,cs"}
    )
    shuffle_source: str = field(
        default="", metadata={"help": "adversarial evaluation (Libovicky et al. 2018, Table 2): replace this "
                                      "source language's sentences by other sentences of the same split"}
    )
    shuffle_seed: int = field(default=1, metadata={"help": "seed of --shuffle-source's permutation"})


def derangement(n: int, seed: int) -> List[int]:
    """A permutation of range(n) that moves every index (n > 1): a random cycle."""
    if n < 2:
        raise ValueError("--shuffle-source needs at least two sentences")
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
    perm = [0] * n
    for i in range(n):
        perm[order[i]] = order[(i + 1) % n]
    return perm


class MultiSourceLanguagePairDataset(BaseWrapperDataset):
    """A LanguagePairDataset (the primary source and the target) plus the extra sources'
    token datasets, collated into ``net_input["extra_src_tokens"]`` in the batch's order."""

    def __init__(self, dataset, extra_sources: List, pad: int, eos: int, left_pad: bool = True,
                 shuffled: Optional[int] = None, permutation: Optional[List[int]] = None):
        """``shuffled``: the source (0 = primary, k = k-th extra) whose sentence at index i is
        replaced by the one at ``permutation[i]`` (adversarial evaluation)."""
        super().__init__(dataset)
        self.shuffled, self.permutation = shuffled, permutation
        for extra in extra_sources:
            if len(extra) != len(dataset):
                raise ValueError(
                    f"--extra-source-langs: an extra source has {len(extra)} sentences, the primary pair {len(dataset)}"
                )
        self.extra_sources = extra_sources
        self.pad, self.eos, self.left_pad = pad, eos, left_pad
        self._source_sizes = None

    def __getitem__(self, index):
        item = self.dataset[index]
        item["extra_sources"] = [extra[index] for extra in self.extra_sources]
        if self.shuffled == 0:
            item["source"] = self.dataset[self.permutation[index]]["source"]
        elif self.shuffled is not None:
            item["extra_sources"][self.shuffled - 1] = self.extra_sources[self.shuffled - 1][self.permutation[index]]
        return item

    def collater(self, samples, **kwargs):
        batch = self.dataset.collater(samples, **kwargs)
        if not batch:
            return batch
        by_id = {s["id"]: s for s in samples}
        ordered = [by_id[int(i)] for i in batch["id"]]  # the primary collater sorts by length
        extras = [
            data_utils.collate_tokens([s["extra_sources"][k] for s in ordered], self.pad, self.eos,
                                      left_pad=self.left_pad)
            for k in range(len(self.extra_sources))
        ]
        width = max(e.size(1) for e in extras)
        padded = [e.new_full((e.size(0), width), self.pad) for e in extras]
        for target, extra in zip(padded, extras):
            if self.left_pad:
                target[:, width - extra.size(1):] = extra
            else:
                target[:, : extra.size(1)] = extra
        batch["net_input"][keys.EXTRA_SRC_TOKENS] = torch.stack(padded, dim=1)  # B x (n-1) x J
        return batch

    # fairseq's BaseWrapperDataset hands batching and filtering to the primary pair, which knows
    # only its own source: these use the longest source of each example, so that --max-tokens
    # and --max-source-positions hold for every source a batch carries.
    @property
    def source_sizes(self) -> np.ndarray:
        """The length of the longest source of each example (as shuffled, when one is)."""
        if self._source_sizes is None:
            sizes = [np.asarray(self.dataset.src_sizes)] + [np.asarray(extra.sizes) for extra in self.extra_sources]
            if self.shuffled is not None:
                sizes[self.shuffled] = sizes[self.shuffled][self.permutation]
            self._source_sizes = np.maximum.reduce(sizes)
        return self._source_sizes

    def num_tokens(self, index):
        tgt = self.dataset.tgt_sizes[index] if self.dataset.tgt_sizes is not None else 0
        return max(int(self.source_sizes[index]), int(tgt))

    def num_tokens_vec(self, indices):
        sizes = self.source_sizes[indices]
        if self.dataset.tgt_sizes is not None:
            sizes = np.maximum(sizes, self.dataset.tgt_sizes[indices])
        return sizes

    def size(self, index):
        return int(self.source_sizes[index]), self.dataset.size(index)[1]

    def batch_by_size(self, indices, max_tokens=None, max_sentences=None, required_batch_size_multiple=1):
        return FairseqDataset.batch_by_size(self, indices, max_tokens, max_sentences, required_batch_size_multiple)

    def filter_indices_by_size(self, indices, max_sizes):
        return data_utils.filter_paired_dataset_indices_by_size(self.source_sizes, self.dataset.tgt_sizes, indices,
                                                                max_sizes)

    @property
    def supports_prefetch(self):
        return False


@register_task("multi_source_translation", dataclass=MultiSourceTranslationConfig)
class MultiSourceTranslationTask(TranslationTask):
    """Translation from several parallel sources (``-s`` and ``--extra-source-langs``)."""

    def __init__(self, cfg: MultiSourceTranslationConfig, src_dict, tgt_dict):
        super().__init__(cfg, src_dict, tgt_dict)
        self.extra_source_langs = [lang for lang in cfg.extra_source_langs.split(",") if lang.strip()]

    @classmethod
    def setup_task(cls, cfg: MultiSourceTranslationConfig, **kwargs):
        extra = [lang for lang in cfg.extra_source_langs.split(",") if lang.strip()]
        if not extra:
            raise ValueError("--extra-source-langs: give at least one extra source language (e.g. fr)")
        task = super().setup_task(cfg, **kwargs)
        path = cfg.data.split(os.pathsep)[0]
        for lang in extra:
            dict_path = os.path.join(path, f"dict.{lang}.txt")
            if not os.path.exists(dict_path):
                raise FileNotFoundError(f"--extra-source-langs {lang}: no {dict_path}")
            if cls.load_dictionary(dict_path).symbols != task.src_dict.symbols:
                raise ValueError(f"--extra-source-langs {lang}: dict.{lang}.txt differs from dict.{cfg.source_lang}.txt; "
                                 "all sources must share one joined dictionary")
        return task

    @property
    def num_source_sentences(self) -> int:
        return 1 + len(self.extra_source_langs)

    def load_dataset(self, split, epoch=1, combine=False, **kwargs):
        super().load_dataset(split, epoch=epoch, combine=combine, **kwargs)
        data_path = self.cfg.data.split(os.pathsep)[0]
        extras = []
        for lang in self.extra_source_langs:
            prefix = os.path.join(data_path, f"{split}.{lang}-{self.cfg.target_lang}.{lang}")
            dataset = data_utils.load_indexed_dataset(prefix, self.src_dict, self.cfg.dataset_impl)
            if dataset is None:
                raise FileNotFoundError(f"--extra-source-langs {lang}: no binarized data {prefix}.bin")
            extras.append(dataset)
        shuffled, permutation = None, None
        if self.cfg.shuffle_source:
            langs = [self.cfg.source_lang] + self.extra_source_langs
            if self.cfg.shuffle_source not in langs:
                raise ValueError(f"--shuffle-source {self.cfg.shuffle_source}: not one of the sources ({', '.join(langs)})")
            shuffled = langs.index(self.cfg.shuffle_source)
            permutation = derangement(len(self.datasets[split]), self.cfg.shuffle_seed)
            logger.info(f"{split}: --shuffle-source {self.cfg.shuffle_source}: every {self.cfg.shuffle_source} sentence "
                        f"replaced by another one of the split (seed {self.cfg.shuffle_seed})")
        self.datasets[split] = MultiSourceLanguagePairDataset(
            self.datasets[split], extras, self.src_dict.pad(), self.src_dict.eos(), self.cfg.left_pad_source,
            shuffled=shuffled, permutation=permutation,
        )
        logger.info(f"{split}: {len(self.datasets[split])} examples with extra sources {self.extra_source_langs}")
