"""The house's arrows, checked on the source: which package may import which, that
product code never imports the tooling rooms, and that no two modules of a package
import each other (through any chain).

Packages build on each other in one direction (DESIGN.md, "Layout"): p2p at the
bottom; fusefs and the tracker on p2p; depsnap and hdfs_stripe on fusefs and p2p; the
simulator on the cores of p2p and the tracker. Test and benchmark tooling lives in each
package's `testing/` and `bench/` rooms, which may import anything; product modules
never import them, so a node runs none of it. Imports inside functions count too: a
lazy import is still an arrow. Imports under `if TYPE_CHECKING:` do not: they never run.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("p2p", "fusefs", "depsnap", "hdfs_stripe", "tracker", "simulations")
MAY_IMPORT = {
    "p2p": set(),
    "fusefs": {"p2p"},
    "depsnap": {"p2p", "fusefs"},
    "hdfs_stripe": {"p2p", "fusefs"},
    "tracker": {"p2p"},
    "simulations": {"p2p", "tracker"},
}
TOOLING_ROOMS = ("testing", "bench")


def _runtime_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node, except what sits under `if TYPE_CHECKING:`."""
    nodes: list[ast.AST] = []
    for child in ast.iter_child_nodes(tree):
        if isinstance(child, ast.If) and ast.unparse(child.test) == "TYPE_CHECKING":
            nodes += [n for orelse in child.orelse for n in [orelse, *_runtime_nodes(orelse)]]
            continue
        nodes += [child, *_runtime_nodes(child)]
    return nodes


def imported_modules(source: str) -> list[str]:
    """Absolute module names `source` imports, at any depth (relative imports skipped)."""
    names: list[str] = []
    for node in _runtime_nodes(ast.parse(source)):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
            names += [f"{node.module}.{alias.name}" for alias in node.names]
    return names


def is_tooling(module: str) -> bool:
    return any(part in TOOLING_ROOMS for part in module.split(".")[1:])


def product_files(package: str) -> list[Path]:
    return [f for f in sorted((ROOT / package).rglob("*.py"))
            if not any(part in TOOLING_ROOMS for part in f.relative_to(ROOT).parts)]


def violations(package: str) -> list[str]:
    found = []
    for path in product_files(package):
        for module in imported_modules(path.read_text()):
            top = module.split(".")[0]
            if top not in PACKAGES:
                continue
            where = path.relative_to(ROOT)
            if is_tooling(module):
                found.append(f"{where} imports tooling {module}")
            elif top != package and top not in MAY_IMPORT[package]:
                found.append(f"{where} imports {module}: {package} may not import {top}")
    return sorted(set(found))


def module_graph(package: str) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports (packages' __init__ aside)."""
    files = {".".join(f.relative_to(ROOT).with_suffix("").parts): f
             for f in (ROOT / package).rglob("*.py") if f.name != "__init__.py"}
    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        targets = set()
        for name in imported_modules(path.read_text()):
            while name and name not in files:
                name = name.rpartition(".")[0]
            if name and name != module:
                targets.add(name)
        graph[module] = targets
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while (w := stack.pop()) != v:
                group.append(w)
            if group:
                found.append(sorted([v, *group]))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


@pytest.mark.parametrize("package", PACKAGES)
def test_no_two_modules_of_a_package_import_each_other(package: str) -> None:
    assert cycles(module_graph(package)) == []


@pytest.mark.parametrize("package", PACKAGES)
def test_product_code_follows_the_arrows_and_never_imports_tooling(package: str) -> None:
    assert violations(package) == []


def test_the_check_sees_an_upward_arrow_and_a_tooling_import(tmp_path: Path) -> None:
    source = "def f():\n    from depsnap.key import x\n    import p2p.testing.localcluster\n"
    modules = imported_modules(source)
    assert "depsnap.key" in modules
    assert any(is_tooling(m) for m in modules)
    assert not is_tooling("p2p.swarm.bench_like")
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert imported_modules("if TYPE_CHECKING:\n    import p2p.peer\n") == []
