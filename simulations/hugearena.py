"""The allocator of a run's process: CPython's small objects on transparent huge pages.

A big run is bound by memory latency, not by instructions: every event touches
another node's objects, spread over about a gigabyte at 10,000 nodes, and a
miss in the TLB comes on top of most cache misses. Backing the heap with 2 MiB
pages instead of 4 KiB ones removes most of those misses. With transparent huge
pages in `madvise` mode (the kernel's default) a program has to ask for them,
which neither CPython's small-object allocator (pymalloc, 1 MiB arenas from
plain mmap) nor glibc's malloc does by default. Two ways to ask, the first where
it is built:

- `simulations._hugearena` (C, optional in setup.py) replaces pymalloc's arena
  allocator with one that carves arenas from regions advised `MADV_HUGEPAGE`
  (the C file says how). `install()` must run at the start of the process,
  before the simulation's objects are made: `python -m simulations.hugearena
  ARGS` is `bootseer ARGS` with it installed first, which the compiled engine's
  child runs (simulations.compiled), and a sweep's local workers install it as a
  Dask preload (`dask_setup`).
- Without it, the process runs on glibc's malloc (`PYTHONMALLOC=malloc`), which
  asks for huge pages with `glibc.malloc.hugetlb=1` (glibc 2.35 and later).
  pymalloc is faster than glibc's malloc here; the pages are what gain.

Either way `GLIBC_TUNABLES` asks glibc for huge pages for what pymalloc passes to
it (objects over 512 bytes: dictionaries' tables, lists' arrays). The allocator
changes how long a run takes, never what it computes: no decision reads an
address. Settings the caller made stay as they were: a `PYTHONMALLOC` in the
environment (`pymalloc` to measure CPython's own allocator, say) keeps the
arenas out.
"""

from __future__ import annotations

import importlib.machinery
import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

HUGETLB = "glibc.malloc.hugetlb="
# Where the arena module's binary may be, relative to the directory holding `simulations`.
NATIVE = tuple(f"simulations/_hugearena{suffix}"
               for suffix in importlib.machinery.EXTENSION_SUFFIXES)


def built_in(root: Path) -> bool:
    """Whether the arena module is built in the `simulations` package under `root` (this
    installation's, or a compiled build that copied it)."""
    return any((root / name).is_file() for name in NATIVE)


def environ(base: Mapping[str, str], arenas: bool) -> dict[str, str]:
    """`base` with this module's allocator settings added where the caller made none:
    glibc's malloc unless the process will install the `arenas`, and huge pages for
    glibc's malloc in both cases."""
    env = dict(base)
    if not arenas:
        env.setdefault("PYTHONMALLOC", "malloc")
    tunables = env.get("GLIBC_TUNABLES", "")
    if HUGETLB not in tunables:
        env["GLIBC_TUNABLES"] = ":".join(filter(None, [tunables, HUGETLB + "1"]))
    return env


def install() -> bool:
    """Install the arena allocator in this process, if it is built and pymalloc is the
    allocator the environment chose (no `PYTHONMALLOC`); whether it is installed now."""
    if os.environ.get("PYTHONMALLOC"):
        return False
    try:
        from simulations import _hugearena
    except ImportError:
        return False
    _hugearena.install()
    return True


def stats() -> dict[str, Any] | None:
    """The arena allocator's counts and regions (`_hugearena.stats`); None if not built."""
    try:
        from simulations import _hugearena
    except ImportError:
        return None
    return _hugearena.stats()


def huge_page_bytes() -> tuple[int, int]:
    """(bytes on huge pages in the mappings that hold arena regions, in the whole process),
    from /proc/self/smaps: what the tests and the benchmark check. The kernel merges
    neighbouring mappings with the same flags, so the first may count a neighbour's."""
    found = stats()
    regions = [(start, start + size) for start, size in (found or {}).get("regions", [])]
    ours = total = 0
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        span = re.match(r"([0-9a-f]+)-([0-9a-f]+) ", line)
        if span:
            start, end = int(span[1], 16), int(span[2], 16)
            inside = any(start < hi and lo < end for lo, hi in regions)
        elif line.startswith("AnonHugePages:"):
            size = int(line.split()[1]) * 1024
            total += size
            ours += size if inside else 0
    return ours, total


def dask_setup(worker: object) -> None:
    """A Dask worker preload (`preload=["simulations.hugearena"]`): the arenas in a sweep's
    local worker before it runs a task."""
    install()


def main() -> None:
    """`python -m simulations.hugearena ARGS`: `bootseer ARGS` on the huge-page arenas."""
    install()
    from p2p.cli import main as bootseer

    sys.exit(bootseer(sys.argv[1:]))


if __name__ == "__main__":
    main()
