"""Training the word-translation probes on the frozen model (Adam, the best validation
parameters of each probe kept), their accuracy on a split, the options that say how, and the
trained projections saved and loaded (``projections.pt``)."""
import os
import sys
import time
from typing import Dict, Optional, Sequence

import torch
import torch.nn as nn

from fairseq_ext.analysis import AnalysisError
from fairseq_ext.analysis.batches import batches, to_device, training_batches
from fairseq_ext.analysis.translation_probes import build_probes, frozen_features, probe_logits
from fairseq_ext.common import checkpoints
from fairseq_ext.guards.checkpoint_safety import load_checkpoint_state, save_atomically


@torch.no_grad()
def evaluate_probes(model, task, split: str, probes: nn.ModuleDict, max_tokens: int = 4000,
                    max_sentences: Optional[int] = None) -> Dict[str, dict]:
    """name -> {"correct", "total", "accuracy"} over ``split``; ``model``: the model's own
    teacher-forced argmax accuracy."""
    dev = next(model.parameters()).device
    pad = task.target_dictionary.pad()
    counts = {name: [0, 0] for name in [*probes, "model"]}
    probes.eval()
    for sample in batches(task, split, max_tokens, max_sentences):
        sample = to_device(sample, dev)
        feats = frozen_features(model, sample, list(probes))
        target = sample["target"]
        mask = target.ne(pad)
        for name in counts:
            logits = model.decoder.output_layer(feats["model"]) if name == "model" else \
                probe_logits(model, probes[name], name, feats)
            counts[name][0] += int((logits.argmax(-1).eq(target) & mask).sum())
            counts[name][1] += int(mask.sum())
    return {name: {"correct": c, "total": n, "accuracy": c / n if n else float("nan")}
            for name, (c, n) in counts.items()}


def train_probes(model, task, probes: nn.ModuleDict, train_split: str, valid_split: str, lr: float = 1e-3,
                 max_epoch: int = 3, max_update: Optional[int] = None, validate_interval: int = 1000,
                 max_tokens: int = 4000, max_train_sentences: Optional[int] = None,
                 max_valid_sentences: Optional[int] = None, seed: int = 1, log=sys.stderr) -> Dict[str, float]:
    """Adam on the cross-entropy of each probe (projections and w only; the model is
    frozen); every probe keeps its parameters of its best validation accuracy. Returns
    name -> best validation accuracy."""
    for p in model.parameters():
        p.requires_grad_(False)
    torch.manual_seed(seed)
    dev = next(model.parameters()).device
    pad = task.target_dictionary.pad()
    optimizer = torch.optim.Adam(probes.parameters(), lr=lr)
    best = {name: -1.0 for name in probes}
    best_state = {name: {k: v.clone() for k, v in probes[name].state_dict().items()} for name in probes}

    def validate(tag):
        scores = evaluate_probes(model, task, valid_split, probes, max_tokens, max_valid_sentences)
        for name in probes:
            if scores[name]["accuracy"] > best[name]:
                best[name] = scores[name]["accuracy"]
                best_state[name] = {k: v.clone() for k, v in probes[name].state_dict().items()}
        summary = " ".join(f"{n}={100 * scores[n]['accuracy']:.1f}" for n in probes)
        print(f"[word_translation] {tag}: valid accuracy {summary}", file=log)

    updates, start = 0, time.time()
    validate("before training")
    for epoch in range(1, max_epoch + 1):
        for sample in training_batches(task, train_split, max_tokens, epoch, seed, max_train_sentences):
            probes.train()
            sample = to_device(sample, dev)
            feats = frozen_features(model, sample, list(probes))
            target = sample["target"]
            ntokens = int(target.ne(pad).sum())
            optimizer.zero_grad()
            for name, probe in probes.items():
                logits = probe_logits(model, probe, name, feats)
                loss = nn.functional.cross_entropy(logits.float().reshape(-1, logits.size(-1)), target.reshape(-1),
                                                   ignore_index=pad, reduction="sum") / max(ntokens, 1)
                loss.backward()
            optimizer.step()
            updates += 1
            if validate_interval and updates % validate_interval == 0:
                validate(f"epoch {epoch}, update {updates} ({time.time() - start:.0f}s)")
            if max_update and updates >= max_update:
                break
        if not (validate_interval and updates % validate_interval == 0):
            validate(f"end of epoch {epoch}, update {updates} ({time.time() - start:.0f}s)")
        if max_update and updates >= max_update:
            break
    for name in probes:
        probes[name].load_state_dict(best_state[name])
    return best


def add_training_arguments(ap):
    """How the projections are trained (word_translation, and translate_from_layer when it
    trains them itself)."""
    g = ap.add_argument_group("training the projections")
    g.add_argument("--train-split", default="train")
    g.add_argument("--valid-split", default="valid")
    g.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate")
    g.add_argument("--max-epoch", type=int, default=3)
    g.add_argument("--max-update", type=int, help="stop after N updates")
    g.add_argument("--validate-interval", type=int, default=1000, help="validate every N updates (and every epoch)")
    g.add_argument("--max-tokens", type=int, default=4000)
    g.add_argument("--max-train-sentences", type=int, help="train on the sentences with ids below N")
    g.add_argument("--max-valid-sentences", type=int, help="validate on the sentences with ids below N")
    g.add_argument("--seed", type=int, default=1)
    return ap


def load_for_training(args):
    """(model, task) of --checkpoint with the training, validation and reported splits loaded."""
    model, task = checkpoints.load_model(args.checkpoint, args.data, cpu=args.cpu)
    for split in {args.train_split, args.valid_split, args.split}:
        task.load_dataset(split)
    return model, task


def train_from_args(model, task, names, args) -> nn.ModuleDict:
    """The probes ``names``, trained as the options of :func:`add_training_arguments` say."""
    probes = build_probes(model, names)
    train_probes(model, task, probes, args.train_split, args.valid_split, lr=args.lr, max_epoch=args.max_epoch,
                 max_update=args.max_update, validate_interval=args.validate_interval, max_tokens=args.max_tokens,
                 max_train_sentences=args.max_train_sentences, max_valid_sentences=args.max_valid_sentences,
                 seed=args.seed)
    return probes


def save_projections(probes: nn.ModuleDict, path: str, checkpoint: str) -> None:
    save_atomically({"checkpoint": os.path.abspath(checkpoint),
                     "probes": {name: {k: v.cpu() for k, v in p.state_dict().items()} for name, p in probes.items()}},
                    path)


def load_projections(model, path: str, names: Sequence[str]) -> nn.ModuleDict:
    if not os.path.exists(path):
        raise AnalysisError(f"--projections {path}: no such file")
    state = load_checkpoint_state(path)
    missing = [n for n in names if n not in state.get("probes", {})]
    if missing:
        raise AnalysisError(f"--projections {path}: no trained projection for {', '.join(missing)}")
    probes = build_probes(model, names)
    for name in names:
        try:
            probes[name].load_state_dict(state["probes"][name])
        except RuntimeError as e:
            raise AnalysisError(f"--projections {path}: {name} does not fit this model "
                                f"({str(e).splitlines()[-1].strip()})") from None
    return probes


