"""Where a mount's file bytes come from: verified ranges of swarm contents.

The filesystem asks a `Source` for `length` bytes of a content from `offset`
(never more than a FUSE read, about 1 MiB, and never past the content's end).
`AgentSource` serves contents the local agent holds:

- A chunk already on local disk is read straight from the agent's store
  directory (`<store>/<content>/<index>.chunk`) through a read-only
  `p2p.chunkview.ChunkView`: hashed against the manifest the first time, then
  trusted only while the file keeps the stat it had when it passed. No HTTP
  round trip, no copy beyond the one `pread` into the reply buffer. The chunk a
  check just read whole stays in memory for the reads that follow it
  (`RecentChunks`, 32 MiB per mount), so a sequential reader reads each chunk
  file once.
- The manifest is the store's `manifest.json`, accepted only if it certifies
  the content id asked for (ids are hashes of the manifest). If the store has
  none yet, the agent is asked to attach the content (its manifest comes from
  the tracker, over the agent's authenticated channel), which writes it.
- A chunk that is absent, or whose file fails the check, is asked of the
  agent over its local API as a whole chunk; the agent fetches it from peers
  or the origin (a damaged file is caught by the agent's own check, deleted
  and fetched again). The chunk that comes back is checked here against the
  manifest too, so a byte this source returns has always been verified by
  this process. Concurrent reads of one missing chunk share one request.

Bounded time: everything a read waits for is under one deadline
(`read_timeout_s`, default 30 s); past it the read raises `SourceError`, which
the filesystem logs and answers with EIO. The reader never hangs. A chunk that
failed that way fails again at once for `RETRY_AFTER_S`, so the kernel's
immediate retry of a failed read-ahead does not double the reader's wait.

Threads: local reads run inline on the event loop by default: from the page
cache a 1 MiB `pread` is a fraction of a millisecond, and a hop to a worker
thread costs about as much (`threaded_reads=True` moves them to threads, for
stores on slow disks).
"""

from __future__ import annotations

import asyncio
import io
import logging
from collections.abc import Awaitable, Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, Protocol

from fusefs.readbound import READ_TIMEOUT_S
from p2p.agentclient import AgentClient, AgentError, AgentUnreachable
from p2p.chunkview import ChunkView, RecentChunks
from p2p.content import ContentId, Manifest, ManifestError, check_content_id
from p2p.errors import RemoteError
from p2p.store import DamagedChunk, MissingChunk

log = logging.getLogger(__name__)

# A chunk the agent could not supply fails at once for this long: the kernel retries a
# failed read-ahead right away with a page-sized read, which would wait the bound again.
RETRY_AFTER_S = 5.0
AGENT_RETRY_S = 0.2  # while the agent is away (restarting), how often a missing chunk asks

Buffer = bytes | bytearray | memoryview


class SourceError(RemoteError):
    """The bytes cannot be had (in time); the message says which and why."""


class Source(Protocol):
    async def read(self, content: str, offset: int, length: int) -> Buffer:
        """Exactly `length` verified bytes of `content` from `offset`; SourceError if not."""
        ...

    async def close(self) -> None: ...


class AgentSource:
    """Contents held by the local agent: its store directory first, its API for the rest."""

    def __init__(self, store_dir: Path, client: AgentClient,
                 read_timeout_s: float = READ_TIMEOUT_S, threaded_reads: bool = False) -> None:
        self.store_dir = Path(store_dir)
        self.client = client
        self.read_timeout_s = read_timeout_s
        self.threaded_reads = threaded_reads
        self.agent_chunks = 0  # chunks that had to come through the agent
        self._views: dict[str, ChunkView] = {}
        self._recent = RecentChunks()
        self._view_lock = asyncio.Lock()
        self._inflight: dict[tuple[ContentId, int], asyncio.Task[memoryview]] = {}
        self._failed: dict[tuple[ContentId, int], tuple[float, str]] = {}  # until, why

    async def read(self, content: str, offset: int, length: int) -> Buffer:
        try:
            async with asyncio.timeout(self.read_timeout_s):
                return await self._read(content, offset, length)
        except TimeoutError:
            raise SourceError(f"{length} bytes of {content} at {offset} did not arrive within "
                              f"{self.read_timeout_s:g} s") from None

    async def manifest(self, content: str) -> Manifest:
        """The manifest of `content` (attached through the agent if the store has none)."""
        return (await self._view(content)).manifest

    async def close(self) -> None:
        for task in list(self._inflight.values()):
            task.cancel()
        await asyncio.gather(*self._inflight.values(), return_exceptions=True)
        await self.client.close()

    async def _read(self, content: str, offset: int, length: int) -> Buffer:
        view = await self._view(content)
        manifest = view.manifest
        try:
            chunks = manifest.chunks_for_range(offset, length)
        except ValueError as exc:
            raise SourceError(f"{content}: {exc}") from None
        # One buffer for the whole reply, each chunk's piece read straight into it: a
        # reply spanning chunks (an extent that starts mid-chunk, as a tar member's does)
        # then costs what one chunk's does. Fresh buffers per piece, joined, ran at a
        # fifth of the speed here (1 GiB through the mount: 0.4 against 2.0 GB/s), the
        # time going to page faults on each new buffer and the copy.
        out = memoryview(bytearray(length)) if len(chunks) > 1 else None
        at = 0
        for index, lo, hi in _pieces(manifest, chunks, offset, length):
            piece = None if out is None else out[at:at + hi - lo]
            got = await self._piece(view, index, lo, hi, piece)
            if out is None:
                return got
            at += hi - lo
        assert out is not None
        return out

    def read_local(self, content: str, offset: int, length: int) -> Buffer | None:
        """The bytes if the content's view is loaded and every chunk of them is in the
        store and passes its check; else None. Synchronous and thread-safe: for a
        decoder thread, which must not wait on the event loop for bytes already here."""
        view = self._views.get(content)
        if view is None:
            return None
        manifest = view.manifest
        try:
            chunks = manifest.chunks_for_range(offset, length)
        except ValueError:
            return None
        out = memoryview(bytearray(length))
        at = 0
        for index, lo, hi in _pieces(manifest, chunks, offset, length):
            try:
                view.read_chunk(index, lo, hi, out[at:at + hi - lo])
            except (MissingChunk, DamagedChunk):
                return None
            at += hi - lo
        return out

    async def _piece(self, view: ChunkView, index: int, lo: int, hi: int,
                     into: memoryview | None) -> Buffer:
        try:
            if self.threaded_reads:
                return await asyncio.to_thread(view.read_chunk, index, lo, hi, into)
            return view.read_chunk(index, lo, hi, into)
        except DamagedChunk as exc:
            log.warning("%s; asking the agent for chunk %d again", exc, index)
        except MissingChunk:
            pass
        whole = await self._from_agent(view, index)
        if into is None:
            return whole[lo:hi]
        into[:] = whole[lo:hi]
        return into

    async def _view(self, content: str) -> ChunkView:
        view = self._views.get(content)
        if view is not None:
            return view
        try:
            cid = check_content_id(content)
        except ManifestError as exc:
            raise SourceError(str(exc)) from None
        async with self._view_lock:
            if cid not in self._views:
                self._views[cid] = await self._load_view(cid)
        return self._views[cid]

    async def _load_view(self, cid: ContentId) -> ChunkView:
        try:
            return ChunkView.load(self.store_dir, cid, self._recent)
        except FileNotFoundError:
            pass
        except (ManifestError, OSError) as exc:
            raise SourceError(f"the store's manifest of {cid} is unusable: {exc}") from None
        try:  # the agent attaches it: the manifest, from the tracker, lands in the store
            async with asyncio.timeout(self.read_timeout_s):
                await self._while_agent_away(lambda: self.client.prefetch(cid, []),
                                             f"the manifest of {cid}")
            return ChunkView.load(self.store_dir, cid, self._recent)
        except AgentError as exc:
            raise SourceError(f"the agent cannot provide {cid}: {exc}") from None
        except TimeoutError:
            raise SourceError(f"no agent gave {cid} within {self.read_timeout_s:g} s") from None
        except (ManifestError, OSError) as exc:
            raise SourceError(f"the agent attached {cid} but its manifest in {self.store_dir} "
                              f"is unusable ({exc}); is --store-dir the agent's store?") \
                from None

    async def _from_agent(self, view: ChunkView, index: int) -> memoryview:
        key = (view.manifest.content_id, index)
        now = asyncio.get_running_loop().time()
        until, why = self._failed.get(key, (0.0, ""))
        if now < until:
            raise SourceError(f"{why} (failed {RETRY_AFTER_S - (until - now):.1f} s ago; "
                              f"tried again after {RETRY_AFTER_S:g} s)")
        task = self._inflight.get(key)
        if task is None:
            task = asyncio.create_task(self._fetch_chunk(view, index))
            self._inflight[key] = task
            task.add_done_callback(lambda t: self._fetched(key, t))
        return await asyncio.shield(task)  # one reader's deadline does not cancel the others'

    def _fetched(self, key: tuple[ContentId, int], task: asyncio.Task[memoryview]) -> None:
        if self._inflight.get(key) is task:
            del self._inflight[key]
        error = None if task.cancelled() else task.exception()  # retrieved: waiters get it
        if error is not None:
            until = asyncio.get_running_loop().time() + RETRY_AFTER_S
            self._failed[key] = (until, str(error) or type(error).__name__)
        else:
            self._failed.pop(key, None)

    @staticmethod
    async def _while_agent_away(call: Callable[[], Awaitable[object]], what: str) -> None:
        """`call()`, again every AGENT_RETRY_S while the agent is away (restarting or being
        upgraded): the reader pauses instead of seeing an error; the caller bounds it."""
        waited = False
        while True:
            try:
                await call()
                return
            except AgentUnreachable as exc:
                if not waited:
                    log.warning("%s waits for the agent: %s", what, exc)
                waited = True
                await asyncio.sleep(AGENT_RETRY_S)

    async def _fetch_chunk(self, view: ChunkView, index: int) -> memoryview:
        manifest = view.manifest
        length = manifest.chunk_length(index)
        buf = bytearray(length)
        got = 0

        def write(data: bytes) -> None:
            nonlocal got
            n = min(len(data), length - got)
            buf[got:got + n] = data[:n]
            got += len(data)

        async def attempt() -> None:
            nonlocal got
            got = 0
            await self.client.read_to(manifest.content_id, manifest.chunk_offset(index),
                                      length, write)

        try:
            async with asyncio.timeout(self.read_timeout_s):
                await self._while_agent_away(attempt,
                                             f"chunk {index} of {manifest.content_id}")
        except AgentError as exc:
            raise SourceError(f"the agent could not read chunk {index} of "
                              f"{manifest.content_id}: {exc}") from None
        except TimeoutError:
            raise SourceError(f"chunk {index} of {manifest.content_id} did not arrive from "
                              f"the agent within {self.read_timeout_s:g} s") from None
        if got != length or not manifest.verify(index, buf):
            raise SourceError(f"the agent sent chunk {index} of {manifest.content_id} that "
                              f"fails its check ({got} bytes); not using it")
        self.agent_chunks += 1
        return memoryview(buf)


def _pieces(manifest: Manifest, chunks: Iterable[int], offset: int,
            length: int) -> Iterator[tuple[int, int, int]]:
    """(chunk, lo, hi): the part [lo, hi) of each chunk that bytes [offset, +length) cover."""
    for index in chunks:
        start = manifest.chunk_offset(index)
        yield (index, max(offset - start, 0),
               min(offset + length - start, manifest.chunk_length(index)))


class RangeFile(io.RawIOBase):
    """A seekable, read-only file over `read_at(offset, n) -> bytes`, for synchronous
    readers (an image decoder's thread, a training script's loader). A read asks for
    exactly the bytes wanted, in one call; seeking before the start stops at 0."""

    def __init__(self, size: int, read_at: Callable[[int, int], Buffer]) -> None:
        super().__init__()
        self.size = size
        self._read_at = read_at
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self.size}[whence]
        self._pos = max(base + offset, 0)
        return self._pos

    def read(self, size: int | None = -1) -> bytes:
        left = max(self.size - self._pos, 0)
        n = left if size is None or size < 0 else min(size, left)
        if n == 0:
            return b""
        data = self._read_at(self._pos, n)
        self._pos += n
        return bytes(data)

    def readall(self) -> bytes:
        return self.read(-1)

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        n = max(min(len(view), self.size - self._pos), 0)
        if n == 0:
            return 0
        view[:n] = self._read_at(self._pos, n)
        self._pos += n
        return n


async def open_agent_source(store_dir: Path, api_socket: str,
                            read_timeout_s: float = READ_TIMEOUT_S) -> AgentSource:
    """An AgentSource with its own client (call inside the loop that will use it)."""
    return AgentSource(store_dir, AgentClient(api_socket), read_timeout_s)
