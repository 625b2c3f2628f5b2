"""The lazy mount's byte source: reads within and across frames.

`SnapshotSource` is driven over a pack held in memory (`Held`, which stands in
for the agent's store: this file tests the decoding, not the
agent; the mount tests in test_depsnap.py and test_depsnap_hot.py do that
through real agents and a real FUSE mount)."""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass

import blake3
import pytest

from depsnap.frames import FrameWriter
from depsnap.snapshot import Member, Pack, Snapshot
from depsnap.source import SnapshotSource

FRAME = 1024
FRAMES = 48


@dataclass
class _Manifest:
    chunk_size: int

    def chunks_for_range(self, offset: int, length: int) -> range:
        return range(offset // self.chunk_size, (offset + length - 1) // self.chunk_size + 1)


class _Client:
    def __init__(self) -> None:
        self.prefetched: list[tuple[str, list[int]]] = []

    async def prefetch(self, content: str, chunks: list[int]) -> None:
        self.prefetched.append((content, chunks))


class Held:
    """A pack's stored bytes, in memory; remembers which ranges were read."""

    def __init__(self, content: str, stored: bytes) -> None:
        self.content, self.stored = content, stored
        self.client = _Client()
        self.reads: list[int] = []  # offsets read

    async def read(self, content: str, offset: int, length: int) -> memoryview:
        assert content == self.content
        self.reads.append(offset)
        return memoryview(self.stored)[offset:offset + length]

    async def manifest(self, content: str) -> _Manifest:
        return _Manifest(4 * FRAME)

    async def close(self) -> None:
        pass


def _pack(raw: bytes) -> tuple[Pack, bytes]:
    writer = FrameWriter(FRAME)
    stored = b"".join([*writer.feed(raw), *writer.finish()])
    content = "c1-" + "5" * 64
    digest = blake3.blake3(raw).hexdigest()  # the mount serves a member only once it matches
    return Pack("unit", content, len(raw), (Member(digest, 0, len(raw)),), FRAME,
                tuple(writer.frames)), stored


def _source(raw: bytes) -> tuple[SnapshotSource, Held, Pack]:
    pack, stored = _pack(raw)
    held = Held(pack.content, stored)
    snapshot = object.__new__(Snapshot)  # the source reads only `packs`
    object.__setattr__(snapshot, "packs", (pack,))
    return SnapshotSource(held, snapshot), held, pack  # type: ignore[arg-type]


async def _settle() -> None:
    """Let the source's background tasks (the file prefetch) run."""
    for _ in range(20):
        await asyncio.sleep(0)


@pytest.mark.parametrize("offset,length", [(0, FRAME), (FRAME - 10, 20), (100, 3 * FRAME),
                                           (5 * FRAME + 1, 2 * FRAME - 2)])
async def test_a_read_across_frames_gives_exactly_the_bytes_asked_for(offset: int,
                                                                      length: int) -> None:
    raw = os.urandom(FRAMES * FRAME // 2) * 2  # compressible, and no two frames alike
    source, _, pack = _source(raw)
    got = await source.read(pack.content, offset, length)
    assert bytes(got) == raw[offset:offset + length]
    await source.close()


async def test_a_files_first_read_checks_it_whole_and_the_file_is_prefetched() -> None:
    """A lazy mount serves a file only once its whole member matches the snapshot's digest
    (as a restore does): the first read decodes every frame of it, once; later reads of it
    decode nothing again."""
    source, held, pack = _source(os.urandom(FRAMES * FRAME))
    await source.read(pack.content, 3 * FRAME, 10)
    await _settle()
    starts = [sum(pack.frames[:i]) for i in range(len(pack.frames))]
    assert sorted(held.reads) == starts
    await source.read(pack.content, 5 * FRAME, 10)
    assert sorted(held.reads) == starts
    # The file is the whole pack: its stored bytes' chunks go to the agent as a prefetch.
    chunks = list(range((sum(pack.frames) - 1) // (4 * FRAME) + 1))
    assert held.client.prefetched == [(pack.content, chunks)]
    await source.close()
