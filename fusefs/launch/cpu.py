"""CPU seconds, as the launch's timeline and `bench launch` report them."""

from __future__ import annotations

import contextlib
import os
import resource
from collections.abc import Iterable
from pathlib import Path


def own_and_children() -> tuple[float, float]:
    """User + system seconds of this process, and of its finished (reaped) children."""
    own, done = (resource.getrusage(who) for who in (resource.RUSAGE_SELF,
                                                     resource.RUSAGE_CHILDREN))
    return own.ru_utime + own.ru_stime, done.ru_utime + done.ru_stime


def of_processes(pids: Iterable[int]) -> float:
    """User + system seconds the live processes `pids` have used so far (gone ones: 0)."""
    total, tick = 0.0, os.sysconf("SC_CLK_TCK")
    for pid in pids:
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
    return total
