"""What the agent keeps per content, and its receive buffers.

A session is *lazy* when it was opened to read or prefetch: its swarm fetches
only the chunks asked for, and it serves, announces and takes more reads when
those are held. `ensure` makes it *eager*: it fetches every chunk, and is
complete when it holds them all.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from p2p.content import ContentId, Manifest
from p2p.relay import Filling
from p2p.swarm import Swarm, bits


class ContentFailed(Exception):
    """A content cannot be completed; the message says why."""


@dataclass(eq=False)
class Session:
    manifest: Manifest
    swarm: Swarm
    done: asyncio.Future[None]
    waiters: dict[int, list[asyncio.Future[None]]] = field(default_factory=dict)
    origin_tasks: dict[int, asyncio.Task[None]] = field(default_factory=dict)
    filling: dict[int, Filling] = field(default_factory=dict)  # origin reads under way
    origin_bytes: int = 0
    peer_bytes: int = 0
    started: float = 0.0
    started_wall: float = field(default_factory=time.time)  # the same moment, as a date
    first_fetch: float | None = None  # when a chunk was first asked of a peer or the origin
    finished: float | None = None
    pinned: bool = True  # attached in the store: not evictable
    failed: str | None = None  # why it stopped; the next request opens a new session

    @property
    def content(self) -> ContentId:
        return self.manifest.content_id

    def waiter(self, chunk: int, loop: asyncio.AbstractEventLoop) -> asyncio.Future[None]:
        """A future for a reader of `chunk`: `wake` resolves it (the node core says when),
        or it fails with the session."""
        fut: asyncio.Future[None] = loop.create_future()
        if self.done.done() and self.done.exception() is not None:
            fut.set_exception(self.done.exception())  # type: ignore[arg-type]
        else:
            self.waiters.setdefault(chunk, []).append(fut)
        return fut

    def wake(self, chunk: int) -> None:
        for fut in self.waiters.pop(chunk, []):
            if not fut.done():
                fut.set_result(None)

    def status(self, now: float, peers: int) -> dict[str, object]:
        """What `GET /v1/status` says of this content.

        `have` counts held chunks, `wanted` the chunks the swarm fetches (all of them
        unless `mode` is "lazy"); `peer_bytes` and `origin_bytes` count what this
        session received from peers (duplicates of the end game included) and read
        from the origin; `peers` counts the peers joined for it (the node core's)."""
        swarm = self.swarm
        return {
            "size": self.manifest.size,
            "chunks": self.manifest.chunks,
            "mode": "lazy" if swarm.lazy else "eager",
            "have": bits.count(swarm.have),
            "wanted": bits.count(swarm.wanted),
            "complete": swarm.complete,
            "failed": self.failed is not None,
            "failure": self.failed,
            "origin_bytes": self.origin_bytes,
            "peer_bytes": self.peer_bytes,
            "peers": peers,
            "seconds": round((self.finished or now) - self.started, 3),
            # When the session began (Unix time), and how long it took to ask for its first
            # chunk: the tracker's answer, the peers' joins, the origin's settle time.
            "started_at": round(self.started_wall, 3),
            "first_fetch_s": (None if self.first_fetch is None
                              else round(self.first_fetch - self.started, 3)),
        }

    def fetching(self, now: float) -> None:
        """A chunk is being asked of a peer or the origin (the first one sets first_fetch)."""
        if self.first_fetch is None:
            self.first_fetch = now


class BufferPool:
    """Chunk-sized receive buffers, reused: a fresh 4 MiB bytearray is zeroed first, and
    its pages faulted in. Up to `keep` free buffers of each size are kept."""

    def __init__(self, keep: int) -> None:
        self._keep = keep
        self._free: dict[int, list[bytearray]] = {}

    def take(self, size: int) -> bytearray:
        free = self._free.get(size)
        return free.pop() if free else bytearray(size)

    def give(self, buf: bytearray) -> None:
        free = self._free.setdefault(len(buf), [])
        if len(free) < self._keep:
            free.append(buf)
