"""One closing line when ``fairseq-train`` stops: how far training got, and why it stopped.

fairseq 0.12 ends a run cut by its time cap (``--stop-time-hours``) with the same "done
training" line as a finished one. :func:`install` wraps ``fairseq_cli.train.train`` (one epoch;
only inside ``fairseq-train``); when the epoch ends the run, the first process logs
:func:`summary`, which starts ``training ended: U of P updates, M min of training``
(scripts/quickstart.sh reads it back).
"""
import logging
import math
import os
import sys

from fairseq_ext.guards.patching import replace

logger = logging.getLogger("fairseq_ext.training")

TIME_CAP = "stopped by the time cap"
# set by a script running fairseq-train for its user (quickstart.sh): where the save dir's
# checkpoints are once the script moved them into place, and the command that continues the run
SHOWN_SAVE_DIR_ENV = "FAIRSEQ_EXT_SHOWN_SAVE_DIR"
CONTINUE_ENV = "FAIRSEQ_EXT_CONTINUE_COMMAND"


def summary(cfg, trainer, epoch: int, should_stop: bool) -> str:
    """The closing line of a run that ended after ``epoch`` (``should_stop``: fairseq's
    verdict of its last validate-and-save)."""
    opt = cfg.optimization
    updates = trainer.get_num_updates()
    planned = opt.max_update if opt.max_update and opt.max_update > 0 else None
    minutes = trainer.cumulative_training_time() / 60
    head = f"training ended: {updates} of {planned if planned else '?'} updates, {minutes:.1f} min of training"
    save_dir = os.environ.get(SHOWN_SAVE_DIR_ENV) or cfg.checkpoint.save_dir
    last = os.path.join(save_dir, "checkpoint_last.pt")
    if planned and updates >= planned:
        return f"{head}; finished (--max-update {planned}); checkpoints in {save_dir}"
    max_epoch = opt.max_epoch or math.inf
    if not should_stop and epoch >= max_epoch:
        return f"{head}; finished (--max-epoch {opt.max_epoch}); checkpoints in {save_dir}"
    cap = opt.stop_time_hours
    if should_stop and cap > 0 and minutes > cap * 60:
        goal = f"{planned} updates" if planned else f"--max-epoch {opt.max_epoch}" if opt.max_epoch else "the end"
        resume = ("run the same command again (--no-save: there is no checkpoint to resume from; run it again "
                  "without --no-save)" if cfg.checkpoint.no_save else
                  f"run the same command again with --stop-time-hours 0 (no cap) or a larger cap (it counts the "
                  f"training time of every resume: {minutes / 60:.4f} h so far); it resumes from {last}")
        if os.environ.get(CONTINUE_ENV) and not cfg.checkpoint.no_save:
            resume = f"run: {os.environ[CONTINUE_ENV]}"
        return (f"{head}; {TIME_CAP} (--stop-time-hours {cap:g} = {cap * 60:.1f} min) before {goal}: "
                f"the model is undertrained and scores below a finished run. To continue it to {goal}, {resume}")
    patience = cfg.checkpoint.patience
    if should_stop and patience > 0:
        return (f"{head}; stopped early: no better validation {cfg.checkpoint.best_checkpoint_metric} in {patience} "
                f"validations (--patience {patience}); best model in {os.path.join(save_dir, 'checkpoint_best.pt')}")
    return f"{head}; checkpoints in {save_dir}"


def _reporting_end(original):
    def train(cfg, trainer, task, epoch_itr, *args, **kwargs):
        valid_losses, should_stop = original(cfg, trainer, task, epoch_itr, *args, **kwargs)
        from fairseq import distributed_utils

        max_epoch = cfg.optimization.max_epoch or math.inf
        ends = should_stop or epoch_itr.epoch >= max_epoch
        if ends and distributed_utils.is_master(cfg.distributed_training):
            logger.info(summary(cfg, trainer, epoch_itr.epoch, should_stop))
        return valid_losses, should_stop

    return train


def install() -> None:
    module = sys.modules.get("fairseq_cli.train")
    if module is not None and hasattr(module, "train"):
        replace(module, "train", _reporting_end)
