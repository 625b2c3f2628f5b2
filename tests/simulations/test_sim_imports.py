"""The simulator runs the real policies: it imports them and defines none of its own."""

from __future__ import annotations

import ast
from pathlib import Path

from test_core_imports import SIMULATION_FORBIDDEN, imported_names, violations

import p2p.swarm.policy
import tracker.handout

ROOT = Path(__file__).resolve().parents[2]
SIM = sorted((ROOT / "simulations").rglob("*.py"))


def _imports(path: Path) -> set[str]:
    module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    return {name for name, _ in imported_names(path.read_text(), module, False)}


def test_the_driver_imports_the_real_swarm_and_tracker_cores() -> None:
    sim = _imports(ROOT / "simulations" / "simulation.py")
    trk = _imports(ROOT / "simulations" / "tracker.py")
    assert "p2p.swarm.Swarm" in sim
    assert "tracker.handout.get_policy" in trk
    assert "tracker.registry.Registry" in trk
    assert "tracker.machine.Machine" in trk  # the very state machine the tracker applies


def test_no_policy_is_redefined_in_the_simulator() -> None:
    policy_names = {n for n in vars(p2p.swarm.policy) if n[0].isupper() or n.islower()}
    policy_names |= set(tracker.handout.HANDOUT_POLICIES) | {"rack_aware", "uniform", "Swarm"}
    policy_names -= {"annotations", "heapq", "random", "dataclass", "Sequence", "Protocol",
                     "PeerId", "PeerLoad"}
    for path in SIM:
        tree = ast.parse(path.read_text())
        defined = {n.name for n in ast.walk(tree)
                   if isinstance(n, ast.FunctionDef | ast.ClassDef)}
        assert not defined & policy_names, f"{path.name} defines {defined & policy_names}"


def test_no_io_shell_is_imported() -> None:
    for path in SIM:
        assert violations(path, SIMULATION_FORBIDDEN) == []
