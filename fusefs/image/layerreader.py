"""Reading a gzip layer's tar through its index: whole spans, decoded once, checked.

`LayerReader` decodes whole spans: seek a long-lived rapidgzip reader to a
span's start, read the span, check its sha256 against the index, keep it in an
LRU of decoded spans bounded by `cache_bytes`, and answer reads (which may
cross spans) from those. The chunk store verifies compressed bytes, but a wrong
window or offset in an index would decode to wrong bytes; the span digests
turn that into `LayerError`, never into file contents. The compressed bytes
come through a caller-supplied file object (see `fusefs.image.gzindex` for
which ones a decode reads).
"""

from __future__ import annotations

import hashlib
import io
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, BinaryIO

import rapidgzip

from fusefs.image.layerindex import LayerIndex
from fusefs.image.toc import LayerError
from p2p.units import MiB

HEADER_BYTES = 128 * 1024  # what opening a reader reads from the blob's start
CACHE_BYTES = 64 * MiB


class LayerReader:
    """Bytes of a layer's uncompressed tar, decoded span by span (see the module docstring).

    `open_blob` returns a new seekable binary file object over the compressed blob; the
    reader calls it when it opens (now) and again after a failed decode. Thread-safe:
    one lock serialises decodes and cache updates. Close it (or use `with`): rapidgzip
    aborts the interpreter if a reader is still open at exit.
    """

    def __init__(self, index: LayerIndex, open_blob: Callable[[], BinaryIO],
                 cache_bytes: int = CACHE_BYTES) -> None:
        self.index = index
        self._open_blob = open_blob
        self._cache_bytes = cache_bytes
        self._lock = threading.Lock()
        self._cache: OrderedDict[int, bytes] = OrderedDict()
        self._cached_bytes = 0
        self._handles: list[Any] = []  # the open rapidgzip reader and its blob, if any
        self._closer = weakref.finalize(self, _close_handles, self._handles)
        self.decoded_spans = 0
        self._closed = False
        with self._lock:
            self._open()

    def __enter__(self) -> LayerReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._cache.clear()
            self._closer()

    def compressed_range(self, tar_offset: int, length: int) -> tuple[int, int]:
        return self.index.compressed_range(tar_offset, length)

    def cached(self, tar_offset: int, length: int) -> bool:
        """Whether every span of those tar bytes is decoded already (a read of them needs
        no blob bytes). A hint, without the lock: the event loop asks it while a decoder
        thread may hold the lock waiting for that loop to supply blob bytes."""
        end = min(tar_offset + length, self.index.tar_bytes)
        if tar_offset < 0 or tar_offset >= end:
            return True
        first, last = self.index.span_at(tar_offset), self.index.span_at(end - 1)
        return all(span in self._cache for span in range(first, last + 1))

    def read(self, tar_offset: int, length: int) -> bytes:
        """Tar bytes [tar_offset, +length), clipped to the tar's end; LayerError if a span
        does not decode to its digest. The blob bytes read are within `compressed_range`,
        except that the first read after a failed span reopens (`HEADER_BYTES` again)."""
        if tar_offset < 0 or length < 0:
            raise ValueError(f"bad range {tar_offset}+{length}")
        end = min(tar_offset + length, self.index.tar_bytes)
        pieces: list[memoryview] = []
        with self._lock:
            if self._closed:
                raise ValueError("read from a closed LayerReader")
            span = self.index.span_at(tar_offset)
            while tar_offset < end:
                start, data = self.index.spans[span].tar_offset, self._span(span)
                take = min(end, start + len(data))
                pieces.append(memoryview(data)[tar_offset - start:take - start])
                tar_offset, span = take, span + 1
        return b"".join(pieces)

    def keep(self, span: int) -> int:
        """Decode `span` now, if it is not cached, and make room for it: the cache grows by
        its size, so spans kept ahead of a launch do not push each other out. Bytes added."""
        with self._lock:
            if self._closed or span in self._cache:
                return 0
            size = self.index.span_end(span) - self.index.spans[span].tar_offset
            self._cache_bytes += size
            self._span(span)
            return size

    def shrink(self, cache_bytes: int) -> None:
        """Bound the cache to `cache_bytes` again, dropping the least recently used spans."""
        with self._lock:
            self._cache_bytes = cache_bytes
            self._evict()

    def _span(self, span: int) -> bytes:
        data = self._cache.get(span)
        if data is not None:
            self._cache.move_to_end(span)
            return data
        data = self._decode(span)
        self._cache[span] = data
        self._cached_bytes += len(data)
        self._evict()
        return data

    def _evict(self) -> None:
        while self._cached_bytes > self._cache_bytes and len(self._cache) > 1:
            self._cached_bytes -= len(self._cache.popitem(last=False)[1])

    def _decode(self, span: int) -> bytes:
        start, end = self.index.spans[span].tar_offset, self.index.span_end(span)
        where = f"span {span} (tar bytes {start}..{end})"
        gz = self._open()
        ok = False
        try:
            gz.seek(start)
            data: bytes = gz.read(end - start)
            ok = len(data) == end - start and \
                hashlib.sha256(data).digest() == self.index.spans[span].sha256
        except (RuntimeError, ValueError) as exc:
            raise LayerError(self.index.layer_digest, where, f"does not decode ({exc})") \
                from None
        finally:
            if not ok:  # start afresh: rapidgzip may have cached what it decoded
                _close_handles(self._handles)
        if not ok:
            raise LayerError(self.index.layer_digest, where, "decodes to bytes that do not "
                                                             "match its sha256")
        self.decoded_spans += 1
        return data

    def _open(self) -> rapidgzip.RapidgzipFile:
        if self._handles:
            return self._handles[0]
        blob = self._open_blob()
        try:
            gz = rapidgzip.RapidgzipFile(blob, parallelization=1,
                                         chunk_size=self.index.span_bytes)
        except BaseException:
            blob.close()
            raise
        self._handles += [gz, blob]
        try:
            gz.import_index(io.BytesIO(self.index.zran))
            points = gz.block_offsets()
        except (RuntimeError, ValueError) as exc:
            _close_handles(self._handles)
            raise LayerError(self.index.layer_digest, "index", f"bad zran index ({exc})") \
                from None
        if any(points.get(s.blob_bit) != s.tar_offset for s in self.index.spans):
            _close_handles(self._handles)
            raise LayerError(self.index.layer_digest, "index", "the zran index does not "
                                                               "match the span table")
        return gz


def _close_handles(handles: list[Any]) -> None:
    for handle in handles:
        handle.close()
    handles.clear()
