"""The probing classifier (SentEval's MLP on a frozen representation): trained with RMSprop,
L2 on its hidden layer, early-stopped on the validation accuracy; its accuracy on a task."""
import collections
from typing import Dict, Optional, Tuple

import torch
import torch.nn as nn

from fairseq_ext.analysis.probing_tasks import PARTITIONS, Split

class MLPProbe(nn.Module):
    """SentEval's MLP: Linear(C, hidden), dropout, sigmoid, Linear(hidden, labels);
    ``hidden`` 0 is logistic regression."""

    def __init__(self, dim: int, num_labels: int, hidden: int = 200, dropout: float = 0.0):
        super().__init__()
        if hidden > 0:
            self.hidden = nn.Linear(dim, hidden)
            self.net = nn.Sequential(self.hidden, nn.Dropout(dropout), nn.Sigmoid(), nn.Linear(hidden, num_labels))
        else:
            self.hidden = None
            self.net = nn.Linear(dim, num_labels)

    def forward(self, x):
        return self.net(x)


@torch.no_grad()
def accuracy(probe: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int = 4096) -> float:
    probe.eval()
    if len(y) == 0:
        return float("nan")
    correct = sum(int((probe(x[i:i + batch_size]).argmax(-1) == y[i:i + batch_size]).sum())
                  for i in range(0, len(y), batch_size))
    return correct / len(y)


def train_probe(x_tr, y_tr, x_va, y_va, num_labels: int, hidden: int = 200, dropout: float = 0.0,
                l2: float = 1e-4, lr: float = 1e-3, batch_size: int = 512, max_epochs: int = 100,
                patience: Optional[int] = None, seed: int = 1) -> Tuple[MLPProbe, dict]:
    """RMSprop on cross-entropy, L2 ``l2`` on the hidden layer's weights, ``max_epochs``
    epochs; the parameters of the epoch with the best validation accuracy are kept (early
    stopping), and with ``patience`` training stops after that many epochs without a better
    one."""
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    probe = MLPProbe(x_tr.size(1), num_labels, hidden, dropout)
    first = probe.hidden if probe.hidden is not None else probe.net
    rest = [p for n, p in probe.named_parameters() if not any(p is q for q in first.parameters())]
    groups = [{"params": [first.weight], "weight_decay": l2}, {"params": [first.bias] + rest, "weight_decay": 0.0}]
    optimizer = torch.optim.RMSprop(groups, lr=lr)
    best, best_state, best_epoch, epoch = -1.0, None, 0, 0
    for epoch in range(1, max_epochs + 1):
        probe.train()
        perm = torch.randperm(len(y_tr), generator=gen)
        for i in range(0, len(perm), batch_size):
            idx = perm[i:i + batch_size]
            loss = nn.functional.cross_entropy(probe(x_tr[idx]), y_tr[idx])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        acc = accuracy(probe, x_va, y_va)
        if acc > best:
            best, best_epoch = acc, epoch
            best_state = {k: v.clone() for k, v in probe.state_dict().items()}
        elif patience and epoch - best_epoch >= patience:
            break
    probe.load_state_dict(best_state)
    return probe, {"valid": best, "epochs": epoch, "best_epoch": best_epoch}


def probe_task(features: Dict[str, torch.Tensor], data: Split, report: str = "te", **train_args) -> dict:
    """Train on tr (labels indexed in sorted order; a label absent from tr counts as an
    error), early-stop on va, accuracy on ``report``."""
    labels = sorted({label for label, _ in data["tr"]})
    index = {label: i for i, label in enumerate(labels)}
    y = {p: torch.tensor([index.get(label, -1) for label, _ in data[p]], dtype=torch.long) for p in PARTITIONS}
    probe, info = train_probe(features["tr"], y["tr"], features["va"], y["va"], len(labels), **train_args)
    majority = collections.Counter(label for label, _ in data["tr"]).most_common(1)[0][0]
    n = len(data[report])
    return {"accuracy": accuracy(probe, features[report], y[report]), "valid": info["valid"],
            "epochs": info["epochs"], "labels": len(labels),
            "majority": sum(label == majority for label, _ in data[report]) / n if n else float("nan")}
