"""What the agent keeps per content, how a content's session lives and ends, and
the agent's receive buffers.

A session is *lazy* when it was opened to read or prefetch: its swarm fetches
only the chunks asked for, and it serves, announces and takes more reads when
those are held. `ensure` makes it *eager*: it fetches every chunk, and is
complete when it holds them all.

`Sessions` holds them, one live session per content: it opens one (attaching
the content in the store, which checks its files, and adding its swarm to the
node core), and ends it when it fails (the store cannot write, no source within
the deadline: every waiter hears why, its bytes are unpinned, and the next
request opens a fresh session, so no failure is sticky) or is evicted. It
pins a content in the store while the node core says its swarm fetches.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

from p2p.content import ContentId, Manifest
from p2p.metrics import AgentMetrics
from p2p.relay import Filling
from p2p.store import ChunkStore, StoreError
from p2p.swarm import Swarm, bits
from p2p.swarm.events import ChunkLost, Event
from p2p.swarm.node import Node, NodeAction

T = TypeVar("T")
log = logging.getLogger(__name__)


class ContentFailed(Exception):
    """A content cannot be completed; the message says why."""


class AgentStopping(ContentFailed):
    """The agent stopped while this waited on it: an agent started again can answer."""


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

    def complete(self, now: float) -> None:
        self.finished = now
        if not self.done.done():
            self.done.set_result(None)

    def chunk_lost(self, loop: asyncio.AbstractEventLoop) -> None:
        """A chunk of a complete content was lost: it is not complete until it is back."""
        if self.swarm.complete:  # (the swarm hears of the loss next)
            self.finished = None
            self.done = quiet_future(loop)

    def close(self, error: ContentFailed) -> None:
        """Stop its origin reads, and fail whoever still waits on it with `error`."""
        current = asyncio.current_task()
        for task in self.origin_tasks.values():
            if task is not current:
                task.cancel()
        self.origin_tasks.clear()
        if not self.done.done():
            self.done.set_exception(error)
        for futs in self.waiters.values():
            for fut in futs:
                if not fut.done():
                    fut.set_exception(error)
        self.waiters.clear()

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


class Sessions:
    """One live session per content; see the module docstring. `by_content` is read by
    the agent's rooms and changed only here."""

    def __init__(self, store: ChunkStore, metrics: AgentMetrics, *,
                 execute: Callable[[list[NodeAction]], None],
                 feed: Callable[[Session, Event], None]) -> None:
        self.by_content: dict[ContentId, Session] = {}
        self._opening: dict[ContentId, asyncio.Future[Session]] = {}
        self._store, self._metrics = store, metrics
        self._execute, self._feed = execute, feed

    def start(self, node: Node, new_swarm: Callable[[Manifest, list[bool], bool], Swarm]) -> None:
        self._node, self._new_swarm = node, new_swarm
        self._loop = asyncio.get_running_loop()

    async def live(self, content: ContentId, manifest: Manifest | None, lazy: bool,
                   fetch_manifest: Callable[[ContentId], Awaitable[Manifest]]) -> Session:
        """The live session of `content`, opened if there is none or it failed; one
        opening at a time, the others wait for it."""
        session = self.by_content.get(content)
        if session is not None and session.failed is None:
            return session
        if content in self._opening:
            return await asyncio.shield(self._opening[content])
        opening: asyncio.Future[Session] = quiet_future(self._loop)
        self._opening[content] = opening
        try:
            if manifest is None:
                manifest = (session.manifest if session is not None
                            else await fetch_manifest(content))
            if session is not None:
                log.info("content %s failed before (%s); trying again", content, session.failed)
            opened = await self.open(manifest, lazy)
        except BaseException as exc:
            opening.set_exception(exc)
            raise
        finally:
            del self._opening[content]
        opening.set_result(opened)
        return opened

    async def open(self, manifest: Manifest, lazy: bool) -> Session:
        """Attach the content in the store (checking its files) and start its swarm.
        StoreError if the store cannot hold it."""
        present = await asyncio.to_thread(self._store.attach, manifest)
        imported = await asyncio.to_thread(self._store.take_origin_read, manifest.content_id)
        content, now = manifest.content_id, self._loop.time()
        old = self.by_content.get(content)
        if old is not None:  # (the node core forgets its joins when it is replaced)
            self.close(old, f"content {content} was opened afresh")
        swarm = self._new_swarm(manifest, present, lazy)
        session = Session(manifest, swarm, quiet_future(self._loop), started=now,
                          origin_bytes=imported)
        self.by_content[content] = session
        self._metrics.contents.set(len(self.by_content))
        self._node.add(content, swarm, now)  # announced at once
        self._execute(self._node.start(content, now))
        return session

    def close(self, session: Session, why: str, *, stopping: bool = False) -> None:
        """Stop the session's work, fail whoever still waits on it (with AgentStopping if
        the agent is `stopping`), unpin its bytes."""
        session.close(AgentStopping(why) if stopping else ContentFailed(why))
        if session.pinned:
            session.pinned = False
            with contextlib.suppress(ValueError):
                self._store.detach(session.content)

    def failed(self, session: Session, reason: str) -> None:
        """The content cannot be completed now: say why, stop, unpin, leave."""
        if session.failed is not None:
            return
        message = f"content {session.content} cannot be completed: {reason}"
        log.error("%s", message)
        session.failed = reason
        self.close(session, message)
        self._execute(self._node.remove(session.content))

    def evicted(self, content: ContentId) -> None:
        """The store deleted a complete content to make room: stop seeding it."""
        session = self.by_content.pop(content, None)
        if session is not None:
            log.info("content %s evicted from the store; no longer serving it", content)
            self.close(session, f"content {content} was evicted from the store")
            self._metrics.contents.set(len(self.by_content))
            self._execute(self._node.remove(content))

    def damaged(self, content: ContentId, chunk: int) -> None:
        """The store deleted a chunk file that failed its check: fetch it again."""
        self._metrics.chunks_damaged.inc()
        session = self.by_content.get(content)
        if session is not None and session.failed is None:
            session.chunk_lost(self._loop)
            self._feed(session, ChunkLost(chunk))

    def pin(self, content: ContentId, pin: bool) -> None:
        """Pin or unpin a content in the store, as the node core says. Pinning again is
        bookkeeping under the store's lock: the content was verified when it opened."""
        session = self.by_content.get(content)
        if session is None or session.failed is not None or session.pinned == pin:
            return
        try:
            if pin:
                self._store.attach(session.manifest)
            else:
                self._store.detach(content)
        except StoreError as exc:
            self.failed(session, str(exc))
            return
        session.pinned = pin


def quiet_future(loop: asyncio.AbstractEventLoop) -> asyncio.Future[T]:
    """A future whose exception, if nobody waits for it, is not logged as never
    retrieved: a session's failure is told to whoever waits, and only to them."""
    fut: asyncio.Future[T] = loop.create_future()
    fut.add_done_callback(lambda f: f.exception() if not f.cancelled() else None)
    return fut


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
