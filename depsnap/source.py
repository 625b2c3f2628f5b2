"""The lazy mount's byte source: compressed packs decoded, files prefetched whole.

The mount's tree (`depsnap.mounttree.snapshot_tree`) gives every file one extent
in its pack's *raw* bytes; `SnapshotSource` turns a read of raw bytes into a
read of the content the pack is stored as, through `fusefs.source.AgentSource`
(local chunks straight from the agent's store, missing ones through the
agent):

- A compressed pack (`depsnap.frames`) is read a frame at a time: the stored
  bytes of each frame under the read are read, decoded and checked against
  the raw length the tree gives, and the last `CACHED_FRAMES` decoded frames
  are kept (a 1 MiB frame holds many small `.py` files, which Python opens one
  after another, and the kernel reads a big file in windows smaller than a
  frame). Concurrent reads of one frame share one decode.
- The first read that lands in a file spanning more chunks than the read
  needs hands the agent the file's whole chunk range as a prefetch list (the
  agent fetches them from peers in parallel, in that order): the kernel reads
  a file a window at a time, and a 60 MiB shared library imported on a cold
  node would otherwise cost a round trip per chunk, one after another. The
  read itself waits only for its own chunks. Files never opened are never
  fetched.
- A file's bytes are served only once its whole member has been read and its
  BLAKE3 digest matched the tree's, as a restore checks them (the packs'
  chunks are verified against their manifest, but the tree, not the pack,
  says which bytes a file must hold). A mismatch is an EIO on every read of
  that file. The check is one pass over the bytes the first read's prefetch
  fetches anyway; verified members are remembered.
- With a `Recorder` (record mode, `depsnap.hot`), every read of a compressed
  pack reports the frames under it, before any cache answers it, so the
  record lists what the mount's readers needed, in the order they first did.
- `prefetch_hot` hands the agent the chunks under a record's frames, per
  pack, in the record's order: the agent fetches them from peers while the
  mount is still starting, so the first import finds them local.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import time
from collections import OrderedDict
from collections.abc import Callable

import blake3
import zstandard

from depsnap.frames import FrameError, decode_frame, frame_span, stored_offsets
from depsnap.hot import Frame, chunk_plan
from depsnap.snapshot import Member, Pack, Snapshot
from fusefs.record import Recorder
from fusefs.source import AgentSource, Buffer, SourceError

log = logging.getLogger(__name__)

CACHED_FRAMES = 64  # decoded frames kept (1 MiB each): with 32, 15% of decodes were repeats


class SnapshotSource:
    """A `fusefs.source.Source` for a snapshot tree (see the module docstring)."""

    def __init__(self, inner: AgentSource, snapshot: Snapshot, recorder: Recorder | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.inner = inner
        self.recorder = recorder
        self._clock = clock
        self.prefetched_files = 0
        self.decoded_frames = 0  # decodes, repeats included (a frame evicted, then read)
        self._seen: set[tuple[str, int]] = set()  # frames decoded at least once
        self._packs = {p.content: p for p in snapshot.packs}
        self._offsets = {p.content: stored_offsets(p) for p in snapshot.packs if p.frames}
        self._members: dict[str, tuple[list[int], tuple[Member, ...]]] = {
            p.content: ([m.offset for m in p.members], p.members) for p in snapshot.packs}
        self._asked: set[tuple[str, int]] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._decoded: OrderedDict[tuple[str, int], bytes] = OrderedDict()
        self._decoding: dict[tuple[str, int], asyncio.Task[bytes]] = {}
        self._zstd = zstandard.ZstdDecompressor()  # decodes run on the event loop's thread
        self._verified: set[tuple[str, int]] = set()  # (pack, member index) whose digest held
        self._verifying: dict[tuple[str, int], asyncio.Task[None]] = {}

    async def read(self, content: str, offset: int, length: int) -> Buffer:
        self._prefetch_file(content, offset, length)
        starts, members = self._members.get(content, ([], ()))
        index = bisect.bisect_right(starts, offset) - 1
        if index >= 0 and length and (content, index) not in self._verified:
            key = (content, index)
            task = self._verifying.get(key)
            if task is None:
                task = asyncio.create_task(self._verify(content, members[index]))
                self._verifying[key] = task
                task.add_done_callback(lambda _: self._verifying.pop(key, None))
            await asyncio.shield(task)
            self._verified.add(key)
        return await self._read_raw(content, offset, length)

    async def _verify(self, content: str, member: Member) -> None:
        """Read the member whole and check its digest; SourceError if it does not match."""
        h = blake3.blake3()
        step = 4 << 20
        for start in range(member.offset, member.offset + member.size, step):
            size = min(step, member.offset + member.size - start)
            h.update(await self._read_raw(content, start, size))
        if h.hexdigest() != member.digest:
            raise SourceError(f"a file in pack {content} does not match the snapshot's "
                              f"digest {member.digest}: refusing to serve it")

    async def _read_raw(self, content: str, offset: int, length: int) -> Buffer:
        pack = self._packs.get(content)
        if pack is None or not pack.frames or length == 0:
            return await self.inner.read(content, offset, length)
        span = frame_span(pack, self._offsets[content], offset, length)
        if self.recorder is not None:
            self.recorder.touched(content, range(span.first, span.last + 1), self._clock())
        frames = await asyncio.gather(*(self._frame(pack, i)
                                        for i in range(span.first, span.last + 1)))
        start = offset - span.first * pack.frame_bytes
        if len(frames) == 1:
            return memoryview(frames[0])[start:start + length]
        # Copy only the bytes asked for, not every frame under them.
        end = start + length
        return b"".join(memoryview(f)[max(start - i * pack.frame_bytes, 0):
                                      max(end - i * pack.frame_bytes, 0)]
                        for i, f in enumerate(frames))

    async def prefetch_hot(self, frames: list[Frame]) -> int:
        """Ask the agent for the chunks under `frames` (a hot-frame record's, in its
        order), pack after pack in the order of their first frame; the chunks asked for."""
        contents = list(dict.fromkeys(pack.content for pack, _ in frames))
        manifests = await asyncio.gather(*(self.inner.manifest(c) for c in contents))
        sizes = {c: m.chunk_size for c, m in zip(contents, manifests, strict=True)}
        plan = chunk_plan(frames, sizes)
        for content, chunks in plan.items():
            await self.inner.client.prefetch(content, chunks)
        return sum(len(chunks) for chunks in plan.values())

    def account(self) -> dict[str, int]:
        """Frames decoded, and how many of them were distinct (the rest were repeats)."""
        return {"decoded_frames": self.decoded_frames, "distinct_frames": len(self._seen),
                "verified_files": len(self._verified)}

    async def close(self) -> None:
        tasks = [*self._tasks, *self._decoding.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.inner.close()

    async def _frame(self, pack: Pack, index: int) -> bytes:
        key = (pack.content, index)
        raw = self._decoded.get(key)
        if raw is not None:
            self._decoded.move_to_end(key)
            return raw
        task = self._decoding.get(key)
        if task is None:
            task = asyncio.create_task(self._decode(pack, index))
            self._decoding[key] = task
            task.add_done_callback(lambda _: self._decoding.pop(key, None))
        return await asyncio.shield(task)  # one reader's deadline does not cancel another's

    async def _decode(self, pack: Pack, index: int) -> bytes:
        start = self._offsets[pack.content][index]
        stored = await self.inner.read(pack.content, start, pack.frames[index])
        try:
            raw = decode_frame(pack, index, stored, self._zstd)
        except FrameError as exc:
            raise SourceError(f"{exc} ({pack.content})") from None
        self._decoded[(pack.content, index)] = raw
        self.decoded_frames += 1
        self._seen.add((pack.content, index))
        if len(self._decoded) > CACHED_FRAMES:
            self._decoded.popitem(last=False)
        return raw

    def _prefetch_file(self, content: str, offset: int, length: int) -> None:
        starts, members = self._members.get(content, ([], ()))
        index = bisect.bisect_right(starts, offset) - 1
        if index < 0 or (content, index) in self._asked:
            return
        self._asked.add((content, index))
        member = members[index]
        if member.offset + member.size <= offset + length:
            return  # this read covers the rest of the file
        task = asyncio.create_task(self._prefetch(content, member))
        self._tasks.add(task)
        task.add_done_callback(self._done)

    async def _prefetch(self, content: str, member: Member) -> None:
        start, size = member.offset, member.size
        pack = self._packs[content]
        if pack.frames:
            span = frame_span(pack, self._offsets[content], start, size)
            start, size = span.start, span.end - span.start
        manifest = await self.inner.manifest(content)
        chunks = list(manifest.chunks_for_range(start, size))
        if len(chunks) > 1:
            await self.inner.client.prefetch(content, chunks)
            self.prefetched_files += 1

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("prefetch failed (reads fetch on demand): %s", task.exception())
