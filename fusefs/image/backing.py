"""Backing files of an image mount, for FUSE passthrough, written only from verified bytes.

A file of a plain (uncompressed) tar layer is a range of the layer blob, so
`fusefs.backing` copies it out of the verified chunk files. A file of a gzip
layer exists only decoded: it gets a decoded copy,
`<store>/<layer content>/tar-<offset>-<length>.whole` (the agent's store
ignores the name and removes it with the layer), written with
`fusefs.backing.write_read_only` from what `ImageSource.read` returns: bytes
decoded from verified chunks, each span checked against the layer index's
sha256.

When. At the file's open, if every span under it is decoded in memory already
(the mount's warm-up decodes the spans a recorded launch read, in its order, as
the prefetch brings their chunks), or if every blob chunk its decode reads is
in the hot-block record (`hot`: the prefetch is bringing them; the open waits
for them and decodes, as the handler's first read would have): the hot files
of a prefetched launch. The copy then costs one write into the page cache, and
the kernel reads it by itself instead of sending each read to the handler. Any
other file is served by the handler: copying it at its open would make the
agent fetch and decode the whole file, which a launch may never read.

Trust. A copy is handed to the kernel only if this process wrote it and it
keeps the stat it was written with (the store's rule, as in `fusefs.backing`).
A copy found on disk (an earlier mount's, or one a disk changed) is never
opened: it is written again from decoded bytes (replaced by a rename), or the
handler serves. Checking it instead would mean decoding the spans under it
anyway (the index's digests are per span, and a file starts and ends inside
spans), which is all that writing it costs. Only files of at least
`MIN_COPY_BYTES` get a copy.
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path
from typing import Any

from fusefs.backing import MIN_COPY_BYTES, WholeBacking, WholeFiles, write_all, write_read_only
from fusefs.image.source import ImageSource
from fusefs.source import Buffer, SourceError
from fusefs.tree import Extent
from p2p.chunkfile import StatKey, stat_key

log = logging.getLogger(__name__)


class ImageBacking:
    """A `fusefs.kernelfs.Backing` for an image: plain layers' ranges (`WholeBacking`) and
    decoded copies of gzip layers' files (see the module docstring)."""

    def __init__(self, store_dir: Path, source: ImageSource, plain: frozenset[str],
                 gzip: frozenset[str], hot: frozenset[tuple[str, int]] = frozenset()) -> None:
        """`hot`: the hot-block record's (layer content, chunk)s, being prefetched."""
        self.store_dir = Path(store_dir)
        self.source = source
        self.gzip = gzip
        self.hot = hot
        self.plain = WholeBacking(WholeFiles(self.store_dir, only=plain)) if plain else None
        self.copies = 0  # decoded copies this process wrote
        self.copy_opens = 0  # opens of gzip layers' files answered with a copy
        self.copy_misses = 0  # opens of gzip layers' files worth a copy, not decoded yet
        self.plain_opens = 0  # opens of plain layers' files answered with a backing file
        self._written: dict[Path, StatKey] = {}

    @property
    def built(self) -> int:
        return self.copies + (self.plain.built if self.plain is not None else 0)

    @property
    def checked(self) -> int:
        return self.plain.checked if self.plain is not None else 0

    def account(self) -> dict[str, Any]:
        """What this backing gave the kernel: for the launch's timeline."""
        return {"copy_opens": self.copy_opens, "copy_misses": self.copy_misses,
                "decoded_copies": self.copies, "plain_opens": self.plain_opens}

    def path(self, extent: Extent) -> Path:
        return self.store_dir / extent.content / f"tar-{extent.offset}-{extent.length}.whole"

    async def open(self, extent: Extent) -> int | None:
        if extent.content in self.gzip:
            fd = await self._open_copy(extent)
            self.copy_opens += fd is not None
        elif self.plain is not None:
            fd = await self.plain.open(extent)
            self.plain_opens += fd is not None
        else:
            fd = None
        return fd

    async def _open_copy(self, extent: Extent) -> int | None:
        if extent.length < MIN_COPY_BYTES:
            return None
        path = self.path(extent)
        if path in self._written:
            fd = await asyncio.to_thread(self._open_written, path)
            if fd is not None:
                return fd
        if not (self.source.decoded(extent.content, extent.offset, extent.length)
                or await self._hot(extent)):
            self.copy_misses += 1
            return None
        try:
            data = await self.source.read(extent.content, extent.offset, extent.length)
        except SourceError as exc:  # the handler's own read will say it again
            log.info("no decoded copy %s: %s", path.name, exc)
            return None
        if len(data) != extent.length:
            return None
        return await asyncio.to_thread(self._write, path, data)

    async def _hot(self, extent: Extent) -> bool:
        chunks = await self.source.blob_chunks(extent.content, extent.offset, extent.length)
        return bool(chunks) and all((extent.content, c) in self.hot for c in chunks)

    def _open_written(self, path: Path) -> int | None:
        """An fd of the copy this process wrote at `path`, if it is still the file written."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            fd = -1
        if fd >= 0 and stat_key(os.fstat(fd)) == self._written[path]:
            return fd
        log.warning("%s is not the copy this mount wrote; writing it again", path)
        if fd >= 0:
            os.close(fd)
        del self._written[path]
        return None

    def _write(self, path: Path, data: Buffer) -> int | None:
        try:
            key = write_read_only(path, lambda fd: write_all(fd, memoryview(data)))
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:  # FileNotFoundError: the layer went with an eviction
            log.info("no decoded copy %s: %s", path, exc)
            return None
        if stat_key(os.fstat(fd)) != key:  # replaced between the rename and the open
            os.close(fd)
            return None
        self._written[path] = key
        self.copies += 1
        return fd

    async def close(self) -> None:
        if self.plain is not None:
            await self.plain.close()
