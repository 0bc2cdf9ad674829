"""Build a model as ``fairseq-train`` would, from an ``--arch`` and command-line flags, without data: the one
implementation used by the tests, ``scripts/param_table.py`` and ``scripts/benchmark.py``."""
import contextlib
import os
from argparse import Namespace
from types import SimpleNamespace
from typing import Optional, Tuple

import torch
from fairseq import options
from fairseq.data import Dictionary
from fairseq.models import ARCH_MODEL_REGISTRY

from fairseq_ext.errors import OptionError

USER_DIR = os.path.dirname(os.path.abspath(__file__))


def make_dictionary(num_symbols: int = 40) -> Dictionary:
    """A dictionary of fairseq's 4 special symbols and ``num_symbols`` words w0, w1, ..."""
    dictionary = Dictionary()
    for i in range(num_symbols):
        dictionary.add_symbol(f"w{i}")
    dictionary.finalize(padding_factor=1)
    return dictionary


class FlagError(OptionError):
    """A flag fairseq-train's parser refuses (unknown, or a value it does not take)."""


def parse_model_args(arch: str, *flags: str) -> Namespace:
    """fairseq-train's parser on ``--arch ARCH FLAGS`` (the preset already applied); a flag it
    refuses is a :class:`FlagError` of one line (not argparse's usage of every fairseq flag)."""
    parser = options.get_training_parser()

    def refuse(message):
        raise FlagError(message)

    parser.error = refuse
    return options.parse_args_and_arch(
        parser, ["/nonexistent", "--task", "translation", "--user-dir", USER_DIR, "--arch", arch, *flags]
    )


def build_model(arch: str, *flags: str, dictionary: Optional[Dictionary] = None, seed: Optional[int] = 0,
                model_cls=None, device: Optional[str] = None) -> Tuple[torch.nn.Module, Namespace]:
    """(model in eval mode, args) for a translation task whose source and target share
    ``dictionary``. ``model_cls`` defaults to the class ``--arch`` is registered to;
    ``device="meta"`` builds without allocating the parameters (for counting them)."""
    dictionary = dictionary if dictionary is not None else make_dictionary()
    task = SimpleNamespace(source_dictionary=dictionary, target_dictionary=dictionary)
    args = parse_model_args(arch, *flags)
    model_cls = model_cls or ARCH_MODEL_REGISTRY[args.arch]
    if seed is not None:
        torch.manual_seed(seed)
    with contextlib.nullcontext() if device is None else torch.device(device):
        model = model_cls.build_model(args, task)
    return model.eval(), args
