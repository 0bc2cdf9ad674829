"""The guards on fairseq (fairseq_ext/guards/): installed once, each around fairseq's own."""
import sys

import fairseq_ext  # noqa: F401  (installs the guards)
from fairseq import checkpoint_utils, file_io, file_utils
from fairseq import trainer as fairseq_trainer
from fairseq.data import data_utils
from fairseq.dataclass import utils as dataclass_utils
from fairseq.distributed import utils as distributed_utils
from fairseq_cli import train as fairseq_train
from hydra.core.utils import JobReturn

from fairseq_ext import guards

# The training summary wraps fairseq-train's loop only once fairseq_cli.train is imported
# (fairseq-train imports it before the plugin); installing again here settles that, whatever
# the other tests in this process imported first.
guards.install()
from fairseq_ext.guards.patching import MARKER, REPLACED, is_guard

# (owner, attribute) -> the module fairseq's original comes from (None: not fairseq's, sys)
GUARDED = {
    (checkpoint_utils, "load_checkpoint_to_cpu"): "fairseq.checkpoint_utils",
    (checkpoint_utils, "torch"): None,  # torch itself, whose load is always weights_only there
    (file_utils, "load_archive_file"): "fairseq.file_utils",
    (data_utils, "batch_by_size"): "fairseq.data.data_utils",
    (distributed_utils, "_broadcast_object_slow"): "fairseq.distributed.utils",
    (checkpoint_utils, "PathManager"): "fairseq.file_io",
    (checkpoint_utils, "torch_persistent_save"): "fairseq.checkpoint_utils",
    (checkpoint_utils, "load_checkpoint"): "fairseq.checkpoint_utils",
    (checkpoint_utils, "verify_checkpoint_directory"): "fairseq.checkpoint_utils",
    (sys, "excepthook"): None,
    (JobReturn, "return_value"): None,  # hydra's property (fairseq-hydra-train's failed job)
    (fairseq_trainer.Trainer, "__init__"): "fairseq.trainer",
    (fairseq_trainer.Trainer, "load_checkpoint"): "fairseq.trainer",
    (fairseq_train, "train"): "fairseq_cli.train",
    (dataclass_utils, "convert_namespace_to_omegaconf"): "fairseq.dataclass.utils",
}


def _installed():
    return {key: getattr(*key) for key in GUARDED}


def test_each_guarded_attribute_is_wrapped_once_around_fairseqs_own():
    assert {(id(owner), name) for owner, name in REPLACED} == {(id(owner), name) for owner, name in GUARDED}
    assert len(REPLACED) == len(GUARDED)
    for (owner, name), module in GUARDED.items():
        wrapper = getattr(owner, name)
        assert is_guard(wrapper) and getattr(wrapper, MARKER) is True, name
        original = wrapper.__wrapped__
        assert not is_guard(original), f"{name} is wrapped twice"
        assert wrapper.__doc__ == original.__doc__, name
        if module is not None:
            assert original.__module__ == module, name
    assert checkpoint_utils.PathManager.__wrapped__ is file_io.PathManager
    # fairseq-train imports the conversion by name before the plugin loads, so its own name is
    # wrapped too (here fairseq_cli.train was imported after the plugin and holds the wrapper)
    assert is_guard(fairseq_train.convert_namespace_to_omegaconf)


def test_installing_again_changes_nothing():
    before, replaced = _installed(), list(REPLACED)
    guards.install()
    guards.install()
    after = _installed()
    assert all(after[key] is before[key] for key in GUARDED)
    assert REPLACED == replaced
