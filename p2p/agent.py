"""The peer agent: one per node, thin asyncio glue around the swarm core.

For each content it serves or fetches, the agent keeps a `Session`: the
trusted manifest, the chunk store's view of it, and a `Swarm` that makes every
decision for that content. The swarms are driven through the node core
(p2p.swarm.node.Node): the agent hands it each swarm's events (a peer joined,
a chunk arrived) with `now = loop.time()`, and carries out the actions the
swarm returns, tagged with their content, in `_execute`. Peer connections
(`Link`) are shared by all sessions; origins are read through a per-origin
concurrency limit; every byte in and out passes the node's rate limits.

A chunk's bytes are verified by the store before they are stored, served or
read, whatever their source. Peers that send bad bytes are dropped and
reported by the swarm's decision; the agent only carries that out. A chunk
file that fails its check on the way out is reported by the store
(`on_damaged`) and fed to the swarm as `ChunkLost`, which fetches it again.
Store work that can block (put, reads, attach) runs in worker threads.

A session that fails (the store cannot write, no source within the
deadline) says why to every waiter, stops, and unpins its bytes; the next
request for the content opens a fresh session, so no failure is sticky.

Three rooms of the agent's work live beside it. The bytes coming in (requests'
Pieces, origin reads, relays' buffers, verifying and storing) are
p2p.intake's. Peer connections (accepting, dialling, address bans, reports
to the tracker) are p2p.connections'. Who is
joined for which content, on which link, is the node core's join table
(p2p.swarm.links): the agent tells it of links opened and closed, dials
failed and Joins heard, names each link by its `id`, carries out the
core's `Dial` and `SendJoin`, and asks it where a request or a have goes.

What spans contents is decided by the node core too, which the simulator
drives the same way: when to announce and what to ask the tracker for
(p2p.announcer carries the announces out and hands each session's swarm its
reply, `tracker_replied`), and when a blocked reader may read its chunk (it
is woken when the chunk is stored, not when it is announced to peers). The
core reacts to its swarms' actions itself (a content complete is announced
at once, one that aborts is left), and has one timer for itself and all its
swarms: the agent keeps one timer handle, re-armed after every call.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import random
from collections.abc import AsyncIterator, Coroutine
from pathlib import Path
from typing import Any, assert_never

from p2p import wire
from p2p.announcer import Announcer
from p2p.config import AgentConfig
from p2p.connections import Connections
from p2p.content import ContentId, Manifest, PeerId
from p2p.intake import Intake
from p2p.link import Link, UploadGate
from p2p.metrics import AgentMetrics
from p2p.origin import OriginPool
from p2p.peer import PeerConnection, PeerInfo, RateLimiter
from p2p.ratelimit import BURST_BYTES
from p2p.relay import Filling
from p2p.session import ContentFailed, Session
from p2p.store import ChunkStore, MissingChunk, StoreError
from p2p.swarm import Swarm, bits
from p2p.swarm.events import (
    Abort,
    Action,
    Advertise,
    Cancel,
    ChunkFailed,
    ChunkLost,
    Complete,
    Connect,
    Disconnect,
    Event,
    FetchFromOrigin,
    PeerHas,
    PeerHint,
    PeerPending,
    PeersFound,
    PeerWithdrew,
    PrefetchGiven,
    ReaderWants,
    Report,
    Request,
    WantedAll,
    Withdraw,
)
from p2p.swarm.links import (
    Dial,
    DialFailed,
    JoinHeard,
    LinkClosed,
    LinkId,
    LinkOpened,
    ReportUnreachable,
    SendJoin,
)
from p2p.swarm.node import (
    AnnounceAll,
    Announced,
    AnnounceFailed,
    ChunkStored,
    Leave,
    Node,
    NodeAction,
    NodeEvent,
    ReaderWaiting,
    SwarmActions,
    WakeReaders,
)
from p2p.swarm.uploads import request_rank
from p2p.tracker_client import (
    UNREACHABLE,
    AnnounceReply,
    TrackerClient,
    TrackerError,
    TrackerUnavailable,
)
from p2p.wire import Have, Join, Pending, Piece, pack_bits, unpack_bits

log = logging.getLogger(__name__)
GOODBYE_S = 1.5  # of the 5 s a stop may take: the tracker hears "stopped" within this
READ_ATTEMPTS = 3  # a chunk damaged this many times in a row during one read fails it


class Agent:
    def __init__(self, config: AgentConfig, secret: bytes) -> None:
        self.config = config
        self.metrics = AgentMetrics()
        self.store = ChunkStore(Path(config.store_dir), config.store_budget_bytes,
                                on_evict=self._from_store(self._evicted),
                                on_damaged=self._from_store(self._damaged))
        self.sessions: dict[ContentId, Session] = {}
        self._opening: dict[ContentId, asyncio.Future[Session]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._upload = RateLimiter(_bps(config.upload_mbps), BURST_BYTES)
        self._upload_slots = UploadGate(config.upload_slots, config.upload_order)
        self._origins = OriginPool(config.origin_concurrency)
        # Chunk buffers kept for reuse: enough for one content's requests and origin
        # reads in flight, since a fresh 4 MiB buffer costs page faults and zeroing.
        self._intake = Intake(self.store, self.metrics, self.sessions,
                              RateLimiter(_bps(config.download_mbps), BURST_BYTES),
                              self._origins,
                              config.swarm.max_inflight + config.swarm.max_origin_inflight,
                              feed=self._feed, stored=self._stored, failed=self._failed)
        self._rng = random.Random()
        self._link_ids = itertools.count(1)
        # Tracker requests leave from our own address, as peer dials do.
        self.tracker = TrackerClient(config.tracker, secret, bind_host=config.host)
        self.me: PeerInfo | None = None
        self._conns = Connections(config, secret, self, new_link=self._new_link,
                                  tracker=self.tracker, metrics=self.metrics, spawn=self._spawn)
        self.port = self._conns.port
        self._announcer = Announcer(self, self.tracker)
        self._node_timer: asyncio.TimerHandle | None = None
        self._node_timer_at: float | None = None
        self._stopping = False

    # ---- lifecycle ------------------------------------------------------------

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        peer = PeerId(self.config.resolved_peer_id(self.port))
        self.me = PeerInfo(peer, f"{self.config.host}:{self.port}", self.config.rack)
        self._conns.start(self.me)
        self.node = Node(self.config.announce_interval_s, self._loop.time(),
                         line_Bps=self.config.line_Bps)
        self._rearm_node()
        for manifest in self.store.known():
            try:  # seed what survived a restart; whoever still wants it all asks again
                await self._open_session(manifest, lazy=True)
            except StoreError as exc:
                log.error("cannot resume %s: %s", manifest.content_id, exc)

    async def stop(self) -> None:
        """Fail every waiter at once, say goodbye within GOODBYE_S, cancel everything."""
        self._stopping = True
        if self._node_timer is not None:
            self._node_timer.cancel()
            self._node_timer = None
        for session in list(self.sessions.values()):
            self._close_session(session)
        with contextlib.suppress(TrackerUnavailable, TrackerError, TimeoutError):
            await asyncio.wait_for(self._announcer.goodbye(), timeout=GOODBYE_S)
        self._conns.close_links("agent stopping")
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._conns.close()
        await self._origins.close()
        await self.tracker.close()

    def _from_store(self, callback: Any) -> Any:
        """A store callback, carried out on the event loop whichever thread calls it."""
        def hop(*args: Any) -> None:
            self._loop.call_soon_threadsafe(callback, *args)
        return hop

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("task %s failed", task.get_name(), exc_info=task.exception())

    # ---- the local API's verbs ------------------------------------------------

    async def ensure(self, content: ContentId, manifest: Manifest | None = None, *,
                     lazy: bool = False) -> Session:
        """The live session for `content`, fetching every chunk unless `lazy` (then it
        fetches what is read or prefetched; a lazy session asked for eagerly turns
        eager). A failed session is replaced by a fresh one, and a new content's
        manifest comes from the tracker unless given."""
        session = await self._live(content, manifest, lazy)
        if not lazy and session.swarm.lazy:
            self._feed(session, WantedAll())
        return session

    async def _live(self, content: ContentId, manifest: Manifest | None,
                    lazy: bool) -> Session:
        session = self.sessions.get(content)
        if session is not None and session.failed is None:
            return session
        if content in self._opening:
            return await asyncio.shield(self._opening[content])
        opening: asyncio.Future[Session] = self._loop.create_future()
        opening.add_done_callback(lambda f: f.exception() if not f.cancelled() else None)
        self._opening[content] = opening
        try:
            if manifest is None:
                manifest = (session.manifest if session is not None
                            else await self.tracker.get_manifest(content))
            if session is not None:
                log.info("content %s failed before (%s); trying again", content, session.failed)
            opened = await self._open_session(manifest, lazy)
        except BaseException as exc:
            opening.set_exception(exc)
            raise
        finally:
            del self._opening[content]
        opening.set_result(opened)
        return opened

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
            self._feed(session, ReaderWants(missing))
        for chunk, lo, hi in pieces:
            yield await self._read_piece(session, chunk, lo, hi)

    async def _read_piece(self, session: Session, chunk: int, lo: int, hi: int) -> memoryview:
        for _ in range(READ_ATTEMPTS):
            if not session.swarm.held(chunk):
                waiter = session.waiter(chunk, self._loop)
                self._node_event(ReaderWaiting(session.content, chunk))
                self._feed(session, ReaderWants((chunk,)))
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
        self._feed(session, PrefetchGiven(chunks))

    # ---- sessions -------------------------------------------------------------

    async def _open_session(self, manifest: Manifest, lazy: bool) -> Session:
        """Attach the content in the store (checking its files) and start its swarm.
        StoreError if the store cannot hold it."""
        present = await asyncio.to_thread(self.store.attach, manifest)
        old = self.sessions.get(manifest.content_id)
        if old is not None:
            self._close_session(old)  # (the node core forgets its joins when it is replaced)
        assert self.me is not None
        swarm = Swarm(self.me.peer, self.config.rack, manifest.chunks, present,
                      manifest.chunk_size, self.config.swarm, random.Random(self._rng.random()),
                      self._loop.time(), lazy=lazy)
        session = Session(manifest, swarm, self._new_done(), started=self._loop.time())
        self.sessions[manifest.content_id] = session
        self.metrics.contents.set(len(self.sessions))
        self.node.add(manifest.content_id, swarm, self._loop.time())  # announced at once
        self._node_execute(self.node.start(manifest.content_id, self._loop.time()))
        return session

    def _new_done(self) -> asyncio.Future[None]:
        done: asyncio.Future[None] = self._loop.create_future()
        done.add_done_callback(lambda f: f.exception() if not f.cancelled() else None)
        return done

    def _close_session(self, session: Session, why: str = "the agent is stopping") -> None:
        """Stop the session's work and fail whoever still waits on it."""
        current = asyncio.current_task()
        for task in session.origin_tasks.values():
            if task is not current:
                task.cancel()
        session.origin_tasks.clear()
        error = ContentFailed(why)
        if not session.done.done():
            session.done.set_exception(error)
        for futs in session.waiters.values():
            for fut in futs:
                if not fut.done():
                    fut.set_exception(error)
        session.waiters.clear()
        if session.pinned:
            session.pinned = False
            with contextlib.suppress(ValueError):
                self.store.detach(session.content)

    def _feed(self, session: Session, event: Event) -> None:
        """Hand `event` to the session's swarm, through the node core; a session that
        was replaced (its callbacks may still come) hears nothing more."""
        if self.sessions.get(session.content) is session:
            self._node_execute(self.node.swarm_event(session.content, event,
                                                     self._loop.time()))

    def _execute(self, session: Session, actions: list[Action]) -> None:
        content = session.content
        for action in actions:
            match action:
                case Connect(peer):
                    self._node_execute(self.node.connect(content, peer, self._loop.time()))
                case Request(peer, chunk):
                    self._request(session, peer, chunk)
                case FetchFromOrigin(chunk):
                    session.fetching(self._loop.time())
                    session.origin_tasks[chunk] = self._spawn(
                        self._intake.fetch_origin(session, chunk))
                case Cancel(peer, chunk, if_unsent):
                    link = self._joined_link(content, peer)
                    if link is not None \
                            and (req := link.cancel(content, chunk, if_unsent)) is not None:
                        self._intake.drop(link.id, req)
                case Disconnect(peer, reason, hostile):
                    self._disconnect(peer, reason, hostile)
                case Report(peer, reason):
                    self._spawn(self._conns.report(content, peer, reason))
                case Advertise(chunk, pending):
                    self._advertise(session, chunk, pending)
                case Withdraw(chunk):
                    self._tell_joined(session, wire.Withdraw(content=content, chunk=chunk))
                case Complete():
                    self._completed(session)
                case Abort(reason):
                    self._failed(session, reason)
                case _:
                    assert_never(action)
        self._pin_while_fetching(session)

    def _pin_while_fetching(self, session: Session) -> None:
        """Pin the content in the store while its swarm fetches, and only then.

        A complete content, or a lazy one that holds all it was asked for, is seeded
        while it stays but is not "in use": the store may evict it, least recently
        used first, for new ones (a lazy image on a node runs to many of those).
        Pinning again is bookkeeping under the store's lock: the content was
        verified when the session opened."""
        fetching = session.swarm.fetching
        if (fetching == session.pinned or session.failed is not None
                or self.sessions.get(session.content) is not session):
            return
        try:
            if fetching:
                self.store.attach(session.manifest)
            else:
                self.store.detach(session.content)
        except StoreError as exc:
            self._failed(session, str(exc))
            return
        session.pinned = fetching

    def _stored(self, session: Session, chunk: int) -> None:
        self._node_event(ChunkStored(session.content, chunk))  # wakes its readers

    def _node_event(self, event: NodeEvent) -> None:
        self._node_execute(self.node.handle(event, self._loop.time()))

    def _on_node_timer(self) -> None:
        self._node_timer = None
        before = self._request_timeouts()
        actions = self.node.handle_timer(self._loop.time())
        self.metrics.request_timeouts.inc(self._request_timeouts() - before)
        self._node_execute(actions)

    def _request_timeouts(self) -> int:
        """Requests the swarms gave up waiting for (they count them when their timer runs)."""
        return sum(s.swarm.stats["timeouts"] for s in self.sessions.values())

    def _node_execute(self, actions: list[NodeAction]) -> None:
        for action in actions:
            match action:
                case AnnounceAll(items):
                    self._spawn(self._announcer.send(items))
                case Leave(content):
                    self._spawn(self._announcer.gone(content))
                case WakeReaders(content, chunk):
                    if (session := self.sessions.get(content)) is not None:
                        session.wake(chunk)
                case SwarmActions(content, swarm_actions):
                    if (session := self.sessions.get(content)) is not None:
                        self._execute(session, swarm_actions)
                case SendJoin(link_id, content):
                    link = self._conns.links.get(link_id)
                    if link is not None and (session := self.sessions.get(content)) is not None:
                        link.send_soon(self._join_msg(session))
                case Dial(peer):
                    self._conns.dial(peer)
                case ReportUnreachable(content, peer):  # it may hold an origin-fetcher slot
                    self._spawn(self._conns.report(content, peer, UNREACHABLE))
                case _:
                    assert_never(action)
        self._rearm_node()

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

    def _completed(self, session: Session) -> None:
        session.finished = self._loop.time()
        if not session.done.done():
            session.done.set_result(None)
        log.info("content %s complete", session.content)

    def _evicted(self, content: ContentId) -> None:
        """The store deleted a complete content to make room: stop seeding it."""
        session = self.sessions.pop(content, None)
        if session is not None:
            log.info("content %s evicted from the store; no longer serving it", content)
            self._close_session(session, f"content {content} was evicted from the store")
            self.metrics.contents.set(len(self.sessions))
            self._node_execute(self.node.remove(content))

    def _failed(self, session: Session, reason: str) -> None:
        """The content cannot be completed now: say why, stop, unpin; the next request
        for it opens a new session."""
        if session.failed is not None:
            return
        message = f"content {session.content} cannot be completed: {reason}"
        log.error("%s", message)
        session.failed = reason
        self._close_session(session, message)
        self._node_execute(self.node.remove(session.content))

    def _damaged(self, content: ContentId, chunk: int) -> None:
        """The store deleted a chunk file that failed its check: fetch it again."""
        self.metrics.chunks_damaged.inc()
        session = self.sessions.get(content)
        if session is None or session.failed is not None:
            return
        if session.swarm.complete:
            session.finished = None
            session.done = self._new_done()  # not complete until the chunk is back
        self._feed(session, ChunkLost(chunk))

    # ---- peers ----------------------------------------------------------------

    def _join_msg(self, session: Session) -> Join:
        have = [session.swarm.held(c) for c in range(session.manifest.chunks)]
        fetching = session.origin_tasks.keys() | set(bits.indices(session.swarm.relayable))
        return Join(content=session.content, have=pack_bits(have), pending=tuple(sorted(fetching)))

    def _joined_link(self, content: ContentId, peer: PeerId) -> Link | None:
        """The link `peer` is joined on for `content`, if it is."""
        link_id = self.node.links.link_of(content, peer)
        return None if link_id is None else self._conns.links.get(link_id)

    def _request(self, session: Session, peer: PeerId, chunk: int) -> None:
        link = self._joined_link(session.content, peer)
        if link is None or link.closed:
            self._loop.call_soon(self._feed, session, ChunkFailed(chunk, peer, "no link"))
            return
        log.debug("request %s/%d from %s", session.content, chunk, peer)
        session.fetching(self._loop.time())
        self._intake.request(session, link, chunk)

    def _disconnect(self, peer: PeerId, reason: str, hostile: bool) -> None:
        """The node core left the peer out of this content; if it misbehaved, cut it off
        altogether: close every link to it."""
        links = [self._conns.links[i] for i in self.node.links.links_to(peer)] if hostile else []
        if links:
            log.warning("dropping peer %s: %s", peer, reason)
        for link in links:
            link.close(reason, hostile=True)

    def _advertise(self, session: Session, chunk: int, pending: bool) -> None:
        self._tell_joined(session, Pending(content=session.content, chunk=chunk) if pending
                          else Have(content=session.content, chunk=chunk))

    def _tell_joined(self, session: Session, msg: wire.Message) -> None:
        # Every peer we sent our Join to, even before its Join came back (the core
        # says on which link): otherwise a chunk finished in that window would
        # never be announced to it.
        for link_id in self.node.links.told(session.content):
            if (link := self._conns.links.get(link_id)) is not None:
                link.send_soon(msg)

    def _new_link(self, conn: PeerConnection) -> Link:
        return Link(conn, LinkId(next(self._link_ids)), self, self.store, self._upload,
                    self._upload_slots)

    # ---- ConnectionsOwner -----------------------------------------------------

    def link_opened(self, link: Link, dialled: bool) -> None:
        self._node_event(LinkOpened(link.id, link.peer, dialled))

    def dial_failed(self, peer: PeerId, reason: str, hostile: bool, unreachable: bool) -> None:
        self._node_event(DialFailed(peer, reason, hostile, unreachable))

    # ---- AnnouncerOwner -------------------------------------------------------

    def announced(self, interval_s: float | None, handed_out: tuple[PeerId, ...]) -> None:
        self._node_event(AnnounceFailed() if interval_s is None
                         else Announced(interval_s, handed_out))

    def tracker_replied(self, session: Session, reply: AnnounceReply) -> None:
        hints = []
        for info in reply.peers:
            self._conns.handed_out(info.peer, info.addr)
            hints.append(PeerHint(info.peer, info.rack))
        log.debug("tracker: %d peers for %s, origin slot %s of %s (%s filled)", len(hints),
                  session.content, reply.origin_slot, reply.origin_slots, reply.origin_filled)
        self._feed(session, PeersFound(tuple(hints), reply.origin_slot, reply.origin_slots,
                                       reply.origin_filled))

    # ---- LinkOwner ------------------------------------------------------------

    def on_join(self, link: Link, msg: Join) -> None:
        content = ContentId(msg.content)
        session = self.sessions.get(content)
        if session is None:
            self._answer_join_from_store(link, msg)
            return
        try:
            have = unpack_bits(msg.have, session.manifest.chunks)
        except ValueError:
            have = []  # wrong length: the swarm treats it as a bad join
        # The core tells a join from a restart (again on this link) and from a second
        # link to a peer joined already (both sides dialled at once).
        self._node_event(JoinHeard(content, link.peer, link.id, link.conn.remote.rack,
                                   tuple(have), tuple(msg.pending), link.conn.remote_ip))

    def _answer_join_from_store(self, link: Link, msg: Join) -> None:
        """A peer asks about a content we hold but are not swarming on: seed it."""
        manifests = {m.content_id: m for m in self.store.known()}
        if msg.content in manifests:
            self._spawn(self._seed_from_store(link, manifests[ContentId(msg.content)], msg))

    async def _seed_from_store(self, link: Link, manifest: Manifest, msg: Join) -> None:
        try:
            await self.ensure(manifest.content_id, manifest, lazy=True)
        except StoreError as exc:
            log.error("cannot seed %s: %s", manifest.content_id, exc)
            return
        if not link.closed:
            self.on_join(link, msg)  # heard now: the peer joins, and hears our Join

    def on_have(self, link: Link, msg: Have | Pending | wire.Withdraw) -> None:
        content = ContentId(msg.content)
        if content not in self.sessions or not self.node.links.joined(content, link.peer):
            return
        session = self.sessions[content]
        event = PeerHas if isinstance(msg, Have) else \
            PeerPending if isinstance(msg, Pending) else PeerWithdrew
        if event is PeerWithdrew:
            self.metrics.withdrawals_heard.inc()
        self._feed(session, event(link.peer, msg.chunk))

    async def on_piece(self, link: Link, msg: Piece, asked: tuple[ContentId, int] | None) -> bool:
        return await self._intake.on_piece(link, msg, asked)

    def relay_source(self, content: ContentId, chunk: int,
                     peer: PeerId | None = None) -> Filling | None:
        return self._intake.relay_source(content, chunk, peer)

    def on_reject(self, link: Link, content: ContentId, chunk: int, req: int,
                  reason: str) -> None:
        self._intake.drop(link.id, req)
        session = self.sessions.get(content)
        if session is not None:
            self._feed(session, ChunkFailed(chunk, link.peer, f"rejected: {reason}"))

    def on_relayed(self, result: str) -> None:
        self.metrics.relays.labels(result).inc()

    def on_served(self, nbytes: int) -> None:
        self.metrics.served_bytes.inc(nbytes)

    def on_cancelled(self) -> None:
        self.metrics.requests_cancelled.inc()

    def upload_rank(self, peer: PeerId, content: ContentId, due_ms: int) -> int:
        session = self.sessions.get(content)
        held = 0 if session is None else session.swarm.peer_progress(peer)
        return request_rank(self.config.upload_order, held, due_ms)

    def request_due_ms(self) -> int:
        now = self._loop.time()
        ahead = round((self.node.due(now) - now) * 1000)
        return max(-wire.MAX_DUE_MS, min(ahead, wire.MAX_DUE_MS))

    def chunk_count(self, content: ContentId) -> int | None:
        session = self.sessions.get(content)
        return session.manifest.chunks if session is not None else None

    def link_ending(self, link: Link, reason: str, hostile: bool) -> None:
        self._conns.link_ending(link, reason, hostile)

    def link_closed(self, link: Link, reason: str, hostile: bool) -> None:
        self._intake.drop_link(link.id)
        self._conns.link_closed(link, hostile)
        self._node_event(LinkClosed(link.id, reason, hostile))

    # ---- status ---------------------------------------------------------------

    def status(self) -> dict[str, object]:
        now = self._loop.time()
        contents = {content: s.status(now, self.node.links.peer_count(content))
                    for content, s in self.sessions.items()}
        return {"peer": self.me.peer if self.me else None, "port": self.port,
                "rack": self.config.rack, "peers_connected": self._conns.peer_count,
                "contents": contents}


def _bps(mbps: float | None) -> float | None:
    return mbps * 1e6 if mbps else None
