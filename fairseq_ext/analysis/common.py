"""What every analysis command shares: loading checkpoints through the plugin's safe loader,
iterating a binarized split, capturing attention weights from the model's own forward,
decoding through the package's evaluation tool (``fairseq_ext.tools.evaluate``: BLEU is
the BLEU ``fairseq-ext evaluate`` reports), and writing tables (printed, CSV, JSON) and figures (PNG). Any fairseq data
directory works: a recipe's output (``prep.env`` and ``text/`` beside the binarized files) or
plain ``fairseq-preprocess`` output (the languages then come from the checkpoint or the file
names, see :func:`languages`).

Command-line convention of every analysis (``python -m fairseq_ext.analysis.NAME``)::

    --checkpoint CKPT [CKPT ...]  --names NAME [NAME ...]  --data DATA_BIN  --split test
    --out DIR  [--cpu]  [--max-sentences N]

API:

- :func:`load_model` -> (model in eval mode, task); the data directory and overrides as in
  fairseq-generate.
- :func:`batches` -> fairseq's batches of a split, every sentence once (in id order groups).
- :func:`capture_self_attention` -> context manager recording every encoder layer's
  self-attention weights per head (and both FI units of Dual Contextual layers).
- :func:`languages` -> (source, target) language of a checkpoint on a data directory.
- :func:`evaluate` -> runs ``fairseq-ext evaluate``'s tool (model overrides allowed) and
  returns its directory and BLEU scores.
- :func:`write_table`, :func:`save_figure`.
- Figures sized for the HTML report (:data:`FIGURE_WIDTH`), with :func:`add_title`,
  :func:`add_caption` (what the figure shows, the data (:func:`data_description`), the
  reading) and :func:`file_stem` (a display name in a file name).
"""
import argparse
import contextlib
import csv
import functools
import json
import logging
import os
import re
import shlex
import sys
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import torch

from fairseq_ext.common import checkpoints, data_text
from fairseq_ext.errors import FairseqExtError

logger = logging.getLogger(__name__)


class AnalysisError(FairseqExtError):
    pass


def common_arguments(parser, several: bool = True):
    parser.add_argument("--checkpoint", nargs="+" if several else None, required=True,
                        help="model checkpoint(s)" if several else "model checkpoint")
    parser.add_argument("--names", nargs="+", help="a name per checkpoint (default: the checkpoint's directory)")
    parser.add_argument("--data", required=True,
                        help="binarized data directory (a prepare-*.sh output, or any fairseq-preprocess output)")
    parser.add_argument("--split", default="test")
    parser.add_argument("--out", required=True, help="output directory (tables, JSON, CSV, PNG)")
    parser.add_argument("--cpu", action="store_true", help="run on the CPU even when a GPU is there")
    return parser


def language_arguments(parser):
    """--src/--tgt of the analyses that decode through evaluate.sh: needed only when neither
    DATA/prep.env, the checkpoint nor the data's file names tell the languages."""
    parser.add_argument("--src", help="source language (default: DATA/prep.env, the checkpoint, the data's file names)")
    parser.add_argument("--tgt", help="target language (default: as --src)")
    return parser


class AnalysisParser(argparse.ArgumentParser):
    """An analysis command's parser: what it parses is also what its figures say they were
    made from (:func:`note_scale`), so that every figure names its models, data and decoding."""

    def parse_args(self, args=None, namespace=None):
        parsed = super().parse_args(args, namespace)
        note_scale(parsed)
        return parsed


def analysis_parser(doc: str, several: bool = True) -> argparse.ArgumentParser:
    """The parser of an analysis command: its module docstring's first paragraph as the
    description, the rest as the epilog, and the arguments every analysis shares."""
    parser = AnalysisParser(description=doc.split("\n\n")[0], epilog=doc.split("\n\n", 1)[1],
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    return common_arguments(parser, several)


# What this command's figures were made from: its checkpoints and their names, the data and
# split, the decoding flags and BLEU flavour (note_scale, from the parsed arguments);
# save_figure adds it to every figure's caption.
_SCALE: Dict[str, object] = {}


def note_scale(args, data_text: Optional[str] = None) -> None:
    """Note what the figures were made from; ``data_text`` says what was analysed where it
    is not the split of --data (probing: its tasks)."""
    _SCALE.clear()
    _SCALE.update({k: getattr(args, k, None) for k in ("checkpoint", "names", "data", "split", "generate_args",
                                                        "flavour", "max_sentences")})
    _SCALE["data_text"] = data_text


def scale_note() -> str:
    """The sentence save_figure adds to a figure: the models (name: size, updates), the data
    (directory, split, test set and its size from DATA/prep.env), the decoding and the BLEU
    flavour where the command has them; "" when no command's arguments were noted."""
    if not _SCALE.get("checkpoint"):
        return ""
    checkpoints = _SCALE["checkpoint"]
    checkpoints = [checkpoints] if isinstance(checkpoints, str) else list(checkpoints)
    names = _SCALE.get("names")
    names = names_for(checkpoints, [names] if isinstance(names, str) else names)
    models = []
    for checkpoint, name in zip(checkpoints, names):
        try:
            models.append(f"{name} ({checkpoints.summary(checkpoint)})")
        except Exception:  # noqa: BLE001 (a note on a figure never stops the analysis)
            models.append(name)
    parts = [("Model: " if len(models) == 1 else "Models: ") + "; ".join(models)]
    data = _SCALE.get("data")
    if _SCALE.get("data_text"):
        parts.append(f"data: {_SCALE['data_text']}")
    elif data:
        env = data_text.read_prep_env(str(data))
        where = data_description(str(data), _SCALE.get("split"))
        if env.get("test_set") and _SCALE.get("split") == "test":
            total = int(env["test_pairs"]) if env.get("test_pairs", "").isdigit() else None
            limit = _SCALE.get("max_sentences")
            if total and isinstance(limit, int) and 0 < limit < total:
                where += f" ({env['test_set']}, {limit:,} of its {total:,} sentences)"
            else:
                where += f" ({env['test_set']}" + (f", {total:,} sentences" if total else "") + ")"
        parts.append(f"data: {where}")
    if _SCALE.get("generate_args"):
        parts.append(f"decoding: {_SCALE['generate_args']}")
    if _SCALE.get("flavour"):
        parts.append(f"BLEU {_SCALE['flavour']}")
    return ". ".join(parts) + "."


def integer_ticks(axis) -> None:
    """Whole-number ticks on a matplotlib axis (layers, heads)."""
    from matplotlib.ticker import MaxNLocator

    axis.set_major_locator(MaxNLocator(integer=True))


def names_for(checkpoints: Sequence[str], names: Optional[Sequence[str]]) -> List[str]:
    if names:
        if len(names) != len(checkpoints):
            raise AnalysisError(f"--names: {len(names)} names for {len(checkpoints)} checkpoints")
        return list(names)
    out = [os.path.basename(os.path.dirname(os.path.abspath(c))) or os.path.basename(c) for c in checkpoints]
    return out if len(set(out)) == len(out) else [f"{n}-{i}" for i, n in enumerate(out, 1)]


def batches(task, split: str, max_tokens: int = 4000, max_sentences: Optional[int] = None) -> Iterator[dict]:
    """fairseq's batches of ``split`` (the plugin keeps every sentence), without shuffling;
    ``max_sentences`` keeps the sentences with the lowest ids."""
    dataset = task.dataset(split)
    itr = task.get_batch_iterator(dataset=dataset, max_tokens=max_tokens, ignore_invalid_inputs=False,
                                  required_batch_size_multiple=1).next_epoch_itr(shuffle=False)
    for sample in itr:
        if not sample:
            continue
        if max_sentences is not None:
            keep = sample["id"] < max_sentences
            if not keep.any():
                continue
            if not keep.all():
                sample = _select(sample, keep)
        yield sample


def _select(sample, keep):
    out = {"id": sample["id"][keep], "nsentences": int(keep.sum())}
    out["net_input"] = {k: (v[keep] if torch.is_tensor(v) and v.size(0) == keep.size(0) else v)
                        for k, v in sample["net_input"].items()}
    if sample.get("target") is not None:
        out["target"] = sample["target"][keep]
    out["ntokens"] = int(out["target"].ne(1).sum()) if "target" in out else 0
    return out


def to_device(sample, dev):
    from fairseq import utils

    return utils.move_to_cuda(sample) if dev.type == "cuda" else sample


@contextlib.contextmanager
def capture_self_attention(model):
    """Record, during the model's own forward, the self-attention weights of every encoder
    layer: ``records[l]`` (l = 0..L-1) gets one tensor per forward call, B x H x T x T
    (``"global"``), and for Dual Contextual layers also ``"local"`` (the local FI unit's
    weights over the local-context keys). Every self-attention of the plugin (fairseq's, MMA, DC) reports its weights through the
    attention modules' contract (``fairseq_ext.modules.attention_utils.record_attention_weights``)."""
    from fairseq_ext.modules.attention_utils import record_attention_weights

    encoders = getattr(model.encoder, "encoders", None) or [model.encoder]
    layers = encoders[0].layers
    records: Dict[int, Dict[str, List[torch.Tensor]]] = {i: {"global": [], "local": []} for i in range(len(layers))}
    index = {id(layer.self_attn): i for i, layer in enumerate(layers)}

    def on_report(module, report):
        record = records[index[id(module)]]
        record["global"].append(report["attention"].float().cpu())
        if report.get("local") is not None:
            record["local"].append(report["local"].float().cpu())

    with record_attention_weights([layer.self_attn for layer in layers], on_report):
        yield records


def evaluate(checkpoint: str, data: str, split: str, out: str, overrides: Optional[dict] = None,
             generate_args: Sequence[str] = (), cpu: bool = False, src: Optional[str] = None,
             tgt: Optional[str] = None) -> dict:
    """``fairseq-ext evaluate`` on ``checkpoint`` (:func:`fairseq_ext.tools.evaluate.evaluate`:
    decoding with the model's own forward and fairseq's SequenceGenerator, BPE removed and
    detokenized as everywhere else); returns {"dir": out, "bleu": {flavour: score},
    "headline": flavour}. The languages are :func:`languages`'; on data without prep.env also
    the subword kind (:func:`subword_kind`) is passed. Without DATA/text/ (the recipes'
    references) evaluation scores against fairseq's T- lines, and warns."""
    from fairseq_ext.tools.evaluate import EvaluationError
    from fairseq_ext.tools.evaluate import evaluate as run_evaluation

    src, tgt = checkpoints.languages(checkpoint, data, split, src, tgt)
    bpe = None if os.path.exists(os.path.join(data, "prep.env")) else checkpoints.subword_kind(data, tgt)
    try:
        result = run_evaluation(checkpoint, data, split=split, out=out, src=src, tgt=tgt, bpe=bpe,
                                generate_args=generate_args, model_overrides=overrides,
                                cpu=cpu or not torch.cuda.is_available())
    except EvaluationError as e:
        raise AnalysisError(f"evaluation failed for {checkpoint} {overrides or ''}: {e}") from None
    return {"dir": out, "bleu": result["bleu"], "headline": result["headline"]}


def write_table(rows: List[dict], out_dir: str, name: str, title: str = "", floatfmt: str = ".2f") -> str:
    """Print ``rows`` (dicts with the same keys) as a Markdown table and write
    ``OUT/NAME.md``, ``.csv`` and ``.json``; returns the Markdown."""
    os.makedirs(out_dir, exist_ok=True)
    columns = list(rows[0]) if rows else []

    def cell(v):
        if isinstance(v, float):
            return format(v, floatfmt)
        return "–" if v is None else str(v)

    lines = ([f"### {title}", ""] if title else []) + ["| " + " | ".join(columns) + " |",
                                                     "|" + "|".join("---" for _ in columns) + "|"]
    lines += ["| " + " | ".join(cell(r[c]) for c in columns) + " |" for r in rows]
    text = "\n".join(lines) + "\n"
    with open(os.path.join(out_dir, f"{name}.md"), "w", encoding="utf-8") as f:
        f.write(text)
    with open(os.path.join(out_dir, f"{name}.csv"), "w", encoding="utf-8", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    with open(os.path.join(out_dir, f"{name}.json"), "w", encoding="utf-8") as f:
        json.dump(rows, f, indent=1, ensure_ascii=False)
    record_command(out_dir)
    print(text)
    return text


def record_command(out_dir: str) -> Optional[str]:
    """Write ``OUT/command.txt``: the analysis command that is running (``python -m
    fairseq_ext.analysis.NAME ARGS``), for the HTML report and for whoever finds the
    directory later. Nothing when the analysis was called from Python rather than as a command."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    module = getattr(spec, "name", "") or ""
    if not module.startswith("fairseq_ext.analysis."):
        return None
    line = " ".join(shlex.quote(a) for a in ["python", "-m", module, *sys.argv[1:]])
    path = os.path.join(out_dir, "command.txt")
    with open(path, "w", encoding="utf-8") as f:
        f.write(line + "\n")
    return path


def save_figure(fig, path: str) -> str:
    """Write ``fig`` as PNG, its caption followed by the command's :func:`scale_note` (the
    models, data and decoding it was made from)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    try:
        note = scale_note()
    except Exception:  # noqa: BLE001 (a note on a figure never stops the analysis)
        note = ""
    if note:
        caption = next((t for t in fig.texts if t.get_gid() == "caption"), None)
        if caption is None:
            add_caption(fig, note)
        elif note not in caption.get_text().replace("\n", " "):
            text, width = caption.unwrapped
            caption.set_text(wrap_text(text + " " + note, width, caption.get_fontsize()))
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


# ---- figures a report or a paper can show --------------------------------------------------------

# The HTML report shows a figure at most about 1100 px wide (its page is 70em wide) and
# save_figure writes 120 dpi: a figure this many inches wide is shown 1:1, so a label of
# f points is 1.67 f pixels on screen (7 pt: 12 px).
FIGURE_WIDTH = 9.1
# the smallest label size a figure uses (10 px on screen at FIGURE_WIDTH)
MIN_FONT_SIZE = 6.0


def file_stem(name: str) -> str:
    """``name`` (a display name: "M-10", "base (ours)") as a piece of a file name."""
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._")
    return stem or "model"


def wrap_text(text: str, width_inches: float = FIGURE_WIDTH, fontsize: float = 8.0) -> str:
    """``text`` broken into lines that fit ``width_inches`` at ``fontsize`` points (each
    paragraph, separated by newlines, on its own)."""
    import textwrap

    # an average character of matplotlib's default font is about half the font size wide
    columns = max(20, int(width_inches * 72 / (0.52 * fontsize)))
    return "\n".join(textwrap.fill(p, columns, break_on_hyphens=False) if p else "" for p in text.split("\n"))


def add_caption(fig, text: str, fontsize: float = 8.0, width: Optional[float] = None) -> None:
    """A caption below the axes of ``fig``, wrapped to the figure's width (or ``width``
    inches): what the figure shows, on which data, and which reading of the numbers
    (save_figure keeps it in the PNG)."""
    caption = fig.text(0.0, 0.0, wrap_text(text, width or fig.get_figwidth(), fontsize), ha="left", va="top",
                       fontsize=fontsize, transform=fig.transFigure, gid="caption")
    caption.unwrapped = (text, width or fig.get_figwidth())  # what save_figure adds the scale note to


def add_title(fig, text: str, fontsize: float = 11.0) -> None:
    """The figure's title, above everything tight_layout arranges (so that it never covers
    the panels' own titles, however tall the figure); save_figure keeps it in the PNG."""
    # tight_layout arranges the axes within the figure and leaves its texts where they are;
    # save_figure's bbox_inches="tight" takes in what lies above the top
    fig.text(0.5, 1.0, text, ha="center", va="bottom", fontsize=fontsize, transform=fig.transFigure)


def data_description(data: Optional[str], split: Optional[str]) -> str:
    """How a figure names its data: the data directory's name and the split ("wmt14.en-de, test")."""
    name = os.path.basename(os.path.normpath(os.path.abspath(data))) if data else ""
    return ", ".join(p for p in (name, split) if p)
