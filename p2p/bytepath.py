"""The byte movers: a piece's payload received, hashed and written by one call.

Theory of operation. The agent's control loop (node core, links, tracker,
local API) is one asyncio thread; the bytes of a piece move beside it, in one
of `data_workers` threads (`Workers`). One `pull` takes the bytes of the
piece that are in the buffer but not yet taken, then reads the socket into
the buffer, feeding each read to the chunk's hasher and writing it to the
chunk's temp file, until the range is full, the socket stays empty for
`linger_s` (then the loop waits for it, so a slow peer never holds a thread),
or the peer closes. The loop sees one event per call, not one per socket read.

Two implementations of `pull` with one contract: `p2p._bytepath` (C, built by
`make setup` against Debian's libxxhash; the GIL is released for the whole
call, and the hasher is its own `Xxh3`), and `pull_py` here, which works with
any hasher (blake3 chunks take it) and is what runs when the extension is not
built, or when the environment says BOOTSEER_BYTEPATH=python (to rule the C part
out when chasing a problem). Tests run both (`use_native`, the `byte_path`
fixture).

Nothing here verifies: p2p.spool compares the digest before the chunk counts.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import errno
import os
import select
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

try:
    from p2p import _bytepath as native_module
except ImportError:  # not built (no xxhash.h): the Python twin does the work
    native_module = None  # type: ignore[assignment]

FILLED, DRAINED, CLOSED = 0, 1, 2  # how a pull ended (the C module's constants)
LINGER_S = 0.02  # how long a pull waits on an empty socket before giving its thread back
# Bytes a pull hashes and writes at once (p2p/_bytepath.c's TAKE_BYTES): a read right
# after a big one brings a few KiB, and writing those into new page-cache pages one
# by one cost more system time than the loop's own reads did (ab.py, 8 x 256 MiB).
TAKE_BYTES = 512 * 1024
MAX_DATA_WORKERS = 8

T = TypeVar("T")


class Hasher(Protocol):
    def update(self, data: Any, /) -> object: ...
    def digest(self) -> bytes: ...


@dataclass(frozen=True, slots=True)
class Pulled:
    """How far a pull got: the buffer holds, and the hasher and file have taken, bytes up
    to `filled`; `state` is FILLED, DRAINED or CLOSED; `write_errno` is non-zero if a
    write failed (writing stopped there); `lowat` is the socket's SO_RCVLOWAT now."""

    filled: int
    state: int
    write_errno: int
    lowat: int


def native() -> bool:
    """Whether the C byte path is in use."""
    return native_module is not None and _use_native


_use_native = os.environ.get("BOOTSEER_BYTEPATH", "c") != "python"


@contextlib.contextmanager
def use_native(on: bool) -> Any:
    """Within the block, pull with the C module (if built) or always with `pull_py`."""
    global _use_native
    before, _use_native = _use_native, on
    try:
        yield
    finally:
        _use_native = before


def xxh3_hasher() -> Hasher | None:
    """An XXH3-128 hasher `pull` can feed without the GIL; None without the C module."""
    return native_module.Xxh3() if native() else None


def pull(sock_fd: int, buf: memoryview, taken: int, filled: int, stop: int, hasher: Hasher,
         out_fd: int, out_offset: int, *, wake: int, lowat: int,
         linger_s: float | None = None) -> Pulled:
    """Hash and write `buf[taken:filled]` (at `out_offset` of `out_fd`; -1: do not write),
    then receive into `buf[filled:stop]`, hashing and writing each read (see the module
    docstring). An empty socket is polled once `min(wake, bytes left)` bytes are there
    (SO_RCVLOWAT, set from `lowat`), for `linger_s` (default LINGER_S). OSError as
    recv(2)."""
    linger_s = LINGER_S if linger_s is None else linger_s
    if native_module is not None and isinstance(hasher, native_module.Xxh3):
        return Pulled(*native_module.pull(sock_fd, buf, taken, filled, stop, hasher, out_fd,
                                          out_offset, int(linger_s * 1000), wake, lowat))
    return pull_py(sock_fd, buf, taken, filled, stop, hasher, out_fd, out_offset,
                   wake=wake, lowat=lowat, linger_s=linger_s)


def pull_py(sock_fd: int, buf: memoryview, taken: int, filled: int, stop: int, hasher: Hasher,
            out_fd: int, out_offset: int, *, wake: int, lowat: int,
            linger_s: float = LINGER_S) -> Pulled:
    """`pull` in Python, for any hasher (the C module's twin)."""
    if not 0 <= taken <= filled <= stop <= len(buf) or wake < 1:
        raise ValueError("pull: need 0 <= taken <= filled <= stop <= len, wake >= 1")
    taker = _Taker(hasher, out_fd, out_offset - taken)
    sock = socket.socket(fileno=sock_fd)  # a view of the caller's socket, detached below
    poller = select.poll()
    poller.register(sock_fd, select.POLLIN)
    pos, state, done = filled, FILLED, taken
    try:
        while pos < stop:
            try:
                got = sock.recv_into(buf[pos:stop], stop - pos, socket.MSG_DONTWAIT)
            except BlockingIOError:
                want = min(wake, stop - pos)
                if want != lowat:
                    with contextlib.suppress(OSError):
                        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, want)
                        lowat = want
                if not poller.poll(linger_s * 1000):
                    state = DRAINED
                    break
                continue
            if not got:
                state = CLOSED
                break
            pos += got
            if pos - done >= TAKE_BYTES:
                taker.take(buf, done, pos)
                done = pos
    finally:
        sock.detach()
    taker.take(buf, done, pos)
    return Pulled(pos, state, taker.write_errno, lowat)


class _Taker:
    """Feeds bytes to the hasher and writes them to the file at their place."""

    def __init__(self, hasher: Hasher, out_fd: int, base: int) -> None:
        self.hasher, self.out_fd, self.base = hasher, out_fd, base
        self.write_errno = 0

    def take(self, buf: memoryview, start: int, end: int) -> None:
        part = buf[start:end]
        self.hasher.update(part)
        while part and self.out_fd >= 0:
            try:
                written = os.pwrite(self.out_fd, part, self.base + start)
            except OSError as exc:
                self.write_errno, self.out_fd = exc.errno or errno.EIO, -1
                return
            part, start = part[written:], start + written


def default_data_workers() -> int:
    """The cores this node can spare beside the control loop, at least 1, at most 8."""
    return max(1, min(MAX_DATA_WORKERS, len(os.sched_getaffinity(0)) - 1))


class Workers:
    """The node's byte-moving threads (`data_workers` of them)."""

    def __init__(self, count: int) -> None:
        self.count = count
        self._pool = concurrent.futures.ThreadPoolExecutor(count, thread_name_prefix="bytes")

    async def run(self, fn: Callable[[], T]) -> T:
        """`fn()` in a worker thread. Cancelled, it returns only once `fn` has ended or
        was never started: the caller's buffer and socket are its own again."""
        loop = asyncio.get_running_loop()
        job = self._pool.submit(fn)
        done = asyncio.wrap_future(job, loop=loop)
        try:
            return await asyncio.shield(done)
        except asyncio.CancelledError:
            if not job.cancel():
                await _finish(done)
            raise

    def close(self) -> None:
        """Let running jobs end; start no new one."""
        self._pool.shutdown(wait=False, cancel_futures=True)


async def _finish(done: asyncio.Future[Any]) -> None:
    """Wait for `done` however often this task is cancelled meanwhile (a pull ends within
    its linger once its socket is shut down or empty)."""
    while not done.done():
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.shield(done)
    with contextlib.suppress(BaseException):
        done.result()
