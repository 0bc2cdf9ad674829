"""What every analysis command is built on: its parser and ``main``, the batches of a split it reads, and its tables
(written as Markdown, CSV and JSON, with the command that made them, and read back)."""
import argparse
import csv
import json
import os
import shlex
import sys
from typing import Callable, Dict, Iterator, List, Optional

import torch
from fairseq import utils

from fairseq_ext.analysis.figures import FigureContext
from fairseq_ext.common.command_line import setup_cli


def doc_parser(doc: str) -> argparse.ArgumentParser:
    """A parser with the docstring's first paragraph as description, the rest as epilog, as written."""
    return argparse.ArgumentParser(description=doc.split("\n\n")[0], epilog=doc.split("\n\n", 1)[1],
                                   formatter_class=argparse.RawDescriptionHelpFormatter)


def common_arguments(parser, several: bool = True, overrides: Optional[Dict[str, dict]] = None, checkpoint_group=None):
    """--checkpoint (one, or ``several``), --names, --data, --split, --out and --cpu; ``overrides``:
    option -> add_argument settings of this command; ``checkpoint_group``: where --checkpoint goes."""
    settings = {
        "--checkpoint": dict(nargs="+" if several else None, required=True,
                             help="model checkpoint(s)" if several else "model checkpoint"),
        "--names": dict(nargs="+", help="a name per checkpoint (default: the checkpoint's directory)"),
        "--data": dict(required=True, help="binarized data directory (a fairseq-ext prepare output, or any "
                                           "fairseq-preprocess output)"),
        "--split": dict(default="test"), "--out": dict(required=True, help="output directory (tables, JSON, CSV, PNG)"),
        "--cpu": dict(action="store_true", help="run on the CPU even when a GPU is there")}
    for option, kwargs in settings.items():
        where = checkpoint_group if option == "--checkpoint" and checkpoint_group is not None else parser
        where.add_argument(option, **{**kwargs, **(overrides or {}).get(option, {})})
    return parser


def parser(doc: str, several: bool = True, max_sentences: bool = False,
           overrides: Optional[Dict[str, dict]] = None) -> argparse.ArgumentParser:
    """:func:`doc_parser` with :func:`common_arguments` and, with ``max_sentences``, --max-sentences."""
    ap = common_arguments(doc_parser(doc), several, overrides)
    if max_sentences:
        ap.add_argument("--max-sentences", type=int, metavar="N",
                        help="analyse only the sentences of --split with ids below N (the N lowest ids)")
    return ap


def evaluation_arguments(parser, significance: bool = True, marks: str = "thesis") -> None:
    """--generate-args, --flavour, with ``significance`` --samples and --marks, --src and --tgt."""
    parser.add_argument("--generate-args", default="", help="fairseq-generate flags, e.g. '--beam 4 --lenpen 0.6'")
    parser.add_argument("--flavour", help="BLEU flavour (default: the one fairseq-ext evaluate reports for the data)")
    if significance:
        parser.add_argument("--samples", type=int, default=1000, help="paired bootstrap samples")
        parser.add_argument("--marks", default=marks, help="significance marks: thesis, mma or wt")
    parser.add_argument("--src", help="source language (default: DATA/prep.env, the checkpoint, the data's file names)")
    parser.add_argument("--tgt", help="target language (default: as --src)")


def main(build_parser: Callable[[], argparse.ArgumentParser], execute: Callable) -> Callable:
    """``main(argv=None)``: ``execute(args, FigureContext.of(args))``'s status, 0 for None."""
    def run(argv=None) -> int:
        setup_cli()
        args = build_parser().parse_args(argv)
        return execute(args, FigureContext.of(args)) or 0

    return run


def batches(task, split: str, max_tokens: int = 4000, max_sentences: Optional[int] = None,
            device: Optional[torch.device] = None, epoch: Optional[int] = None, seed: int = 1) -> Iterator[dict]:
    """fairseq's batches of ``split`` in order (shuffled for ``epoch`` and ``seed`` when given), only
    the sentences with ids below ``max_sentences``, on ``device``."""
    itr = task.get_batch_iterator(dataset=task.dataset(split), max_tokens=max_tokens, ignore_invalid_inputs=False,
                                  required_batch_size_multiple=1, seed=seed, epoch=epoch or 1)
    for sample in itr.next_epoch_itr(shuffle=epoch is not None):
        keep = sample["id"] < max_sentences if sample and max_sentences is not None else None
        if keep is not None and not keep.all():
            if not keep.any():
                continue
            sample = {"id": sample["id"][keep], "nsentences": int(keep.sum()),
                      "net_input": {k: (v[keep] if torch.is_tensor(v) and v.size(0) == keep.size(0) else v)
                                    for k, v in sample["net_input"].items()},
                      "target": None if sample.get("target") is None else sample["target"][keep]}
            sample["ntokens"] = 0 if sample["target"] is None else int(sample["target"].ne(1).sum())
        if sample:
            yield sample if device is None else to_device(sample, device)


def to_device(sample: dict, device: torch.device) -> dict:
    return utils.move_to_cuda(sample) if device.type == "cuda" else sample


def write_table(rows: List[dict], out_dir: str, name: str, title: str = "", floatfmt: str = ".2f") -> str:
    """Print ``rows`` as a Markdown table and write OUT/NAME.md, .csv and .json (and, run as
    ``python -m fairseq_ext.analysis.NAME``, the command line to OUT/command.txt); returns the Markdown."""
    os.makedirs(out_dir, exist_ok=True)
    columns = list(rows[0]) if rows else []

    def cell(v):
        return format(v, floatfmt) if isinstance(v, float) else "–" if v is None else str(v)

    lines = ([f"### {title}", ""] if title else []) + ["| " + " | ".join(columns) + " |",
                                                     "|" + "|".join("---" for _ in columns) + "|"]
    text = "\n".join(lines + ["| " + " | ".join(cell(r[c]) for c in columns) + " |" for r in rows]) + "\n"
    with open(os.path.join(out_dir, f"{name}.md"), "w", encoding="utf-8") as f:
        f.write(text)
    with open(os.path.join(out_dir, f"{name}.csv"), "w", encoding="utf-8", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    with open(os.path.join(out_dir, f"{name}.json"), "w", encoding="utf-8") as f:
        json.dump(rows, f, indent=1, ensure_ascii=False)
    module = getattr(getattr(sys.modules.get("__main__"), "__spec__", None), "name", "") or ""
    if module.startswith("fairseq_ext.analysis."):
        with open(os.path.join(out_dir, "command.txt"), "w", encoding="utf-8") as f:
            f.write(" ".join(shlex.quote(a) for a in ["python", "-m", module, *sys.argv[1:]]) + "\n")
    print(text)
    return text


def read_table(out_dir: str, name: str) -> List[dict]:
    """The rows :func:`write_table` wrote: NAME.json, else NAME.md (numbers as printed, "–" None)."""
    path = os.path.join(out_dir, f"{name}.json")
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    with open(os.path.join(out_dir, f"{name}.md"), encoding="utf-8") as f:
        lines = [l.strip() for l in f if l.strip().startswith("|")]
    if len(lines) < 2:
        raise ValueError(f"{out_dir}/{name}.md holds no table")

    def value(text):
        for kind in (int, float):
            try:
                return kind(text)
            except ValueError:
                pass
        return None if text == "–" else text

    def cells(line):  # cells are separated by " | " (a header such as "|Y|" holds bars of its own)
        return [c.strip() for c in line[1:-1].strip().split(" | ")] if line != "|" else []

    return [dict(zip(cells(lines[0]), map(value, cells(line)))) for line in lines[2:]]
