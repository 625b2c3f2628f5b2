"""Decoded copies of a snapshot's files, for FUSE passthrough: written only from verified bytes.

A snapshot file is a member of a pack kept as zstd frames; passthrough maps a FUSE
file onto one plain file, so a file the kernel reads by itself needs a decoded copy:
`<store>/<pack>/member-<offset>-<size>.whole`, beside the pack's chunks (the agent's
store ignores the name and removes it with the pack). It is written from what
`depsnap.source.SnapshotSource.read` returns: bytes decoded from verified chunks
that matched the file's BLAKE3 digest in the snapshot's tree, which this process
holds in memory while it writes them (so, unlike `fusefs.backing`'s copies, made by
the kernel from chunk files, the written file is not hashed a second time). A copy
this process did not write is hashed against the digest at its first open here
before the kernel gets it; after that, as one it wrote, it is trusted while its stat
is what it was (the store's rule, as in `fusefs.backing`, whose per-store memory of
checked stats it shares: one check per process, whichever of its mounts opens first).
A copy that fails is deleted and written again.

When. A file opened before its copy exists is served by the handler, and its
copy is written then, in the background: the next open (in this mount, or a
later one on this node) reads by passthrough. With a hot-frame record, `warm`
writes the copies of the files the recorded frames hold whole, in the
record's order, as the prefetch brings their chunks, so a first import finds
them.
Only files of at least `MIN_COPY_BYTES` get a copy: a smaller file is one READ
through the handler, and its copy would cost a file creation on the node's
disk for at most that round trip (the shared libraries an import maps are the
bytes that matter: 164 MiB of `import pandas`).
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import mmap
import os
from pathlib import Path

import blake3

from depsnap.hot import Frame
from depsnap.snapshot import Member, Snapshot
from depsnap.source import SnapshotSource
from fusefs.backing import MIN_COPY_BYTES, checked_in, write_read_only
from fusefs.source import Buffer, SourceError
from fusefs.tree import Extent

log = logging.getLogger(__name__)


class MemberFiles:
    """A `fusefs.kernelfs.Backing` of decoded snapshot files (see the module docstring)."""

    def __init__(self, store_dir: Path, snapshot: Snapshot, source: SnapshotSource) -> None:
        self.store_dir = Path(store_dir)
        self.source = source
        self.built = 0
        self.checked = 0  # copies this object hashed at an open: not trusted by then
        self._members = {(p.content, m.offset): m for p in snapshot.packs for m in p.members}
        self._checked = checked_in(self.store_dir)  # shared by this process's mounts
        self._building: dict[tuple[str, int], asyncio.Task[bool]] = {}

    def path(self, pack: str, member: Member) -> Path:
        return self.store_dir / pack / f"member-{member.offset}-{member.size}.whole"

    async def open(self, extent: Extent) -> int | None:
        member = self._members.get((extent.content, extent.offset))
        if member is None or member.size != extent.length or member.size < MIN_COPY_BYTES:
            return None
        fd = await asyncio.to_thread(self._open_checked, extent.content, member)
        if fd is None:
            self._build_later(extent.content, member)
        return fd

    async def warm(self, frames: list[Frame]) -> int:
        """Write the copies of the files under `frames` (a hot-frame record's), in the
        order of their first recorded frame; the copies written. A file that cannot be
        read now is left to the handler (its own read reports why)."""
        written = 0
        for pack, member in self._under(frames):
            if self.path(pack, member).exists():
                continue
            task = self._build_later(pack, member)  # one build per file, whoever asks
            try:
                written += await asyncio.shield(task)
            except (SourceError, TimeoutError) as exc:
                log.info("no decoded copy of a file of pack %s yet: %s", pack, exc)
        log.info("wrote %d decoded copies ahead of the first reads", written)
        return written

    def _under(self, frames: list[Frame]) -> list[tuple[str, Member]]:
        """The files worth a copy whose every frame is in `frames`, in the order of their
        first one there. A file the recorded mounts read is one: its first read checked
        it whole. Others would make the agent fetch chunks the record does not list."""
        hot = {(pack.content, index) for pack, index in frames}
        out: dict[tuple[str, int], Member] = {}
        starts: dict[str, list[int]] = {}
        for pack, index in frames:
            if not pack.frame_bytes:
                continue
            offsets = starts.setdefault(pack.content, [m.offset for m in pack.members])
            lo, hi = index * pack.frame_bytes, (index + 1) * pack.frame_bytes
            first = max(bisect.bisect_right(offsets, lo) - 1, 0)
            for member in pack.members[first:bisect.bisect_left(offsets, hi)]:
                end = member.offset + member.size
                if member.size < MIN_COPY_BYTES or end <= lo:
                    continue
                span = range(member.offset // pack.frame_bytes, (end - 1) // pack.frame_bytes + 1)
                if all((pack.content, i) in hot for i in span):
                    out.setdefault((pack.content, member.offset), member)
        return [(pack, member) for (pack, _), member in out.items()]

    def _build_later(self, pack: str, member: Member) -> asyncio.Task[bool]:
        key = (pack, member.offset)
        task = self._building.get(key)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._build(pack, member))
            self._building[key] = task
            task.add_done_callback(lambda t: self._done(key, t))
        return task

    def _done(self, key: tuple[str, int], task: asyncio.Task[bool]) -> None:
        self._building.pop(key, None)
        if not task.cancelled() and task.exception() is not None:
            log.info("no decoded copy of a file of pack %s: %s", key[0], task.exception())

    async def _build(self, pack: str, member: Member) -> bool:
        data = await self.source.read(pack, member.offset, member.size)  # checked: digest
        return await asyncio.to_thread(self._write, pack, member, data)

    def _write(self, pack: str, member: Member, data: Buffer) -> bool:
        path = self.path(pack, member)

        def fill(fd: int) -> None:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]

        try:
            self._checked.passed(path, write_read_only(path, fill))
        except FileNotFoundError as exc:  # the pack's directory went with an eviction
            log.info("no decoded copy %s: %s", path, exc)
            return False
        except OSError as exc:
            log.warning("no decoded copy %s: %s", path, exc)
            return False
        self.built += 1
        return True

    def _open_checked(self, pack: str, member: Member) -> int | None:
        fd, checked = self._checked.open(self.path(pack, member),
                                         lambda fd: _passes(fd, member))
        self.checked += checked
        return fd

    async def close(self) -> None:
        for task in self._building.values():
            task.cancel()
        await asyncio.gather(*self._building.values(), return_exceptions=True)


def _passes(fd: int, member: Member) -> bool:
    """Whether the file at `fd` holds the member's bytes (hashed through a mapping)."""
    if os.fstat(fd).st_size != member.size:
        return False
    with mmap.mmap(fd, 0, prot=mmap.PROT_READ) as mapped:
        return blake3.blake3(mapped).hexdigest() == member.digest
