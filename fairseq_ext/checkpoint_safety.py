"""Let stock fairseq load its checkpoints under torch's ``weights_only=True`` default.

torch >= 2.6 unpickles checkpoints with ``weights_only=True``, which refuses every global
that is not allowlisted; fairseq 0.12 checkpoints hold a few such globals, so stock
``fairseq-generate`` fails on them. Importing ``fairseq_ext`` allowlists exactly those
types (never the blanket ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD``): a checkpoint whose pickle
would call anything else (``os.system``, ...) is still refused by torch.

What fairseq 0.12 checkpoints hold beyond tensors and builtin containers:
- ``argparse.Namespace``: the legacy ``args`` and ``cfg.model`` of models configured
  through ``add_args`` (all ``--arch`` presets, ours included);
- numpy arrays and scalars: metric state such as ``--eval-bleu``'s n-gram counts and
  ``best``/``val_loss`` values computed with numpy.
"""
import argparse

import numpy as np
import torch


def _numpy_globals():
    try:  # numpy >= 2
        from numpy._core.multiarray import _reconstruct, scalar
    except ImportError:  # numpy 1.x
        from numpy.core.multiarray import _reconstruct, scalar
    dtype_classes = {
        type(np.dtype(t))
        for t in (np.float16, np.float32, np.float64, np.int32, np.int64, np.bool_, np.uint8, np.int8, np.int16)
    }
    return [_reconstruct, scalar, np.ndarray, np.dtype, *sorted(dtype_classes, key=lambda c: c.__name__)]


CHECKPOINT_SAFE_GLOBALS = [argparse.Namespace, *_numpy_globals()]


def install() -> None:
    """Allowlist the fairseq checkpoint types for ``torch.load(weights_only=True)``."""
    if hasattr(torch.serialization, "add_safe_globals"):  # torch >= 2.4
        torch.serialization.add_safe_globals(CHECKPOINT_SAFE_GLOBALS)


install()
