"""The analyses: every module of this package that declares ``ANALYSIS = Analysis(...)`` (named
as the analysis), in the report's page order; no command keeps a list of its own."""
import dataclasses
import functools
import importlib
import pkgutil
from typing import TYPE_CHECKING, Callable, Dict, Optional, Set

import fairseq_ext.analysis as package
from fairseq_ext.analysis import AnalysisError

if TYPE_CHECKING:  # the list of analyses loads no model code
    from fairseq_ext.models.multilayer_transformer_config import MultilayerOptions


@dataclasses.dataclass(frozen=True)
class Analysis:
    """``name``: its module, ``fairseq_ext.analysis.NAME``, with ``build_parser()`` and ``main(argv)``;
    ``title`` and ``reference`` head its report section; ``single``: --checkpoint takes one, so
    the report runs it once per model; ``needs``: a test of a model's options, ``lacks`` what a
    model failing it lacks; ``order``: its place on the report's page."""

    name: str
    title: str
    reference: str
    single: bool = False
    needs: Optional[Callable[["MultilayerOptions"], bool]] = None
    lacks: str = ""
    order: int = 1000

    def __post_init__(self):
        if (self.needs is None) != (not self.lacks):
            raise AnalysisError(f"analysis {self.name}: 'needs' and 'lacks' go together (what a model must have, "
                                "and what the report says of one without it)")

    @property
    def module(self) -> str:
        return f"{package.__name__}.{self.name}"

    def applies_to(self, options: "MultilayerOptions") -> bool:
        return self.needs is None or bool(self.needs(options))

    def parser(self):
        return importlib.import_module(self.module).build_parser()

    def option_strings(self) -> Set[str]:
        return _option_strings(self.name)


@functools.lru_cache(maxsize=None)
def _option_strings(name: str) -> Set[str]:
    return set(get(name).parser()._option_string_actions)


@functools.lru_cache(maxsize=None)
def _discover() -> Dict[str, Analysis]:
    found = []
    for info in pkgutil.iter_modules(package.__path__):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        analysis = getattr(module, "ANALYSIS", None)
        if analysis is None:
            continue
        if not isinstance(analysis, Analysis) or analysis.name != info.name:
            raise AnalysisError(f"{module.__name__}.ANALYSIS: expected Analysis(name={info.name!r}, ...)")
        missing = [f for f in ("build_parser", "main") if not callable(getattr(module, f, None))]
        if missing:
            raise AnalysisError(f"{module.__name__} declares ANALYSIS but has no {' or '.join(missing)}()")
        found.append(analysis)
    return {a.name: a for a in sorted(found, key=lambda a: (a.order, a.name))}


def analyses() -> Dict[str, Analysis]:
    return dict(_discover())


def get(name: str) -> Analysis:
    try:
        return _discover()[name]
    except KeyError:
        raise AnalysisError(f"no analysis {name!r} (choose from {', '.join(sorted(_discover()))})") from None
