"""How every guard replaces one attribute of fairseq (or of ``sys``) that fairseq looks up at
call time with a wrapper built from the original (:func:`replace`): the wrapper keeps the
original as ``__wrapped__`` and its name and doc, carries :data:`MARKER` (a second installation
leaves it alone) and is listed in :data:`REPLACED`.
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
    """Set ``owner.name`` to ``make_wrapper(original)`` unless it already is a guard's
    wrapper; return what ``owner.name`` is afterwards.

    ``owner`` is a module or a class; ``default`` stands for the original when ``owner``
    has no such attribute (a module global that falls back to ``builtins``). The wrapper
    may be a function or any object that accepts attributes (a proxy instance)."""
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
