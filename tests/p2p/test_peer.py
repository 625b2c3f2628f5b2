"""Peer connections over real loopback sockets, under uvloop and the stdlib loop.

Each test is a plain function that runs its scenario on a fresh loop of the
parametrized kind; misbehaving peers are raw sockets that speak the wire
format by hand. Rate limiting is checked on the TokenBucket with a fake clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import msgpack
import pytest
import uvloop
import xxhash

from p2p import bytepath, wire
from p2p.auth import AuthError, handshake_mac
from p2p.bytepath import Workers
from p2p.content import ContentId, PeerId
from p2p.link import Link, UploadGate
from p2p.peer import (
    ConnectionClosed,
    IdentityError,
    PeerConnection,
    PeerIdle,
    PeerInfo,
    RateLimiter,
    Timeouts,
    WrongPeer,
    accept,
    connect,
    listen_socket,
)
from p2p.ratelimit import TokenBucket
from p2p.store import ChunkStore
from p2p.swarm.links import LinkId
from p2p.swarm.uploads import UPLOAD_ORDER
from p2p.units import KiB, MiB
from p2p.wire import (
    Auth,
    Bye,
    Have,
    Hello,
    Join,
    LocalProtocolError,
    Piece,
    RemoteProtocolError,
)

C = "c1-" + "ab" * 32  # a well-formed content id
SERVER = PeerInfo(PeerId("server"), "127.0.0.1:7001", "rack-a")
CLIENT = PeerInfo(PeerId("client"), "127.0.0.1:7002", "rack-b")
SECRET = b"s" * 32
FAST = Timeouts(handshake_s=5.0, idle_s=5.0, frame_s=5.0)
LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "stdlib": asyncio.new_event_loop,
    "uvloop": uvloop.new_event_loop,
}

Run = Callable[[Callable[[], Awaitable[Any]]], Any]


@pytest.fixture(params=sorted(LOOPS))
def run(request: pytest.FixtureRequest) -> Run:
    """Run an async scenario to completion on a new loop of the parametrized kind."""

    def runner(scenario: Callable[[], Awaitable[Any]]) -> Any:
        async def bounded() -> Any:
            is_uvloop = isinstance(asyncio.get_running_loop(), uvloop.Loop)
            assert is_uvloop == (request.param == "uvloop")
            async with asyncio.timeout(30):
                return await scenario()

        with asyncio.Runner(loop_factory=LOOPS[request.param]) as r:
            return r.run(bounded())

    return runner


async def serve_one(listener: socket.socket, secret: bytes = SECRET,
                    timeouts: Timeouts = FAST) -> PeerConnection:
    sock, _ = await asyncio.get_running_loop().sock_accept(listener)
    return await accept(sock, SERVER, secret, timeouts)


async def pair(timeouts: Timeouts = FAST) -> tuple[PeerConnection, PeerConnection]:
    with listen_socket("127.0.0.1", 0) as listener:
        addr = f"127.0.0.1:{listener.getsockname()[1]}"
        return await asyncio.gather(serve_one(listener, SECRET, timeouts),
                                    connect(addr, CLIENT, SECRET, timeouts))


async def recv_frame(sock: socket.socket) -> wire.Message:
    loop = asyncio.get_running_loop()

    async def exactly(n: int) -> bytes:
        data = bytearray()
        while len(data) < n:
            chunk = await loop.sock_recv(sock, n - len(data))
            assert chunk, "peer closed"
            data += chunk
        return bytes(data)

    return wire.parse_header(await exactly(wire.parse_length(await exactly(4))))


async def raw_client(port: int, secret: bytes = SECRET) -> socket.socket:
    """A hand-driven client that completes the handshake and then obeys the test."""
    loop = asyncio.get_running_loop()
    sock = socket.socket()
    sock.setblocking(False)
    await loop.sock_connect(sock, ("127.0.0.1", port))
    nonce = os.urandom(16)
    await loop.sock_sendall(sock, Hello(wire.PROTOCOL_VERSION, "raw", "", "", nonce).encode())
    chal = await recv_frame(sock)
    assert isinstance(chal, wire.Challenge)
    mac = handshake_mac(secret, "client", nonce, chal.nonce, "raw", chal.peer)
    await loop.sock_sendall(sock, Auth(mac).encode())
    return sock


async def with_raw_client(timeouts: Timeouts, secret: bytes = SECRET,
                          ) -> tuple[PeerConnection, socket.socket]:
    with listen_socket("127.0.0.1", 0) as listener:
        port = listener.getsockname()[1]
        return await asyncio.gather(serve_one(listener, SECRET, timeouts),
                                    raw_client(port, secret))


def test_handshake_tells_each_side_who_the_other_is(run: Run) -> None:
    async def scenario() -> None:
        server, client = await pair()
        assert server.remote == CLIENT
        assert client.remote == SERVER
        await client.send(Have(C, 1))
        await server.send(Have(C, 2))
        assert await server.recv() == Have(C, 1)
        assert await client.recv() == Have(C, 2)
        client.close()
        with pytest.raises(ConnectionClosed):
            await server.recv()
        assert server.closed and client.closed

    run(scenario)


@pytest.mark.parametrize("wrong", ["client", "server"])
def test_wrong_secret_fails_on_both_sides(run: Run, wrong: str) -> None:
    async def scenario() -> None:
        with listen_socket("127.0.0.1", 0) as listener:
            addr = f"127.0.0.1:{listener.getsockname()[1]}"
            other = b"o" * 32
            results = await asyncio.gather(
                serve_one(listener, other if wrong == "server" else SECRET),
                connect(addr, CLIENT, other if wrong == "client" else SECRET, FAST),
                return_exceptions=True)
        assert [type(r) for r in results] == [AuthError, AuthError], results

    run(scenario)


def test_client_with_a_bad_mac_is_told_and_dropped(run: Run) -> None:
    async def scenario() -> None:
        with listen_socket("127.0.0.1", 0) as listener:
            port = listener.getsockname()[1]
            server, sock = await asyncio.gather(serve_one(listener), raw_client(port, b"x" * 32),
                                                return_exceptions=True)
        assert isinstance(server, AuthError)
        assert isinstance(sock, socket.socket)
        with sock:
            assert await recv_frame(sock) == Bye("auth failed")
            assert await asyncio.get_running_loop().sock_recv(sock, 10) == b""

    run(scenario)


def test_unsupported_version_is_refused(run: Run) -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        with listen_socket("127.0.0.1", 0) as listener, socket.socket() as sock:
            sock.setblocking(False)
            await loop.sock_connect(sock, listener.getsockname())
            other = wire.PROTOCOL_VERSION + 1
            await loop.sock_sendall(sock, Hello(other, "raw", "", "", bytes(16)).encode())
            with pytest.raises(RemoteProtocolError, match=f"version {other}"):
                await serve_one(listener)
            reply = await recv_frame(sock)
            assert isinstance(reply, Bye) and "version" in reply.reason

    run(scenario)


def test_silent_client_fails_the_handshake_in_time(run: Run) -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        with listen_socket("127.0.0.1", 0) as listener, socket.socket() as sock:
            sock.setblocking(False)
            await loop.sock_connect(sock, listener.getsockname())
            with pytest.raises(RemoteProtocolError, match="handshake"):
                await serve_one(listener, timeouts=Timeouts(handshake_s=0.3))

    run(scenario)


async def send_and_receive_piece(sender: PeerConnection, receiver: PeerConnection, path: Path,
                                 limiter: RateLimiter | None) -> bytes:
    payload = path.read_bytes()
    fd = os.open(path, os.O_RDONLY)
    try:
        send = asyncio.create_task(
            sender.send_piece(C, 3, 7, fd, 0, len(payload), limiter))
        header = await receiver.recv()
        assert header == Piece(C, 3, 7, 0, len(payload))
        buf = bytearray(len(payload))
        await receiver.recv_payload_into(memoryview(buf), limiter)
        await send
    finally:
        os.close(fd)
    return bytes(buf)


@pytest.mark.parametrize("limited", [False, True])
def test_8_mib_piece_arrives_intact(run: Run, tmp_path: Path, limited: bool) -> None:
    path = tmp_path / "chunk"
    path.write_bytes(os.urandom(8 * MiB))

    async def scenario() -> None:
        server, client = await pair()
        limiter = RateLimiter(1e12, 1 * MiB) if limited else None
        assert await send_and_receive_piece(server, client, path, limiter) == path.read_bytes()
        # and in the other direction, while header-only messages share the link
        fd = os.open(path, os.O_RDONLY)
        try:
            sends = [client.send(Have(C, i)) for i in range(50)]
            sends.insert(25, client.send_piece(C, 3, 7, fd, 0, 8 * MiB, limiter))
            tasks = [asyncio.create_task(s) for s in sends]
            haves, payload = [], bytearray(8 * MiB)
            for _ in range(51):
                msg = await server.recv()
                if isinstance(msg, Piece):
                    await server.recv_payload_into(memoryview(payload), limiter)
                else:
                    haves.append(msg)
            await asyncio.gather(*tasks)
        finally:
            os.close(fd)
        assert payload == path.read_bytes()
        assert sorted(h.chunk for h in haves if isinstance(h, Have)) == list(range(50))

    run(scenario)


def test_pieces_both_ways_at_once(run: Run, tmp_path: Path) -> None:
    path = tmp_path / "chunk"
    path.write_bytes(os.urandom(8 * MiB))

    async def scenario() -> None:
        server, client = await pair()
        got = await asyncio.gather(send_and_receive_piece(server, client, path, None),
                                   send_and_receive_piece(client, server, path, None))
        assert list(got) == [path.read_bytes()] * 2

    run(scenario)


def test_payload_can_be_discarded_but_not_skipped(run: Run, tmp_path: Path) -> None:
    path = tmp_path / "chunk"
    path.write_bytes(os.urandom(300 * KiB))

    async def scenario() -> None:
        server, client = await pair()
        fd = os.open(path, os.O_RDONLY)
        try:
            await server.send_piece(C, 0, 1, fd, 100, 300 * KiB - 100)
        finally:
            os.close(fd)
        await server.send(Have(C, 9))
        piece = await client.recv()
        assert isinstance(piece, Piece)
        with pytest.raises(LocalProtocolError):
            await client.recv()
        with pytest.raises(LocalProtocolError):
            await client.recv_payload_into(memoryview(bytearray(5)))
        await client.discard_payload(piece.len)
        assert await client.recv() == Have(C, 9)

    run(scenario)


def test_piece_beyond_the_file_is_refused_before_sending(run: Run, tmp_path: Path) -> None:
    path = tmp_path / "chunk"
    path.write_bytes(b"x" * 100)

    async def scenario() -> None:
        server, client = await pair()
        fd = os.open(path, os.O_RDONLY)
        try:
            with pytest.raises(LocalProtocolError):
                await server.send_piece(C, 0, 1, fd, 50, 51)
        finally:
            os.close(fd)
        await server.send(Have(C, 1))
        assert await client.recv() == Have(C, 1)

    run(scenario)


@pytest.mark.parametrize("prefix", [b"\xff\xff\xff\xff", b"\x00\x01\x00\x01", b"\x00\x00\x00\x00"])
def test_oversized_length_prefix_is_a_protocol_error(run: Run, prefix: bytes) -> None:
    async def scenario() -> None:
        server, sock = await with_raw_client(FAST)
        with sock:
            await asyncio.get_running_loop().sock_sendall(sock, prefix)
            with pytest.raises(RemoteProtocolError, match="header length"):
                await server.recv()
            assert server.closed

    run(scenario)


def test_oversized_piece_length_is_a_protocol_error(run: Run) -> None:
    async def scenario() -> None:
        server, sock = await with_raw_client(FAST)
        with sock:
            raw: bytes = msgpack.packb(
                {"t": "piece", "content": C, "chunk": 0, "req": 0, "off": 0, "len": 2**40})
            await asyncio.get_running_loop().sock_sendall(sock, len(raw).to_bytes(4, "big") + raw)
            with pytest.raises(RemoteProtocolError, match="len"):
                await server.recv()

    run(scenario)


async def drip(sock: socket.socket, data: bytes, every_s: float) -> None:
    for i in range(len(data)):
        await asyncio.get_running_loop().sock_sendall(sock, data[i:i + 1])
        await asyncio.sleep(every_s)


def test_slow_drip_header_is_a_protocol_error(run: Run) -> None:
    async def scenario() -> None:
        server, sock = await with_raw_client(Timeouts(idle_s=5.0, frame_s=1.0))
        with sock:
            # a long silence between frames is fine, a frame sent slowly is not
            await asyncio.sleep(1.2)
            await asyncio.get_running_loop().sock_sendall(sock, Have(C, 1).encode())
            assert await server.recv() == Have(C, 1)
            dripper = asyncio.create_task(drip(sock, Have(C, 2).encode(), 0.5))
            with pytest.raises(RemoteProtocolError, match="header"):
                await server.recv()
            dripper.cancel()

    run(scenario)


def test_slow_drip_payload_is_a_protocol_error(run: Run) -> None:
    async def scenario() -> None:
        timeouts = Timeouts(idle_s=5.0, frame_s=0.5, min_payload_rate_bps=1000)
        server, sock = await with_raw_client(timeouts)
        with sock:
            loop = asyncio.get_running_loop()
            await loop.sock_sendall(sock, Piece(C, 0, 0, 0, 1000).encode() + b"x" * 100)
            piece = await server.recv()
            assert isinstance(piece, Piece)
            dripper = asyncio.create_task(drip(sock, b"y" * 900, 0.2))
            with pytest.raises(RemoteProtocolError, match="payload"):
                await server.recv_payload_into(memoryview(bytearray(1000)))
            dripper.cancel()

    run(scenario)


def test_idle_peer_is_dropped(run: Run) -> None:
    async def scenario() -> None:
        server, client = await pair(Timeouts(idle_s=0.3))
        with pytest.raises(PeerIdle):
            await server.recv()
        assert server.closed
        with pytest.raises(ConnectionClosed):
            await client.recv()

    run(scenario)


def test_close_wakes_a_blocked_reader(run: Run) -> None:
    async def scenario() -> None:
        server, client = await pair()
        reader = asyncio.create_task(server.recv())
        await asyncio.sleep(0.05)
        server.close()
        with pytest.raises(ConnectionClosed):
            await reader
        with pytest.raises(ConnectionClosed):
            await server.send(Have(C, 1))
        client.close()

    run(scenario)


def test_close_wakes_a_blocked_sender(run: Run, tmp_path: Path) -> None:
    path = tmp_path / "chunk"
    path.write_bytes(bytes(64 * MiB))

    async def scenario() -> None:
        server, client = await pair()
        fd = os.open(path, os.O_RDONLY)
        try:
            sender = asyncio.create_task(server.send_piece(C, 0, 0, fd, 0, 64 * MiB))
            await asyncio.sleep(0.2)  # the client reads nothing: the sender is blocked
            assert not sender.done()
            server.close()
            with pytest.raises(ConnectionClosed):
                await sender
        finally:
            os.close(fd)
        client.close()

    run(scenario)


def test_peer_that_stops_reading_is_a_protocol_error(run: Run, tmp_path: Path) -> None:
    path = tmp_path / "chunk"
    path.write_bytes(bytes(64 * MiB))

    async def scenario() -> None:
        server, client = await pair(Timeouts(idle_s=0.3))
        fd = os.open(path, os.O_RDONLY)
        try:
            with pytest.raises(RemoteProtocolError, match="read nothing"):
                await server.send_piece(C, 0, 0, fd, 0, 64 * MiB)
        finally:
            os.close(fd)
        assert server.closed
        client.close()

    run(scenario)


def test_connect_to_a_closed_port_is_an_os_error(run: Run) -> None:
    async def scenario() -> None:
        with listen_socket("127.0.0.1", 0) as listener:
            addr = f"127.0.0.1:{listener.getsockname()[1]}"
        with pytest.raises(OSError):
            await connect(addr, CLIENT, SECRET, FAST)

    run(scenario)


# Identity: a claim is held against the address the connection comes from.


async def serve_checked(listener: socket.socket, known: dict[str, str]) -> PeerConnection:
    sock, _ = await asyncio.get_running_loop().sock_accept(listener)
    return await accept(sock, SERVER, SECRET, FAST, lambda peer: known.get(peer))


async def refused_by_server(client: PeerInfo, bind_host: str,
                            known: dict[str, str]) -> BaseException:
    """What the server raises when `client` (dialling from `bind_host`) connects."""
    with listen_socket("127.0.0.1", 0) as listener:
        addr = f"127.0.0.1:{listener.getsockname()[1]}"
        served, dialled = await asyncio.gather(
            serve_checked(listener, known),
            connect(addr, client, SECRET, FAST, bind_host=bind_host), return_exceptions=True)
    if isinstance(dialled, PeerConnection):
        with contextlib.suppress(ConnectionClosed, RemoteProtocolError):
            assert isinstance(await dialled.recv(), Bye)  # told why, then hung up
        dialled.close()
    assert isinstance(served, BaseException), "the server let the client in"
    return served


def test_client_claiming_an_address_it_does_not_connect_from_is_refused(run: Run) -> None:
    async def scenario() -> None:
        error = await refused_by_server(CLIENT, "127.0.0.2", {})  # claims 127.0.0.1:7002
        assert isinstance(error, IdentityError) and "127.0.0.2" in str(error)

    run(scenario)


def test_client_claiming_an_id_known_at_another_address_is_refused(run: Run) -> None:
    async def scenario() -> None:
        impostor = PeerInfo(PeerId("client"), "", "rack-b")  # no address claimed
        error = await refused_by_server(impostor, "127.0.0.2", {"client": "127.0.0.1"})
        assert isinstance(error, IdentityError) and "known at 127.0.0.1" in str(error)

    run(scenario)


def test_client_at_the_address_it_claims_and_is_known_at_gets_in(run: Run) -> None:
    async def scenario() -> None:
        me = PeerInfo(PeerId("client"), "127.0.0.2:7002", "rack-b")
        with listen_socket("127.0.0.1", 0) as listener:
            addr = f"127.0.0.1:{listener.getsockname()[1]}"
            server, client = await asyncio.gather(
                serve_checked(listener, {"client": "127.0.0.2"}),
                connect(addr, me, SECRET, FAST, bind_host="127.0.0.2"))
        assert server.remote == me and server.remote_ip == "127.0.0.2"
        server.close()
        client.close()

    run(scenario)


def test_dialer_that_reaches_another_peer_is_told_so(run: Run) -> None:
    async def scenario() -> None:
        with listen_socket("127.0.0.1", 0) as listener:
            addr = f"127.0.0.1:{listener.getsockname()[1]}"
            # The server proves "server": a stale address for "someone" ...
            served = asyncio.ensure_future(serve_one(listener))
            with pytest.raises(WrongPeer):
                await connect(addr, CLIENT, SECRET, FAST, expect=PeerId("someone"))
            (await served).close()
            # ... but an impostor if we know "server" at another address.
            served = asyncio.ensure_future(serve_one(listener))
            with pytest.raises(IdentityError, match=r"known at 10\.9\.9\.9"):
                await connect(addr, CLIENT, SECRET, FAST, expect=PeerId("someone"),
                              known_host=lambda peer: "10.9.9.9" if peer == "server" else None)
            (await served).close()

    run(scenario)


def test_big_header_before_the_handshake_is_refused_but_fine_after(run: Run) -> None:
    async def scenario() -> None:
        with listen_socket("127.0.0.1", 0) as listener:
            loop = asyncio.get_running_loop()
            sock = socket.socket()
            sock.setblocking(False)
            with sock:
                await loop.sock_connect(sock, listener.getsockname())
                served = asyncio.ensure_future(serve_one(listener))
                big = Hello(1, "a" * 200, "", "r" * 200, os.urandom(16)).encode()
                await loop.sock_sendall(sock, (4096).to_bytes(4, "big") + big[4:] * 10)
                with pytest.raises(RemoteProtocolError, match="before the handshake"):
                    await served
        server, client = await pair()
        join = Join(C, bytes(60 * KiB), ())
        await client.send(join)
        assert await server.recv() == join
        server.close()
        client.close()

    run(scenario)


# Rate limiting: the bucket on a fake clock (no wall clock in these tests).


def sent_by(bucket: TokenBucket, sizes: list[int], start: float = 0.0) -> list[float]:
    """When each send may start if every caller honours its wait, in order."""
    return [start + bucket.reserve(n, start) for n in sizes]


def test_bucket_allows_the_burst_then_the_rate() -> None:
    bucket = TokenBucket(1000.0, 500)
    assert bucket.reserve(500, 0.0) == 0.0
    assert bucket.reserve(100, 0.0) == pytest.approx(0.1)
    assert bucket.reserve(100, 0.0) == pytest.approx(0.2)  # queued behind the first
    assert bucket.reserve(100, 10.0) == 0.0  # refilled, but only up to the burst
    assert bucket.available(10.0) == pytest.approx(400)


def test_bucket_long_run_rate_never_exceeds_the_limit() -> None:
    rate, burst = 1e6, 64 * KiB
    bucket = TokenBucket(rate, burst)
    now, granted = 0.0, 0
    for step in range(2000):
        n = 1000 + (step * 7919) % (256 * KiB)
        now += bucket.reserve(n, now)  # the caller sleeps, then sends
        granted += n
        assert granted <= burst + rate * now + 1e-6
    assert granted / now == pytest.approx(rate, rel=0.05)


def test_bucket_grants_reservations_larger_than_the_burst() -> None:
    bucket = TokenBucket(100.0, 10)
    assert bucket.reserve(1010, 0.0) == pytest.approx(10.0)


def test_a_refund_goes_to_the_next_reservation_and_never_past_the_burst() -> None:
    bucket = TokenBucket(100.0, 10)
    assert bucket.reserve(10, 0.0) == 0.0
    assert bucket.reserve(100, 0.0) == pytest.approx(1.0)  # cancelled while it waits
    bucket.refund(100, 0.0)
    assert bucket.reserve(10, 0.0) == pytest.approx(0.1)  # as if it had never been asked
    bucket.refund(10**6, 0.0)
    assert bucket.available(0.0) == pytest.approx(10)  # a refund never exceeds the burst
    with pytest.raises(ValueError):
        bucket.refund(-1, 0.0)


def test_bucket_unlimited_and_clock_going_back() -> None:
    assert TokenBucket(None, 0).reserve(10**12, 0.0) == 0.0
    bucket = TokenBucket(10.0, 10)
    bucket.reserve(10, 5.0)
    assert bucket.reserve(10, 4.0) == pytest.approx(1.0)  # no refill from the past
    with pytest.raises(ValueError):
        TokenBucket(0.0, 10)
    with pytest.raises(ValueError):
        bucket.reserve(-1, 6.0)


# A link's requests against the node's download budget (p2p.link).


class _Owner:
    """The agent's side of a link, as far as sending requests needs it."""

    def request_due_ms(self) -> int:
        return 0

    def link_ending(self, link: Link, reason: str, hostile: bool) -> None:
        pass

    def link_closed(self, link: Link, reason: str, hostile: bool) -> None:
        pass


def test_a_request_cancelled_while_it_waits_for_budget_never_goes_out_and_refunds_it(
        run: Run, tmp_path: Path) -> None:
    async def scenario() -> None:
        ours, theirs = await pair()
        store = ChunkStore(tmp_path / "store", 64 * MiB)
        link = Link(ours, LinkId(1), _Owner(), store,  # type: ignore[arg-type]
                    RateLimiter(None), UploadGate(1, UPLOAD_ORDER))
        download = RateLimiter(100 * MiB, burst=1 * MiB)
        try:
            content = ContentId(C)
            link.request(content, 0, 1 * MiB, download)  # the burst: goes out at once
            second = link.request(content, 1, 10 * MiB, download)  # waits 0.1 s
            assert download.bucket.available(asyncio.get_running_loop().time()) < 0
            assert link.cancel(content, 1, if_unsent=True) == second
            assert download.bucket.available(asyncio.get_running_loop().time()) >= 0
            first = await theirs.recv()
            assert isinstance(first, wire.Request) and first.chunk == 0
            assert link.cancel(content, 0, if_unsent=True) is None  # sent: it stays asked
            await asyncio.sleep(0.3)  # past the cancelled request's wait
            link.request(content, 2, 1 * KiB, download)
            after = await theirs.recv()
            assert isinstance(after, wire.Request) and after.chunk == 2  # not chunk 1
        finally:
            link.close("test over")
            theirs.close()
    run(scenario)


class FilePuller:
    """A byte mover into `buf` and the file `fd`, hashing as it goes (as p2p.spool's)."""

    def __init__(self, buf: bytearray, fd: int) -> None:
        self.buf, self.fd, self.taken = memoryview(buf), fd, 0
        self.hasher = bytepath.xxh3_hasher() or xxhash.xxh3_128()
        self.calls = 0

    def __call__(self, sock_fd: int, filled: int, stop: int, wake: int,
                 lowat: int) -> bytepath.Pulled:
        self.calls += 1
        pulled = bytepath.pull(sock_fd, self.buf, self.taken, filled, stop, self.hasher,
                               self.fd, self.taken, wake=wake, lowat=lowat)
        self.taken = pulled.filled
        return pulled


def test_a_piece_pulled_by_a_byte_mover_arrives_intact(run: Run, byte_path: str,
                                                       tmp_path: Path) -> None:
    path = tmp_path / "chunk"
    path.write_bytes(os.urandom(8 * MiB))
    payload = path.read_bytes()

    async def scenario() -> None:
        server, client = await pair()
        fd = os.open(path, os.O_RDONLY)
        out = os.open(tmp_path / "copy", os.O_RDWR | os.O_CREAT)
        workers = Workers(2)
        try:
            send = asyncio.create_task(client.send_piece(C, 3, 7, fd, 0, len(payload)))
            assert await server.recv() == Piece(C, 3, 7, 0, len(payload))
            buf, seen = bytearray(len(payload)), []
            puller = FilePuller(buf, out)
            await server.recv_payload_pulled(memoryview(buf), puller, workers,
                                             progress=seen.append, step=1 * MiB)
            await send
            await client.send(Have(C, 9))  # the stream goes on after the payload
            assert await server.recv() == Have(C, 9)
        finally:
            os.close(fd)
            os.close(out)
            workers.close()
        assert buf == payload and (tmp_path / "copy").read_bytes() == payload
        assert puller.hasher.digest() == xxhash.xxh3_128(payload).digest()
        assert seen == sorted(seen) and seen[-1] == len(payload) and len(seen) >= 8

    run(scenario)


def test_slow_drip_payload_into_a_byte_mover_is_a_protocol_error(run: Run,
                                                                 byte_path: str) -> None:
    async def scenario() -> None:
        timeouts = Timeouts(idle_s=5.0, frame_s=0.5, min_payload_rate_bps=1000)
        server, sock = await with_raw_client(timeouts)
        workers = Workers(1)
        with sock:
            loop = asyncio.get_running_loop()
            await loop.sock_sendall(sock, Piece(C, 0, 0, 0, 1000).encode() + b"x" * 100)
            assert isinstance(await server.recv(), Piece)
            dripper = asyncio.create_task(drip(sock, b"y" * 900, 0.2))
            buf = bytearray(1000)
            with pytest.raises(RemoteProtocolError, match="payload"):
                await server.recv_payload_pulled(memoryview(buf), FilePuller(buf, -1), workers)
            dripper.cancel()
            assert server.closed
        workers.close()

    run(scenario)


def test_close_wakes_a_reader_whose_payload_a_byte_mover_pulls(run: Run,
                                                               byte_path: str) -> None:
    async def scenario() -> None:
        server, sock = await with_raw_client(FAST)
        workers = Workers(1)
        with sock:
            loop = asyncio.get_running_loop()
            await loop.sock_sendall(sock, Piece(C, 0, 0, 0, MiB).encode() + b"x" * 100)
            assert isinstance(await server.recv(), Piece)
            buf = bytearray(MiB)
            reader = asyncio.create_task(
                server.recv_payload_pulled(memoryview(buf), FilePuller(buf, -1), workers))
            await asyncio.sleep(0.1)
            server.close()
            with pytest.raises(ConnectionClosed):
                await reader
        workers.close()

    run(scenario)
