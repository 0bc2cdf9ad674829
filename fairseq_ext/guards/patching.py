"""How every guard replaces one attribute of fairseq (or of ``sys``) that fairseq looks up at
call time with a wrapper built from the original: :func:`replace`; and how a reloaded fairseq module gets its
wrappers back (:class:`GuardedModule`).
"""
import functools
import sys
import types
from typing import Any, Callable, Dict, List, Set, Tuple

MARKER = "__fairseq_ext_guard__"

# (owner, attribute name) of every attribute replaced so far, in installation order
REPLACED: List[Tuple[Any, str]] = []

_MISSING = object()

# fairseq module -> (class name or None, attribute) of what the guards replaced in it; and the spec it was imported with
_IN_MODULE: Dict[types.ModuleType, Set[Tuple[Any, str]]] = {}
_SPEC_SEEN: Dict[types.ModuleType, Any] = {}
_reinstalling = False


class GuardedModule(types.ModuleType):
    """A fairseq module a guard patched. ``importlib.reload`` (a new ``__spec__``) binds fairseq's originals again: the
    next read of any of its attributes puts the guards back first, so its own functions meet the wrappers too."""

    def __getattribute__(self, name):
        global _reinstalling
        namespace = types.ModuleType.__getattribute__(self, "__dict__")
        if namespace.get("__spec__") is not _SPEC_SEEN.get(self) and not _reinstalling and not all(
                is_guard(namespace.get(attribute) if owner is None else getattr(namespace.get(owner), attribute, None))
                for owner, attribute in _IN_MODULE[self]):
            from fairseq_ext import guards

            _reinstalling = True
            try:
                guards.install()
            finally:
                _reinstalling = False
        return types.ModuleType.__getattribute__(self, name)


def is_guard(obj: Any) -> bool:
    """Whether ``obj`` is a wrapper installed by :func:`replace`."""
    return bool(getattr(obj, MARKER, False))


def replace(owner: Any, name: str, make_wrapper: Callable[[Any], Any], default: Any = _MISSING) -> Any:
    """Set ``owner.name`` (of a module or a class) to ``make_wrapper(original)`` unless it already
    is a guard's wrapper, which keeps the original as ``__wrapped__`` with its name and doc,
    carries :data:`MARKER` and is listed in :data:`REPLACED`; return what ``owner.name`` is
    afterwards. ``default`` stands for an original that falls back to ``builtins``."""
    original = getattr(owner, name, default)
    if original is _MISSING:
        raise AttributeError(f"{owner!r} has no attribute {name!r} to wrap")
    if is_guard(original):
        return original
    wrapper = make_wrapper(original)
    functools.update_wrapper(wrapper, original, assigned=("__doc__", "__name__", "__qualname__"), updated=())
    setattr(wrapper, MARKER, True)
    setattr(owner, name, wrapper)
    if (owner, name) not in REPLACED:
        REPLACED.append((owner, name))
    module = owner if isinstance(owner, types.ModuleType) else sys.modules.get(getattr(owner, "__module__", ""))
    if getattr(module, "__name__", "").startswith(("fairseq.", "fairseq_cli.")):
        module.__class__ = GuardedModule
        _IN_MODULE.setdefault(module, set()).add((None if module is owner else owner.__name__, name))
        _SPEC_SEEN.setdefault(module, vars(module).get("__spec__"))  # a reloaded module is checked at every read
    return wrapper
