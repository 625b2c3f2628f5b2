"""Get files' bytes out of packs, through the local agent, into their paths.

`unpack` is given, per file digest it wants, the path that digest is to be
written to, and the packs. Every pack is first asked of the agent with
`ensure`, so the agent fetches all its chunks at once, from every peer that
holds them, rather than one reader's demand at a time. Then the bytes come
out one of two ways:

- *from the store* (`store_dir` given, the usual case on a node): once a
  pack is complete, its chunk files are read straight from the agent's store
  through `p2p.chunkview.ChunkView` (each chunk checked against the manifest the
  pack's id pins), by `PARALLEL_PACKS` extractor processes (`_Extractors`),
  a pack each. No HTTP, and no copy through the agent's process. Packs are
  asked of the agent `PARALLEL_FETCHES` at a time, biggest first, so they
  complete one after another and are extracted while the rest arrive (all at
  once, they all completed at the end);
- *through the API* (no store directory, or one without the pack's manifest,
  i.e. not this agent's store, or one this process cannot read):
  member-aligned ranges of about `SEGMENT_BYTES` are streamed with `read_to`,
  `PARALLEL_READS` at a time, while the agent is still fetching.

Either way a `_MemberWriter` decodes a compressed pack's frames as they
come (`depsnap.frames`), cuts the raw byte stream at member boundaries,
writes each wanted member to its path and checks it against its BLAKE3
digest as it goes (the tree's digests are also the local cache's keys, so a
tree that lies about one must not get it into the cache).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import blake3

from depsnap.frames import FrameDecoder, FrameError
from depsnap.snapshot import Member, Pack
from p2p.agentclient import AgentClient, AgentError
from p2p.chunkview import ChunkView
from p2p.content import ContentId, ManifestError
from p2p.store import DamagedChunk, MissingChunk, write_all

log = logging.getLogger(__name__)

PARALLEL_PACKS = min(os.cpu_count() or 1, 8)  # extractor processes: packs extracted at once
PARALLEL_FETCHES = 6  # packs asked of the agent at once
PARALLEL_READS = 8  # ranges streamed through the API at once
SEGMENT_BYTES = 32 << 20


class UnpackError(Exception):
    """A pack's bytes cannot be had or do not match the tree; the message says which."""


@dataclass(frozen=True, slots=True)
class _Segment:
    """A run of whole members of one pack, read as one range."""

    pack: Pack
    start: int
    end: int
    members: tuple[Member, ...]


def segments(pack: Pack, targets: Mapping[str, str], size: int) -> list[_Segment]:
    """The pack's members with a target, cut into runs of about `size` bytes or more
    (a compressed pack is one run: its stream is decoded from its first frame on)."""
    if pack.frames:
        return [_Segment(pack, 0, pack.size, pack.members)]
    out: list[list[Member]] = []
    group: list[Member] = []
    for m in pack.members:
        group.append(m)
        if m.offset + m.size - group[0].offset >= size:
            out.append(group)
            group = []
    if group:
        out.append(group)
    return [_Segment(pack, g[0].offset, g[-1].offset + g[-1].size, tuple(g)) for g in out
            if any(m.digest in targets for m in g)]


async def unpack(agent: AgentClient, packs: list[Pack], targets: dict[str, str],
                 store_dir: Path | None) -> None:
    """Write every digest in `targets` to its path, out of `packs` (see the module doc)."""
    owned = _owners(packs, targets)
    slots = asyncio.Semaphore(PARALLEL_PACKS if store_dir else PARALLEL_READS)
    fetching = asyncio.Semaphore(PARALLEL_FETCHES)
    extractors = _Extractors(PARALLEL_PACKS) if store_dir is not None and packs else None

    async def from_store(pack: Pack, store: Path) -> None:
        async with fetching:
            await _ensure(agent, pack)
        async with slots:
            try:
                ChunkView.load(store, ContentId(pack.content))  # ours, and readable?
            except (OSError, ManifestError) as exc:
                log.warning("cannot read pack %s from the agent's store %s (%s); reading it "
                            "through the agent instead", pack.content, store, exc)
                for seg in segments(pack, owned[pack.content], SEGMENT_BYTES):
                    await through_api(seg)
                return
            assert extractors is not None
            await extractors.extract(store, pack, owned[pack.content])

    async def through_api(seg: _Segment) -> None:
        async with slots if store_dir is None else contextlib.nullcontext():
            writer = _MemberWriter(seg, owned[seg.pack.content])
            stored = (0, seg.pack.stored_size) if seg.pack.frames \
                else (seg.start, seg.end - seg.start)
            try:
                await agent.read_to(seg.pack.content, *stored, writer.write_stored)
            except AgentError as exc:
                raise UnpackError(f"cannot fetch pack {seg.pack.name} ({seg.pack.content}): "
                                  f"{exc}") from None
            finally:
                writer.close()
            writer.check_done()

    if store_dir is not None:  # biggest first: the last pack to arrive is quick to extract
        tasks = [asyncio.create_task(from_store(p, store_dir))
                 for p in sorted(packs, key=lambda p: -p.stored_size)]
    else:
        tasks = [asyncio.create_task(_ensure(agent, p)) for p in packs]
        tasks += [asyncio.create_task(through_api(s)) for p in packs
                  for s in segments(p, owned[p.content], SEGMENT_BYTES)]
    try:
        await asyncio.gather(*tasks)
    finally:  # one failed: stop the others before the caller removes the tree
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if extractors is not None:
            extractors.stop()


class _Extractors:
    """Processes that extract packs from the store (`_extract`), forked at the start.

    Not threads: extracting is decoding frames, hashing and writing thousands of
    files, and the Python work per file (open, hash, close) holds the GIL. The
    bench's 22 packs (454 MB, 10,447 files) from a complete store, two at a time:
    0.67-0.77 s in processes, 0.74-0.90 s in threads (alternating runs, loaded
    machine). `stop` ends them: at once if a pack failed, so none writes into a
    tree the caller is removing. They ignore SIGINT: the restore handles it."""

    def __init__(self, processes: int) -> None:
        self._pool = multiprocessing.get_context("fork").Pool(processes, _ignore_sigint)
        self._failed = False

    async def extract(self, store: Path, pack: Pack, targets: dict[str, str]) -> None:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()

        def settle(error: BaseException | None) -> None:
            if done.done():
                return
            if error is None:
                done.set_result(None)
            else:
                done.set_exception(error)

        self._pool.apply_async(
            _extract_from, (store, pack, targets),
            callback=lambda _: loop.call_soon_threadsafe(settle, None),
            error_callback=lambda exc: loop.call_soon_threadsafe(settle, exc))
        try:
            await done
        except BaseException:
            self._failed = True
            raise

    def stop(self) -> None:
        if self._failed:
            self._pool.terminate()
        else:
            self._pool.close()
        self._pool.join()


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _extract_from(store: Path, pack: Pack, targets: dict[str, str]) -> None:
    """`_extract` in an extractor process, with a view of its own."""
    try:
        view = ChunkView.load(store, ContentId(pack.content))
    except (OSError, ManifestError) as exc:
        raise UnpackError(f"pack {pack.name}: the agent's store lost it ({exc})") from None
    _extract(view, pack, targets)


def _owners(packs: list[Pack], targets: dict[str, str]) -> dict[str, dict[str, str]]:
    """Per pack, the targets it writes: each digest from the first pack that has it."""
    owned: dict[str, dict[str, str]] = {p.content: {} for p in packs}
    placed: set[str] = set()
    for pack in packs:
        for m in pack.members:
            if m.digest in targets and m.digest not in placed:
                placed.add(m.digest)
                owned[pack.content][m.digest] = targets[m.digest]
    return owned


async def _ensure(agent: AgentClient, pack: Pack) -> None:
    try:
        await agent.ensure(pack.content)
    except AgentError as exc:
        raise UnpackError(f"cannot fetch pack {pack.name} ({pack.content}): {exc}") from None


def _extract(view: ChunkView, pack: Pack, targets: dict[str, str]) -> None:
    """Write the pack's wanted members from the agent's store."""
    manifest = view.manifest
    if manifest.size != pack.stored_size:
        raise UnpackError(f"pack {pack.name} ({pack.content}) has {manifest.size} bytes, "
                          f"the tree says {pack.stored_size}")
    writer = _MemberWriter(_Segment(pack, 0, pack.size, pack.members), targets)
    try:
        for index in range(manifest.chunks):
            writer.write_stored(view.read_chunk(index, 0, manifest.chunk_length(index)))
    except (MissingChunk, DamagedChunk) as exc:
        raise UnpackError(f"pack {pack.name}: {exc}") from None
    finally:
        writer.close()
    writer.check_done()


class _MemberWriter:
    """Cuts a segment's byte stream into its members; writes and checks the wanted ones.
    `write` takes raw bytes, `write_stored` the content's (decoded first if compressed)."""

    def __init__(self, seg: _Segment, targets: dict[str, str]) -> None:
        self.pack = seg.pack
        self.decoder = FrameDecoder(seg.pack) if seg.pack.frames else None
        self.members = seg.members  # sorted and disjoint: Snapshot checks that
        self.targets = targets
        self.index = 0
        self.pos = seg.start
        self.out: int | None = None  # the open member's file descriptor
        self.hash = blake3.blake3()
        self._advance()

    def write_stored(self, data: bytes | memoryview) -> None:
        if self.decoder is None:
            self.write(data)
            return
        try:
            for raw in self.decoder.feed(data):
                self.write(raw)
        except FrameError as exc:
            raise UnpackError(f"{exc} ({self.pack.content})") from None

    def write(self, data: bytes | memoryview) -> None:
        view = memoryview(data)
        while view:
            if self.index >= len(self.members):
                self.pos += len(view)
                return
            m = self.members[self.index]
            if self.pos < m.offset:
                n = min(len(view), m.offset - self.pos)
            else:
                n = min(len(view), m.offset + m.size - self.pos)
                if self.out is not None:
                    write_all(self.out, view[:n])
                    self.hash.update(view[:n])
            view = view[n:]
            self.pos += n
            self._advance()

    def _advance(self) -> None:
        """Finish the members the stream has passed; open the next wanted one."""
        while self.index < len(self.members):
            m = self.members[self.index]
            path = self.targets.get(m.digest)
            if self.out is None and path is not None and self.pos <= m.offset:
                self.out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
                self.hash = blake3.blake3()
            if self.pos < m.offset + m.size:
                return
            if self.out is not None:
                os.close(self.out)
                self.out = None
                if self.hash.hexdigest() != m.digest:
                    raise UnpackError(f"pack {self.pack.name} ({self.pack.content}): the "
                                      f"bytes at {m.offset} do not match digest {m.digest}")
            self.index += 1

    def close(self) -> None:
        if self.out is not None:
            os.close(self.out)
            self.out = None

    def check_done(self) -> None:
        if self.decoder is not None:
            try:
                self.decoder.check_done()
            except FrameError as exc:
                raise UnpackError(f"{exc} ({self.pack.content})") from None
        if self.index < len(self.members):
            raise UnpackError(f"pack {self.pack.name} ended at byte {self.pos}, before its "
                              f"member at {self.members[self.index].offset}")
