"""Image file bytes: uncompressed tar ranges of gzip layers, decoded through their index.

An image tree's extents name a layer's swarm content and an offset in the
layer's *uncompressed* tar stream (that is what the tar table of contents
gives). `ImageSource.read` turns such a range into the compressed byte range
a decode needs (`LayerReader.compressed_range`: from the span's access point
to a little past the next one), makes sure those compressed chunks are local
and verified (through `fusefs.source.AgentSource`: the store's files, or the
agent for missing ones, concurrently, under its read deadline), then decodes
in a worker thread (`LayerReader.read`, which checks each decoded span
against the index's digest and keeps recent spans).

The decoder reads compressed bytes through a small synchronous file object.
Almost always those bytes are already local (just made so), but if a decode
wanders further, the file object asks the event loop for them and waits: a
correct read is never traded for a fast one.

Recording: with a `Recorder`, every read reports the compressed chunks it
needed, per layer digest, before any cache answers it, so a record lists what
a launch needs even when this mount already had it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

from fusefs.image.gzindex import LayerError, LayerIndex, LayerReader
from fusefs.image.record import Recorder
from fusefs.source import AgentSource, Buffer, RangeFile, SourceError
from p2p.content import ContentId

SPAN_CACHE_BYTES = 64 << 20  # decoded spans kept per layer


@dataclass(frozen=True, slots=True)
class _Layer:
    digest: str
    reader: LayerReader
    chunk_bytes: int


class ImageSource:
    """A `fusefs.source.Source` for image trees (see the module docstring)."""

    def __init__(self, inner: AgentSource, recorder: Recorder | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.inner = inner
        self.recorder = recorder
        self._clock = clock
        self._layers: dict[str, _Layer] = {}

    async def add_layer(self, content_id: ContentId, digest: str, index: LayerIndex) -> None:
        """Serve `content_id` (the gzip blob of layer `digest`) decompressed."""
        manifest = await self.inner.manifest(content_id)
        loop = asyncio.get_running_loop()
        timeout = self.inner.read_timeout_s + 5.0

        def read_compressed(offset: int, length: int) -> bytes:
            future = asyncio.run_coroutine_threadsafe(
                self.inner.read(content_id, offset, length), loop)
            return bytes(future.result(timeout))

        blob = RangeFile(manifest.size, read_compressed)
        reader = LayerReader(index, blob, cache_bytes=SPAN_CACHE_BYTES)
        self._layers[content_id] = _Layer(digest, reader, manifest.chunk_size)

    async def read(self, content: str, offset: int, length: int) -> Buffer:
        layer = self._layers.get(content)
        if layer is None:
            return await self.inner.read(content, offset, length)
        start, end = layer.reader.compressed_range(offset, length)
        if self.recorder is not None:
            first, last = start // layer.chunk_bytes, (end - 1) // layer.chunk_bytes
            self.recorder.touched(layer.digest, range(first, last + 1), self._clock())
        if not layer.reader.cached(offset, length):
            await self.inner.read(content, start, end - start)  # local and verified now
        try:
            return await asyncio.to_thread(layer.reader.read, offset, length)
        except LayerError as exc:
            raise SourceError(str(exc)) from None

    async def close(self) -> None:
        await self.inner.close()
