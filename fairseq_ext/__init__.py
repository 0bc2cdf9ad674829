"""fairseq_ext: multi-layer Transformer architectures for NMT, as a fairseq user dir.

With fairseq imported (``--user-dir fairseq_ext``, or fairseq imported first), importing this
package installs the plugin's guards on fairseq 0.12 (docs/trust.md), then registers the models,
their presets, the criterion and the task. Imported before fairseq, it does the same the moment
fairseq's own import ends, so that the commands which never build a model (``fairseq-ext
user-dir``, ``config-dir``, ``significance``; ``prepare``, ``train`` and ``evaluate``, which start
fairseq's own commands as processes) load neither fairseq nor torch themselves. It also silences
the deprecation warnings that fairseq 0.12's own code draws from hydra and torch at every start
(none a user can act on); every other warning is shown as before.

The registration never meets one of its own modules half imported: no guard module imports
fairseq before its ``install`` runs, and the core's subpackages (models, modules, criterions,
tasks) import fairseq in their ``__init__`` before any of their modules runs.
"""
import importlib.abc
import importlib.util
import sys
import warnings

# (message start, category) of what fairseq 0.12's own calls into hydra and torch warn
FAIRSEQ_DEPRECATIONS = (
    (r"hydra\.experimental\.(initialize|compose)\(\) is no longer experimental", UserWarning),
    (r"\s*The version_base parameter is not specified", UserWarning),
    (r"In 'config': Usage of deprecated keyword in package header", UserWarning),
    (r"\s*'config' is validated against ConfigStore schema with the same name", UserWarning),
    (r"\s*The strict flag in the compose API is deprecated", UserWarning),
    (r"Support for mismatched key_padding_mask and attn_mask is deprecated", UserWarning),
    (r"'pin_memory' argument is set as true but no accelerator is found", UserWarning),
    (r"`torch\.cuda\.amp\.autocast\(args\.\.\.\)` is deprecated", FutureWarning),
)
for _message, _category in FAIRSEQ_DEPRECATIONS:
    warnings.filterwarnings("ignore", message=_message, category=_category)

from fairseq_ext.guards import one_line_errors  # noqa: E402

one_line_errors.install_excepthook()  # the plugin's errors in one line, fairseq imported or not


def register() -> None:
    """Install the guards (before anything registers or loads: every checkpoint load is checked),
    then register the models, presets, criterion and task; idempotent."""
    from fairseq_ext import guards

    guards.install()
    from fairseq_ext import models  # noqa: F401
    from fairseq_ext import criterions  # noqa: F401
    from fairseq_ext import tasks  # noqa: F401


class _RegisterAfterFairseq(importlib.abc.MetaPathFinder):
    """Finds nothing itself: every spec of fairseq looked up before fairseq's import (an import,
    ``importlib.util.find_spec``, a submodule first) comes from the finders after it, with a loader
    that runs :func:`register` right after fairseq's ``__init__``. It leaves ``sys.meta_path`` only
    once that has run, so that no lookup in between can leave fairseq to load unguarded."""

    def find_spec(self, name, path=None, target=None):
        if name != "fairseq":
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None) if finder is not self else None
            spec = find(name, path, target) if find is not None else None
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            exec_fairseq = spec.loader.exec_module

            def exec_then_register(module):
                exec_fairseq(module)
                if self in sys.meta_path:
                    sys.meta_path.remove(self)
                register()

            spec.loader.exec_module = exec_then_register
        return spec


if "fairseq" in sys.modules:
    register()
else:
    sys.meta_path.insert(0, _RegisterAfterFairseq())
