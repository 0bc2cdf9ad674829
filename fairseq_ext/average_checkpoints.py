"""Average the parameters of several checkpoints (Vaswani et al. 2017), in place of fairseq's
``scripts/average_checkpoints.py`` (not installed with fairseq; under torch >= 2.6 it cannot read
fairseq checkpoints without disabling ``weights_only``), with its options. Every input is read
through the plugin's safe path, and the output written atomically (docs/trust.md).
"""
import argparse
import collections
import os
import re
import sys
from typing import Dict, List, Optional

import torch

from fairseq_ext.guards.checkpoint_safety import load_checkpoint_state, save_atomically
from fairseq_ext.errors import FairseqExtError


def last_n_checkpoints(directory: str, n: int, update_based: bool, upper_bound: Optional[int] = None) -> List[str]:
    """The n newest ``checkpointE.pt`` or ``checkpoint_E_U.pt`` (``update_based``) in ``directory``,
    newest first, ignoring those past ``upper_bound``."""
    pattern = re.compile(r"checkpoint_\d+_(\d+)\.pt" if update_based else r"checkpoint(\d+)\.pt")
    found = []
    for name in os.listdir(directory):
        match = pattern.fullmatch(name)
        if match is not None:
            number = int(match.group(1))
            if upper_bound is None or number <= upper_bound:
                found.append((number, name))
    if len(found) < n:
        kind = "update (checkpoint_E_U.pt)" if update_based else "epoch (checkpointE.pt)"
        raise FairseqExtError(f"--inputs {directory}: found {len(found)} {kind} checkpoints, need {n}")
    return [os.path.join(directory, name) for _, name in sorted(found, reverse=True)[:n]]


def average_checkpoints(paths: List[str]) -> Dict:
    """The first checkpoint with its ``model`` replaced by the mean over ``paths`` and its
    optimizer state dropped (it describes none of the averaged parameters)."""
    if not paths:
        raise FairseqExtError("no checkpoints to average")
    new_state = None
    sums: "collections.OrderedDict[str, torch.Tensor]" = collections.OrderedDict()
    for path in paths:
        state = load_checkpoint_state(path)
        if new_state is None:
            new_state = state
        params = state["model"]
        if list(params) != list(sums) and sums:
            raise FairseqExtError(f"{path}: its parameters differ from those of {paths[0]}; "
                                  f"only checkpoints of one model can be averaged")
        for key, value in params.items():
            value = value.double() if value.is_floating_point() else value.clone()
            sums[key] = value if key not in sums else sums[key] + value
    averaged = collections.OrderedDict()
    for key, total in sums.items():
        reference = new_state["model"][key]
        if reference.is_floating_point():
            averaged[key] = (total / len(paths)).to(reference.dtype)
        else:
            averaged[key] = torch.div(total, len(paths), rounding_mode="floor")
    new_state["model"] = averaged
    new_state["last_optimizer_state"] = None
    return new_state


def cli_main(argv=None):
    parser = argparse.ArgumentParser(
        prog="fairseq-ext average-checkpoints",
        description="Average the parameters of fairseq checkpoints, loading them safely.",
    )
    parser.add_argument("--inputs", required=True, nargs="+",
                        help="checkpoint files, or one directory with --num-epoch/update-checkpoints")
    parser.add_argument("--output", required=True, help="the averaged checkpoint (written atomically)")
    count = parser.add_mutually_exclusive_group()
    count.add_argument("--num-epoch-checkpoints", type=int, help="average the last N checkpointE.pt")
    count.add_argument("--num-update-checkpoints", type=int, help="average the last N checkpoint_E_U.pt")
    parser.add_argument("--checkpoint-upper-bound", type=int, help="ignore checkpoints past this epoch / update number")
    args = parser.parse_args(argv)

    n = args.num_epoch_checkpoints or args.num_update_checkpoints
    if n is not None:  # an error of ours is one line (guards/one_line_errors.py)
        if len(args.inputs) != 1 or not os.path.isdir(args.inputs[0]):
            parser.error("--num-epoch-checkpoints/--num-update-checkpoints need --inputs to be one directory")
        if n < 1:
            parser.error("--num-epoch-checkpoints/--num-update-checkpoints must be at least 1")
        paths = last_n_checkpoints(args.inputs[0], n, args.num_update_checkpoints is not None,
                                   args.checkpoint_upper_bound)
    else:
        paths = args.inputs
        for path in paths:
            if not os.path.isfile(path):
                parser.error(f"--inputs: {path} is not a checkpoint file (a directory needs "
                             f"--num-epoch-checkpoints or --num-update-checkpoints)")
    if os.path.exists(args.output) and any(os.path.exists(p) and os.path.samefile(p, args.output) for p in paths):
        parser.error(f"--output {args.output} is one of the inputs; choose another file")
    print(f"averaging {len(paths)} checkpoints: {', '.join(paths)}", file=sys.stderr)
    save_atomically(average_checkpoints(paths), args.output)
    print(f"wrote {args.output}", file=sys.stderr)


if __name__ == "__main__":
    cli_main()
