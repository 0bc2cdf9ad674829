"""How every guard replaces one attribute of fairseq (or of ``sys``) that fairseq looks up at
call time with a wrapper built from the original: :func:`replace`.
"""
import functools
from typing import Any, Callable, List, Tuple

MARKER = "__fairseq_ext_guard__"

# (owner, attribute name) of every attribute replaced so far, in installation order
REPLACED: List[Tuple[Any, str]] = []

_MISSING = object()


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
    REPLACED.append((owner, name))
    return wrapper
