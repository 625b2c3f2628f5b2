"""What the agent keeps per content, and its receive buffers."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from p2p.content import ContentId, Manifest, PeerId
from p2p.link import Link
from p2p.swarm import Swarm


class ContentFailed(Exception):
    """A content cannot be completed; the message says why."""


@dataclass(eq=False)
class Session:
    manifest: Manifest
    swarm: Swarm
    done: asyncio.Future[None]
    links: dict[PeerId, Link] = field(default_factory=dict)
    waiters: dict[int, list[asyncio.Future[None]]] = field(default_factory=dict)
    origin_tasks: dict[int, asyncio.Task[None]] = field(default_factory=dict)
    timer: asyncio.TimerHandle | None = None
    wake_announcer: asyncio.Event = field(default_factory=asyncio.Event)
    announcer: asyncio.Task[None] | None = None
    origin_bytes: int = 0
    peer_bytes: int = 0
    started: float = 0.0
    finished: float | None = None
    pinned: bool = True  # attached in the store: not evictable
    failed: str | None = None  # why it stopped; the next request opens a new session

    @property
    def content(self) -> ContentId:
        return self.manifest.content_id


class BufferPool:
    """Chunk-sized receive buffers, reused: a fresh 4 MiB bytearray is zeroed first."""

    def __init__(self, keep: int = 4) -> None:
        self._keep = keep
        self._free: dict[int, list[bytearray]] = {}

    def take(self, size: int) -> bytearray:
        free = self._free.get(size)
        return free.pop() if free else bytearray(size)

    def give(self, buf: bytearray) -> None:
        free = self._free.setdefault(len(buf), [])
        if len(free) < self._keep:
            free.append(buf)
