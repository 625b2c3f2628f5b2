"""Progress of long work, as people and logs each want it.

On a terminal (stderr is a TTY) a bar redrawn in place: bytes held of the total,
the rate and the time left (tqdm). Anywhere else a plain line every
`PLAIN_EVERY_S` (10 s; `BOOTSEER_PROGRESS_EVERY_S` sets another), so a log
shows that the work moves without a line per refresh, and no control
characters. The caller reports what it knows (`update(done, peers, origin)`);
this module only decides how it is shown. `while_fetching` does the reporting
for work that fetches contents through the local agent (get, image pull,
snapshot restores): it reads the agent's status while the work runs.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Awaitable, Sequence
from typing import IO, Any, Protocol, TypeVar

PLAIN_EVERY_S = 10.0
REFRESH_S = 0.5  # how often callers look at the work and report it
MB = 1e6
T = TypeVar("T")


class StatusSource(Protocol):
    async def status(self) -> dict[str, Any]: ...


class Progress:
    """The progress of `what` towards `total` bytes, shown on `stream`."""

    def __init__(self, what: str, total: int, stream: IO[str] | None = None) -> None:
        self.what = what
        self.total = total
        self.stream = stream or sys.stderr
        self._bar: Any = None
        self._every_s = float(os.environ.get("BOOTSEER_PROGRESS_EVERY_S") or PLAIN_EVERY_S)
        self._next_line = time.monotonic() + self._every_s
        if self.stream.isatty():
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=what, unit="B", unit_scale=True,
                             unit_divisor=1000, file=self.stream, leave=True,
                             dynamic_ncols=True)

    def update(self, done: int, peer_bytes: int, origin_bytes: int) -> None:
        if self._bar is not None:
            self._bar.set_postfix_str(f"peers {peer_bytes / MB:,.1f} MB, "
                                      f"origin {origin_bytes / MB:,.1f} MB", refresh=False)
            self._bar.update(done - self._bar.n)
        elif time.monotonic() >= self._next_line:
            self._next_line = time.monotonic() + self._every_s
            self.stream.write(f"{self.what}: {done / MB:,.1f} of {self.total / MB:,.1f} MB "
                              f"(from peers {peer_bytes / MB:,.1f} MB, from the origin "
                              f"{origin_bytes / MB:,.1f} MB)\n")
            self.stream.flush()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


async def while_fetching(agent: StatusSource, what: str, contents: Sequence[str],
                         work: Awaitable[T], *, total: int | None = None,
                         show: bool = True) -> T:
    """Await `work` (which fetches `contents` through `agent`), showing their progress:
    bytes held of their `total`, and how many came from peers and from the origin.
    Without `total`, it is known once the agent has opened them all."""
    if not show:
        return await work
    task = asyncio.ensure_future(work)
    progress = None
    try:
        while not task.done():
            await asyncio.wait([task], timeout=REFRESH_S)
            status = await agent.status()
            if total is None and not all(c in status["contents"] for c in contents):
                continue  # not all opened yet: the total is not known
            held = totals(status, contents)
            progress = progress or Progress(what, total or held["bytes"])
            progress.update(held["have_bytes"], held["peer_bytes"], held["origin_bytes"])
        return await task
    finally:
        task.cancel()
        if progress is not None:
            progress.close()


def totals(status: dict[str, Any], contents: Sequence[str]) -> dict[str, int]:
    """What the agent's `status` says of `contents` together: their size (`bytes`), the
    bytes held (`have_bytes`), and those it received from peers and read from the origin."""
    out = {"bytes": 0, "have_bytes": 0, "peer_bytes": 0, "origin_bytes": 0}
    for content in contents:
        info = status["contents"].get(content, {})
        size, chunks = info.get("size", 0), max(info.get("chunks", 1), 1)
        out["bytes"] += size
        out["have_bytes"] += size if info.get("complete") else size * info.get("have", 0) // chunks
        out["peer_bytes"] += info.get("peer_bytes", 0)
        out["origin_bytes"] += info.get("origin_bytes", 0)
    return out
