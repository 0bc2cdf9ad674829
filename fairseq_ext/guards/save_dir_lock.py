"""One training run per ``--save-dir``.

Two ``fairseq-train`` runs writing one save dir at once overwrite each other's
``checkpoint_last.pt`` and ``checkpoint_best.pt``, and each resumes from the other's: the
model a run reports at its end may be the other run's. fairseq does not notice. The plugin's
``load_checkpoint`` wrapper (:mod:`fairseq_ext.guards.resume`, which ``fairseq_cli/train.py``
calls once on every rank before training) calls :func:`hold_save_dir` first: the process of
global rank 0 takes the save dir's lock (``PARENT/.NAME.lock``,
:mod:`fairseq_ext.recipes.helpers.outputs`, the lock of every output of the package) and holds it
until it exits; a second run is refused with one line naming the first (its process id, host,
start time and command line). A run with ``--no-save`` writes nothing there and takes no lock;
remote save dirs (``s3://``, ...) are left as they are. A process killed with SIGKILL leaves
the lock file, never the lock: the next run takes it.
"""
import atexit
import os
from typing import Dict

from fairseq.distributed import utils as distributed_utils

from fairseq_ext.errors import SaveDirBusyError
from fairseq_ext.recipes.helpers.outputs import OutputBusyError, OutputLock

# the locks this process holds, by save dir (released at exit)
_HELD: Dict[str, OutputLock] = {}


def hold_save_dir(cfg) -> None:
    """Take the lock of ``cfg.save_dir`` (a ``CheckpointConfig``) for the rest of the process,
    on global rank 0; raise :class:`SaveDirBusyError` when another run holds it."""
    # a config without a save dir (the mocks of fairseq's own tests of load_checkpoint) names
    # nothing to lock; one without a no_save key writes its save dir, as --no-save is off
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
