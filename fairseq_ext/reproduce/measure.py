"""What a finished run measured, read from what it left: the checkpoint's parameter count and
model size, the training log's speed and updates, fairseq-generate's decoding speed, the
evaluation's BLEU and its text files."""
import glob
import json
import os
import re
from typing import Dict, Optional

from fairseq_ext.common import checkpoints
from fairseq_ext.errors import CheckpointError

def model_summary(checkpoint: str) -> dict:
    """{"params": trainable parameters (:func:`fairseq_ext.common.checkpoints.count_parameters`),
    "model": its size (layers, widths, heads; {} when the checkpoint records no configuration)}."""
    state = checkpoints.load_state(checkpoint)
    try:
        size = checkpoints.shape(checkpoints.saved_config(state, checkpoint))
    except CheckpointError:
        size = {}
    return {"params": checkpoints.count_parameters(state), "model": size}


_TRAIN_RE = re.compile(r"\|\s*train\s*\|.*")
_NUM = r"([0-9.]+)"


def training_speed(log_path: str) -> Dict[str, float]:
    """Updates per second and words per second of the last epoch summaries fairseq printed
    (``| train | ... | wps W | ups U |``), as the mean over epochs."""
    ups, wps = [], []
    if not os.path.exists(log_path):
        return {}
    with open(log_path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if not _TRAIN_RE.search(line):
                continue
            m_u = re.search(r"\bups " + _NUM, line)
            m_w = re.search(r"\bwps " + _NUM, line)
            if m_u:
                ups.append(float(m_u.group(1)))
            if m_w:
                wps.append(float(m_w.group(1)))
    out = {}
    if ups:
        out["train_ups"] = sum(ups) / len(ups)
    if wps:
        out["train_wps"] = sum(wps) / len(wps)
    return out


def training_progress(log_path: str) -> Dict[str, int]:
    """Updates done and planned, from fairseq-train's closing line (``training ended: U of P
    updates``, fairseq_ext.guards.training_summary), else the last ``num_updates`` it logged."""
    if not os.path.exists(log_path):
        return {}
    out = {}
    with open(log_path, encoding="utf-8", errors="replace") as f:
        for line in f:
            m = re.search(r"training ended: (\d+) of (\d+|\?) updates", line)
            if m:
                out = {"updates": int(m.group(1))}
                if m.group(2) != "?":
                    out["planned_updates"] = int(m.group(2))
            elif not out or "planned_updates" not in out:
                m = re.search(r"\bnum_updates (\d+)", line)
                if m:
                    out["updates"] = int(m.group(1))
    return out


def decoding_speed(eval_dir: str) -> Dict[str, float]:
    """fairseq-generate's "Translated N sentences (T tokens) in Xs (S sentences/s, K tokens/s)"."""
    for path in sorted(glob.glob(os.path.join(eval_dir, "generate-*.txt")) + glob.glob(os.path.join(eval_dir, "generate-*.log"))):
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                m = re.search(r"Translated ([\d,]+) sentences \(([\d,]+) tokens\) in ([0-9.]+)s \(([0-9.]+) sentences/s, ([0-9.]+) tokens/s\)", line)
                if m:
                    return {"decode_sentences": int(m.group(1).replace(",", "")),
                            "decode_seconds": float(m.group(3)),
                            "decode_sents_per_s": float(m.group(4)), "decode_tokens_per_s": float(m.group(5))}
    return {}


def read_bleu(eval_dir: str, flavour: str) -> Optional[float]:
    path = os.path.join(eval_dir, "bleu.json")
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        scores = json.load(f)
    return scores.get(flavour, {}).get("score")
