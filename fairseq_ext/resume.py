"""Resuming training: any world size, after a crash, and never silently from scratch.

Three narrow patches of fairseq 0.12, installed on import (``--user-dir fairseq_ext``), so
``scripts/train.sh`` and plain ``fairseq-train`` both get them:

1. **Multi-process resume** (``distributed.utils._broadcast_object_slow``). On resume,
   rank 0 loads the checkpoint and ``Trainer.load_checkpoint`` broadcasts it to the other
   ranks: fairseq ``torch.save``s the non-tensor part into a buffer and the other ranks
   ``torch.load`` it. Under torch's ``weights_only=True`` default that fails on rank 1
   (``Unsupported global: omegaconf.dictconfig.DictConfig``, and fairseq's own
   ``_TensorPlaceholder``). Allowlisting those would let checkpoints carry OmegaConf's
   object graph; instead the sender encodes them as plain data (a ``DictConfig`` as its
   container, exactly as checkpoints store ``cfg``; a tensor placeholder as its index) and
   the receivers, still loading with ``weights_only=True``, rebuild them as
   ``load_checkpoint_to_cpu`` builds a checkpoint's ``cfg``.
2. **Crash-safe saves** (``checkpoint_utils.PathManager.copy``). fairseq writes the first
   checkpoint of a save atomically but *copies* it to ``checkpoint_last.pt`` (and
   ``checkpoint_best.pt``, ...) in place, so a kill during the copy leaves a truncated
   file. Copies to local paths now go to a temporary file in the same directory and are
   renamed into place.
3. **Resume from what is there** (``checkpoint_utils.load_checkpoint``):
   - an explicit ``--restore-file`` that does not exist is refused (fairseq 0.12 logs
     "No existing checkpoint found" and trains from scratch);
   - an unreadable ``checkpoint_last.pt`` (empty or truncated) is skipped with a warning
     naming it, and training resumes from the newest intact checkpoint of ``--save-dir``
     (``checkpoint_E_U.pt`` / ``checkpointE.pt``, by epoch and update); with none intact
     it is refused, naming the broken file.
"""
import logging
import os
import re
import shutil
import tempfile
import zipfile
from typing import Any, List, Optional, Tuple

from fairseq import checkpoint_utils
from fairseq.distributed import utils as distributed_utils
from fairseq.file_io import PathManager

from fairseq_ext.errors import FairseqExtError

logger = logging.getLogger(__name__)


class ResumeError(FairseqExtError):
    """A checkpoint to resume from is missing or unreadable."""


# ----------------------------------------------------------------------------------------
# 1. broadcasting a loaded checkpoint to the other ranks
# ----------------------------------------------------------------------------------------
_BROADCAST_KEY = "__fairseq_ext_broadcast__"
_DICTCONFIG_KEY = "__fairseq_ext_dictconfig__"
_PLACEHOLDER_KEY = "__fairseq_ext_tensor_placeholder__"


def encode_for_broadcast(obj: Any) -> Any:
    """Replace DictConfigs and fairseq's tensor placeholders by plain data."""
    from omegaconf import DictConfig, OmegaConf

    if isinstance(obj, DictConfig):
        return {_DICTCONFIG_KEY: encode_for_broadcast(OmegaConf.to_container(obj, resolve=False))}
    if isinstance(obj, distributed_utils._TensorPlaceholder):
        return {_PLACEHOLDER_KEY: obj.index}
    if isinstance(obj, dict):
        return {k: encode_for_broadcast(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(encode_for_broadcast(v) for v in obj)
    return obj


def decode_broadcast(obj: Any) -> Any:
    from omegaconf import OmegaConf

    if isinstance(obj, dict):
        if set(obj) == {_DICTCONFIG_KEY}:
            return OmegaConf.create(decode_broadcast(obj[_DICTCONFIG_KEY]), flags={"allow_objects": True})
        if set(obj) == {_PLACEHOLDER_KEY}:
            return distributed_utils._TensorPlaceholder(index=obj[_PLACEHOLDER_KEY])
        return {k: decode_broadcast(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(decode_broadcast(v) for v in obj)
    return obj


def _wrap_broadcast_object_slow() -> None:
    original = distributed_utils._broadcast_object_slow
    if getattr(original, "_fairseq_ext", False):
        return

    def _broadcast_object_slow(obj, src_rank, group, dist_device):
        if distributed_utils.get_rank(group) == src_rank:
            original({_BROADCAST_KEY: encode_for_broadcast(obj)}, src_rank, group, dist_device)
            return obj
        received = original(None, src_rank, group, dist_device)
        if isinstance(received, dict) and _BROADCAST_KEY in received:
            return decode_broadcast(received[_BROADCAST_KEY])
        return received

    _broadcast_object_slow._fairseq_ext = True
    _broadcast_object_slow.__wrapped__ = original
    distributed_utils._broadcast_object_slow = _broadcast_object_slow


# ----------------------------------------------------------------------------------------
# 2. atomic copies of checkpoint files
# ----------------------------------------------------------------------------------------
class _AtomicCopyPathManager:
    """fairseq's PathManager for checkpoint_utils, with atomic copies to local files."""

    def __getattr__(self, name):
        return getattr(PathManager, name)

    @staticmethod
    def copy(src_path: str, dst_path: str, overwrite: bool = False) -> bool:
        if "://" in str(dst_path) or "://" in str(src_path):
            return PathManager.copy(src_path, dst_path, overwrite)
        if os.path.exists(dst_path) and not overwrite:
            return False
        directory = os.path.dirname(os.path.abspath(dst_path))
        fd, tmp = tempfile.mkstemp(prefix=".copy-", suffix=".pt", dir=directory)
        os.close(fd)
        try:
            shutil.copyfile(src_path, tmp)
            os.replace(tmp, dst_path)
        except BaseException:
            if os.path.exists(tmp):
                os.remove(tmp)
            raise
        return True


# ----------------------------------------------------------------------------------------
# 3. choosing the checkpoint to resume from
# ----------------------------------------------------------------------------------------
def is_intact(path: str) -> bool:
    """A checkpoint file that torch.save finished: torch's zip format ends with the zip
    central directory, which a truncated file lacks."""
    try:
        if os.path.getsize(path) == 0:
            return False
        with zipfile.ZipFile(path) as archive:  # reads the central directory only
            return len(archive.namelist()) > 0
    except (OSError, zipfile.BadZipFile):
        return False


_NAME = re.compile(r"checkpoint(?:(\d+)|_(\d+)_(\d+))(.*)\.pt")


def newest_intact_checkpoint(save_dir: str, suffix: str = "") -> Optional[str]:
    """The newest ``checkpoint_E_U{suffix}.pt`` / ``checkpointE{suffix}.pt`` that is intact,
    ordered by (epoch, updates); an end-of-epoch checkpoint is newer than the mid-epoch
    ones of the same epoch."""
    candidates: List[Tuple[Tuple[int, float], str]] = []
    for name in os.listdir(save_dir):
        match = _NAME.fullmatch(name)
        if match is None or match.group(4) != suffix:
            continue
        if match.group(1) is not None:
            key = (int(match.group(1)), float("inf"))
        else:
            key = (int(match.group(2)), float(match.group(3)))
        candidates.append((key, os.path.join(save_dir, name)))
    for _, path in sorted(candidates, reverse=True):
        if is_intact(path):
            return path
    return None


def _wrap_load_checkpoint() -> None:
    original = checkpoint_utils.load_checkpoint
    if getattr(original, "_fairseq_ext", False):
        return

    def load_checkpoint(cfg, trainer, **passthrough_args):
        suffix = trainer.checkpoint_suffix or ""
        if cfg.restore_file != "checkpoint_last.pt":
            path = cfg.restore_file.replace(".pt", suffix + ".pt") if suffix else cfg.restore_file
            if not PathManager.exists(path):
                raise ResumeError(f"--restore-file {path} does not exist (fairseq would train from scratch); "
                                  f"give an existing checkpoint, or leave --restore-file out to resume from "
                                  f"{os.path.join(cfg.save_dir, 'checkpoint_last.pt')}")
            return original(cfg, trainer, **passthrough_args)
        last = os.path.join(cfg.save_dir, f"checkpoint_last{suffix}.pt")
        if not os.path.exists(last) or is_intact(last):
            return original(cfg, trainer, **passthrough_args)
        fallback = newest_intact_checkpoint(cfg.save_dir, suffix)
        if fallback is None:
            raise ResumeError(f"{last} is unreadable (empty or truncated, e.g. by a crash during a save) and "
                              f"{cfg.save_dir} has no intact checkpoint to resume from; move it away to start "
                              f"from scratch")
        logger.warning(f"{last} is unreadable (empty or truncated, e.g. by a crash during a save): resuming from "
                       f"{fallback}, the newest intact checkpoint in {cfg.save_dir}")
        restore_file = cfg.restore_file
        cfg.restore_file = fallback[: -len(suffix + ".pt")] + ".pt" if suffix else fallback
        try:
            return original(cfg, trainer, **passthrough_args)
        finally:
            cfg.restore_file = restore_file

    load_checkpoint._fairseq_ext = True
    load_checkpoint.__wrapped__ = original
    checkpoint_utils.load_checkpoint = load_checkpoint


def install() -> None:
    _wrap_broadcast_object_slow()
    if not isinstance(checkpoint_utils.PathManager, _AtomicCopyPathManager):
        checkpoint_utils.PathManager = _AtomicCopyPathManager()
    _wrap_load_checkpoint()


install()
