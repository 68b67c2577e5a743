"""The package tree is the pipeline: imports point only down it, and no modules import in a circle.

Every `import` in `src/flint` is read with `ast` (function-level and TYPE_CHECKING imports too), so
a new module is covered by the package it lives in, with no list of modules to keep up to date.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import networkx as nx
import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

LAYERS = [
    {"errors", "version"},
    {"schema", "devices", "mesh", "sharding"},
    {"trace"},
    {"frontend"},
    {"layout"},
    {"compile"},
    {"ir"},
    {"graph"},
    {"pipelining"},
    {"emit"},
    {"isolation"},
    {"pipeline"},
    {"step"},
    {"analysis"},
    {"simulation"},
    {"exploration"},
    {"api"},
    {"cli"},
    {"launch"},
    {"__main__"},
]
"""Top-level units of `flint`, lowest first: the foundation, the trace format, the stages in
pipeline order, then what runs them, what times a step on a machine, and what reads traces back. A unit may import from itself and
from units of lower layers only; units of one layer are independent of each other."""

LEVEL = {unit: level for level, units in enumerate(LAYERS) for unit in units}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """The `flint` modules a file imports (a `from package import name` may name a submodule)."""
    package = _module_name(path) if path.name == "__init__.py" else _module_name(path).rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = importlib.util.resolve_name("." * node.level + base, package)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return {name for name in found if name == "flint" or name.startswith("flint.")}


def _graph() -> nx.DiGraph:
    files = sorted((SRC / "flint").rglob("*.py"))
    modules = {_module_name(f): f for f in files}
    graph = nx.DiGraph()
    graph.add_nodes_from(modules)
    for name, path in modules.items():
        for target in _imports(path):
            if target in modules and target != name:
                graph.add_edge(name, target)
    return graph


def _unit(module: str) -> str:
    return module.split(".")[1] if "." in module else module


GRAPH = _graph()


def test_every_unit_has_a_layer():
    units = {_unit(m) for m in GRAPH if m != "flint"}
    assert units <= set(LEVEL), f"place these in LAYERS: {sorted(units - set(LEVEL))}"
    assert len(units) >= 12, units  # the walk found the tree


def upward_imports(graph: nx.DiGraph) -> list[str]:
    wrong = []
    for source, target in graph.edges:
        if "flint" in (source, target):
            continue
        a, b = _unit(source), _unit(target)
        if a != b and LEVEL[b] >= LEVEL[a]:
            wrong.append(f"{source} -> {target}")
    return wrong


def test_imports_point_down_the_pipeline():
    wrong = upward_imports(GRAPH)
    assert not wrong, "imports up the pipeline or across one layer:\n" + "\n".join(wrong)


def test_no_import_cycles():
    cycles = list(nx.simple_cycles(GRAPH))
    assert not cycles, "modules importing each other in a circle: " + "; ".join(" -> ".join(c) for c in cycles)


@pytest.mark.parametrize(
    "source, target, upward, cyclic",
    [
        ("flint.ir.costs", "flint.analysis.dot", True, False),
        ("flint.mesh", "flint.sharding", True, False),  # one layer: independent
        ("flint.frontend.torch_model", "flint.frontend.torch_step", False, True),
    ],
)
def test_a_wrong_import_is_caught(source, target, upward, cyclic):
    """Each kind of mistake the rules exist for, added to the real graph, is reported."""
    graph = GRAPH.copy()
    graph.add_edge(source, target)
    assert bool(upward_imports(graph)) == upward
    assert bool(list(nx.simple_cycles(graph))) == cyclic
