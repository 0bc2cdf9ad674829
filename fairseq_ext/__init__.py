"""fairseq_ext: multi-layer Transformer architectures for NMT, as a fairseq user dir.

With fairseq imported (``--user-dir fairseq_ext``, or fairseq imported first), importing this package installs the
plugin's guards on fairseq 0.12 (docs/trust.md), then registers the models, their presets, the criterion and the task.
Imported before fairseq, it does the same the moment fairseq's own import ends, so that the commands which never build a
model (``fairseq-ext user-dir``, ``config-dir``, ``significance``; ``prepare``, ``train`` and ``evaluate``, which start
fairseq's own commands as processes) load neither fairseq nor torch themselves. It also silences the deprecation
warnings that fairseq 0.12's own code draws from hydra and torch at every start (none a user can act on); every other
warning is shown as before.

The registration never meets one of its own modules half imported: no guard module imports
fairseq before its ``install`` runs, and the core's subpackages (models, modules, criterions,
tasks) import fairseq in their ``__init__`` before any of their modules runs.
"""
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
    global _REGISTERED
    from fairseq_ext import guards

    guards.install()
    from fairseq_ext import models  # noqa: F401
    from fairseq_ext import criterions  # noqa: F401
    from fairseq_ext import tasks  # noqa: F401
    _REGISTERED = True


def _registering_when_done(spec):
    """``spec`` (fairseq's, half imported) made to :func:`register` when importlib sets ``spec._initializing = False``
    (fairseq's ``__init__`` has ended), before the import returns; its finder and loader stay as they are."""
    base = type(spec)

    def __setattr__(self, name, value):
        base.__setattr__(self, name, value)
        if name == "_initializing" and not value:
            self.__class__ = base
            if sys.modules.get("fairseq") is not None:
                try:
                    register()
                except BaseException:  # never a fairseq without its guards
                    sys.modules.pop("fairseq", None)
                    raise

    spec.__class__ = type("RegisteringSpec", (base,), {"__setattr__": __setattr__})


def _register_when_fairseq_is_imported(event, args):
    """An audit hook (for the life of the process): Python raises ``import`` at every import statement that loads a
    module, before any finder, so no other library's import hook can pass it by. The first submodule fairseq's
    ``__init__`` imports finds fairseq half imported: :func:`_registering_when_done`."""
    if event != "import" or _REGISTERED or not args[0].startswith("fairseq."):
        return
    spec = getattr(sys.modules.get("fairseq"), "__spec__", None)
    if getattr(spec, "_initializing", False) and type(spec).__name__ != "RegisteringSpec":
        _registering_when_done(spec)


_REGISTERED = False
if "fairseq" in sys.modules:
    register()
else:
    sys.addaudithook(_register_when_fairseq_is_imported)
