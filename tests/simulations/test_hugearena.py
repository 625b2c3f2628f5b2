"""pymalloc's arenas on huge pages (simulations._hugearena) and the allocator settings of a
run's process (simulations.hugearena). Each probe runs in a fresh interpreter: an arena
allocator, once installed, stays for the life of its process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from simulations import compiled, hugearena

# About 200 MB of small objects, made, freed and made again, after objects made before
# the arenas were installed are freed: what each probe reports about its allocator.
PROBE = """
import json, sys
from simulations import hugearena
early = [str(i) for i in range(300_000)]  # arenas of the interpreter's own allocator
installed = hugearena.install()
del early
made = [(i, str(i)) for i in range(2_000_000)]
first = hugearena.stats()
arena_huge, _ = hugearena.huge_page_bytes()
del made
freed = hugearena.stats()
made = [(i, str(i)) for i in range(2_000_000)]
again = hugearena.stats()
print(json.dumps({"installed": installed, "first": first, "freed": freed, "again": again,
                  "arena_huge": arena_huge, "module": hugearena.__file__}))
"""


def _probe(env: dict[str, str]) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-P", "-c", PROBE], env=env, capture_output=True,
                          text=True, cwd=compiled.source_root(), check=True)
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def _env(**changes: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONMALLOC", "GLIBC_TUNABLES")}
    env["PYTHONPATH"] = str(compiled.source_root())
    env.update({k: v for k, v in changes.items() if v is not None})
    return env


def _thp_enabled() -> bool:
    mode = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    return "[never]" not in mode


def test_the_arenas_come_from_huge_page_regions_and_are_reused_once_freed() -> None:
    assert hugearena.built_in(compiled.source_root())  # setup.py built it in place
    found = _probe(_env())
    first, freed, again = found["first"], found["freed"], found["again"]
    assert found["installed"] and first["installed"]
    assert first["arena_bytes"] == 1 << 20  # CPython 3.10+ on 64 bits
    assert first["arenas_in_use"] >= 150
    # Freed arenas go to the free list (not to the previous allocator, not leaked) ...
    assert freed["arenas_free"] >= first["arenas_in_use"] - 10
    assert freed["arenas_in_use"] + freed["arenas_free"] == \
           first["arenas_in_use"] + first["arenas_free"]
    # ... and are handed out again before a new region is mapped.
    assert len(again["regions"]) == len(first["regions"])
    assert all(start % (2 << 20) == 0 for start, _ in first["regions"])
    if _thp_enabled():
        assert found["arena_huge"] >= 64 << 20  # most of ~200 MB on 2 MiB pages


def test_a_process_the_caller_put_on_another_allocator_keeps_it() -> None:
    for setting in ("malloc", "pymalloc"):
        found = _probe(_env(PYTHONMALLOC=setting))
        assert not found["installed"] and not found["first"]["installed"]
        assert found["first"]["regions"] == []


def test_with_the_arenas_the_environment_leaves_pymalloc_and_asks_glibc_for_huge_pages() -> None:
    assert hugearena.environ({"PATH": "/bin"}, arenas=True) == {
        "PATH": "/bin", "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}
    off = {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}
    assert hugearena.environ(off, arenas=True) == off
