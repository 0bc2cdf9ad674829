"""Checks of fairseq-train's ``Trainer`` (training only): a model that defines
``check_training_setup(criterion, cfg)`` checks itself against the criterion before fairseq sets
up (an :class:`~fairseq_ext.errors.OptionError`, one line), and a checkpoint loaded with the
optimizer reset is marked as a warm start (:data:`WARM_START`).
"""
import logging
import time
from contextvars import ContextVar
from typing import Optional

from fairseq_ext.guards.patching import replace

logger = logging.getLogger(__name__)
# the checkpoint the trainer is loading for a warm start (the optimizer reset), else None: read
# by the model's load_state_dict (fairseq_ext.models.warm_start)
WARM_START: ContextVar[Optional[str]] = ContextVar("warm_start", default=None)


def _unwrapped(model):
    while hasattr(model, "module"):
        model = model.module
    return model


def _checking_model_and_criterion(original):
    def __init__(self, cfg, task, model, criterion, *args, **kwargs):
        check = getattr(_unwrapped(model), "check_training_setup", None)
        if check is not None:  # before fairseq moves anything to a device
            check(criterion, cfg)
        original(self, cfg, task, model, criterion, *args, **kwargs)

    return __init__


def _warm_starting(original):
    """A checkpoint loaded with the optimizer reset (``--finetune-from-model``, or
    ``--restore-file`` with ``--reset-optimizer``) starts a new training from its weights: the
    model may then have options the checkpoint's model had not (fairseq_ext.models.warm_start).
    With its meters reset too (``--finetune-from-model``), its clock starts at zero (fairseq keeps
    the loaded run's training time, which ``--stop-time-hours`` and the closing line count)."""
    def load_checkpoint(self, filename, reset_optimizer=False, *args, **kwargs):
        token = WARM_START.set(str(filename) if reset_optimizer else None)
        try:
            extra_state = original(self, filename, reset_optimizer, *args, **kwargs)
        finally:
            WARM_START.reset(token)
        if reset_optimizer and kwargs.get("reset_meters", args[2] if len(args) > 2 else False):
            self._previous_training_time, self._start_time = 0, time.time()
        return extra_state

    return load_checkpoint


def install() -> None:
    from fairseq import trainer as fairseq_trainer

    replace(fairseq_trainer.Trainer, "__init__", _checking_model_and_criterion)
    replace(fairseq_trainer.Trainer, "load_checkpoint", _warm_starting)
