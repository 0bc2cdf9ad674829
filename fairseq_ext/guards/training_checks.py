"""Checks that need both the model and the criterion, run when fairseq-train starts.

The model is built before the criterion, and neither sees the other until fairseq's
``Trainer`` receives both; the ``Trainer`` exists only in training, so generation,
validation and the hub are not affected. :func:`install` wraps ``Trainer.__init__``:
after fairseq's own set-up, a model that defines ``check_training_setup(criterion, cfg)``
is asked to check them, and refuses with a :class:`~fairseq_ext.errors.OptionError` naming
the flags (printed as one line by the plugin's error hook).
"""
import logging

from fairseq import trainer as fairseq_trainer

from fairseq_ext.guards.patching import replace

logger = logging.getLogger(__name__)


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


def install() -> None:
    replace(fairseq_trainer.Trainer, "__init__", _checking_model_and_criterion)
