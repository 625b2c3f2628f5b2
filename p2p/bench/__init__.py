"""`bootseer bench`: the swarm benchmark, and the parser that gathers every package's
benchmarks. Product code never imports this room.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def workdir(given: Path | None, bench: str) -> Iterator[Path]:
    """Where a benchmark keeps its logs and stores: `given` (--workdir, kept afterwards,
    made if missing), else a temporary directory removed at the end."""
    if given is not None:
        given.mkdir(parents=True, exist_ok=True)
        yield given
        return
    with tempfile.TemporaryDirectory(prefix=f"bootseer-bench-{bench}-") as scratch:
        yield Path(scratch)
