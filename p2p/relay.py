"""Relays: serving a chunk to peers while it still arrives (from the origin, or a peer).

Theory of operation. With whole-chunk forwarding, the last chunks out of the
origin reach the other nodes one chunk-time after they land: the fetchers
all finish their last chunk at about the same moment, and only then does
that chunk start through the swarm. So a node asks a fetcher for a chunk it
is still fetching (`SwarmConfig.relay_pending`), and the fetcher sends the
bytes as they come. (`bootseer bench swarm`, 8 agents, 256 MiB, 50 MB/s caps,
eight fetchers: 1.11-1.13x the lower bound with relays, about 1.2x without;
benchmarks/RESULTS.md, "the swarm".)

The same goes one hop further (`SwarmConfig.relay_fetching`): a node announces
as pending the chunks it fetches from peers, and relays those too while they
arrive, so a chunk crosses several hops in little more than one chunk-time
instead of one chunk-time per hop.

The fetcher's read (from the origin, or a peer's Pieces) fills a `Filling`:
the chunk's buffer and how much of it has arrived. A relay (`relay`, run by
the link that got the request) sends what has arrived in Pieces of at least
RELAY_PART_BYTES, in order, under the node's upload limit and upload slots
like any piece. It holds back the last RELAY_HOLD_BYTES until the fetcher has
verified the whole chunk against the manifest: the receiver can complete the
chunk only once the sender vouched for it, and it verifies it again itself.
A corrupt or failed read ends the relay with a Reject instead, which the receiver takes
as "not held", not as the sender's fault; a peer that completes a relay with
bytes that fail the receiver's check is banned like any peer that sends a
corrupt chunk.

A chunk is never relayed back to the peer it comes from: when an origin read
fails, the fetcher may ask for the chunk at once from a peer whose relay of
it still counts on the fetcher, and each would wait on the other. That peer
answers "not held" instead, which costs the asker nothing (seen in
tests/p2p/test_relay.py before this rule: the two agents kept asking each other
until one had more than 64 requests queued at the other, and dropped it).

The buffer goes back to the agent's pool only when the fetcher and every relay
reading it have released it: a relay never sends bytes of another chunk.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from p2p.units import KiB

RELAY_PART_BYTES = 256 * KiB  # a relay sends in Pieces this big at least (the last may be less)
RELAY_HOLD_BYTES = 64 * KiB  # ... and this tail only once the sender has verified the chunk


class RelayFailed(Exception):
    """The chunk a relay was sending will not be complete here; the message says why."""


class Filling:
    """A chunk arriving from the origin into `buf` (exactly the chunk's size): `filled`
    bytes are in so far.

    The fetcher calls `advance` as bytes arrive, then `verified` or `failed`;
    relays wait for more with `wait`. The fetcher holds it from the start, a relay
    from `acquire`; each calls `release` once, and the last gives `buf` back.
    """

    def __init__(self, buf: bytearray, give_back: Callable[[bytearray], None]) -> None:
        self.buf = buf
        self.filled = 0
        self.ok = False
        self.failure: str | None = None
        self._give_back = give_back
        self._holders = 1  # the fetcher
        self._waiters: list[asyncio.Future[None]] = []

    def acquire(self) -> Filling:
        self._holders += 1
        return self

    def abandon(self) -> None:
        """Never give `buf` back: a worker thread may still read or write it."""
        self._give_back = _keep

    def release(self) -> None:
        self._holders -= 1
        if self._holders == 0:
            self._give_back(self.buf)

    @property
    def length(self) -> int:
        return len(self.buf)

    @property
    def ended(self) -> bool:
        return self.ok or self.failure is not None

    def advance(self, filled: int) -> None:
        if filled > self.filled:
            self.filled = filled
            self._wake()

    def verified(self) -> None:
        self.filled, self.ok = self.length, True
        self._wake()

    def failed(self, reason: str) -> None:
        if not self.ended:
            self.failure = reason
            self._wake()

    def sendable(self) -> int:
        """Bytes a relay may send so far: all once verified, else all but the held tail."""
        if self.failure is not None:
            raise RelayFailed(self.failure)
        return self.length if self.ok else min(self.filled,
                                               max(0, self.length - RELAY_HOLD_BYTES))

    async def wait(self) -> None:
        """Until something changes (more bytes, or the end)."""
        fut = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        await fut

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)


def _keep(buf: bytearray) -> None:
    """Leave `buf` to the garbage collector."""


Send = Callable[[int, memoryview], Awaitable[None]]  # (offset in the chunk, bytes)


async def relay(filling: Filling, send: Send, still_wanted: Callable[[], bool]) -> bool:
    """Send `filling`'s chunk through `send` as it arrives, in order, the last part once it
    is verified. False if the receiver stopped wanting it (`still_wanted`, asked before
    each part); RelayFailed if the chunk will not be complete. Takes over one hold on
    `filling` (`acquire`d by the caller when it took the request) and releases it."""
    view = memoryview(filling.buf)
    sent = 0
    try:
        while sent < filling.length:
            ready = filling.sendable()
            if ready - sent >= RELAY_PART_BYTES or (ready > sent and filling.ok):
                if not still_wanted():
                    return False
                await send(sent, view[sent:ready])
                sent = ready
            else:
                await filling.wait()
        return True
    finally:
        filling.release()


PartKey = tuple[int, int]  # (link id, request id)


class Parts:
    """Chunks being received, in one Piece or in several (a relay's), until whole.

    `place` says where a Piece's payload goes: Pieces of a chunk must come in
    order, without gaps or overlap, within the chunk (else ValueError: the peer
    broke the protocol). `received` records the payload read and returns the
    buffer once the chunk is whole. Buffers come from `take`. `drop` forgets an
    unfinished chunk, and leaves its buffer to the garbage collector, never to
    the pool: a cancel or a closing link may drop a chunk whose payload is being
    read into that buffer at that moment.

    A chunk that we relay while it arrives (`SwarmConfig.relay_fetching`) is
    received into a `Filling` given by `expect` before its first Piece; the
    receiver advances it as bytes come in and ends it once the chunk is stored
    (`filling`); `drop` fails it, and relays reading it end with a Reject.
    """

    def __init__(self, take: Callable[[int], bytearray]) -> None:
        self._take = take
        self._open: dict[PartKey, tuple[bytearray, int]] = {}  # key -> (buffer, bytes in)
        self._fillings: dict[PartKey, Filling] = {}

    def expect(self, key: PartKey, filling: Filling) -> None:
        """Receive `key`'s chunk into `filling` (holding it until `filling` or `drop`)."""
        self._open[key] = (filling.buf, 0)
        self._fillings[key] = filling

    def filling(self, key: PartKey) -> Filling | None:
        """The Filling `key` is received into, if any."""
        return self._fillings.get(key)

    def hand_over(self, key: PartKey) -> Filling | None:
        """The Filling of `key`, whole now: the caller verifies, ends and releases it."""
        return self._fillings.pop(key, None)

    def place(self, key: PartKey, off: int, n: int, length: int) -> memoryview:
        buf, got = self._open.get(key) or (None, 0)
        if off != got or off + n > length:
            raise ValueError(f"piece of bytes {off}..{off + n} of a {length}-byte chunk "
                             f"when {got} bytes are in")
        if buf is None:
            buf = self._take(length)
            self._open[key] = (buf, 0)
        return memoryview(buf)[off:off + n]

    def buffer(self, key: PartKey) -> bytearray:
        """The whole chunk's buffer of `key` (placed, not dropped)."""
        return self._open[key][0]

    def holds(self, key: PartKey) -> bool:
        """Whether `key` is still being put together (not dropped meanwhile)."""
        return key in self._open

    def received(self, key: PartKey, n: int) -> bytearray | None:
        """`n` more bytes of `key` are in; its buffer once the chunk is whole (the caller
        gives it back), else None."""
        buf, got = self._open[key]
        if got + n < len(buf):
            self._open[key] = (buf, got + n)
            return None
        del self._open[key]
        return buf

    def drop(self, key: PartKey) -> int:
        """Forget an unfinished chunk; the bytes of it that were in (now wasted)."""
        entry = self._open.pop(key, None)
        filling = self._fillings.pop(key, None)
        if filling is not None:
            filling.failed("the chunk stopped arriving from its peer")
            filling.abandon()  # its payload may be being read into the buffer
            filling.release()
        return 0 if entry is None else entry[1]

    def drop_link(self, link: int) -> int:
        keys = {k for k in [*self._open, *self._fillings] if k[0] == link}
        return sum(self.drop(key) for key in keys)
