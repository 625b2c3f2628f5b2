"""The peer agent: one per node, thin asyncio glue around the node core.

For each content it serves or fetches, the agent keeps a `Session`: the
trusted manifest, the chunk store's view of it, and a `Swarm` that makes every
decision for that content. The swarms are driven through the node core
(p2p.swarm.node.Node), which the simulator drives the same way: the agent
hands it events with `now = loop.time()`, carries out the actions it returns
(`_node_execute`, and `_execute` for one swarm's), and keeps one timer handle
for it, re-armed after every call.

Beside the agent: sessions open, fail, end and are pinned by p2p.session's
`Sessions`; the bytes coming in (requests' Pieces, origin reads, relays,
verifying and storing) are p2p.intake's; what goes to and comes from peers
(links, Joins, Haves, dials, bans, reports) is p2p.peering's; announces are
p2p.announcer's. A chunk's bytes are verified by the store before they are
stored, served or read, whatever their source; a chunk file that fails its check
on the way out is reported by the store (`on_damaged`) and fetched again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, assert_never

from p2p import wire
from p2p.announcer import Announcer
from p2p.bytepath import Workers
from p2p.config import AgentConfig
from p2p.content import ContentId, Manifest, PeerId
from p2p.intake import Intake
from p2p.metrics import AgentMetrics
from p2p.origin import OriginPool
from p2p.peer import PeerInfo, RateLimiter
from p2p.peering import Peering
from p2p.ratelimit import BURST_BYTES
from p2p.session import ContentFailed, Session, Sessions
from p2p.store import ChunkStore, MissingChunk, StoreError
from p2p.swarm import Swarm
from p2p.swarm import events as ev
from p2p.swarm.links import CloseLinks, Dial, ReportUnreachable, SendJoin
from p2p.swarm.node import (
    AnnounceAll,
    Announced,
    AnnounceFailed,
    ChunkStored,
    Leave,
    Node,
    NodeAction,
    NodeEvent,
    Pin,
    ReaderWaiting,
    SwarmActions,
    Unpin,
    WakeReaders,
)
from p2p.tasks import Tasks
from p2p.tracker_client import (
    UNREACHABLE,
    AnnounceReply,
    TrackerClient,
    TrackerError,
    TrackerUnavailable,
)

log = logging.getLogger(__name__)
GOODBYE_S = 1.5  # of the 5 s a stop may take: the tracker hears "stopped" within this
READ_ATTEMPTS = 3  # a chunk damaged this many times in a row during one read fails it


class Agent:
    def __init__(self, config: AgentConfig, secret: bytes) -> None:
        self.config = config
        self.metrics = AgentMetrics()
        self.store = ChunkStore(Path(config.store_dir), config.store_budget_bytes,
                                on_evict=self._from_store(lambda c: self._sessions.evicted(c)),
                                on_damaged=self._from_store(
                                    lambda c, i: self._sessions.damaged(c, i)))
        self.metrics.watch_store(self.store)
        self._sessions = Sessions(self.store, self.metrics, execute=self._node_execute,
                                  feed=self.feed)
        self.sessions = self._sessions.by_content
        self._tasks = Tasks()
        self._origins = OriginPool(config.origin_concurrency)
        self._workers = Workers(config.data_threads)
        # Chunk buffers kept for reuse: enough for one content's requests and origin
        # reads in flight, since a fresh 4 MiB buffer costs page faults and zeroing.
        self._intake = Intake(self.store, self.metrics, self.sessions,
                              RateLimiter(config.download_Bps, BURST_BYTES), self._origins,
                              config.swarm.max_inflight + config.swarm.max_origin_inflight,
                              self._workers, movers=config.byte_movers,
                              feed=self.feed, stored=self._stored,
                              failed=self._sessions.failed)
        self._rng = random.Random()
        # Tracker requests leave from our own address, as peer dials do.
        self.tracker = TrackerClient(config.tracker, secret, bind_host=config.host)
        self.me: PeerInfo | None = None
        self._peering = Peering(self, config, secret, store=self.store, intake=self._intake,
                                tracker=self.tracker, metrics=self.metrics,
                                spawn=self._tasks.spawn, seed=self._seed)
        self._conns = self._peering.conns
        self.port = self._conns.port
        self._announcer = Announcer(self, self.tracker, self.metrics)
        self._node_timer: asyncio.TimerHandle | None = None
        self._node_timer_at: float | None = None
        self._stopping = False

    # ---- lifecycle ------------------------------------------------------------

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        peer = PeerId(self.config.resolved_peer_id(self.port))
        self.me = PeerInfo(peer, f"{self.config.host}:{self.port}", self.config.rack)
        self._conns.start(self.me)
        self.node = Node(self.config.announce_interval_s, self.now(),
                         line_Bps=self.config.line_Bps)
        self._sessions.start(self.node, self._new_swarm)
        self._rearm_node()
        self._tasks.spawn(self._announcer.check())
        for manifest in self.store.known():
            try:  # seed what survived a restart; whoever still wants it all asks again
                await self._sessions.open(manifest, lazy=True)
            except StoreError as exc:
                log.error("cannot resume %s: %s", manifest.content_id, exc)

    async def stop(self) -> None:
        """Fail every waiter at once, say goodbye within GOODBYE_S, cancel everything."""
        self._stopping = True
        if self._node_timer is not None:
            self._node_timer.cancel()
            self._node_timer = None
        for session in list(self.sessions.values()):
            self._sessions.close(session, "the agent is stopping", stopping=True)
        with contextlib.suppress(TrackerUnavailable, TrackerError, TimeoutError):
            await asyncio.wait_for(self._announcer.goodbye(), timeout=GOODBYE_S)
        self._conns.close_links("agent stopping")
        await self._tasks.cancel_all()
        self._conns.close()
        await self._origins.close()
        await self.tracker.close()
        self._workers.close()

    def now(self) -> float:
        return self._loop.time()

    def _from_store(self, callback: Callable[..., None]) -> Callable[..., None]:
        """A store callback, carried out on the event loop whichever thread calls it."""
        def hop(*args: Any) -> None:
            self._loop.call_soon_threadsafe(callback, *args)
        return hop

    # ---- the local API's verbs ------------------------------------------------

    async def ensure(self, content: ContentId, manifest: Manifest | None = None, *,
                     lazy: bool = False) -> Session:
        """The live session for `content`, fetching every chunk unless `lazy` (then it
        fetches what is read or prefetched; a lazy session asked for eagerly turns
        eager). A failed session is replaced by a fresh one, and a new content's
        manifest comes from the tracker unless given."""
        session = await self._sessions.live(content, manifest, lazy, self.tracker.get_manifest)
        if not lazy and session.swarm.lazy:
            self.feed(session, ev.WantedAll())
        return session

    async def _seed(self, manifest: Manifest) -> Session:
        return await self.ensure(manifest.content_id, manifest, lazy=True)

    async def wait_complete(self, content: ContentId) -> Session:
        session = await self.ensure(content)
        while not session.swarm.complete:  # `done` is renewed when a chunk is lost
            await asyncio.shield(session.done)
        return session

    async def read(self, content: ContentId, offset: int,
                   length: int) -> AsyncIterator[memoryview]:
        """Verified bytes [offset, offset + length), one chunk's piece at a time.

        Missing chunks are asked for at once (reader demand goes first), then each
        piece is read and checked in a worker thread as its chunk lands. A chunk found
        damaged on disk is fetched again and read again.
        """
        session = await self.ensure(content, lazy=True)
        pieces = list(self.store.read_range(content, offset, length))
        missing = tuple(c for c, _, _ in pieces if not session.swarm.held(c))
        if missing:
            self.feed(session, ev.ReaderWants(missing))
        for chunk, lo, hi in pieces:
            yield await self._read_piece(session, chunk, lo, hi)

    async def _read_piece(self, session: Session, chunk: int, lo: int, hi: int) -> memoryview:
        for _ in range(READ_ATTEMPTS):
            if not session.swarm.held(chunk):
                waiter = session.waiter(chunk, self._loop)
                self.node_event(ReaderWaiting(session.content, chunk))
                self.feed(session, ev.ReaderWants((chunk,)))
                await waiter
            try:
                return await asyncio.to_thread(self.store.read_chunk, session.content, chunk,
                                               lo, hi)
            except MissingChunk as exc:
                log.info("read of %s: %s", session.content, exc)
        raise ContentFailed(f"chunk {chunk} of {session.content} failed its check on disk "
                            f"{READ_ATTEMPTS} times in a row during one read; the disk under "
                            f"{self.store.root} may be failing")

    def prefetch(self, session: Session, chunks: tuple[int, ...]) -> None:
        self.feed(session, ev.PrefetchGiven(chunks))

    def status(self) -> dict[str, object]:
        now = self.now()
        contents = {content: s.status(now, self.node.links.peer_count(content))
                    for content, s in self.sessions.items()}
        return {"peer": self.me.peer if self.me else None, "port": self.port,
                "rack": self.config.rack, "peers_connected": self._conns.peer_count,
                "contents": contents}

    def _new_swarm(self, manifest: Manifest, present: list[bool], lazy: bool) -> Swarm:
        assert self.me is not None
        return Swarm(self.me.peer, self.config.rack, manifest.chunks, present,
                     manifest.chunk_size, self.config.swarm, random.Random(self._rng.random()),
                     self.now(), lazy=lazy)

    # ---- driving the node core --------------------------------------------------

    def feed(self, session: Session, event: ev.Event) -> None:
        """Hand `event` to the session's swarm, through the node core; a session that
        was replaced (its callbacks may still come) hears nothing more."""
        if self.sessions.get(session.content) is session:
            self._node_execute(self.node.swarm_event(session.content, event, self.now()))

    def node_event(self, event: NodeEvent) -> None:
        self._node_execute(self.node.handle(event, self.now()))

    def _stored(self, session: Session, chunk: int) -> None:
        self.node_event(ChunkStored(session.content, chunk))  # wakes its readers

    def _on_node_timer(self) -> None:
        self._node_timer = None
        before = self._request_timeouts()
        actions = self.node.handle_timer(self.now())
        self.metrics.request_timeouts.inc(self._request_timeouts() - before)
        self._node_execute(actions)

    def _request_timeouts(self) -> int:
        """Requests the swarms gave up waiting for (they count them when their timer runs)."""
        return sum(s.swarm.stats["timeouts"] for s in self.sessions.values())

    def _node_execute(self, actions: list[NodeAction]) -> None:
        peering = self._peering
        for action in actions:
            match action:
                case SwarmActions(content, swarm_actions):
                    if (session := self.sessions.get(content)) is not None:
                        self._execute(session, swarm_actions)
                case AnnounceAll(items):
                    self._tasks.spawn(self._announcer.send(items))
                case Leave(content):
                    self._tasks.spawn(self._announcer.gone(content))
                case WakeReaders(content, chunk):
                    if (session := self.sessions.get(content)) is not None:
                        session.wake(chunk)
                case Pin(content) | Unpin(content):
                    self._sessions.pin(content, type(action) is Pin)
                case SendJoin(link, content):
                    peering.send_join(link, content)
                case Dial(peer):
                    self._conns.dial(peer)
                case ReportUnreachable(content, peer):  # it may hold an origin-fetcher slot
                    self._tasks.spawn(self._conns.report(content, peer, UNREACHABLE))
                case CloseLinks(links, reason):
                    peering.close_links(links, reason)
                case _:
                    assert_never(action)
        self._rearm_node()

    def _execute(self, session: Session, actions: list[ev.Action]) -> None:
        content, peering = session.content, self._peering
        for action in actions:
            match action:
                case ev.Request(peer, chunk):
                    peering.request(session, peer, chunk)
                case ev.FetchFromOrigin(chunk):
                    session.fetching(self.now())
                    session.origin_tasks[chunk] = self._tasks.spawn(
                        self._intake.fetch_origin(session, chunk))
                case ev.Connect(peer):
                    self._node_execute(self.node.connect(content, peer, self.now()))
                case ev.Cancel(peer, chunk, if_unsent):
                    peering.cancel(content, peer, chunk, if_unsent)
                case ev.Advertise(chunk, pending):
                    peering.advertise(content, chunk, pending)
                case ev.Withdraw(chunk):
                    peering.tell_joined(content, wire.Withdraw(content=content, chunk=chunk))
                case ev.Report(peer, reason):
                    self._tasks.spawn(self._conns.report(content, peer, reason))
                case ev.Disconnect():
                    pass  # the node core dropped the join, and cuts a hostile peer off
                case ev.Complete():
                    session.complete(self.now())
                    log.info("content %s complete", content)
                case ev.Abort(reason):
                    self._sessions.failed(session, reason)
                case _:
                    assert_never(action)

    def _rearm_node(self) -> None:
        when = self.node.next_timer()
        if self._node_timer is not None:
            if self._node_timer_at == when:
                return  # most events (a chunk stored) leave it where it was
            self._node_timer.cancel()
            self._node_timer = None
        if when is not None and not self._stopping:
            # (uvloop's timer handles cannot say when they are due: remember it here)
            self._node_timer, self._node_timer_at = self._loop.call_at(
                when, self._on_node_timer), when

    # ---- AnnouncerOwner -------------------------------------------------------

    def announced(self, interval_s: float | None, handed_out: tuple[PeerId, ...]) -> None:
        self.node_event(AnnounceFailed() if interval_s is None
                        else Announced(interval_s, handed_out))

    def tracker_replied(self, session: Session, reply: AnnounceReply) -> None:
        hints = []
        for info in reply.peers:
            self._conns.handed_out(info.peer, info.addr)
            hints.append(ev.PeerHint(info.peer, info.rack))
        log.debug("tracker: %d peers for %s, origin slot %s of %s (%s filled)", len(hints),
                  session.content, reply.origin_slot, reply.origin_slots, reply.origin_filled)
        self.feed(session, ev.PeersFound(tuple(hints), reply.origin_slot, reply.origin_slots,
                                         reply.origin_filled))
