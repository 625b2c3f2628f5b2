"""A layer's index as a value: span table, table of contents, zran bytes, and its file form.

Theory of operation
-------------------
`LayerIndex` is what `fusefs.image.gzindex.build_index` learns from one pass
over a gzip layer blob; this module holds it without doing any I/O. A *span*
is the decoded bytes between two consecutive zran access points; each records
where it starts in the tar, the access point (a bit offset in the blob) that
decoding it restarts from, and the sha256 of its bytes. `compressed_range`
says which blob bytes a decode of some tar bytes reads (the span's access point
through the next one plus rapidgzip's 128 KiB read-ahead), so the caller can
make those chunks local first.

File form (version 1): one msgpack map with the sizes, the span table as two
integer lists and one byte string of digests, the table of contents as
`fusefs.image.toc` columns, and rapidgzip's index as raw bytes (gztool
format). A plain tar layer's index has empty span lists and zran bytes.
Packing is deterministic: the same index gives the same bytes.
`from_bytes` is a trust boundary: the input size is bounded, every field is
type- and range-checked (spans start at 0, rise, are at most
`MAX_SPAN_BYTES`, access points rise inside the blob, one digest per span),
and any fault is a `LayerError` naming the index, never a crash or a loop.
The zran bytes are opaque here; the reader checks them against the span table
when it opens them.

This module does no I/O and reads no clock.
"""

from __future__ import annotations

import bisect
import itertools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import msgpack

from fusefs.image.toc import LayerError, Member, pack_members, unpack_members
from fusefs.tree import Entry, Layer
from p2p.units import KiB, MiB

READ_AHEAD_BYTES = 128 * KiB  # rapidgzip reads the compressed file in 128 KiB blocks
MAX_SPAN_BYTES = 64 * MiB
DIGEST_BYTES = 32
FORMAT_VERSION = 1
MAX_INDEX_BYTES = 1024 * MiB
MAX_MEMBERS = 1 << 24
MAX_BLOB_BYTES = 1 << 48
DIGEST_PATTERN = re.compile(r"sha256:[0-9a-f]{64}")


@dataclass(frozen=True, slots=True)
class Span:
    """Decoded bytes from `tar_offset` to the next span's, starting at access point
    `blob_bit` (a bit offset in the blob); `sha256` is their digest."""

    tar_offset: int
    blob_bit: int
    sha256: bytes


@dataclass(frozen=True, slots=True)
class LayerIndex:
    """One layer's index: sizes, spans, tar members and rapidgzip's zran index. A plain
    (uncompressed) tar layer has no spans and no zran; its tar offsets are blob offsets."""

    layer_digest: str
    blob_bytes: int
    tar_bytes: int
    span_bytes: int
    spans: tuple[Span, ...]
    members: tuple[Member, ...]
    zran: bytes  # rapidgzip's index, gztool format

    @property
    def compressed(self) -> bool:
        return bool(self.zran)

    def entries(self, content: str) -> list[Entry]:
        """The members as `build_tree` entries whose files read uncompressed `content`."""
        return [m.entry(content) for m in self.members]

    def layer(self, content: str) -> Layer:
        return Layer(self.layer_digest, self.entries(content))

    def span_at(self, tar_offset: int) -> int:
        """The span holding byte `tar_offset` of the tar."""
        return bisect.bisect_right(self.spans, tar_offset, key=_span_start) - 1

    def span_end(self, span: int) -> int:
        return self.spans[span + 1].tar_offset if span + 1 < len(self.spans) else self.tar_bytes

    def compressed_range(self, tar_offset: int, length: int) -> tuple[int, int]:
        """Blob bytes [start, end) that decoding tar bytes [tar_offset, +length) reads."""
        end = min(tar_offset + length, self.tar_bytes)
        if tar_offset < 0 or tar_offset >= end:
            return 0, 0
        if not self.compressed:
            return tar_offset, end
        first, last = self.span_at(tar_offset), self.span_at(end - 1)
        next_bit = self.spans[last + 1].blob_bit if last + 1 < len(self.spans) \
            else 8 * self.blob_bytes
        return (self.spans[first].blob_bit // 8,
                min(next_bit // 8 + 1 + READ_AHEAD_BYTES, self.blob_bytes))

    def span_blob_range(self, span: int) -> tuple[int, int]:
        """Blob bytes [start, end) that decoding `span` reads."""
        start = self.spans[span].tar_offset
        return self.compressed_range(start, self.span_end(span) - start)

    def spans_reading(self, chunk_bytes: int, rank: Mapping[int, int]) -> list[tuple[int, int]]:
        """(rank, span) for every span whose decode reads only blob chunks in `rank`
        (chunk index -> position in a launch's record), ranked by its earliest chunk and
        sorted: the spans a recorded launch decoded, in about the order it did."""
        out = []
        for span in range(len(self.spans)):
            first, end = self.span_blob_range(span)
            chunks = range(first // chunk_bytes, (end - 1) // chunk_bytes + 1)
            if end > first and all(c in rank for c in chunks):
                out.append((min(rank[c] for c in chunks), span))
        return sorted(out)

    def to_bytes(self) -> bytes:
        doc = {"version": FORMAT_VERSION, "layer": self.layer_digest,
               "blob_bytes": self.blob_bytes, "tar_bytes": self.tar_bytes,
               "span_bytes": self.span_bytes,
               "span_tar_offsets": [s.tar_offset for s in self.spans],
               "span_blob_bits": [s.blob_bit for s in self.spans],
               "span_sha256": b"".join(s.sha256 for s in self.spans),
               "toc": pack_members(self.members), "zran": self.zran}
        packed: bytes = msgpack.packb(doc, use_bin_type=True)
        return packed

    @classmethod
    def from_bytes(cls, data: bytes, name: str, layer_digest: str | None = None,
                   with_members: bool = True) -> LayerIndex:
        """An index `to_bytes` wrote; LayerError (naming `name`) if it is malformed or, when
        `layer_digest` is given, for another layer. Without `with_members` the table of
        contents is left unread (`members` is empty): a mount of an image whose merged
        tree was packed at index time needs only the spans, and reading the members
        made a Python object per tar entry (0.09 s for 8,200)."""
        raw = _unpack(data, name)
        digest = raw.get("layer")
        if not isinstance(digest, str) or not DIGEST_PATTERN.fullmatch(digest):
            raise LayerError(name, "index", "no valid layer digest")
        if layer_digest is not None and digest != layer_digest:
            raise LayerError(name, "index", f"indexes {digest}, not {layer_digest}")
        blob_bytes, tar_bytes = _int(raw, "blob_bytes", name), _int(raw, "tar_bytes", name)
        span_bytes = _int(raw, "span_bytes", name)
        zran = raw.get("zran")
        if not isinstance(zran, bytes) or not 0 < span_bytes <= MAX_SPAN_BYTES:
            raise LayerError(name, "index", "bad zran index or span size")
        if zran:
            spans = _spans_from(raw, name, blob_bytes, tar_bytes)
        elif raw.get("span_tar_offsets") == [] and tar_bytes == blob_bytes:
            spans = ()
        else:
            raise LayerError(name, "index", "a plain tar's index has no spans and as many "
                                            "tar bytes as blob bytes")
        members = unpack_members(raw.get("toc"), name, tar_bytes, MAX_MEMBERS) \
            if with_members else ()
        return cls(digest, blob_bytes, tar_bytes, span_bytes, spans, members, zran)


def _span_start(span: Span) -> int:
    return span.tar_offset


def _unpack(data: bytes, name: str) -> dict[str, Any]:
    if len(data) > MAX_INDEX_BYTES:
        raise LayerError(name, "index", f"larger than {MAX_INDEX_BYTES} bytes")
    try:
        raw = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise LayerError(name, "index", f"not msgpack ({exc})") from None
    if not isinstance(raw, dict) or raw.get("version") != FORMAT_VERSION:
        raise LayerError(name, "index", f"not a version {FORMAT_VERSION} layer index")
    return raw


def _int(raw: dict[str, Any], key: str, name: str) -> int:
    value = raw.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_BLOB_BYTES:
        raise LayerError(name, "index", f"field {key!r} must be a size")
    return value


def _spans_from(raw: dict[str, Any], name: str, blob_bytes: int, tar_bytes: int
                ) -> tuple[Span, ...]:
    """The span table, checked: offsets rise from 0, spans are at most MAX_SPAN_BYTES,
    access points rise inside the blob, one digest per span."""
    starts, bits, digests = (raw.get(k) for k in ("span_tar_offsets", "span_blob_bits",
                                                  "span_sha256"))
    if not (isinstance(starts, list) and isinstance(bits, list) and isinstance(digests, bytes)
            and len(starts) == len(bits) and len(digests) == DIGEST_BYTES * len(starts)
            and all(isinstance(v, int) and not isinstance(v, bool) for v in starts + bits)):
        raise LayerError(name, "index", "bad span table")
    ends = [*starts[1:], tar_bytes]
    if (not starts or starts[0] != 0 or bits[0] < 0 or bits[-1] >= 8 * blob_bytes
            or any(not 0 < end - start <= MAX_SPAN_BYTES
                   for start, end in zip(starts, ends, strict=True))
            or any(b <= a for a, b in itertools.pairwise(bits))):
        raise LayerError(name, "index", "span table out of order or out of range")
    return tuple(Span(start, bit, digests[DIGEST_BYTES * i:DIGEST_BYTES * (i + 1)])
                 for i, (start, bit) in enumerate(zip(starts, bits, strict=True)))
