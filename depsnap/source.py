"""The lazy mount's byte source: a file's first read asks the agent for all of it.

A snapshot's files lie whole and contiguous in their packs. The kernel reads
a file a window at a time, and through `fusefs.source.AgentSource` every
missing chunk is one request to the agent, so a 60 MiB shared library
imported on a cold node would cost sixty round trips one after another.
`SnapshotSource` wraps that source: the first read that lands in a file
spanning more chunks than the read needs hands the agent the file's whole
chunk range as a prefetch list (the agent fetches them from peers in
parallel, in that order); the read itself proceeds as before and waits only
for its own chunks. Files that are never opened are never fetched.
"""

from __future__ import annotations

import asyncio
import bisect
import logging

from depsnap.snapshot import Member, Snapshot
from fusefs.source import AgentSource, Buffer

log = logging.getLogger(__name__)


class SnapshotSource:
    """A `fusefs.source.Source` for a snapshot tree (see the module docstring)."""

    def __init__(self, inner: AgentSource, snapshot: Snapshot) -> None:
        self.inner = inner
        self.prefetched_files = 0
        self._members: dict[str, tuple[list[int], tuple[Member, ...]]] = {
            p.content: ([m.offset for m in p.members], p.members) for p in snapshot.packs}
        self._asked: set[tuple[str, int]] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    async def read(self, content: str, offset: int, length: int) -> Buffer:
        self._prefetch_file(content, offset, length)
        return await self.inner.read(content, offset, length)

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.inner.close()

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
        manifest = await self.inner.manifest(content)
        chunks = list(manifest.chunks_for_range(member.offset, member.size))
        if len(chunks) > 1:
            await self.inner.client.prefetch(content, chunks)
            self.prefetched_files += 1

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("prefetch failed (reads fetch on demand): %s", task.exception())
