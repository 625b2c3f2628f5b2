"""Random access into an unchanged gzip layer: its index, and a reader of the tar inside.

Theory of operation
-------------------
A layer blob is a gzip of a tar, byte for byte what the registry holds. Gzip
has no random access, so one pass over the blob (`build_index`) records where
decoding can restart: rapidgzip's zran index (an access point about every
`span_bytes` of output, with the sparse 32 KiB window each point needs, in
gztool format). The same pass hashes the blob (it must be the layer digest),
hashes the decoded bytes between consecutive access points (a *span*), and
lists the tar members (`fusefs.image.toc`). Everything is a pure function of
the blob, so two builders produce the same bytes (`LayerIndex.to_bytes`).

A plain (uncompressed) tar layer gets the same index without spans or zran:
its tar offsets are blob offsets, read straight from the swarm's chunks.

Reading a gzip layer is `fusefs.image.layerreader.LayerReader`'s job.

Which compressed bytes a decode reads (measured with rapidgzip 0.16): from
the span's access point through the next point plus one 128 KiB read-ahead,
plus the blob's first 128 KiB when a reader opens (`HEADER_BYTES`). The
caller makes those chunks local first (`LayerIndex.compressed_range`); the
compressed bytes come through a caller-supplied file object, so the caller's
version may fetch verified chunks, and tests pass a plain file.

Errors: every unusable blob, index or span raises `LayerError` naming the
layer and the member or span. `from_bytes` is a trust boundary: sizes are
bounded, every field is type- and range-checked, and the zran index must list
the span table's access points when a reader opens it.
"""

from __future__ import annotations

import hashlib
import io
import tarfile
from collections.abc import Callable
from typing import IO, Any, BinaryIO, cast

import rapidgzip

from fusefs.image.layerindex import DIGEST_PATTERN, MAX_SPAN_BYTES, LayerIndex, Span
from fusefs.image.toc import LayerError, Member, member_from_tarinfo
from p2p.units import MiB

__all__ = ["LayerError", "LayerIndex", "Span", "build_index"]

SPAN_BYTES = 1 * MiB  # see benchmarks/LAYER_ACCESS.md for why 1 MiB
COPY_BYTES = 256 * 1024  # tarfile copies its buffer per header: 1 MiB is slower
END_MARKER_BYTES = 1024  # two zero blocks end a tar


# ---- building ------------------------------------------------------------------------


def build_index(blob: BinaryIO, layer_digest: str, span_bytes: int = SPAN_BYTES,
                compressed: bool = True) -> LayerIndex:
    """Index the layer `blob` (read once, never held in memory): a gzip tar, or with
    `compressed=False` a plain tar (no spans, no zran: its tar offsets are blob offsets);
    LayerError if it is not `layer_digest`, not a complete gzip, or not a tar this index
    can serve."""
    if not DIGEST_PATTERN.fullmatch(layer_digest):
        raise LayerError(layer_digest, "", "not a sha256 layer digest")
    hashed = _HashedBlob(blob)
    try:
        index = _decode(hashed, layer_digest, span_bytes) if compressed \
            else _plain(hashed, layer_digest, span_bytes)
    except LayerError:
        _check_digest(hashed, layer_digest)  # a wrong blob explains any other error best
        raise
    _check_digest(hashed, layer_digest)
    return index


def _check_digest(hashed: _HashedBlob, layer: str) -> None:
    found = hashed.finish()
    if found != layer:
        raise LayerError(layer, "", f"the blob's digest is {found}")


def _decode(hashed: _HashedBlob, layer: str, span_bytes: int) -> LayerIndex:
    try:
        gz = rapidgzip.RapidgzipFile(hashed, parallelization=1, chunk_size=span_bytes)
    except (RuntimeError, ValueError) as exc:
        raise LayerError(layer, "", f"not a gzip stream ({exc})") from None
    with gz:
        stream = _DecodedStream(gz.read, layer,
                                _SpanHasher(lambda: gz.available_block_offsets().values()))
        members, tar_end = _read_toc(stream, layer)
        stream.drain()
        _check_tar_end(stream, tar_end, members, layer)
        points = _access_points(gz, hashed.size, stream.position, layer)
        zran = io.BytesIO()
        gz.export_index(zran, index_format=rapidgzip.IndexFormat.GZTOOL)
    assert stream.spans is not None
    digests = stream.spans.finish([*points, (8 * hashed.size, stream.position)], layer)
    spans = tuple(Span(u, bit, d) for (bit, u), d in zip(
        _span_points(points, stream.position), digests, strict=True))
    _check_span_sizes(spans, stream.position, layer)
    return LayerIndex(layer, hashed.size, stream.position, span_bytes, spans, members,
                      zran.getvalue())


def _plain(hashed: _HashedBlob, layer: str, span_bytes: int) -> LayerIndex:
    stream = _DecodedStream(hashed.read, layer, None)
    members, tar_end = _read_toc(stream, layer)
    stream.drain()
    _check_tar_end(stream, tar_end, members, layer)
    return LayerIndex(layer, hashed.size, stream.position, span_bytes, (), members, b"")


def _read_toc(stream: _DecodedStream, layer: str) -> tuple[tuple[Member, ...], int]:
    """The members, and the tar offset where the end-of-archive marker should start."""
    members: list[Member] = []
    try:
        with tarfile.open(fileobj=cast(IO[bytes], stream), mode="r|", bufsize=COPY_BYTES,
                          encoding="utf-8", errors="surrogateescape") as tar:
            for info in tar:
                members.append(member_from_tarinfo(info, layer))
            return tuple(members), tar.offset
    except (tarfile.TarError, EOFError) as exc:
        raise LayerError(layer, _near(members, "in or after"),
                         f"corrupt or truncated tar ({exc})") from None
    except LayerError as exc:
        if exc.where:
            raise
        raise LayerError(layer, _near(members, "in or after"), exc.why) from None


def _near(members: list[Member], how: str) -> str:
    return f"{how} member {members[-1].path!r}" if members else "at the tar's start"


def _check_tar_end(stream: _DecodedStream, tar_end: int, members: tuple[Member, ...],
                   layer: str) -> None:
    where = _near(list(members), "after")
    if stream.nonzero_end > tar_end:
        raise LayerError(layer, where, f"the tar ends at byte {tar_end}, but data follows: "
                                       "a corrupt header, or data after the archive")
    if stream.position < tar_end + END_MARKER_BYTES:
        raise LayerError(layer, where, "the tar has no end-of-archive marker: truncated")


def _access_points(gz: rapidgzip.RapidgzipFile, blob_bytes: int, tar_bytes: int, layer: str
                   ) -> list[tuple[int, int]]:
    """(blob bit, tar offset) of rapidgzip's access points, the end of the stream left out."""
    points = sorted(gz.block_offsets().items())
    if not points or points[-1] != (8 * blob_bytes, tar_bytes):
        raise LayerError(layer, "", "the gzip stream is truncated")
    return points[:-1]


def _check_span_sizes(spans: tuple[Span, ...], tar_bytes: int, layer: str) -> None:
    ends = [s.tar_offset for s in spans[1:]] + [tar_bytes]
    for span, end in zip(spans, ends, strict=True):
        if end - span.tar_offset > MAX_SPAN_BYTES:
            raise LayerError(layer, f"tar bytes {span.tar_offset}..{end}", "rapidgzip "
                             f"made no access point in more than {MAX_SPAN_BYTES} bytes")


def _span_points(points: list[tuple[int, int]], tar_bytes: int) -> list[tuple[int, int]]:
    """One access point per span start: the first of several at one tar offset."""
    out: list[tuple[int, int]] = []
    for bit, tar_offset in points:
        if tar_offset < tar_bytes and (not out or out[-1][1] != tar_offset):
            out.append((bit, tar_offset))
    return out


class _HashedBlob(io.RawIOBase):
    """The blob as rapidgzip reads it; each byte is hashed once, in order, whatever order
    rapidgzip reads in (a skipped gap is read here, a re-read is not hashed again)."""

    def __init__(self, raw: BinaryIO) -> None:
        super().__init__()
        self._raw = raw
        self._sha = hashlib.sha256()
        self._hashed = 0
        self.size = raw.seek(0, io.SEEK_END)
        raw.seek(0)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return self._raw.seek(offset, whence)

    def tell(self) -> int:
        return self._raw.tell()

    def readinto(self, buffer: Any) -> int:
        at = self._raw.tell()
        if at > self._hashed:
            self._hash_to(at)
        n = self._raw.readinto(buffer)  # type: ignore[attr-defined]
        if n and at + n > self._hashed:
            self._sha.update(memoryview(buffer)[self._hashed - at:n])
            self._hashed = at + n
        return int(n or 0)

    def _hash_to(self, end: int) -> None:
        self._raw.seek(self._hashed)
        while self._hashed < end and (data := self._raw.read(min(COPY_BYTES, end - self._hashed))):
            self._sha.update(data)
            self._hashed += len(data)
        self._raw.seek(end)

    def finish(self) -> str:
        """The digest of the whole blob, reading what was not read yet."""
        self._hash_to(self.size)
        return f"sha256:{self._sha.hexdigest()}"


class _DecodedStream:
    """The tar as tarfile reads it (rapidgzip's output, or a plain blob), hashed span by
    span if there are spans; also tracks where the last nonzero byte ends, to check what
    follows the tar's last member."""

    def __init__(self, read: Callable[[int], bytes | None], layer: str,
                 spans: _SpanHasher | None) -> None:
        self._read = read
        self._layer = layer
        self.position = 0
        self.nonzero_end = 0
        self.spans = spans

    def read(self, size: int = -1) -> bytes:
        try:
            data = self._read(size if 0 <= size <= COPY_BYTES else COPY_BYTES) or b""
        except (RuntimeError, ValueError) as exc:
            raise LayerError(self._layer, "", f"corrupt gzip stream ({exc}) near tar byte "
                                              f"{self.position}") from None
        if data:
            zeros = len(data) - len(data.rstrip(b"\0")) if data[-1] == 0 else 0
            if zeros < len(data):
                self.nonzero_end = self.position + len(data) - zeros
            self.position += len(data)
            if self.spans is not None:
                self.spans.feed(data)
        return data

    def drain(self) -> None:
        while self.read(COPY_BYTES):
            pass


class _SpanHasher:
    """sha256 of the decoded bytes between access points. rapidgzip reports points a
    little late, so bytes past the last known point are held until it reports more."""

    def __init__(self, known_points: Callable[[], Any]) -> None:
        self._known_points = known_points
        self._ends: list[int] = []  # known points past the last cut, ascending
        self._cut = 0
        self._held: list[memoryview] = []
        self._held_bytes = 0
        self._digests: dict[int, bytes] = {}  # span start -> sha256

    def feed(self, data: bytes) -> None:
        self._held.append(memoryview(data))
        self._held_bytes += len(data)
        if not self._ends or self._ends[-1] < self._cut + self._held_bytes:
            self._learn(self._known_points())
        while self._ends and self._ends[0] <= self._cut + self._held_bytes:
            self._cut_at(self._ends.pop(0))

    def _learn(self, points: Any) -> None:
        last = self._ends[-1] if self._ends else self._cut
        self._ends += sorted(p for p in set(points) if p > last)

    def _cut_at(self, end: int) -> None:
        sha, need = hashlib.sha256(), end - self._cut
        while need:
            piece = self._held[0]
            take = min(need, len(piece))
            sha.update(piece[:take])
            need -= take
            if take == len(piece):
                self._held.pop(0)
            else:
                self._held[0] = piece[take:]
        if end > self._cut:
            self._digests[self._cut] = sha.digest()
        self._held_bytes -= end - self._cut
        self._cut = end

    def finish(self, points: list[tuple[int, int]], layer: str) -> list[bytes]:
        """Digests of the spans starting at `points` (blob bit, tar offset); the last
        point is the end of the tar."""
        self._learn(u for _, u in points)
        while self._ends:
            self._cut_at(self._ends.pop(0))
        starts = [u for _, u in _span_points(points[:-1], points[-1][1])]
        if self._held_bytes or sorted(self._digests) != starts:
            raise LayerError(layer, "", "rapidgzip reported access points out of order")
        return [self._digests[u] for u in starts]
