"""The package's layers, read from its imports: every import of the package by itself (at the
top of a module or inside a function) points down the layers of docs/design.md, and no module
reaches itself again through its imports. Each check is a walk of the source (no import is
run), compared with the layer table below; a test of the walk itself keeps it honest."""
import ast
import os
from pathlib import Path
from typing import Dict, Iterable, List, Set, Tuple

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "fairseq_ext"

# Lowest first; a module may import its own layer and the layers below it. Modules of one
# layer that belong to different subpackages are siblings and do not import each other.
LAYERS: List[Tuple[str, ...]] = [
    ("fairseq_ext.standalone",),  # the ground floor the recipes run as plain files: nothing of the package above it
    ("fairseq_ext.keys", "fairseq_ext.errors"),
    ("fairseq_ext.resources",),
    ("fairseq_ext.guards",),
    ("fairseq_ext.modules",),
    ("fairseq_ext.criterions",),
    ("fairseq_ext.models", "fairseq_ext.tasks"),
    ("fairseq_ext.model_builder", "fairseq_ext.average_checkpoints", "fairseq_ext.strip_aux"),
    ("fairseq_ext",),  # the package itself: registration of the research core
    ("fairseq_ext.common",),  # checkpoints and the data's text contract, under every command
    ("fairseq_ext.tools",),  # the commands: evaluate, translate, score, significance, ...
    ("fairseq_ext.analysis",),  # the analyses, which decode through the evaluation command
    ("fairseq_ext.reproduce",),  # the papers' tables: training, evaluation and analyses
    ("fairseq_ext.selfcheck",),  # the device check: environment, tests, benchmark, training
    ("fairseq_ext.cli",),
    ("fairseq_ext.__main__",),
]


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(root: Path) -> Dict[str, Path]:
    return {module_name(p, root): p for p in sorted(root.rglob("*.py")) if "__pycache__" not in p.parts}


def imports(name: str, path: Path, known: Set[str]) -> Set[str]:
    """The package's modules that ``name`` imports anywhere in its source (functions
    included): ``from pkg import sub`` counts as an import of ``pkg.sub`` when that is a module."""
    is_package = path.name == "__init__.py"
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".") if is_package else name.split(".")[:-1]
                anchor = anchor[:len(anchor) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        found.update(t for t in targets if t == "fairseq_ext" or t.startswith("fairseq_ext."))
    found.discard(name)
    return found


def graph(root: Path) -> Dict[str, Set[str]]:
    found = modules(root)
    return {name: imports(name, path, set(found)) for name, path in found.items()}


def layer_of(name: str) -> Tuple[int, str]:
    """(layer, the entry of LAYERS the module belongs to): the longest matching prefix."""
    best = None
    for index, entries in enumerate(LAYERS):
        for entry in entries:
            if (name == entry or name.startswith(entry + ".")) and (best is None or len(entry) > len(best[1])):
                best = (index, entry)
    if best is None:
        raise AssertionError(f"{name} is in no layer of tests/test_import_layers.py: add it to LAYERS")
    return best


def upward(edges: Dict[str, Set[str]]) -> List[str]:
    bad = []
    for source, targets in sorted(edges.items()):
        here, home = layer_of(source)
        for target in sorted(targets):
            there, other = layer_of(target)
            if there > here or (there == here and other != home):
                bad.append(f"{source} -> {target}")
    return bad


def cycles(edges: Dict[str, Set[str]]) -> List[List[str]]:
    """Every strongly connected set of more than one module (Tarjan)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    found: List[List[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(edges.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_every_import_of_the_package_points_down_its_layers():
    assert upward(graph(PACKAGE)) == []


def test_no_module_imports_the_package_itself():
    """``import fairseq_ext`` inside the package does nothing: Python imports a package before
    any of its modules, so the plugin is registered wherever such a line would stand."""
    assert sorted(name for name, targets in graph(PACKAGE).items() if "fairseq_ext" in targets) == []


def test_no_module_reaches_itself_through_its_imports():
    assert cycles(graph(PACKAGE)) == []


def test_no_file_of_the_package_is_over_600_lines():
    """A cap that keeps a module to one concern without pushing a cohesive one apart."""
    long = {name: n for name, path in modules(PACKAGE).items()
            if (n := len(path.read_text(encoding="utf-8").splitlines())) > 600}
    assert long == {}


def test_no_test_module_imports_another():
    """What several test files share lives in the suite's helper modules (model_utils,
    script_utils, joint_attention_reference, ...), never in a test module, which is collected
    and run on its own."""
    tests = PACKAGE.parent / "tests"
    found = []
    for path in sorted(tests.rglob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            found += [f"{path.relative_to(tests)}: {n}" for n in names if n.split(".")[-1].startswith("test_")]
    assert found == []


def write(root: Path, files: Dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / "fairseq_ext"


def test_the_walk_sees_imports_inside_functions_relative_ones_and_circles(tmp_path):
    """The checks above fail where they should: an import inside a function that climbs from
    the commands to the analyses, a relative import, and a circle of two modules."""
    root = write(tmp_path, {
        "fairseq_ext/__init__.py": "",
        "fairseq_ext/errors.py": "",
        "fairseq_ext/tools/__init__.py": "",
        "fairseq_ext/tools/score.py": "def main():\n    from fairseq_ext.analysis import common\n",
        "fairseq_ext/analysis/__init__.py": "",
        "fairseq_ext/analysis/common.py": "from . import report\nfrom ..errors import X\n",
        "fairseq_ext/analysis/report.py": "import fairseq_ext.analysis.common\n",
    })
    edges = graph(root)
    assert edges["fairseq_ext.tools.score"] == {"fairseq_ext.analysis.common"}
    assert edges["fairseq_ext.analysis.common"] == {"fairseq_ext.analysis.report", "fairseq_ext.errors"}
    assert upward(edges) == ["fairseq_ext.tools.score -> fairseq_ext.analysis.common"]
    assert cycles(edges) == [["fairseq_ext.analysis.common", "fairseq_ext.analysis.report"]]


@pytest.mark.parametrize("name,layer", [("fairseq_ext.standalone.corpus", 0), ("fairseq_ext.tools.evaluate", 10),
                                        ("fairseq_ext.analysis.report", 11), ("fairseq_ext", 8),
                                        ("fairseq_ext.selfcheck.stages", 13), ("fairseq_ext.__main__", 15)])
def test_layers_are_read_by_the_longest_prefix(name, layer):
    assert layer_of(name)[0] == layer
