"""The sentences an analysis reads: fairseq's batches of a binarized split, every sentence once
(the plugin keeps every one), optionally only those with the lowest ids, and moved to the
model's device."""
from typing import Iterator, Optional

import torch
from fairseq import utils


def batches(task, split: str, max_tokens: int = 4000, max_sentences: Optional[int] = None) -> Iterator[dict]:
    """fairseq's batches of ``split``, without shuffling; ``max_sentences`` keeps the
    sentences with the lowest ids."""
    itr = task.get_batch_iterator(dataset=task.dataset(split), max_tokens=max_tokens, ignore_invalid_inputs=False,
                                  required_batch_size_multiple=1).next_epoch_itr(shuffle=False)
    yield from _below(itr, max_sentences)


def training_batches(task, split: str, max_tokens: int, epoch: int, seed: int,
                     max_sentences: Optional[int] = None) -> Iterator[dict]:
    """Shuffled batches of ``split`` (fairseq's order for ``epoch``), only the sentences with
    ids below ``max_sentences`` when given."""
    itr = task.get_batch_iterator(dataset=task.dataset(split), max_tokens=max_tokens, ignore_invalid_inputs=False,
                                  required_batch_size_multiple=1, seed=seed, epoch=epoch).next_epoch_itr(shuffle=True)
    yield from _below(itr, max_sentences)


def _below(itr, max_sentences: Optional[int]) -> Iterator[dict]:
    for sample in itr:
        if not sample:
            continue
        if max_sentences is not None:
            keep = sample["id"] < max_sentences
            if not keep.any():
                continue
            if not keep.all():
                sample = select(sample, keep)
        yield sample


def select(sample: dict, keep: torch.Tensor) -> dict:
    """The sentences of ``sample`` where ``keep`` (B) is true, as a batch of its own."""
    out = {"id": sample["id"][keep], "nsentences": int(keep.sum())}
    out["net_input"] = {k: (v[keep] if torch.is_tensor(v) and v.size(0) == keep.size(0) else v)
                        for k, v in sample["net_input"].items()}
    if sample.get("target") is not None:
        out["target"] = sample["target"][keep]
    out["ntokens"] = int(out["target"].ne(1).sum()) if "target" in out else 0
    return out


def to_device(sample: dict, device: torch.device) -> dict:
    return utils.move_to_cuda(sample) if device.type == "cuda" else sample
