"""The agent's side of its links: what it says to peers, and what it hears from them.

The node core (p2p.swarm.node) decides; this module carries out the part of
its decisions that goes to peers, and turns what peers say into the core's
events. It owns the node's `Connections` (accepting, dialling, bans, reports)
and makes each link (`Link`, which moves the bytes); it is the links' owner.

Out: a swarm's Request, Cancel, Advertise, Withdraw and Report, and the core's
SendJoin, Dial, ReportUnreachable and CloseLinks. Requests go to the link a
peer is joined on for that content (the core's join table); Haves, Pendings and
Withdraws go to every peer our Join went to, even before its Join came back, or
a chunk finished in that window would never be announced to it.

In: a Join becomes `JoinHeard` (the core tells a join from a restart and from a
second link), a Have, Pending or Withdraw of a joined peer its swarm's event, a
Reject a failed chunk; Pieces and relays go to the intake (p2p.intake). A Join
for a content we hold but do not swarm on opens a lazy session to seed it.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

from p2p import wire
from p2p.config import AgentConfig
from p2p.connections import Connections, Spawn
from p2p.content import ContentId, Manifest, PeerId
from p2p.intake import Intake
from p2p.link import Link, UploadGate
from p2p.metrics import AgentMetrics
from p2p.peer import PeerConnection, RateLimiter
from p2p.ratelimit import BURST_BYTES
from p2p.relay import Filling
from p2p.session import Session
from p2p.store import ChunkStore, StoreError
from p2p.swarm.events import ChunkFailed, Event, PeerHas, PeerPending, PeerWithdrew
from p2p.swarm.links import DialFailed, JoinHeard, LinkClosed, LinkId, LinkOpened
from p2p.swarm.node import Node, NodeEvent
from p2p.swarm.uploads import request_rank
from p2p.tracker_client import TrackerClient
from p2p.wire import Have, Join, Pending, Piece, pack_bits, unpack_bits

log = logging.getLogger(__name__)


class PeeringOwner(Protocol):
    """The agent, as the links see it: its sessions and node core, and where events go."""

    sessions: dict[ContentId, Session]
    node: Node

    def feed(self, session: Session, event: Event) -> None: ...
    def node_event(self, event: NodeEvent) -> None: ...
    def now(self) -> float: ...


class Peering:
    def __init__(self, owner: PeeringOwner, config: AgentConfig, secret: bytes, *,
                 store: ChunkStore, intake: Intake, tracker: TrackerClient,
                 metrics: AgentMetrics, spawn: Spawn,
                 seed: Callable[[Manifest], Awaitable[object]]) -> None:
        self._owner = owner
        self._config = config
        self._store = store
        self._intake = intake
        self._metrics = metrics
        self._spawn = spawn
        self._seed = seed
        self._upload = RateLimiter(config.upload_Bps, BURST_BYTES)
        self._upload_slots = UploadGate(config.upload_slots, config.upload_order)
        self._link_ids = itertools.count(1)
        self.conns = Connections(config, secret, self, new_link=self._new_link,
                                 tracker=tracker, metrics=metrics, spawn=spawn)

    def _new_link(self, conn: PeerConnection) -> Link:
        return Link(conn, LinkId(next(self._link_ids)), self, self._store, self._upload,
                    self._upload_slots)

    # ---- out ------------------------------------------------------------------

    def joined_link(self, content: ContentId, peer: PeerId) -> Link | None:
        """The link `peer` is joined on for `content`, if it is."""
        link_id = self._owner.node.links.link_of(content, peer)
        return None if link_id is None else self.conns.links.get(link_id)

    def request(self, session: Session, peer: PeerId, chunk: int) -> None:
        link = self.joined_link(session.content, peer)
        if link is None or link.closed:
            return  # (never: the swarm hears a peer lost as its link closes, and asks elsewhere)
        log.debug("request %s/%d from %s", session.content, chunk, peer)
        session.fetching(self._owner.now())
        self._intake.request(session, link, chunk)

    def cancel(self, content: ContentId, peer: PeerId, chunk: int, if_unsent: bool) -> None:
        link = self.joined_link(content, peer)
        if link is not None and (req := link.cancel(content, chunk, if_unsent)) is not None:
            self._intake.drop(link.id, req)

    def advertise(self, content: ContentId, chunk: int, pending: bool) -> None:
        self.tell_joined(content, Pending(content=content, chunk=chunk) if pending
                         else Have(content=content, chunk=chunk))

    def tell_joined(self, content: ContentId, msg: wire.Message) -> None:
        for link_id in self._owner.node.links.told(content):
            if (link := self.conns.links.get(link_id)) is not None:
                link.send_soon(msg)

    def send_join(self, link_id: LinkId, content: ContentId) -> None:
        link = self.conns.links.get(link_id)
        session = self._owner.sessions.get(content)
        if link is not None and session is not None:
            have, pending = session.swarm.join_view()
            link.send_soon(Join(content=content, have=pack_bits(have), pending=pending))

    def close_links(self, links: tuple[LinkId, ...], reason: str) -> None:
        log.warning("dropping a peer: %s", reason)
        for link_id in links:
            if (link := self.conns.links.get(link_id)) is not None:
                link.close(reason, hostile=True)

    # ---- ConnectionsOwner -----------------------------------------------------

    def link_opened(self, link: Link, dialled: bool) -> None:
        self._owner.node_event(LinkOpened(link.id, link.peer, dialled))

    def dial_failed(self, peer: PeerId, reason: str, hostile: bool, unreachable: bool) -> None:
        self._owner.node_event(DialFailed(peer, reason, hostile, unreachable))

    # ---- LinkOwner ------------------------------------------------------------

    def on_join(self, link: Link, msg: Join) -> None:
        content = ContentId(msg.content)
        session = self._owner.sessions.get(content)
        if session is None:
            manifest = next((m for m in self._store.known() if m.content_id == content), None)
            if manifest is not None:
                self._spawn(self._seed_from_store(link, manifest, msg))
            return
        try:
            have = unpack_bits(msg.have, session.manifest.chunks)
        except ValueError:
            have = []  # wrong length: the swarm treats it as a bad join
        self._owner.node_event(JoinHeard(content, link.peer, link.id, link.conn.remote.rack,
                                         tuple(have), tuple(msg.pending), link.conn.remote_ip))

    async def _seed_from_store(self, link: Link, manifest: Manifest, msg: Join) -> None:
        """A peer asks about a content we hold but do not swarm on: seed it."""
        try:
            await self._seed(manifest)
        except StoreError as exc:
            log.error("cannot seed %s: %s", manifest.content_id, exc)
            return
        if not link.closed:
            self.on_join(link, msg)  # heard now: the peer joins, and hears our Join

    def on_have(self, link: Link, msg: Have | Pending | wire.Withdraw) -> None:
        content = ContentId(msg.content)
        session = self._owner.sessions.get(content)
        if session is None or not self._owner.node.links.joined(content, link.peer):
            return
        event = PeerHas if isinstance(msg, Have) else \
            PeerPending if isinstance(msg, Pending) else PeerWithdrew
        if event is PeerWithdrew:
            self._metrics.withdrawals_heard.inc()
        self._owner.feed(session, event(link.peer, msg.chunk))

    async def on_piece(self, link: Link, msg: Piece, asked: tuple[ContentId, int] | None) -> bool:
        return await self._intake.on_piece(link, msg, asked)

    def relay_source(self, content: ContentId, chunk: int,
                     peer: PeerId | None = None) -> Filling | None:
        return self._intake.relay_source(content, chunk, peer)

    def on_reject(self, link: Link, content: ContentId, chunk: int, req: int,
                  reason: str) -> None:
        self._intake.drop(link.id, req)
        session = self._owner.sessions.get(content)
        if session is not None:
            self._owner.feed(session, ChunkFailed(chunk, link.peer, f"rejected: {reason}"))

    def on_relayed(self, result: str) -> None:
        self._metrics.relays.labels(result).inc()

    def on_served(self, nbytes: int) -> None:
        self._metrics.served_bytes.inc(nbytes)

    def on_cancelled(self) -> None:
        self._metrics.requests_cancelled.inc()

    def upload_rank(self, peer: PeerId, content: ContentId, due_ms: int) -> int:
        session = self._owner.sessions.get(content)
        held = 0 if session is None else session.swarm.peer_progress(peer)
        return request_rank(self._config.upload_order, held, due_ms)

    def request_due_ms(self) -> int:
        now = self._owner.now()
        ahead = round((self._owner.node.due(now) - now) * 1000)
        return max(-wire.MAX_DUE_MS, min(ahead, wire.MAX_DUE_MS))

    def chunk_count(self, content: ContentId) -> int | None:
        session = self._owner.sessions.get(content)
        return session.manifest.chunks if session is not None else None

    def link_ending(self, link: Link, reason: str, hostile: bool) -> None:
        self.conns.link_ending(link, reason, hostile)

    def link_closed(self, link: Link, reason: str, hostile: bool) -> None:
        self._intake.drop_link(link.id)
        self.conns.link_closed(link, hostile)
        self._owner.node_event(LinkClosed(link.id, reason, hostile))
