"""Image file bytes: tar ranges of image layers, gzip layers decoded through their index.

An image tree's extents name a layer's swarm content and an offset in the
layer's *uncompressed* tar stream (that is what the tar table of contents
gives). `ImageSource.read` turns such a range into the compressed byte range
a decode needs (`LayerIndex.compressed_range`: from the span's access point
to a little past the next one), makes sure those compressed chunks are local
and verified (through `fusefs.source.AgentSource`: the store's files, or the
agent for missing ones, concurrently, under its read deadline), then decodes
in a worker thread (`LayerReader.read`, which checks each decoded span
against the index's sha256 and keeps recent spans). Reads of spans already
decoded skip the first step.

The decoder reads compressed bytes through a small synchronous file object,
straight from the store's chunk files in its own thread (`AgentSource.read_local`,
verified as every read is). Almost always those bytes are already local (just
made so), but if a decode wanders further (a reader reopening after a failed
span reads the blob's head again), the file object asks the event loop for
them and waits: a correct read is never traded for a fast one. The direct path
matters: through the loop, a decode waited on it for every 128 KiB it read,
and ran at half speed while the loop was busy.

Warming: with a hot-block record, `warm` decodes the spans the recorded
launch read, in its order, as the prefetch brings their bytes, so the launch
finds them decoded.

A layer's reader is made on its first read, not at mount: opening one reads
the blob's first `HEADER_BYTES`, and most layers of a large image are never
read by a launch.

A plain (uncompressed) tar layer needs none of this: its tar offsets are blob
offsets, so its reads go straight to `AgentSource` (the store's chunk files).

Recording: with a `Recorder`, every read reports the compressed chunks it
needed, per layer digest, before any cache answers it, so a record lists what
a launch needs even when this mount already had it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import BinaryIO, cast

from fusefs.image.layerindex import LayerIndex
from fusefs.image.layerreader import HEADER_BYTES, LayerReader
from fusefs.image.record import Recorder
from fusefs.image.toc import LayerError
from fusefs.source import AgentSource, Buffer, RangeFile, SourceError
from p2p.content import ContentId

log = logging.getLogger(__name__)

SPAN_CACHE_BYTES = 32 << 20  # decoded spans kept per layer
WARM_BYTES = 512 << 20  # decoded spans kept ahead of a launch, for the whole image
WARM_HOLD_S = 60.0  # how long they are kept beyond the cache's usual bound
BRIDGE_SLACK_S = 5.0  # a decoder thread waits the read deadline plus this for blob bytes


class _Layer:
    """One gzip layer of the image; its reader once something was read."""

    def __init__(self, content: ContentId, digest: str, index: LayerIndex) -> None:
        self.content = content
        self.digest = digest
        self.index = index
        self.chunk_bytes = 0
        self.reader: LayerReader | None = None
        self.opening = asyncio.Lock()


class ImageSource:
    """A `fusefs.source.Source` for image trees (see the module docstring)."""

    def __init__(self, inner: AgentSource, recorder: Recorder | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.inner = inner
        self.recorder = recorder
        self._clock = clock
        self._layers: dict[str, _Layer] = {}

    def add_layer(self, content: ContentId, digest: str, index: LayerIndex) -> None:
        """Serve `content` (the gzip blob of layer `digest`) decompressed."""
        self._layers[content] = _Layer(content, digest, index)

    async def read(self, content: str, offset: int, length: int) -> Buffer:
        layer = self._layers.get(content)
        if layer is None:
            return await self.inner.read(content, offset, length)
        if not layer.index.compressed:  # a plain tar: its tar offsets are blob offsets
            if self.recorder is not None:
                await self._record(layer, offset, offset + length)
            return await self.inner.read(content, offset, length)
        reader = layer.reader or await self._open(layer)
        start, end = reader.compressed_range(offset, length)
        if self.recorder is not None:
            await self._record(layer, start, end)
        if not reader.cached(offset, length):
            await self.inner.read(content, start, end - start)  # local and verified now
        try:
            return await asyncio.to_thread(reader.read, offset, length)
        except (LayerError, SourceError) as exc:
            raise SourceError(str(exc)) from None
        except TimeoutError:  # the decoder waited for blob bytes the loop could not give
            raise SourceError(f"layer {layer.digest}: blob bytes for tar bytes {offset}+"
                              f"{length} did not arrive in time") from None

    def decoded(self, content: str, offset: int, length: int) -> bool:
        """Whether tar bytes [offset, +length) of gzip layer `content` are decoded and
        checked in memory now (a read of them fetches and decodes nothing)."""
        layer = self._layers.get(content)
        return (layer is not None and layer.index.compressed and layer.reader is not None
                and layer.reader.cached(offset, length))

    async def blob_chunks(self, content: str, offset: int, length: int) -> range:
        """The chunks of gzip layer `content` that decoding tar bytes [offset, +length)
        reads (empty for any other content)."""
        layer = self._layers.get(content)
        if layer is None or not layer.index.compressed:
            return range(0)
        start, end = layer.index.compressed_range(offset, length)
        chunk = (await self.inner.manifest(content)).chunk_size
        return range(start // chunk, (end - 1) // chunk + 1) if end > start else range(0)

    async def warm(self, hot: Sequence[tuple[str, int]], hold_s: float = WARM_HOLD_S,
                   budget: int = WARM_BYTES) -> int:
        """Decode, ahead of the launch and in its order, the spans a recorded launch read:
        `hot` is the record's (layer digest, chunk) list, whose chunks are being
        prefetched. Each span waits for its blob bytes (the prefetch brings them), then
        decodes in a worker thread (rapidgzip lets go of the GIL, so this overlaps the
        tree build) into its layer's cache, which grows to keep it. After `hold_s` the
        caches shrink back to their usual bound. Decoded bytes; stops at `budget`."""
        plan = await self._warm_plan(hot)
        warmed = spans = 0
        for _, layer, span in plan:
            if warmed >= budget:
                break
            reader = layer.reader or await self._open(layer)
            start, end = layer.index.span_blob_range(span)
            await self.inner.read(layer.content, start, end - start)
            warmed += await asyncio.to_thread(reader.keep, span)
            spans += 1
        log.info("decoded %d spans (%d bytes) ahead of the launch", spans, warmed)
        await asyncio.sleep(hold_s)
        for _, layer, _ in plan:
            if layer.reader is not None:
                layer.reader.shrink(SPAN_CACHE_BYTES)
        return warmed

    async def _warm_plan(self, hot: Sequence[tuple[str, int]]) -> list[tuple[int, _Layer, int]]:
        by_digest = {layer.digest: layer for layer in self._layers.values()
                     if layer.index.compressed}
        ranks: dict[str, dict[int, int]] = {}
        for rank, (digest, chunk) in enumerate(hot):
            if digest in by_digest:
                ranks.setdefault(digest, {}).setdefault(chunk, rank)
        plan = []
        for digest, chunk_ranks in ranks.items():
            layer = by_digest[digest]
            chunk_bytes = (await self.inner.manifest(layer.content)).chunk_size
            spans = await asyncio.to_thread(layer.index.spans_reading, chunk_bytes,
                                            chunk_ranks)
            plan += [(first, layer, span) for first, span in spans]
        return sorted(plan, key=lambda p: (p[0], p[2]))

    async def _record(self, layer: _Layer, start: int, end: int) -> None:
        assert self.recorder is not None
        if not layer.chunk_bytes:
            layer.chunk_bytes = (await self.inner.manifest(layer.content)).chunk_size
        if end > start:
            first, last = start // layer.chunk_bytes, (end - 1) // layer.chunk_bytes
            self.recorder.touched(layer.digest, range(first, last + 1), self._clock())

    async def _open(self, layer: _Layer) -> LayerReader:
        async with layer.opening:
            if layer.reader is not None:
                return layer.reader
            manifest = await self.inner.manifest(layer.content)
            if manifest.size != layer.index.blob_bytes:
                raise SourceError(f"layer {layer.digest}: its content has {manifest.size} "
                                  f"bytes, its index says {layer.index.blob_bytes}")
            await self.inner.read(layer.content, 0, min(HEADER_BYTES, manifest.size))
            opener = self._blob_opener(layer.content, manifest.size)
            try:
                reader = await asyncio.to_thread(LayerReader, layer.index, opener,
                                                 SPAN_CACHE_BYTES)
            except LayerError as exc:
                raise SourceError(str(exc)) from None
            layer.chunk_bytes, layer.reader = manifest.chunk_size, reader
            return reader

    def _blob_opener(self, content: ContentId, size: int) -> Callable[[], BinaryIO]:
        loop = asyncio.get_running_loop()
        wait_s = self.inner.read_timeout_s + BRIDGE_SLACK_S

        def read_at(offset: int, length: int) -> Buffer:  # in a decoder thread
            local = self.inner.read_local(content, offset, length)
            if local is not None:  # as almost always: no round trip through the loop
                return local
            future = asyncio.run_coroutine_threadsafe(
                self.inner.read(content, offset, length), loop)
            return bytes(future.result(wait_s))

        # A raw file object is all the decoder uses (readinto, seek, tell) of BinaryIO.
        return lambda: cast(BinaryIO, RangeFile(size, read_at))

    async def close(self) -> None:
        for layer in self._layers.values():
            if layer.reader is not None:
                layer.reader.close()
        await self.inner.close()
