"""Chunks written to the store while they arrive, verified before they count.

Theory of operation. A chunk from a peer lands in a chunk-sized buffer, a
socket read at a time. Hashing and writing it only once it is whole left the
link idle for that long: with one request per peer (`SwarmConfig.
per_peer_inflight`), the next request waits for the store, and on this
project's VMs writing 4 MiB of new page cache took longer than receiving it
(one pair, 1 GiB: 66% of the agents' samples in the store thread's write(2),
the receiving loop 9%; benchmarks/RESULTS.md, issue 31).

So a `Spool` takes the chunk's bytes in order as they arrive: each part is fed
to the manifest's hasher and written to a temp file beside the chunk's file
(`ChunkStore.temp_file`). `commit` compares the digest with the manifest's and
only then renames the file into place (`ChunkStore.adopt`): bytes that do not
verify are never stored, served or read, as with `ChunkStore.put`. The bytes
hashed are the bytes written (one buffer, not changed once received). If the
disk refuses the temp file (full, failing), the spool stops writing and the
commit stores the whole buffer through `put`, which evicts and retries.

With the agent's `byte_movers` on, a chunk from a peer is taken by `Spool.pull`
(p2p.bytepath): one call in a byte-moving thread receives the payload from the
socket, hashes and writes it, so the event loop sees one event per piece instead
of one per read (with the C byte path, an XXH3-128 chunk's hasher is the C
module's own, fed without the GIL). Otherwise, and for chunks from the origin
(aiohttp's reads), a `Streamer` runs the spool from the event loop: `advance(n)` says the first `n`
bytes are in the buffer; it writes them in a worker thread, at most one write
of at least STREAM_STEP bytes at a time (the last part may be smaller), so
when the last byte arrives only the last part is left to write.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading

from p2p import bytepath
from p2p.bytepath import Hasher, Pulled
from p2p.content import ContentId
from p2p.store import ChunkStore, CorruptChunk, write_all
from p2p.units import KiB

STREAM_STEP = 512 * KiB  # bytes per write job: 8 thread trips per 4 MiB chunk


class Spool:
    """One chunk written to a temp file as it arrives (see the module docstring).

    One `write` or `pull` at a time, in order (never both kinds: `pull` writes with
    pwrite, `write` at the file's position); then `commit` or `abort`. `abort` may come
    from another thread while a `pull` runs: the file is closed and removed when it
    returns."""

    def __init__(self, store: ChunkStore, content: ContentId, index: int) -> None:
        """UnknownContent, IndexError, StoreError as `ChunkStore.temp_file`."""
        self._store, self.content, self.index = store, content, index
        self._manifest, self._fd, self._tmp = store.temp_file(content, index)
        native = bytepath.xxh3_hasher() if self._manifest.digest == "xxh3-128" else None
        self._hasher: Hasher = native or self._manifest.hasher()
        self.written = 0
        self.error: OSError | None = None  # the disk refused the temp file: `put` at the end
        self._guard = threading.Lock()  # _fd, _pulling, _abort_due between threads
        self._pulling = False
        self._abort_due = False

    def write(self, data: memoryview) -> None:
        """Hash the next `len(data)` bytes of the chunk and write them to the temp file."""
        self._hasher.update(data)
        if self.error is None:
            try:
                write_all(self._fd, data)
            except OSError as exc:
                self.error = exc
        self.written += len(data)

    def pull(self, sock_fd: int, buf: memoryview, filled: int, stop: int, *, wake: int,
             lowat: int) -> Pulled:
        """Take `buf[written:filled]` (the chunk's bytes in so far, the start of `buf` at
        offset 0 of the chunk), then receive from the socket into `buf[filled:stop]`,
        hashing and writing as it comes (`p2p.bytepath.pull`; for a byte-moving thread).
        OSError as recv(2); a refused write is kept for `commit`, as in `write`."""
        with self._guard:
            out_fd = self._fd if self.error is None else -1
            self._pulling = True
        try:
            pulled = bytepath.pull(sock_fd, buf, self.written, filled, stop, self._hasher,
                                   out_fd, self.written, wake=wake, lowat=lowat)
        finally:
            with self._guard:
                self._pulling = False
                due, self._abort_due = self._abort_due, False
            if due:
                self.abort()
        self.written = pulled.filled
        if pulled.write_errno and self.error is None:
            self.error = OSError(pulled.write_errno, os.strerror(pulled.write_errno))
        return pulled

    def commit(self, whole: memoryview) -> None:
        """Store the chunk if the bytes written are it. `whole` is the same bytes, stored
        through `ChunkStore.put` if the disk refused the temp file. CorruptChunk if they
        do not match the manifest (nothing stored); UnknownContent, StoreFullError,
        StoreError as `ChunkStore.adopt`."""
        self._close()
        if not self._manifest.matches(self.index, self.written, self._hasher.digest()):
            self.abort()
            raise CorruptChunk(f"chunk {self.index} of {self.content}: {self.written} bytes do "
                               "not match the manifest")
        if self.error is not None:
            self.abort()
            self._store.put(self.content, self.index, whole)
        else:
            self._store.adopt(self.content, self.index, self._tmp, self.written)

    def abort(self) -> None:
        """Remove the temp file (idempotent); once the `pull` under way, if any, returns."""
        with self._guard:
            if self._pulling:
                self._abort_due = True
                return
        self._close()
        with contextlib.suppress(OSError):  # gone with its directory, or the like
            os.unlink(self._tmp)

    def _close(self) -> None:
        with self._guard:
            fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)


class Streamer:
    """Feeds a `Spool` from `buf` as it fills, one worker-thread write at a time."""

    def __init__(self, spool: Spool, buf: bytearray) -> None:
        self.spool = spool
        self._view = memoryview(buf)
        self._loop = asyncio.get_running_loop()
        self._filled = 0  # bytes in the buffer
        self._queued = 0  # ... handed to writes
        self._job: asyncio.Future[None] | None = None
        self._written = self._loop.create_future()  # every byte written
        self._aborted = False
        self._committing = False

    def advance(self, filled: int) -> None:
        """The first `filled` bytes of the chunk are in the buffer."""
        if filled > self._filled:
            self._filled = filled
            self._next()

    async def commit(self) -> None:
        """The whole buffer is in: write what is left, then `Spool.commit` it (in a worker
        thread; its errors are raised here). Cancelled before the commit began, the temp
        file is removed; once it began, the commit runs to its end."""
        self.advance(len(self._view))
        try:
            await asyncio.shield(self._written)
        except asyncio.CancelledError:
            self.abort()
            raise
        self._committing = True
        await asyncio.to_thread(self.spool.commit, self._view)

    def abort(self) -> None:
        """Stop writing and remove the temp file (once a write under way is done: the
        thread may still be writing from the buffer); nothing once the commit began."""
        if self._committing:
            return
        self._aborted = True
        if self._job is None:
            self.spool.abort()

    def _next(self) -> None:
        if self._job is not None or self._aborted:
            return
        ready = self._filled - self._queued
        if ready >= STREAM_STEP or (ready > 0 and self._filled == len(self._view)):
            part = self._view[self._queued:self._filled]
            self._queued = self._filled
            self._job = self._loop.run_in_executor(None, self.spool.write, part)
            self._job.add_done_callback(self._wrote)
        elif self._queued == len(self._view) and not self._written.done():
            self._written.set_result(None)

    def _wrote(self, job: asyncio.Future[None]) -> None:
        self._job = None
        if self._aborted or job.cancelled():
            self._aborted = True
            self.spool.abort()
        elif (exc := job.exception()) is not None:  # a bug: disk errors are kept for commit
            self._aborted = True
            self.spool.abort()
            if not self._written.done():
                self._written.set_exception(exc)
        else:
            self._next()
