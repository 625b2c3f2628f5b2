"""The agent's peer connections: accepting, dialling, bans and reports.

Theory of operation. Every content's swarm shares the links to a peer; this
module opens them and knows where each peer is. The agent owns it; which
peers to dial, which link carries what, and who is joined is the node
core's (p2p.swarm.links). The owner hears of every link opened (dialled or
accepted) and of every dial that failed, through `ConnectionsOwner`.

Admission. An inbound connection is admitted or refused by a
`ConnectionGuard` (p2p.guard) right after accept, before its handshake costs
anything: caps on handshakes and connections, and addresses banned for
misbehaviour. Refusals are logged at most once per reason every few seconds.
An accept that fails (out of descriptors or memory) pauses the accept loop,
doubling up to ACCEPT_BACKOFF_MAX_S, rather than let it spin.

Identity by address. A node is known by the address it is seen at:
p2p.handshake checks every claim against it, and against the host the
tracker hands the peer out at (`handed_out`). We remember where each peer was
last seen, dialled or accepted, so that a report can name it even after the
link is gone.

Bans. A hostile drop (a link ended for misbehaviour, a handshake that lies
about its identity) bans that address here for a while and closes every link
from it; a dial to a banned address is not even tried.

Reports. The tracker hears about a peer that misbehaved (the swarm's
decision) or that it handed out and we cannot dial (it may hold an
origin-fetcher slot: `dial_failed` says whether it is that), naming the
address we saw it at; at most one report per peer, content and kind every
REPORT_EVERY_S.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
from collections import OrderedDict
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

from p2p.auth import AuthError
from p2p.config import AgentConfig
from p2p.content import ContentId, PeerId
from p2p.guard import ConnectionGuard, ConnectionLimits
from p2p.handshake import IdentityError, WrongPeer, addr_host, is_specific
from p2p.link import Link
from p2p.metrics import AgentMetrics
from p2p.peer import (
    ConnectionClosed,
    PeerConnection,
    PeerInfo,
    Timeouts,
    accept,
    connect,
    listen_socket,
)
from p2p.ratelimit import LogLimiter
from p2p.swarm.links import LinkId
from p2p.tracker_client import UNREACHABLE, TrackerClient, TrackerError, TrackerUnavailable
from p2p.wire import RemoteProtocolError, normal_ip

log = logging.getLogger(__name__)
ACCEPT_BACKOFF_S = 0.1  # first pause after a failed accept (out of descriptors, memory)
ACCEPT_BACKOFF_MAX_S = 1.0
REPORT_EVERY_S = 60.0  # one report per peer, content and kind of fault
MAX_REMEMBERED_PEERS = 4096  # where peers were last seen, for reports

Spawn = Callable[[Coroutine[Any, Any, Any]], asyncio.Task[Any]]


class ConnectionsOwner(Protocol):
    """Who hears of links opened and dials failed. `unreachable`: the tracker handed
    the peer out and it cannot be reached there (report it)."""

    def link_opened(self, link: Link, dialled: bool) -> None: ...
    def dial_failed(self, peer: PeerId, reason: str, hostile: bool,
                    unreachable: bool) -> None: ...


class Connections:
    """One node's links to its peers; see the module docstring."""

    def __init__(self, config: AgentConfig, secret: bytes, owner: ConnectionsOwner, *,
                 new_link: Callable[[PeerConnection], Link], tracker: TrackerClient,
                 metrics: AgentMetrics, spawn: Spawn) -> None:
        self.links: dict[LinkId, Link] = {}  # open links; the agent reads it, we change it
        self._config = config
        self._secret = secret
        self._owner = owner
        self._new_link = new_link
        self._tracker = tracker
        self._metrics = metrics
        self._spawn = spawn
        self._timeouts = Timeouts()
        self._server_sock = listen_socket(config.host, config.port)
        self.port: int = self._server_sock.getsockname()[1]
        own = frozenset({normal_ip(config.host)} if is_specific(config.host) else ())
        self._guard = ConnectionGuard(
            ConnectionLimits(config.max_connections, config.max_handshakes), own)
        self._quiet = LogLimiter()
        self._me: PeerInfo | None = None
        self._addrs: dict[PeerId, str] = {}
        self._known_by_tracker: set[PeerId] = set()
        self._seen_at: OrderedDict[PeerId, str] = OrderedDict()  # peer -> IP last seen at
        self._reported: dict[tuple[PeerId, ContentId, str], float] = {}  # -> quiet until

    def start(self, me: PeerInfo) -> None:
        self._me = me
        self._loop = asyncio.get_running_loop()
        self._spawn(self._accept_loop())

    def close_links(self, reason: str) -> None:
        for link in list(self.links.values()):
            link.close(reason)

    def close(self) -> None:
        self._server_sock.close()

    # ---- what the tracker told us ---------------------------------------------

    def handed_out(self, peer: PeerId, addr: str) -> None:
        """The tracker hands `peer` out at `addr`."""
        self._addrs[peer] = addr
        self._known_by_tracker.add(peer)

    def _known_host(self, peer: PeerId) -> str | None:
        """The host the tracker hands `peer` out at, if it does."""
        if peer in self._known_by_tracker and peer in self._addrs:
            return addr_host(self._addrs[peer])
        return None

    # ---- dialling -------------------------------------------------------------

    @property
    def peer_count(self) -> int:
        """Peers with an open link (two links to one peer are one peer)."""
        return len({link.peer for link in self.links.values()})

    def dial(self, peer: PeerId) -> None:
        """Dial `peer` (the node core asks once per peer at a time); the owner hears
        `link_opened` or `dial_failed`."""
        self._spawn(self._dial(peer))

    async def _dial(self, peer: PeerId) -> None:
        try:
            conn = await self._dial_checked(peer)
        except Exception as exc:  # any dial failure is a lost peer
            self._dial_failed(peer, exc)
            return
        self._adopt(conn, dialled=True)

    async def _dial_checked(self, peer: PeerId) -> PeerConnection:
        """A connection to `peer` from our own address, unless its address is banned here."""
        addr = self._addrs.get(peer)
        if addr is None:
            raise OSError(f"no address known for {peer}")
        ip = normal_ip(addr_host(addr))
        self._saw(peer, ip)
        if self._guard.banned(ip, self._loop.time()):
            raise IdentityError(f"{addr} is banned here for misbehaviour")
        assert self._me is not None
        return await connect(addr, self._me, self._secret, self._timeouts, expect=peer,
                             bind_host=self._config.host, known_host=self._known_host)

    def _dial_failed(self, peer: PeerId, exc: Exception) -> None:
        hostile = isinstance(exc, AuthError | RemoteProtocolError)
        log.log(logging.WARNING if hostile else logging.DEBUG,
                "cannot connect to %s: %s", peer, exc)
        if isinstance(exc, IdentityError) and (ip := self._seen_at.get(peer)):
            self._ban(ip, f"{peer}: {exc}")
        unreachable = isinstance(exc, OSError | WrongPeer) and peer in self._known_by_tracker
        self._owner.dial_failed(peer, f"connect failed: {exc}", hostile, unreachable)

    # ---- accepting ------------------------------------------------------------

    async def _accept_loop(self) -> None:
        pause = 0.0
        while True:
            try:
                sock, addr = await self._loop.sock_accept(self._server_sock)
            except OSError as exc:
                pause = self._accept_failed(exc, pause)
                await asyncio.sleep(pause)
                continue
            if pause:
                log.warning("accepting peer connections again")
                pause = 0.0
            self._admit(sock, normal_ip(str(addr[0])))

    def _accept_failed(self, exc: OSError, pause: float) -> float:
        """The next pause before accepting again; one log line per episode of failures.

        Out of descriptors or memory, the listening socket stays readable: without
        a pause the loop would spin; without the loop nothing is accepted again.
        """
        self._metrics.accept_errors.inc()
        if not pause:
            pressure = exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
            log.warning("cannot accept peer connections: %s%s; retrying every %gs at most",
                        exc.strerror or exc, " (raise the nofile limit?)" if pressure else "",
                        ACCEPT_BACKOFF_MAX_S)
        return min(ACCEPT_BACKOFF_MAX_S, 2 * pause or ACCEPT_BACKOFF_S)

    def _admit(self, sock: socket.socket, ip: str) -> None:
        """Start the handshake, or close at once: banned address or a cap reached."""
        refused = self._guard.admit(ip, self._loop.time())
        if refused is None:
            self._spawn(self._accept_one(sock, ip))
            return
        sock.close()
        self._metrics.connections_refused.labels(refused).inc()
        self._quietly(f"refused:{refused}", "closed a peer connection from %s at once: %s",
                      ip, refused.replace("_", " ") + ("" if refused == "banned" else " cap"))

    def _quietly(self, key: str, fmt: str, *args: object) -> None:
        """Log a warning, at most one per `key` every few seconds."""
        held = self._quiet.allow(key, self._loop.time())
        if held is not None:
            log.warning(fmt + (f" (and {held} more like it)" if held else ""), *args)

    async def _accept_one(self, sock: socket.socket, ip: str) -> None:
        assert self._me is not None
        try:
            conn = await accept(sock, self._me, self._secret, self._timeouts, self._known_host)
        except IdentityError as exc:
            self._ban(ip, str(exc))
            return
        except (AuthError, RemoteProtocolError, ConnectionClosed, OSError) as exc:
            self._quietly("handshake", "refused a peer connection from %s: %s", ip, exc)
            return
        finally:
            self._guard.handshake_ended(ip)
        if self._guard.banned(ip, self._loop.time()):  # banned while it authenticated
            conn.close()
            return
        self._adopt(conn, dialled=False)

    # ---- links ----------------------------------------------------------------

    def _adopt(self, conn: PeerConnection, dialled: bool) -> None:
        link = self._new_link(conn)
        self._guard.link_opened()
        self._saw(link.peer, conn.remote_ip)
        self.links[link.id] = link
        self._addrs.setdefault(link.peer, conn.remote.addr)
        self._metrics.peers_connected.set(self.peer_count)
        link.start()
        self._owner.link_opened(link, dialled)

    def link_ending(self, link: Link, reason: str, hostile: bool) -> None:
        self._guard.link_closed()
        if hostile:
            self._ban(link.conn.remote_ip, f"{link.peer}: {reason}")

    def link_closed(self, link: Link, hostile: bool) -> None:
        self.links.pop(link.id, None)
        self._metrics.peers_connected.set(self.peer_count)
        if hostile:
            self._metrics.peers_dropped.inc()

    def _saw(self, peer: PeerId, ip: str) -> None:
        self._seen_at[peer] = ip
        self._seen_at.move_to_end(peer)
        if len(self._seen_at) > MAX_REMEMBERED_PEERS:
            self._seen_at.popitem(last=False)

    def _ban(self, ip: str, reason: str) -> None:
        """Refuse `ip` for a while (see ConnectionGuard) and drop every link from it."""
        if not self._guard.ban(ip, self._loop.time()):
            return
        self._metrics.addresses_banned.inc()
        log.warning("banning address %s for %gs: %s", ip, self._guard.limits.ban_s, reason)
        for link in list(self.links.values()):
            if link.conn.remote_ip == ip:
                link.close(f"address {ip} is banned: {reason}", hostile=True)

    # ---- reports --------------------------------------------------------------

    async def report(self, content: ContentId, peer: PeerId, reason: str) -> None:
        """Tell the tracker, naming the address we saw the peer at; at most one report per
        peer, content and kind (unreachable or misbehaving) every REPORT_EVERY_S."""
        assert self._me is not None
        now = self._loop.time()
        key = (peer, content, UNREACHABLE if reason == UNREACHABLE else "hostile")
        if self._reported.get(key, 0.0) > now:
            return
        if len(self._reported) >= MAX_REMEMBERED_PEERS:
            self._reported = {k: t for k, t in self._reported.items() if t > now}
        self._reported[key] = now + REPORT_EVERY_S
        ip = self._seen_at.get(peer) or normal_ip(addr_host(self._addrs.get(peer, ""))) or None
        try:
            await self._tracker.report(self._me.peer, peer, content, reason, addr=ip)
        except (TrackerUnavailable, TrackerError) as exc:
            log.warning("could not report %s: %s", peer, exc)
