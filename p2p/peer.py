"""One authenticated peer connection over a raw non-blocking socket (asyncio).

Theory of operation. The connection speaks the frames of p2p.wire over a
plain non-blocking TCP socket driven with the loop's low-level calls, so it
runs the same on uvloop and on the stdlib loop, and chunk bytes never pass
through Python objects:

- Reads call `recv_into` at once, and wait for readability (`loop.add_reader`
  and a future) only when the socket holds nothing: the loop's own
  `sock_recv_into` registered and removed the descriptor for every read.
- Headers are read into one reused buffer with a start/end window
  (compacted in place, never grown: no `bytes +=`).
- A payload is read straight into the caller's memoryview, woken only once
  WAKE_BYTES have arrived (SO_RCVLOWAT, set back to 1 for headers). Only the
  few KiB that a header read may have pulled in past the header are copied
  from the buffer.
- Or a payload is read by a byte mover (`recv_payload_pulled`): one call in
  one of the node's byte-moving threads (p2p.bytepath) receives, hashes and
  writes as much of it as keeps coming, so the loop runs once per piece, not
  once per read; when the socket stays empty the loop waits for it as above.
- A payload is sent with `os.sendfile` from the caller's file descriptor
  until the socket buffer is full (BlockingIOError), then the task waits
  for writability with `loop.add_writer` and a future. uvloop has no
  `loop.sendfile`; this path is zero-copy on both loops. The parts of a
  relay (a chunk still arriving from the origin) are sent from memory.
- Sends hold an asyncio.Lock for a whole frame, so frames never interleave.
  Receives are meant for one reader task.

Memory before authentication. Until the handshake is done a connection owns
a buffer of HANDSHAKE_BUFFER_BYTES (a Hello, Challenge or Auth fits; a bigger
header is a RemoteProtocolError), so idle unauthenticated connections cost
little; the full header buffer is allocated once the peer is authenticated.
The handshake itself, with the identity checks, lives in p2p.handshake.

Time limits (Timeouts): the whole handshake must finish within
`handshake_s`; between frames the link may stay silent for `idle_s`; a
header whose first byte has arrived must be complete within `frame_s`; a
payload of n bytes must arrive within `frame_s + n / min_payload_rate_bps`
of reading time (time spent waiting on our own RateLimiter does not count).
A peer that breaks them is a RemoteProtocolError (a slow drip is an attack
on our memory and our requests, not a slow network). A send that finds the
peer reading nothing for `idle_s` is one too.

Errors. RemoteProtocolError: the peer broke the protocol or a time limit.
ConnectionClosed: EOF, reset, or closed here. AuthError: the handshake
failed. LocalProtocolError: our own misuse. After any of these except
LocalProtocolError raised before anything was sent or read, the connection
is closed. `close()` shuts the socket down at once, which wakes any task
still blocked on it; the descriptor itself is closed when the last of them
has returned, so the loop never watches a closed descriptor.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import socket
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from p2p import wire
from p2p.bytepath import CLOSED, DRAINED, Pulled, Workers
from p2p.content import PeerId
from p2p.handshake import (
    AUTH_FAILED,
    IdentityError,
    KnownHost,
    PeerInfo,
    WrongPeer,
    client_handshake,
    is_specific,
    server_handshake,
)
from p2p.ratelimit import TokenBucket
from p2p.units import KiB, MiB
from p2p.wire import LocalProtocolError, Message, Piece, RemoteProtocolError, normal_ip

__all__ = ["AUTH_FAILED", "ConnectionClosed", "IdentityError", "PeerConnection", "PeerIdle",
           "PeerInfo", "Puller", "RateLimiter", "Timeouts", "WrongPeer", "accept", "connect",
           "listen_socket"]

SLICE_BYTES = 256 * KiB  # payload bytes per limiter grant
HEADER_READ_BYTES = 16 * KiB  # most bytes one header read asks for: bounds payload copying
# A payload read waits until this much has arrived (or the rest of the payload): on one
# pair over loopback, per-segment wake-ups sent an ACK, and ran the sender's transmit,
# for every 240 KiB read on average (perf: 10% of the agents' samples; strace).
WAKE_BYTES = 512 * KiB
# A byte mover's poll wakes later: each wake is a context switch of its thread
# (finish_task_switch 9% of the agents' samples at 512 KiB, one pair).
MOVER_WAKE_BYTES = 2 * MiB
_BUFFER_BYTES = wire.PREFIX_SIZE + wire.MAX_HEADER + HEADER_READ_BYTES
HANDSHAKE_BUFFER_BYTES = 2 * KiB  # the largest handshake message is about 900 bytes


# A byte mover (p2p.spool.Spool.pull): (socket fd, bytes of the payload in the buffer,
# where to stop, SO_RCVLOWAT to wait for, SO_RCVLOWAT now) -> how far it got.
Puller = Callable[[int, int, int, int, int], Pulled]


class ConnectionClosed(Exception):
    """The connection ended: the peer closed or reset it, or it was closed here."""


class PeerIdle(ConnectionClosed):
    """The peer sent nothing for Timeouts.idle_s; the connection was closed."""


@dataclass(frozen=True, slots=True)
class Timeouts:
    """Time limits on a connection, in seconds (see the module docstring)."""

    handshake_s: float = 5.0
    idle_s: float | None = 120.0  # None: a silent link is never closed
    frame_s: float = 10.0
    min_payload_rate_bps: float = 256 * KiB  # bytes per second


class RateLimiter:
    """A TokenBucket on the running loop's clock; `acquire` sleeps when over the rate.

    Share one per node and direction: waiting callers are served first come,
    first served. `bytes_per_s=None` means unlimited.
    """

    def __init__(self, bytes_per_s: float | None, burst: int = 4 * MiB) -> None:
        self.bucket = TokenBucket(bytes_per_s, burst)

    async def acquire(self, n: int) -> None:
        """Return when `n` more bytes may be sent or received."""
        wait = self.reserve(n)
        if wait > 0:
            await asyncio.sleep(wait)

    def reserve(self, n: int) -> float:
        """Take `n` bytes of budget now; the seconds to wait before they may move."""
        if self.bucket.unlimited:
            return 0.0
        return self.bucket.reserve(n, asyncio.get_running_loop().time())

    def refund(self, n: int) -> None:
        """Give back `n` reserved bytes that will never move."""
        if not self.bucket.unlimited:
            self.bucket.refund(n, asyncio.get_running_loop().time())


def listen_socket(host: str, port: int, backlog: int = 1024) -> socket.socket:
    """A non-blocking listening TCP socket; accept with `loop.sock_accept`, then `accept`."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(backlog)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


async def connect(addr: str, me: PeerInfo, secret: bytes, timeouts: Timeouts,
                  expect: PeerId | None = None, bind_host: str | None = None,
                  known_host: KnownHost | None = None) -> PeerConnection:
    """Dial `addr` ("host:port") and run the client handshake.

    With `bind_host` (a specific address) the socket is bound to it first, so
    the peer sees us at the address we claim. With `expect`, the server must
    prove that peer id (WrongPeer otherwise; IdentityError if `known_host`
    places the id it proved elsewhere). OSError if the TCP connection
    fails (TimeoutError after handshake_s), AuthError if the server does not
    prove the secret or rejects ours, IdentityError if it claims an address
    it does not answer from, RemoteProtocolError if it breaks the protocol.
    """
    host, port = wire.split_addr(addr)
    loop = asyncio.get_running_loop()
    family, _, proto, _, sockaddr = (await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM))[0]
    sock = socket.socket(family, socket.SOCK_STREAM, proto)
    try:
        sock.setblocking(False)
        if bind_host is not None and is_specific(bind_host) and _family(bind_host) == family:
            sock.bind((bind_host, 0))
        async with asyncio.timeout(timeouts.handshake_s):
            await loop.sock_connect(sock, sockaddr)
    except TimeoutError:
        sock.close()
        raise TimeoutError(f"connecting to {addr} took over {timeouts.handshake_s}s") from None
    except BaseException:
        sock.close()
        raise
    conn = PeerConnection(sock, timeouts)
    await conn._handshake(client_handshake(conn, me, secret, expect, known_host))
    return conn


def _family(host: str) -> int:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


async def accept(sock: socket.socket, me: PeerInfo, secret: bytes, timeouts: Timeouts,
                 known_host: KnownHost | None = None) -> PeerConnection:
    """Run the server handshake on an accepted socket (which the connection then owns).

    A client that fails authentication gets Bye("auth failed") and the socket
    is closed; AuthError is raised. `known_host(peer)`: the host we know the
    claimed peer id at, if any; a client elsewhere is an IdentityError.
    """
    try:
        sock.setblocking(False)
        conn = PeerConnection(sock, timeouts)
    except BaseException:
        sock.close()
        raise
    await conn._handshake(server_handshake(conn, me, secret, known_host))
    return conn


def _limiting(limiter: RateLimiter | None) -> RateLimiter | None:
    """The limiter, or None when it never limits (so payloads need not be sliced)."""
    return None if limiter is None or limiter.bucket.unlimited else limiter


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class _Operation:
    """`with`: one operation on a connection's socket (see PeerConnection._io).

    Holds no state of its own use, so one object serves every operation of its kind,
    nested or concurrent."""

    __slots__ = ("_cancel_breaks", "_conn")

    def __init__(self, conn: PeerConnection, cancel_breaks: bool) -> None:
        self._conn = conn
        self._cancel_breaks = cancel_breaks

    def __enter__(self) -> None:
        conn = self._conn
        if conn._closed:
            raise ConnectionClosed("connection is closed")
        conn._busy += 1

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        conn = self._conn
        try:
            if kind is None:
                return
            if issubclass(kind, ConnectionError):
                conn.close()
                raise ConnectionClosed(f"connection to {conn.peername} lost: {exc}") from exc
            if issubclass(kind, RemoteProtocolError | ConnectionClosed | LocalProtocolError):
                conn.close()
            elif issubclass(kind, asyncio.CancelledError) and self._cancel_breaks:
                conn.close()  # a frame is half sent or half read: the stream is lost
        finally:
            conn._busy -= 1
            if conn._closed and not conn._busy:
                conn._sock.close()


class PeerConnection:
    """A framed, authenticated connection; build it with `connect` or `accept`.

    `remote` is the peer's PeerInfo as it stated it in the handshake (and as
    p2p.handshake checked it); `peername` is the address the socket is
    actually connected to, `remote_ip` its host as a normalized IP.
    """

    remote: PeerInfo

    def __init__(self, sock: socket.socket, timeouts: Timeouts) -> None:
        self._sock = sock
        self._fd = sock.fileno()
        self._t = timeouts
        self._loop = asyncio.get_running_loop()
        self._buf = bytearray(HANDSHAKE_BUFFER_BYTES)
        self._view = memoryview(self._buf)
        self._start = self._end = 0  # buffered, unconsumed bytes: _buf[_start:_end]
        self._payload_left = 0
        self._lowat = 1  # SO_RCVLOWAT as last set
        self._send_lock = asyncio.Lock()
        self._closed = False
        self._busy = 0  # operations in flight on the socket
        # Guards of an operation (_io): a cancelled read or send either breaks the stream
        # (half a frame went) or not. Built once: a generator context manager per frame
        # was 7.6% of an agent's interpreter samples (py-spy, 8 x 256 MiB uncapped).
        self._breaking = _Operation(self, cancel_breaks=True)
        self._lasting = _Operation(self, cancel_breaks=False)
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            host, port = sock.getpeername()[:2]
        except OSError:
            host, port = "?", 0
        self.remote_ip = normal_ip(host)
        self.peername = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Close now; tasks blocked on this connection get ConnectionClosed."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        if not self._busy:
            self._sock.close()

    async def bye(self, reason: str) -> None:
        """Send Bye(reason) if the peer still listens, then close."""
        with contextlib.suppress(ConnectionClosed, RemoteProtocolError, TimeoutError):
            async with asyncio.timeout(self._t.frame_s):
                await self.send(wire.Bye(reason))
        self.close()

    # -- sending ------------------------------------------------------------------

    async def send(self, msg: Message) -> None:
        """Send one header-only message (anything but Piece)."""
        if isinstance(msg, Piece):
            raise LocalProtocolError("a Piece needs its payload: use send_piece")
        data = msg.encode()
        async with self._send_lock:
            with self._io(cancel_breaks=True):
                await self._send_bytes(data)

    async def send_piece(self, content: str, chunk: int, req: int, fd: int, offset: int,
                         length: int, limiter: RateLimiter | None = None) -> None:
        """Send a whole chunk as one Piece: its header, then `length` bytes of file `fd`
        from `offset` via sendfile.

        With a limiter the payload goes out in SLICE_BYTES slices, each after
        `limiter.acquire`. LocalProtocolError (nothing sent) if the file is
        shorter than offset + length.
        """
        header = Piece(content, chunk, req, 0, length).encode()
        size = os.fstat(fd).st_size
        if offset < 0 or offset + length > size:
            raise LocalProtocolError(f"file of {size} bytes has no {length} bytes at {offset}")
        await self._send_payload(header, length, limiter,
                                 lambda pos, step: self._sendfile(fd, offset + pos, step))

    async def send_piece_bytes(self, content: str, chunk: int, req: int, off: int,
                               data: memoryview, limiter: RateLimiter | None = None) -> None:
        """Send bytes `off` to `off + len(data)` of a chunk, from memory, as one Piece (one
        part of a relay: p2p.relay); paced like `send_piece`."""
        header = Piece(content, chunk, req, off, len(data)).encode()
        await self._send_payload(header, len(data), limiter,
                                 lambda pos, step: self._send_bytes(data[pos:pos + step]))

    async def _send_payload(self, header: bytes, length: int, limiter: RateLimiter | None,
                            send: Callable[[int, int], Awaitable[None]]) -> None:
        """Send `header`, then the payload through `send(pos, step)`, in one frame."""
        limiter = _limiting(limiter)
        async with self._send_lock:
            with self._io(cancel_breaks=True):
                await self._send_bytes(header, socket.MSG_MORE)
                pos = 0
                while pos < length:
                    step = length - pos if limiter is None else min(SLICE_BYTES, length - pos)
                    if limiter is not None:
                        await limiter.acquire(step)
                    await send(pos, step)
                    pos += step

    async def _send_bytes(self, data: bytes | memoryview, flags: int = 0) -> None:
        view = memoryview(data)
        while view:
            try:
                view = view[self._sock.send(view, flags):]
            except BlockingIOError:
                await self._writable()

    async def _sendfile(self, fd: int, offset: int, count: int) -> None:
        while count:
            try:
                sent = os.sendfile(self._fd, fd, offset, count)
            except BlockingIOError:
                await self._writable()
                continue
            if sent == 0:
                raise LocalProtocolError(f"file ended {count} bytes before the piece did")
            offset += sent
            count -= sent

    async def _writable(self) -> None:
        fut: asyncio.Future[None] = self._loop.create_future()
        self._loop.add_writer(self._fd, _wake, fut)
        try:
            async with asyncio.timeout(self._t.idle_s):
                await fut
        except TimeoutError:
            raise RemoteProtocolError(f"peer read nothing for {self._t.idle_s}s") from None
        finally:
            self._loop.remove_writer(self._fd)

    # -- receiving ----------------------------------------------------------------

    async def recv(self) -> Message:
        """The next message. After a Piece, call recv_payload_into or discard_payload
        before the next recv."""
        if self._payload_left:
            raise LocalProtocolError(
                f"read or discard the {self._payload_left}-byte piece payload first")
        with self._io(cancel_breaks=False):
            if self._start == self._end:
                try:
                    async with asyncio.timeout(self._t.idle_s):
                        await self._read_more(1)
                except TimeoutError:
                    raise PeerIdle(f"peer sent nothing for {self._t.idle_s}s") from None
            if not self._header_buffered():
                try:
                    async with asyncio.timeout(self._t.frame_s):
                        await self._fill(wire.PREFIX_SIZE)
                        await self._fill(wire.PREFIX_SIZE + self._header_length())
                except TimeoutError:
                    raise RemoteProtocolError(
                        f"peer took over {self._t.frame_s}s to send one header") from None
            begin = self._start + wire.PREFIX_SIZE
            end = begin + self._header_length()
            msg = wire.parse_header(self._view[begin:end])
            self._start = end
            if isinstance(msg, Piece):
                self._payload_left = msg.len
            return msg

    async def recv_payload_into(self, view: memoryview, limiter: RateLimiter | None = None,
                                progress: Callable[[int], None] | None = None) -> None:
        """Read the payload of the Piece just received into `view` (exactly piece.len bytes).

        With a limiter, bytes are read in SLICE_BYTES slices, each paid for with
        `limiter.acquire` once it has arrived. With `progress`, it is called with the
        bytes in so far after each slice (a chunk relayed while it arrives: p2p.relay).
        """
        view = self._payload_view(view)
        with self._io(cancel_breaks=True):
            await self._recv_exact(view, _limiting(limiter), self._payload_budget(len(view)),
                                   progress)
            self._payload_left = 0

    async def recv_payload_pulled(self, view: memoryview, pull: Puller, workers: Workers,
                                  progress: Callable[[int], None] | None = None,
                                  step: int | None = None) -> None:
        """Read the payload of the Piece just received into `view` by `pull` in `workers`
        threads (see Puller), each call going at most `step` bytes further if given; with
        `progress`, it is called with the bytes in so far after each call. The time limits
        are those of `recv_payload_into` (no limiter: pay when asking)."""
        view = self._payload_view(view)
        with self._io(cancel_breaks=True):
            pos = min(len(view), self._end - self._start)
            view[:pos] = self._view[self._start:self._start + pos]
            self._start += pos
            try:
                async with asyncio.timeout(self._payload_budget(len(view))):
                    await self._pull(view, pos, pull, workers, progress, step)
            except TimeoutError:
                raise RemoteProtocolError(
                    f"piece payload slower than {self._t.min_payload_rate_bps:.0f} B/s") from None
            finally:
                self._wake_at(1)
            self._payload_left = 0

    async def _pull(self, view: memoryview, pos: int, pull: Puller, workers: Workers,
                    progress: Callable[[int], None] | None, step: int | None) -> None:
        end, first = len(view), True
        while first or pos < end:  # the first call takes the bytes the header read brought
            first = False
            stop = end if step is None else min(end, pos + step)
            pulled = await workers.run(functools.partial(pull, self._fd, pos, stop,
                                                         MOVER_WAKE_BYTES, self._lowat))
            self._lowat, pos = pulled.lowat, pulled.filled
            if pulled.state == CLOSED:
                raise ConnectionClosed("peer closed the connection")
            if progress is not None:
                progress(pos)
            if pulled.state == DRAINED:
                self._wake_at(min(MOVER_WAKE_BYTES, end - pos))
                await self._readable()

    def _payload_view(self, view: memoryview) -> memoryview:
        view = memoryview(view).cast("B")
        if len(view) != self._payload_left or not self._payload_left or view.readonly:
            raise LocalProtocolError(f"the pending payload is {self._payload_left} bytes, the "
                                     f"buffer {len(view)} (read-only: {view.readonly})")
        return view

    async def discard_payload(self, n: int) -> None:
        """Read and drop the `n`-byte payload of the Piece just received."""
        if n != self._payload_left or not n:
            raise LocalProtocolError(f"the pending payload is {self._payload_left} bytes, not {n}")
        scratch = memoryview(bytearray(min(n, SLICE_BYTES)))
        with self._io(cancel_breaks=True):
            budget = self._payload_budget(n)
            while n:
                step = min(n, len(scratch))
                budget = await self._recv_exact(scratch[:step], None, budget)
                n -= step
            self._payload_left = 0

    def _payload_budget(self, n: int) -> float:
        return self._t.frame_s + n / self._t.min_payload_rate_bps

    async def _recv_exact(self, view: memoryview, limiter: RateLimiter | None,
                          budget: float, progress: Callable[[int], None] | None = None,
                          ) -> float:
        """Fill `view`: buffered bytes first, then the socket; return the budget left.

        Each read takes what the socket holds (up to the slice's end), and the loop is
        woken only once WAKE_BYTES of it are there (SO_RCVLOWAT), not per segment: the
        kernel then sends one window update per read instead of many, and the
        interpreter runs once per read."""
        pos = min(len(view), self._end - self._start)
        view[:pos] = self._view[self._start:self._start + pos]
        self._start += pos
        try:
            while pos < len(view):
                stop = min(len(view), pos + SLICE_BYTES) if limiter is not None else len(view)
                began, first = self._loop.time(), pos
                try:
                    async with asyncio.timeout(budget):
                        while pos < stop:
                            if progress is not None:
                                progress(pos)
                            pos += await self._recv_some(view[pos:stop], WAKE_BYTES)
                except TimeoutError:
                    raise RemoteProtocolError(
                        f"piece payload slower than {self._t.min_payload_rate_bps:.0f} B/s"
                    ) from None
                budget -= self._loop.time() - began
                if limiter is not None:
                    # Pay after receiving: tokens taken before the bytes arrive are spent
                    # while the sender paces itself, and the link runs below its cap.
                    await limiter.acquire(pos - first)
        finally:
            self._wake_at(1)  # headers are woken for at once
        if progress is not None:
            progress(pos)
        return budget

    async def _recv_some(self, view: memoryview, wake: int = 1) -> int:
        """Read what the socket holds into `view` (at least a byte); if it holds nothing,
        wait until it holds min(wake, len(view)) bytes, or the peer closes."""
        while True:
            try:
                got = self._sock.recv_into(view)
            except BlockingIOError:
                self._wake_at(min(wake, len(view)))
                await self._readable()
                continue
            if not got:
                raise ConnectionClosed("peer closed the connection")
            return got

    def _wake_at(self, nbytes: int) -> None:
        """Readable for the loop once `nbytes` are in the socket (SO_RCVLOWAT)."""
        if nbytes != self._lowat and not self._closed:
            with contextlib.suppress(OSError):
                self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, nbytes)
                self._lowat = nbytes

    async def _readable(self) -> None:
        fut: asyncio.Future[None] = self._loop.create_future()
        self._loop.add_reader(self._fd, _wake, fut)
        try:
            await fut
        finally:
            self._loop.remove_reader(self._fd)

    def _header_length(self) -> int:
        n = wire.parse_length(self._view[self._start:self._start + wire.PREFIX_SIZE])
        if wire.PREFIX_SIZE + n > len(self._buf):
            raise RemoteProtocolError(f"a {n}-byte header before the handshake is done")
        return n

    def _grow(self) -> None:
        """The full header buffer, now that the peer is authenticated."""
        kept = self._end - self._start
        buf = bytearray(_BUFFER_BYTES)
        buf[:kept] = self._buf[self._start:self._end]
        self._buf, self._view = buf, memoryview(buf)
        self._start, self._end = 0, kept

    def _header_buffered(self) -> bool:
        have = self._end - self._start
        return have >= wire.PREFIX_SIZE and have >= wire.PREFIX_SIZE + self._header_length()

    async def _fill(self, n: int) -> None:
        while self._end - self._start < n:
            await self._read_more(n - (self._end - self._start))

    async def _read_more(self, need: int) -> None:
        if self._start == self._end:
            self._start = self._end = 0
        elif len(self._buf) - self._end < need:
            kept = self._end - self._start
            self._buf[:kept] = self._buf[self._start:self._end]
            self._start, self._end = 0, kept
        size = min(len(self._buf) - self._end, max(need, HEADER_READ_BYTES))
        self._end += await self._recv_some(self._view[self._end:self._end + size])

    # -- lifecycle ----------------------------------------------------------------

    def _io(self, cancel_breaks: bool) -> _Operation:
        """Count an operation in flight; map socket errors; close on fatal ones."""
        return self._breaking if cancel_breaks else self._lasting

    async def _handshake(self, steps: Coroutine[Any, Any, PeerInfo]) -> None:
        try:
            async with asyncio.timeout(self._t.handshake_s):
                self.remote = await steps
        except TimeoutError:
            self.close()
            raise RemoteProtocolError(
                f"handshake with {self.peername} not done in {self._t.handshake_s}s") from None
        except BaseException:
            self.close()
            raise
        self._grow()
