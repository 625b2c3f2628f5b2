"""Misbehaving and hand-driven peers for the fault tests (not a test module).

`HostilePeer` listens like an agent and announces itself to the tracker as a
complete seeder of one content. A node's identity is its address, so it runs
on a loopback address of its own (127.0.0.2 by default): its listener, its
tracker requests and its dials all come from there. It can also dial an
agent itself, claiming any peer id (`dial`), and come back under a new peer
id (`rename`). With the cluster secret it answers every Join
with all bits set and every Request with garbage of the right length: in one
Piece (`pieces="whole"`), in two, as a relay would (`"parts"`), or as a
second part with no first (`"gap"`), or never answers a Request at all
(`"silent"`); with another secret it is a listener that no honest agent can
authenticate with. Either way it records what happened to each connection,
so a test can check that honest agents dropped it.

`RawClient` (optionally bound to a source address) completes the client
handshake by hand over a plain socket and then lets the test send any bytes
at all (malformed frames, absurd length prefixes, one byte per second), and
tell when the agent hung up.

`fetch_chunk` asks an agent for one chunk as an ordinary peer would, to check
what agents serve.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections import Counter
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from p2p import wire
from p2p.auth import AuthError, handshake_mac
from p2p.content import ContentId, Manifest, PeerId
from p2p.peer import (
    ConnectionClosed,
    PeerConnection,
    PeerInfo,
    Timeouts,
    accept,
    connect,
    listen_socket,
)
from p2p.tracker_client import TrackerClient, TrackerError, TrackerUnavailable
from p2p.wire import Auth, Challenge, Hello, Join, Piece, RemoteProtocolError, Request

ANNOUNCE_EVERY_S = 1.0
TIMEOUTS = Timeouts(handshake_s=5.0, idle_s=60.0, frame_s=10.0)


@dataclass
class HostileLog:
    """What the hostile peer saw, per honest peer id."""

    accepted: int = 0  # TCP connections accepted
    auth_failures: list[str] = field(default_factory=list)  # handshakes that failed on auth
    handshakes: int = 0  # handshakes completed, either way
    dial_failures: list[str] = field(default_factory=list)  # our own dials that failed
    joined: set[PeerId] = field(default_factory=set)  # authenticated and sent Join
    garbage_sent: Counter[PeerId] = field(default_factory=Counter)  # bad pieces, per peer
    ignored: Counter[PeerId] = field(default_factory=Counter)  # requests left unanswered
    dues: list[int] = field(default_factory=list)  # the due_ms of every request, in order
    closed_by_peer: dict[PeerId, str] = field(default_factory=dict)  # who hung up on us, why


class HostilePeer:
    """A listener that serves garbage (or cannot authenticate), announced to the tracker."""

    def __init__(self, manifest: Manifest, secret: bytes, tracker_url: str,
                 tracker_secret: bytes, peer_id: str = "hostile", rack: str = "rack0",
                 host: str = "127.0.0.2", pieces: str = "whole") -> None:
        self.manifest = manifest
        self.pieces = pieces
        self.log = HostileLog()
        self.host = host
        self._secret = secret
        self._tracker_url, self._tracker_secret = tracker_url, tracker_secret
        self._tracker: TrackerClient | None = None
        self._http: aiohttp.ClientSession | None = None
        self._listener = listen_socket(host, 0)
        self.addr = f"{host}:{self._listener.getsockname()[1]}"
        self.info = PeerInfo(PeerId(peer_id), self.addr, rack)
        self.claim: str | None = None  # the peer id to prove to those who dial us, if not ours
        self._garbage = _garbage_fd(manifest.chunk_size)
        self._tasks: set[asyncio.Task[None]] = set()
        self.announce_errors: list[str] = []

    @property
    def tracker(self) -> TrackerClient:
        """The tracker, over connections from our own address."""
        if self._tracker is None:
            connector = aiohttp.TCPConnector(local_addr=(self.host, 0))
            self._http = aiohttp.ClientSession(connector=connector)
            self._tracker = TrackerClient(self._tracker_url, self._tracker_secret, self._http)
        return self._tracker

    async def start(self) -> None:
        """Announce once (so the tracker knows us before any agent asks), then keep at it."""
        await self._announce()
        self._spawn(self._announce_loop())
        self._spawn(self._accept_loop())

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._listener.close()
        os.close(self._garbage)
        with contextlib.suppress(TrackerUnavailable, TrackerError):
            await self.tracker.announce(self.manifest.content_id, self.info.peer, self.addr,
                                        self.info.rack, 0, False, event="stopped")
        if self._http is not None:
            await self._http.close()

    async def rename(self, peer_id: str, manifest: Manifest | None = None) -> None:
        """Come back under a new peer id (same address), seeding `manifest` if given."""
        self.manifest = manifest or self.manifest
        self.info = PeerInfo(PeerId(peer_id), self.addr, self.info.rack)
        await self._announce()

    async def dial(self, addr: str, claim: str, claim_addr: str | None = None) -> None:
        """Connect to the agent at `addr` as peer `claim` (listening at `claim_addr`, by
        default ours), join our content and serve garbage until it hangs up."""
        me = PeerInfo(PeerId(claim), self.addr if claim_addr is None else claim_addr, "rack0")
        try:
            conn = await connect(addr, me, self._secret, TIMEOUTS, bind_host=self.host)
        except (AuthError, RemoteProtocolError, ConnectionClosed, OSError) as exc:
            self.log.dial_failures.append(f"{type(exc).__name__}: {exc}")
            return
        self.log.handshakes += 1
        m = self.manifest
        await conn.send(Join(m.content_id, wire.pack_bits([True] * m.chunks), ()))
        await self._converse(conn, conn.remote.peer)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _announce(self) -> None:
        m = self.manifest
        await self.tracker.announce(m.content_id, self.info.peer, self.addr, self.info.rack,
                                     m.chunks, True)

    async def _announce_loop(self) -> None:
        while True:
            await asyncio.sleep(ANNOUNCE_EVERY_S)
            try:
                await self._announce()
            except (TrackerUnavailable, TrackerError) as exc:
                self.announce_errors.append(str(exc))

    async def _accept_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            sock, _ = await loop.sock_accept(self._listener)
            self.log.accepted += 1
            self._spawn(self._serve(sock))

    async def _serve(self, sock: socket.socket) -> None:
        try:
            me = self.info if self.claim is None else PeerInfo(PeerId(self.claim), self.addr,
                                                               self.info.rack)
            conn = await accept(sock, me, self._secret, TIMEOUTS)
        except AuthError as exc:
            self.log.auth_failures.append(str(exc))
            return
        except (RemoteProtocolError, ConnectionClosed, OSError):
            return
        self.log.handshakes += 1
        await self._converse(conn, conn.remote.peer)

    async def _converse(self, conn: PeerConnection, peer: PeerId) -> None:
        try:
            while True:
                await self._answer(conn, peer, await conn.recv())
        except (ConnectionClosed, RemoteProtocolError, OSError) as exc:
            self.log.closed_by_peer[peer] = f"{type(exc).__name__}: {exc}"
        finally:
            conn.close()

    async def _answer(self, conn: PeerConnection, peer: PeerId, msg: wire.Message) -> None:
        m = self.manifest
        match msg:
            case Join():
                self.log.joined.add(peer)
                await conn.send(Join(m.content_id, wire.pack_bits([True] * m.chunks), ()))
            case Request(content, chunk, req, due_ms) if content == m.content_id and \
                    self.pieces == "silent":
                self.log.dues.append(due_ms)
                self.log.ignored[peer] += 1
            case Request(content, chunk, req, due_ms) if content == m.content_id:
                self.log.dues.append(due_ms)
                length = m.chunk_length(chunk)
                if self.pieces == "whole":
                    await conn.send_piece(content, chunk, req, self._garbage, 0, length)
                else:
                    garbage = memoryview(os.urandom(length))
                    half = length // 2
                    if self.pieces == "parts":
                        await conn.send_piece_bytes(content, chunk, req, 0, garbage[:half])
                    await conn.send_piece_bytes(content, chunk, req, half, garbage[half:])
                self.log.garbage_sent[peer] += 1
            case Piece():
                await conn.discard_payload(msg.len)
            case _:
                pass


def _garbage_fd(size: int) -> int:
    """An in-memory file of `size` random bytes, for sendfile."""
    fd = os.memfd_create("bootseer-garbage")
    data = memoryview(os.urandom(size))
    while data:
        data = data[os.write(fd, data):]
    return fd


class RawClient:
    """A plain non-blocking socket to an agent's peer port, driven byte by byte."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.dripped = 0  # bytes `drip` got into the socket so far
        self._loop = asyncio.get_running_loop()

    @classmethod
    async def open(cls, addr: str, bind_host: str | None = None) -> RawClient:
        host, port = wire.split_addr(addr)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            if bind_host is not None:
                sock.bind((bind_host, 0))
            await asyncio.get_running_loop().sock_connect(sock, (host, port))
        except BaseException:
            sock.close()
            raise
        return cls(sock)

    @classmethod
    async def authenticated(cls, addr: str, secret: bytes, peer_id: str,
                            bind_host: str | None = None) -> RawClient:
        """Connected and past the handshake: the agent now takes us for a peer."""
        client = await cls.open(addr, bind_host)
        nonce = os.urandom(wire.NONCE_SIZE)
        await client.send(Hello(wire.PROTOCOL_VERSION, peer_id, "", "rack0", nonce).encode())
        challenge = await client.recv_message()
        if not isinstance(challenge, Challenge):
            raise AssertionError(f"expected a challenge, got {challenge}")
        await client.send(Auth(handshake_mac(secret, "client", nonce, challenge.nonce, peer_id,
                                             challenge.peer)).encode())
        return client

    async def send(self, data: bytes) -> None:
        await self._loop.sock_sendall(self.sock, data)

    async def first_bytes(self) -> bytes:
        """What the agent sends first (b"" if it closes or resets without a word)."""
        try:
            return await self._loop.sock_recv(self.sock, 65536)
        except ConnectionResetError:
            return b""

    async def recv_message(self) -> wire.Message:
        prefix = await self._exactly(wire.PREFIX_SIZE)
        return wire.parse_header(await self._exactly(wire.parse_length(prefix)))

    async def recv_exactly(self, n: int) -> bytes:
        return await self._exactly(n)

    async def _exactly(self, n: int) -> bytes:
        data = bytearray()
        while len(data) < n:
            got = await self._loop.sock_recv(self.sock, n - len(data))
            if not got:
                raise ConnectionClosed("closed mid-frame")
            data += got
        return bytes(data)

    async def drip(self, data: bytes, every_s: float = 1.0) -> None:
        """Send `data` one byte every `every_s` (counted in `dripped`) until the peer hangs up."""
        for i in range(len(data)):
            try:
                await self.send(data[i:i + 1])
            except OSError:
                return
            self.dripped += 1
            await asyncio.sleep(every_s)

    async def closed_by_peer(self) -> str:
        """Read (and drop) whatever comes until the peer closes; how it closed."""
        while True:
            try:
                got = await self._loop.sock_recv(self.sock, 65536)
            except ConnectionResetError:
                return "reset"
            if not got:
                return "eof"

    def close(self) -> None:
        self.sock.close()


async def fetch_chunk(addr: str, secret: bytes, content: ContentId, chunk: int,
                      length: int, peer_id: str = "probe", bind_host: str | None = None,
                      ) -> bytes:
    """Chunk `chunk` as agent `addr` serves it to an authenticated peer."""
    me = PeerInfo(PeerId(peer_id), "", "rack0")
    conn = await connect(addr, me, secret, TIMEOUTS, bind_host=bind_host)
    try:
        await conn.send(Request(content, chunk, 1))
        while True:
            msg = await conn.recv()
            if isinstance(msg, Piece):
                if (msg.chunk, msg.len) != (chunk, length):
                    raise AssertionError(f"asked for chunk {chunk}, got {msg}")
                buf = bytearray(length)
                await conn.recv_payload_into(memoryview(buf))
                return bytes(buf)
            if isinstance(msg, wire.Reject):
                raise AssertionError(f"{addr} rejected chunk {chunk}: {msg.reason}")
    finally:
        conn.close()
