"""Resuming training: any world size, after a crash, and never silently from scratch.

Three narrow patches of fairseq 0.12, installed by :func:`install` when the plugin is imported
(``--user-dir fairseq_ext``), so ``fairseq_ext/recipes/train.sh`` and plain ``fairseq-train``
both get them. Errors the user can fix are
:class:`ResumeError` (a :class:`~fairseq_ext.errors.FairseqExtError`: one line, no traceback).

1. **Multi-process resume** (``fairseq.distributed.utils._broadcast_object_slow``).
   *What fairseq does:* on resume only data-parallel rank 0 reads the checkpoint
   (``Trainer.load_checkpoint``) and sends it to the other ranks with
   ``distributed_utils.broadcast_object``, which splits out the tensors (replacing each by
   a ``_TensorPlaceholder``) and passes the rest to ``_broadcast_object_slow``: rank 0
   ``torch.save``s it into a buffer, the other ranks ``torch.load`` it.
   *Why it fails:* torch >= 2.6 loads with ``weights_only=True``, and the state holds the
   ``omegaconf.DictConfig`` that ``load_checkpoint_to_cpu`` made of the checkpoint's ``cfg``
   (and fairseq's ``_TensorPlaceholder`` dataclass), so rank 1 dies with
   ``Unsupported global: omegaconf.dictconfig.DictConfig``. Allowlisting them would let any
   pickle carry OmegaConf's object graph.
   *What we change:* ``broadcast_object`` looks ``_broadcast_object_slow`` up as a module
   attribute at call time; our wrapper encodes, on the sending rank only, each
   ``DictConfig`` as its plain container (``OmegaConf.to_container(resolve=False)``, as
   checkpoints store ``cfg``) and each placeholder as its index; the receiving ranks load
   with ``weights_only=True`` as before and rebuild them exactly as
   ``load_checkpoint_to_cpu`` builds a checkpoint's ``cfg``
   (``OmegaConf.create(..., flags={"allow_objects": True})``). Everything else travels
   unchanged. Every rank imports the plugin, so both ends are always patched.
2. **Crash-safe saves** (``PathManager.copy`` as seen by ``fairseq.checkpoint_utils``).
   ``save_checkpoint`` writes the first file of a save atomically (``.tmp`` + rename) but
   *copies* it to the others (``checkpoint_last.pt``, ``checkpoint_best.pt``, ...) in place,
   so a kill during the copy leaves a truncated or empty file. Copies to local paths now go
   to a temporary file in the destination's directory (``.checkpoint_last.pt.XXXX.tmp``,
   same permissions as the source) and are renamed into place with ``os.replace``.
3. **Resume from what is there** (``fairseq.checkpoint_utils.load_checkpoint``, which
   ``fairseq_cli/train.py`` calls on every rank):
   - an explicit ``--restore-file`` that does not exist keeps fairseq's meaning under plain
     ``fairseq-train`` (training starts from scratch; fairseq's own tests name a missing file
     on purpose), said in one WARNING line naming the file; ``fairseq-ext train`` (which sets
     :data:`STRICT_ENV`) refuses it, naming the path, as it refuses a ``--continue-once`` that
     is not a file or a ``--restore-file`` that is a directory. One that is unreadable is refused too (naming the newest intact checkpoint of
     ``--save-dir``), rather than replaced: the user chose that file. A fresh ``--save-dir``
     without ``checkpoint_last.pt`` still starts from scratch;
   - an unreadable ``checkpoint_last.pt`` (empty, truncated, zero-filled) is skipped with a
     WARNING naming it and the replacement: the intact checkpoint of ``--save-dir`` with the
     most updates recorded in it (``checkpoint_E_U.pt``, ``checkpointE.pt``,
     ``checkpoint_best.pt``, ``checkpoint.best_*.pt``; each verified by loading it with
     ``weights_only=True``, memory-mapped so that no tensor data is read). fairseq's own logic
     (``--reset-*``, ``--finetune-from-model``, ...) then runs as if that file were
     ``checkpoint_last.pt``. With none intact the run is refused, naming the broken file.

   - first of all, the run takes the save dir's lock (:mod:`fairseq_ext.guards.save_dir_lock`):
     a second run writing the same ``--save-dir`` is refused, naming the first.

   These checks are :func:`check_restore`; ``fairseq_ext/recipes/train.sh`` runs them once
   through :func:`preflight` before it starts several processes, so that the error is one
   line rather than one per rank followed by torchrun's traceback.

Not covered: remote storage paths (``s3://``, ...: fairseq's behaviour is kept), a
checkpoint in torch's legacy (pre-1.6) format that is truncated (fairseq 0.12 never writes
one), and a kill during fairseq's own ``--write-checkpoints-asynchronously`` writes.
"""
import logging
import os
import re
import shutil
import tempfile
import zipfile
from typing import Any, List, Optional, Tuple

import torch
from fairseq import checkpoint_utils
from fairseq.distributed import utils as distributed_utils
from fairseq.file_io import PathManager

from fairseq_ext.errors import ResumeError
from fairseq_ext.guards.patching import replace
from fairseq_ext.guards.save_dir_lock import hold_save_dir

logger = logging.getLogger(__name__)
# set by fairseq-ext train (fairseq_ext/recipes/train.sh): a --restore-file that does not exist
# is refused there, where nobody names a missing file on purpose
STRICT_ENV = "FAIRSEQ_EXT_STRICT_RESTORE"


# ----------------------------------------------------------------------------------------
# 1. broadcasting a loaded checkpoint to the other ranks
# ----------------------------------------------------------------------------------------
_BROADCAST_KEY = "__fairseq_ext_broadcast__"
_DICTCONFIG_KEY = "__fairseq_ext_dictconfig__"
_PLACEHOLDER_KEY = "__fairseq_ext_tensor_placeholder__"


def encode_for_broadcast(obj: Any) -> Any:
    """Replace DictConfigs and fairseq's tensor placeholders by plain data (recursively
    through dicts, lists and tuples); everything else is returned as it is."""
    from omegaconf import DictConfig, OmegaConf

    if isinstance(obj, DictConfig):
        return {_DICTCONFIG_KEY: encode_for_broadcast(OmegaConf.to_container(obj, resolve=False))}
    if isinstance(obj, distributed_utils._TensorPlaceholder):
        return {_PLACEHOLDER_KEY: obj.index}
    if isinstance(obj, dict):
        return {k: encode_for_broadcast(v) for k, v in obj.items()}
    if type(obj) in (list, tuple):  # not namedtuples: left as they are
        return type(obj)(encode_for_broadcast(v) for v in obj)
    return obj


def decode_broadcast(obj: Any) -> Any:
    """Inverse of :func:`encode_for_broadcast`, on data loaded with ``weights_only=True``."""
    from omegaconf import OmegaConf

    if isinstance(obj, dict):
        if set(obj) == {_DICTCONFIG_KEY}:
            # as checkpoint_utils.load_checkpoint_to_cpu builds a checkpoint's cfg
            return OmegaConf.create(decode_broadcast(obj[_DICTCONFIG_KEY]), flags={"allow_objects": True})
        if set(obj) == {_PLACEHOLDER_KEY}:
            return distributed_utils._TensorPlaceholder(index=obj[_PLACEHOLDER_KEY])
        return {k: decode_broadcast(v) for k, v in obj.items()}
    if type(obj) in (list, tuple):
        return type(obj)(decode_broadcast(v) for v in obj)
    return obj


def _broadcasting_plain_data(original):
    def _broadcast_object_slow(obj, src_rank, group, dist_device):
        if distributed_utils.get_rank(group) == src_rank:
            original({_BROADCAST_KEY: encode_for_broadcast(obj)}, src_rank, group, dist_device)
            return obj  # as fairseq: the sender keeps its own object
        received = original(None, src_rank, group, dist_device)  # torch.load, weights_only=True
        if isinstance(received, dict) and set(received) == {_BROADCAST_KEY}:
            return decode_broadcast(received[_BROADCAST_KEY])
        return received

    return _broadcast_object_slow


# ----------------------------------------------------------------------------------------
# 2. atomic copies of checkpoint files
# ----------------------------------------------------------------------------------------
def atomic_copy(src_path: str, dst_path: str) -> None:
    """Copy to a temporary file beside ``dst_path`` and rename it into place: a kill at any
    moment leaves either the old ``dst_path`` or the complete copy, never a partial one."""
    directory = os.path.dirname(os.path.abspath(dst_path))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(dst_path)}.", suffix=".tmp", dir=directory)
    os.close(fd)
    try:
        shutil.copyfile(src_path, tmp)
        shutil.copymode(src_path, tmp)  # mkstemp makes it 0600; keep the checkpoint's mode
        os.replace(tmp, dst_path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


class _AtomicCopyPathManager:
    """fairseq's PathManager as ``checkpoint_utils`` sees it: every attribute is fairseq's,
    except that ``copy`` between local paths is atomic."""

    def __init__(self, path_manager):
        self._path_manager = path_manager

    def __getattr__(self, name):
        return getattr(self.__dict__.get("_path_manager", PathManager), name)

    def copy(self, src_path: str, dst_path: str, overwrite: bool = False) -> bool:
        if "://" in str(dst_path) or "://" in str(src_path):  # remote storage: fairseq's copy
            return self._path_manager.copy(src_path, dst_path, overwrite)
        if os.path.exists(dst_path) and not overwrite:
            return False
        atomic_copy(src_path, dst_path)
        return True


# ----------------------------------------------------------------------------------------
# 3. choosing the checkpoint to resume from
# ----------------------------------------------------------------------------------------
def is_intact(path: str) -> bool:
    """Whether ``path`` looks like a checkpoint that ``torch.save`` finished writing. torch's
    format is a zip archive whose central directory is written last, so an empty,
    truncated or zero-filled file fails; only the directory is read. A file in torch's
    legacy (pre-1.6, plain pickle) format is not checked further."""
    try:
        with open(path, "rb") as f:
            head = f.read(4)
        if head.startswith(b"PK"):
            with zipfile.ZipFile(path) as archive:
                return any(name.endswith("data.pkl") for name in archive.namelist())
        return head[:1] == b"\x80"  # a pickle: torch's legacy format
    except (OSError, zipfile.BadZipFile):
        return False


def recorded_updates(path: str) -> Optional[int]:
    """The number of updates recorded in a checkpoint, loading it with ``weights_only=True``
    (memory-mapped: tensor data is not read); None if it does not load."""
    if not is_intact(path):
        return None
    try:
        try:
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as err:
            if "mmap" not in str(err):
                raise
            state = torch.load(path, map_location="cpu", weights_only=True)  # legacy format
        history = state.get("optimizer_history") or [{}]
        return int(history[-1].get("num_updates", 0))
    except Exception as err:  # noqa: BLE001  (any failure to load means: not a candidate)
        logger.debug(f"{path} does not load: {err}")
        return None


def _name_pattern(suffix: str) -> "re.Pattern":
    # fairseq's names: checkpointE, checkpoint_E_U, checkpoint_best, checkpoint.best_METRIC_VALUE
    return re.compile(r"checkpoint(?:(\d+)|_(\d+)_(\d+)|_best|\.best_\w+_-?[\d.]+?)" + re.escape(suffix) + r"\.pt")


def newest_intact_checkpoint(save_dir: str, suffix: str = "") -> Optional[str]:
    """The checkpoint of ``save_dir`` (other than ``checkpoint_last{suffix}.pt``) that loads
    and records the most updates; ties go to the newest by name (epoch, then update)."""
    pattern = _name_pattern(suffix)
    candidates: List[Tuple[int, Tuple[int, float], str]] = []
    for name in sorted(os.listdir(save_dir)):
        match = pattern.fullmatch(name)
        if match is None:
            continue
        path = os.path.join(save_dir, name)
        updates = recorded_updates(path)
        if updates is None:
            logger.debug(f"not resuming from {path}: it does not load")
            continue
        if match.group(1) is not None:
            by_name = (int(match.group(1)), float("inf"))
        elif match.group(2) is not None:
            by_name = (int(match.group(2)), float(match.group(3)))
        else:  # best checkpoints: copies of one of the others
            by_name = (-1, -1.0)
        candidates.append((updates, by_name, path))
    return max(candidates)[2] if candidates else None


def _is_data_parallel_master(trainer) -> bool:
    try:
        return trainer.data_parallel_rank == 0
    except Exception:  # noqa: BLE001  (a trainer-like object without a process group)
        return True


def _check_explicit(option: str, path: str, save_dir: str, suffix: str = "", strict: bool = True) -> None:
    """Refuse a checkpoint the user named (``--restore-file``, ``--continue-once``) that is
    not a file, or that is unreadable (fairseq would fail with a bare ``EOFError`` /
    ``RuntimeError`` from torch)."""
    if PathManager.isfile(path):
        if is_intact(path):
            return
        newest = newest_intact_checkpoint(save_dir, suffix) if os.path.isdir(save_dir) else None
        instead = f"; the intact checkpoint of {save_dir} with the most updates is {newest}" if newest else ""
        raise ResumeError(f"{option} {path} is unreadable (empty or truncated, e.g. by a crash during a save)"
                          f"{instead}")
    what = "is a directory, not a checkpoint file" if os.path.isdir(path) else "does not exist"
    hint = ""
    beside = os.path.join(save_dir, path)
    if not os.path.isabs(path) and PathManager.isfile(beside):
        hint = f" (did you mean {beside}? the path is relative to the working directory, not --save-dir)"
    if not strict and option == "--restore-file" and what == "does not exist":
        logger.warning(f"--restore-file {path} does not exist: training starts from scratch, as fairseq does{hint} "
                       f"(fairseq-ext train refuses a missing --restore-file)")
        return
    raise ResumeError(f"{option} {path} {what}; fairseq would train from scratch{hint}. Give an existing "
                      f"checkpoint, or leave {option} out to resume from "
                      f"{os.path.join(save_dir, 'checkpoint_last.pt')} (or start from scratch if there is none)")


def check_restore(cfg, suffix: str = "", strict: Optional[bool] = None) -> Optional[str]:
    """What :func:`load_checkpoint` checks before fairseq's own code runs, for a
    ``CheckpointConfig`` ``cfg``: raises :class:`ResumeError` for a missing or unreadable
    explicit ``--restore-file`` / ``--continue-once`` and for an unreadable
    ``checkpoint_last.pt`` with no intact checkpoint beside it; returns the checkpoint to
    load in place of an unreadable ``checkpoint_last{suffix}.pt``, else None (fairseq's
    choice stands). ``strict`` (default: :data:`STRICT_ENV` is ``1``) refuses a missing
    ``--restore-file`` instead of training from scratch with a warning."""
    if strict is None:
        strict = os.environ.get(STRICT_ENV) == "1"
    if cfg.save_dir is None:  # no save dir (the mocked configs of fairseq's own tests): nothing to check
        return None
    if "://" in str(cfg.save_dir) or "://" in str(cfg.restore_file):  # remote storage: unchanged
        return None
    if cfg.restore_file != "checkpoint_last.pt":  # given explicitly (fairseq's own test)
        if not cfg.finetune_from_model:  # fairseq refuses that combination itself
            restore_file = cfg.restore_file.replace(".pt", suffix + ".pt")
            _check_explicit("--restore-file", restore_file, cfg.save_dir, suffix, strict)
        return None
    last = os.path.join(cfg.save_dir, f"checkpoint_last{suffix}.pt")
    if not PathManager.exists(last):  # a fresh save dir (or --finetune-from-model / --continue-once)
        continue_once = getattr(cfg, "continue_once", None)
        if continue_once is not None:
            _check_explicit("--continue-once", continue_once, cfg.save_dir, suffix)
        return None
    if is_intact(last):
        return None
    fallback = newest_intact_checkpoint(cfg.save_dir, suffix)
    if fallback is None:
        raise ResumeError(f"{last} is unreadable (empty or truncated, e.g. by a crash during a save) and "
                          f"{cfg.save_dir} has no intact checkpoint to resume from; give one with "
                          f"--restore-file, or move {last} away to start from scratch")
    return fallback


def _resuming_from_what_is_there(original):
    def load_checkpoint(cfg, trainer, **passthrough_args):
        hold_save_dir(cfg)  # one run per save dir, before anything is read from it
        suffix = trainer.checkpoint_suffix or ""
        fallback = check_restore(cfg, suffix)
        if fallback is None:
            return original(cfg, trainer, **passthrough_args)
        last = os.path.join(cfg.save_dir, f"checkpoint_last{suffix}.pt")
        if _is_data_parallel_master(trainer):
            logger.warning(f"{last} is unreadable (empty or truncated, e.g. by a crash during a save): resuming "
                           f"from {fallback}, the intact checkpoint of {cfg.save_dir} with the most updates")
        # fairseq's own logic (--reset-*, --finetune-from-model, ...), with the fallback file
        # in place of checkpoint_last.pt
        shadowed = trainer.__dict__.get("load_checkpoint")
        load_method = trainer.load_checkpoint

        def load_fallback(filename, *args, **kwargs):
            return load_method(fallback if filename == last else filename, *args, **kwargs)

        trainer.load_checkpoint = load_fallback
        try:
            return original(cfg, trainer, **passthrough_args)
        finally:
            if shadowed is None:
                del trainer.load_checkpoint
            else:
                trainer.load_checkpoint = shadowed

    return load_checkpoint


def preflight(argv: List[str]) -> None:
    """``fairseq_ext/recipes/train.sh``'s check before it starts several processes with
    torchrun, where every rank would print the error and torchrun a traceback after it: parse ``argv``
    (fairseq-train's arguments) with fairseq-train's own parser and run
    :func:`check_restore` once. Sharded (FSDP) checkpoints are per rank: left to the ranks."""
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    args = options.parse_args_and_arch(options.get_training_parser(), input_args=argv)
    cfg = convert_namespace_to_omegaconf(args)
    if cfg.distributed_training.ddp_backend == "fully_sharded" and cfg.distributed_training.use_sharded_state:
        return
    check_restore(cfg.checkpoint, cfg.checkpoint.checkpoint_suffix or "", strict=True)


def install() -> None:
    replace(distributed_utils, "_broadcast_object_slow", _broadcasting_plain_data)
    replace(checkpoint_utils, "PathManager", _AtomicCopyPathManager)
    replace(checkpoint_utils, "load_checkpoint", _resuming_from_what_is_there)
