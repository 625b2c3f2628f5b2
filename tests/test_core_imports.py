"""The no-I/O rules, checked from the source so that they hold by themselves.

The policy cores (p2p/swarm, the tracker's registry and handout policy, the rate
limiter) never import anything that does I/O, reads a clock or uses the global
random module: the agent and the simulator both run them unchanged. The simulator
imports those cores, never the shells around them.

A module breaks a rule if it imports a forbidden module anywhere in its own code,
or if a project module it imports does so when it is imported (module level, not
inside functions). Parent packages' `__init__` count too, since Python runs them.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

CORE_FILES = [ROOT / f for f in ("tracker/handout.py", "tracker/registry.py", "tracker/index.py",
                                  "tracker/machine.py",
                                  "p2p/ratelimit.py", "p2p/draws.py",
                                  "p2p/guard.py", "fusefs/tree.py", "fusefs/image/toc.py",
                                  "fusefs/image/layerindex.py", "fusefs/image/record.py",
                                  "fusefs/record.py", "fusefs/protocol.py",
                                  "hdfs_stripe/stripe.py", "hdfs_stripe/naming.py",
                                  "depsnap/key.py", "depsnap/snapshot.py",
                                  "p2p/testing/testbed/plan.py",
                                  "fusefs/launch/plan.py",
                                  "simulations/floor.py")]
CORE_MODULES = sorted(
    [*(ROOT / "p2p" / "swarm").rglob("*.py"), *(f for f in CORE_FILES if f.is_file())]
)
CORE_FORBIDDEN = (
    "asyncio", "socket", "os", "time", "subprocess", "threading", "select", "selectors",
    "ssl", "aiohttp", "uvloop", "pathlib", "io", "shutil", "datetime",
)  # fmt: skip
SIMULATION_MODULES = sorted((ROOT / "simulations").rglob("*.py"))
SIMULATION_FORBIDDEN = (
    "asyncio", "aiohttp", "socket",
    "p2p.agent", "p2p.peer", "p2p.store", "p2p.wire", "tracker.app",
)  # fmt: skip


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_path(name: str, root: Path) -> Path | None:
    base = root.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _nodes(tree: ast.AST, into_functions: bool) -> Iterator[ast.AST]:
    for child in ast.iter_child_nodes(tree):
        if into_functions or not isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
            yield child
            yield from _nodes(child, into_functions)


def imported_names(
    source: str, module: str, is_package: bool, into_functions: bool = True
) -> Iterator[tuple[str, int]]:
    """Every dotted name the source imports, with its line; relative imports resolved.

    `from a import b` yields `a.b`, which matches a rule on `a` as well as one on
    the submodule `a.b`.
    """
    package = module.split(".") if is_package else module.split(".")[:-1]
    for node in _nodes(ast.parse(source), into_functions):
        if isinstance(node, ast.Import):
            yield from ((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            prefix = ".".join([*base, *([node.module] if node.module else [])])
            yield from ((f"{prefix}.{alias.name}", node.lineno) for alias in node.names)


def global_random_uses(source: str) -> Iterator[tuple[str, int]]:
    """Uses of the global random module; only the `random.Random` class is allowed."""
    tree = ast.parse(source)
    aliases = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            aliases |= {a.asname or a.name for a in node.names if a.name == "random"}
        elif isinstance(node, ast.ImportFrom) and node.module == "random" and not node.level:
            for alias in node.names:
                if alias.name != "Random":
                    yield f"from random import {alias.name}", node.lineno
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in aliases
            and node.attr != "Random"
        ):
            yield f"{node.value.id}.{node.attr}", node.lineno


def is_forbidden(name: str, forbidden: tuple[str, ...]) -> str | None:
    return next((bad for bad in forbidden if name == bad or name.startswith(bad + ".")), None)


def violations(path: Path, forbidden: tuple[str, ...], root: Path = ROOT) -> list[str]:
    """Forbidden imports made by `path`, or at import time by project modules it imports."""
    found: list[str] = []
    chains = {path: [path]}
    queue = [path]
    while queue:
        current = queue.pop(0)
        chain = " -> ".join(str(p.relative_to(root)) for p in chains[current])
        names = imported_names(
            current.read_text(),
            module_name(current, root),
            current.name == "__init__.py",
            into_functions=current == path,
        )
        for name, line in names:
            if bad := is_forbidden(name, forbidden):
                found.append(f"{chain}:{line} imports {bad}")
            parts = name.split(".")
            for prefix in (".".join(parts[:n]) for n in range(1, len(parts) + 1)):
                target = module_path(prefix, root)
                if target and target not in chains:
                    chains[target] = [*chains[current], target]
                    queue.append(target)
    return found


def _ids(paths: list[Path]) -> list[str]:
    return [str(p.relative_to(ROOT)) for p in paths]


def test_swarm_core_exists() -> None:
    assert list((ROOT / "p2p" / "swarm").rglob("*.py")), "p2p/swarm has no modules"


@pytest.mark.parametrize("path", CORE_MODULES, ids=_ids(CORE_MODULES))
def test_core_does_no_io(path: Path) -> None:
    assert violations(path, CORE_FORBIDDEN) == []


@pytest.mark.parametrize("path", CORE_MODULES, ids=_ids(CORE_MODULES))
def test_core_uses_no_global_random(path: Path) -> None:
    assert list(global_random_uses(path.read_text())) == []


@pytest.mark.parametrize("path", SIMULATION_MODULES, ids=_ids(SIMULATION_MODULES))
def test_simulator_imports_no_io_shell(path: Path) -> None:
    assert violations(path, SIMULATION_FORBIDDEN) == []


# The checker itself, on small sources, so that the tests above can fail.


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("import os.path", "os"),
        ("from time import monotonic", "time"),
        ("import asyncio as aio", "asyncio"),
        ("def f():\n    import socket", "socket"),
        ("from datetime import datetime", "datetime"),
        ("import random", None),
        ("from typing import IO", None),
        ("import iota", None),
    ],
)
def test_checker_finds_forbidden_imports(source: str, expected: str | None) -> None:
    names = [name for name, _ in imported_names(source, "p2p.swarm.picker", False)]
    assert [bad for n in names if (bad := is_forbidden(n, CORE_FORBIDDEN))] == (
        [expected] if expected else []
    )


@pytest.mark.parametrize(
    ("source", "module", "is_package", "expected"),
    [
        ("from p2p import agent", "simulations.net", False, "p2p.agent"),
        ("from .. import store", "p2p.swarm.picker", False, "p2p.store"),
        ("from ..wire import Frame", "p2p.swarm.picker", False, "p2p.wire"),
        ("from . import wire", "p2p", True, "p2p.wire"),
        ("from p2p.swarm import picker", "simulations.net", False, None),
    ],
)
def test_checker_resolves_submodule_imports(
    source: str, module: str, is_package: bool, expected: str | None
) -> None:
    names = [name for name, _ in imported_names(source, module, is_package)]
    assert [bad for n in names if (bad := is_forbidden(n, SIMULATION_FORBIDDEN))] == (
        [expected] if expected else []
    )


def test_checker_follows_project_imports(tmp_path: Path) -> None:
    files = {
        "p2p/__init__.py": "",
        "p2p/auth.py": "import os\n",
        "p2p/cli.py": "def main():\n    import asyncio\n",
        "p2p/swarm/__init__.py": "",
        "p2p/swarm/picker.py": "from p2p.auth import load_secret\nfrom p2p import cli\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    picker = tmp_path / "p2p/swarm/picker.py"
    # p2p.cli imports asyncio only when main() runs, which the core never calls.
    assert violations(picker, CORE_FORBIDDEN, tmp_path) == [
        "p2p/swarm/picker.py -> p2p/auth.py:1 imports os"
    ]


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("import random\nrng = random.Random(7)", []),
        ("from random import Random", []),
        ("import random\nx = random.random()", ["random.random"]),
        ("import random as r\nr.choice([1])", ["r.choice"]),
        ("from random import shuffle", ["from random import shuffle"]),
        ("import random\nrandom.SystemRandom()", ["random.SystemRandom"]),
    ],
)
def test_checker_finds_global_random(source: str, expected: list[str]) -> None:
    assert [use for use, _ in global_random_uses(source)] == expected
