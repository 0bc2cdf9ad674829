"""Resuming training: any world size, after a crash, never silently from scratch, one run per
save dir (docs/trust.md, "Resuming"). :func:`install`, run when the plugin is imported (so that
``fairseq-ext train`` and plain ``fairseq-train --user-dir`` both get it), patches fairseq 0.12:

1. ``distributed.utils._broadcast_object_slow``: on resume rank 0 sends the loaded checkpoint to
   the other ranks, which ``torch.load`` it with ``weights_only=True`` and fail on its
   ``omegaconf.DictConfig`` and fairseq's ``_TensorPlaceholder``. The sender encodes them as
   plain data (:func:`encode_for_broadcast`); the receivers, still loading with
   ``weights_only=True``, rebuild them as ``load_checkpoint_to_cpu`` builds a checkpoint's cfg.
2. ``torch_persistent_save`` and ``PathManager.copy`` as ``checkpoint_utils`` sees them: ``save_checkpoint`` writes its
   first file (``NAME.tmp`` left by a failed write) and copies it to ``checkpoint_last.pt``, ... in place; local files
   now go to a :func:`~fairseq_ext.guards.checkpoint_safety.staged_file` (a full disk said in one line, no retries).
3. ``checkpoint_utils.load_checkpoint`` (every rank): first the save dir's lock
   (:func:`hold_save_dir`), then :func:`check_restore`: an unreadable ``checkpoint_last.pt`` is
   replaced by the intact checkpoint with the most updates (a WARNING names both), or refused
   when there is none; an explicit ``--restore-file`` / ``--continue-once`` that is missing,
   a directory or unreadable is refused with :class:`ResumeError` (plain ``fairseq-train``
   keeps fairseq's meaning of a missing ``--restore-file``, with a warning).
   ``recipes/train.sh`` runs the lock and the check once before it starts several processes
   (:func:`preflight`), so that the error is one line rather than one per rank.

Remote storage paths (``s3://``, ...) keep fairseq's behaviour.
"""
import atexit
import logging
import os
import re
import shutil
import zipfile
from typing import Any, Dict, List, Optional, Tuple

import torch

from fairseq_ext.errors import ResumeError, SaveDirBusyError
from fairseq_ext.guards.checkpoint_safety import save_atomically, staged_file
from fairseq_ext.guards.patching import replace
from fairseq_ext.standalone.outputs import OutputBusyError, OutputLock

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
    from fairseq.distributed import utils as distributed_utils
    from omegaconf import DictConfig, OmegaConf

    def encode(obj: Any) -> Any:
        if isinstance(obj, DictConfig):
            return {_DICTCONFIG_KEY: encode(OmegaConf.to_container(obj, resolve=False))}
        if isinstance(obj, distributed_utils._TensorPlaceholder):
            return {_PLACEHOLDER_KEY: obj.index}
        if isinstance(obj, dict):
            return {k: encode(v) for k, v in obj.items()}
        if type(obj) in (list, tuple):  # not namedtuples: left as they are
            return type(obj)(encode(v) for v in obj)
        return obj

    return encode(obj)


def decode_broadcast(obj: Any) -> Any:
    """Inverse of :func:`encode_for_broadcast`, on data loaded with ``weights_only=True``."""
    from fairseq.distributed import utils as distributed_utils
    from omegaconf import OmegaConf

    def decode(obj: Any) -> Any:
        if isinstance(obj, dict):
            if set(obj) == {_DICTCONFIG_KEY}:
                # as checkpoint_utils.load_checkpoint_to_cpu builds a checkpoint's cfg
                return OmegaConf.create(decode(obj[_DICTCONFIG_KEY]), flags={"allow_objects": True})
            if set(obj) == {_PLACEHOLDER_KEY}:
                return distributed_utils._TensorPlaceholder(index=obj[_PLACEHOLDER_KEY])
            return {k: decode(v) for k, v in obj.items()}
        if type(obj) in (list, tuple):
            return type(obj)(decode(v) for v in obj)
        return obj

    return decode(obj)


def _broadcasting_plain_data(original):
    from fairseq.distributed import utils as distributed_utils

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
def _saving_atomically(original):
    def torch_persistent_save(obj, filename, async_write: bool = False):
        if async_write or "://" in str(filename):  # fairseq's own: --write-checkpoints-asynchronously, remote storage
            return original(obj, filename, async_write)
        save_atomically(obj, filename)

    return torch_persistent_save


class _AtomicCopyPathManager:
    """fairseq's PathManager as ``checkpoint_utils`` sees it: every attribute is fairseq's,
    except that ``copy`` between local paths is atomic."""

    def __init__(self, path_manager):
        self._path_manager = path_manager

    def __getattr__(self, name):
        from fairseq.file_io import PathManager

        return getattr(self.__dict__.get("_path_manager", PathManager), name)

    def copy(self, src_path: str, dst_path: str, overwrite: bool = False) -> bool:
        if "://" in str(dst_path) or "://" in str(src_path):  # remote storage: fairseq's copy
            return self._path_manager.copy(src_path, dst_path, overwrite)
        if os.path.exists(dst_path) and not overwrite:
            return False
        with staged_file(dst_path) as tmp:
            shutil.copyfile(src_path, tmp)
            shutil.copymode(src_path, tmp)  # not mkstemp's 0600
        return True


# ----------------------------------------------------------------------------------------
# 3. one run per save dir, and choosing the checkpoint to resume from
# ----------------------------------------------------------------------------------------
# the save dir locks this process holds (released at exit)
_HELD: Dict[str, OutputLock] = {}


def hold_save_dir(cfg) -> None:
    """On global rank 0, take the lock of ``cfg.save_dir`` (``PARENT/.NAME.lock``, the output lock
    of standalone/outputs.py) for the rest of the process; raise :class:`SaveDirBusyError`
    naming the holder when another run has it. Nothing is locked with ``--no-save``, for a
    remote save dir, or for a config without one (the mocks of fairseq's own tests)."""
    from fairseq.distributed import utils as distributed_utils

    save_dir = getattr(cfg, "save_dir", None)
    if save_dir is None or getattr(cfg, "no_save", False) or "://" in str(save_dir) \
            or distributed_utils.get_global_rank() != 0:
        return
    key = os.path.realpath(save_dir)
    if key in _HELD:
        return
    lock = OutputLock(save_dir, what="--save-dir")
    try:
        lock.acquire()
    except OutputBusyError as e:
        raise SaveDirBusyError(f"{e}; two training runs need two save dirs") from None
    _HELD[key] = lock
    atexit.register(lock.release)


def _leaving_no_empty_save_dir(original):
    """fairseq-train makes --save-dir and its missing parents before anything can refuse the run: those still empty
    at exit are removed (a warm start of another width leaves no folder)."""
    def verify_checkpoint_directory(save_dir):
        made, path = [], os.path.abspath(save_dir)
        while not os.path.exists(path):
            made, path = made + [path], os.path.dirname(path)
        original(save_dir)
        atexit.register(lambda: all(os.path.isdir(p) and not os.listdir(p) and not os.rmdir(p) for p in made))

    return verify_checkpoint_directory


def is_intact(path: str) -> bool:
    """Whether ``path`` looks like a checkpoint that ``torch.save`` finished writing. torch's format is a zip archive
    whose central directory is written last, so an empty, truncated or zero-filled file fails; only the directory is
    read. A file in torch's legacy (pre-1.6, plain pickle) format is not checked further."""
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
        epoch, update = match.group(1) or match.group(2), match.group(3)  # neither: a best checkpoint, a copy
        by_name = (-1, -1.0) if epoch is None else (int(epoch), float(update) if update else float("inf"))
        candidates.append((updates, by_name, path))
    return max(candidates)[2] if candidates else None


def _is_data_parallel_master(trainer) -> bool:
    try:
        return trainer.data_parallel_rank == 0
    except Exception:  # noqa: BLE001  (a trainer-like object without a process group)
        return True


def _check_explicit(option: str, path: str, save_dir: str, suffix: str = "", strict: bool = True) -> None:
    """Refuse a checkpoint the user named (``--restore-file``, ``--continue-once``) that is not a file, or that is
    unreadable (fairseq would fail with a bare ``EOFError`` / ``RuntimeError`` from torch)."""
    from fairseq.file_io import PathManager

    if PathManager.isfile(path):
        if is_intact(path):
            return
        newest = newest_intact_checkpoint(save_dir, suffix) if os.path.isdir(save_dir) else None
        instead = f"; the intact checkpoint of {save_dir} with the most updates is {newest}" if newest else ""
        raise ResumeError(f"{option} {path} is unreadable (empty or truncated, e.g. by a crash during a save){instead}")
    what = "is a directory, not a checkpoint file" if os.path.isdir(path) else "does not exist"
    beside = os.path.join(save_dir, path)
    hint = (f" (did you mean {beside}? the path is relative to the working directory, not --save-dir)"
            if not os.path.isabs(path) and PathManager.isfile(beside) else "")
    if not strict and option == "--restore-file" and what == "does not exist":
        logger.warning(f"--restore-file {path} does not exist: training starts from scratch, as fairseq does{hint} "
                       f"(fairseq-ext train refuses a missing --restore-file)")
        return
    raise ResumeError(f"{option} {path} {what}; fairseq would train from scratch{hint}. Give an existing "
                      f"checkpoint, or leave {option} out to resume from "
                      f"{os.path.join(save_dir, 'checkpoint_last.pt')} (or start from scratch if there is none)")


def check_restore(cfg, suffix: str = "", strict: Optional[bool] = None) -> Optional[str]:
    """The checks of a ``CheckpointConfig`` before fairseq's ``load_checkpoint`` runs: the checkpoint
    to load in place of an unreadable ``checkpoint_last{suffix}.pt``, else None (fairseq's choice
    stands); :class:`ResumeError` when there is none to load, or for a missing or unreadable
    ``--restore-file`` / ``--continue-once``. Not ``strict`` (default: :data:`STRICT_ENV` is not
    ``1``), a missing ``--restore-file`` means training from scratch, with a warning."""
    from fairseq.file_io import PathManager

    strict = os.environ.get(STRICT_ENV) == "1" if strict is None else strict
    # no save dir (the mocked configs of fairseq's own tests): nothing to check; remote storage: unchanged
    if cfg.save_dir is None or "://" in str(cfg.save_dir) or "://" in str(cfg.restore_file):
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
    """``recipes/train.sh``'s :func:`hold_save_dir` (let go as it exits) and :func:`check_restore` before torchrun
    starts several processes, on fairseq-train's arguments ``argv``. Sharded (FSDP) checkpoints: left to the ranks."""
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    args = options.parse_args_and_arch(options.get_training_parser(), input_args=argv)
    cfg = convert_namespace_to_omegaconf(args)
    hold_save_dir(cfg.checkpoint)
    if cfg.distributed_training.ddp_backend == "fully_sharded" and cfg.distributed_training.use_sharded_state:
        return
    check_restore(cfg.checkpoint, cfg.checkpoint.checkpoint_suffix or "", strict=True)


def install() -> None:
    from fairseq import checkpoint_utils
    from fairseq.distributed import utils as distributed_utils

    replace(distributed_utils, "_broadcast_object_slow", _broadcasting_plain_data)
    replace(checkpoint_utils, "PathManager", _AtomicCopyPathManager)
    replace(checkpoint_utils, "torch_persistent_save", _saving_atomically)
    replace(checkpoint_utils, "load_checkpoint", _resuming_from_what_is_there)
    replace(checkpoint_utils, "verify_checkpoint_directory", _leaving_no_empty_save_dir)
