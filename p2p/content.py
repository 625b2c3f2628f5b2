"""The content model: ids, manifests and chunk geometry.

A content is an immutable byte sequence. Its manifest names it, gives its
size and chunk size, the xxh3-128 digest of every chunk, and where the origin
copy lives. Manifests come from trusted places only (the publisher, the origin,
or the tracker over an authenticated channel), never from a peer: a peer can
only ever hand us bytes that we check against a manifest we already trust.

This module does no I/O; hashing a buffer is the only computation it does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NewType

import xxhash

ContentId = NewType("ContentId", str)
PeerId = NewType("PeerId", str)

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB
CHUNK_SIZE = 4 * MiB
MAX_CHUNK_SIZE = 64 * MiB
DIGEST_SIZE = 16  # xxh3-128


class ManifestError(ValueError):
    """A manifest is malformed or inconsistent with itself."""


def chunk_digest(data: bytes | bytearray | memoryview) -> bytes:
    """The xxh3-128 digest that every chunk is verified against."""
    return xxhash.xxh3_128_digest(data)


@dataclass(frozen=True, slots=True)
class Manifest:
    """What a node must know, from a trusted source, to fetch and verify a content."""

    content_id: ContentId
    kind: str
    size: int
    chunk_size: int
    digests: tuple[bytes, ...]
    origin: str  # URL of the origin copy: http(s)://... or file:///...

    def __post_init__(self) -> None:
        if not self.content_id or "/" in self.content_id:
            raise ManifestError(f"bad content id {self.content_id!r}")
        if self.size < 0:
            raise ManifestError(f"negative size {self.size}")
        if not 0 < self.chunk_size <= MAX_CHUNK_SIZE:
            raise ManifestError(f"chunk size {self.chunk_size} outside 1..{MAX_CHUNK_SIZE}")
        if len(self.digests) != chunk_count(self.size, self.chunk_size):
            raise ManifestError(
                f"{len(self.digests)} digests for {chunk_count(self.size, self.chunk_size)} chunks"
            )
        if any(len(d) != DIGEST_SIZE for d in self.digests):
            raise ManifestError("every digest must be 16 bytes (xxh3-128)")

    @property
    def chunks(self) -> int:
        return len(self.digests)

    def chunk_length(self, index: int) -> int:
        """Bytes in chunk `index`; only the last chunk may be short."""
        if not 0 <= index < self.chunks:
            raise IndexError(f"chunk {index} outside 0..{self.chunks - 1}")
        return min(self.chunk_size, self.size - index * self.chunk_size)

    def chunk_offset(self, index: int) -> int:
        return index * self.chunk_size

    def chunks_for_range(self, offset: int, length: int) -> range:
        """The chunks that hold bytes [offset, offset + length)."""
        if offset < 0 or length < 0 or offset + length > self.size:
            raise ValueError(f"range {offset}+{length} outside content of {self.size} bytes")
        if length == 0:
            return range(0)
        return range(offset // self.chunk_size, (offset + length - 1) // self.chunk_size + 1)

    def verify(self, index: int, data: bytes | bytearray | memoryview) -> bool:
        return len(data) == self.chunk_length(index) and chunk_digest(data) == self.digests[index]

    def to_dict(self) -> dict[str, Any]:
        return {
            "content_id": self.content_id,
            "kind": self.kind,
            "size": self.size,
            "chunk_size": self.chunk_size,
            "digests": [d.hex() for d in self.digests],
            "origin": self.origin,
        }

    @classmethod
    def from_dict(cls, raw: Any) -> Manifest:
        """Parse a manifest from decoded JSON; any shape error is a ManifestError."""
        try:
            return cls(
                content_id=ContentId(_typed(raw["content_id"], str)),
                kind=_typed(raw["kind"], str),
                size=_typed(raw["size"], int),
                chunk_size=_typed(raw["chunk_size"], int),
                digests=tuple(bytes.fromhex(_typed(d, str)) for d in _typed(raw["digests"], list)),
                origin=_typed(raw["origin"], str),
            )
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, ManifestError):
                raise
            raise ManifestError(f"malformed manifest: {exc!r}") from exc


def _typed(value: Any, kind: type) -> Any:
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise TypeError(f"expected {kind.__name__}, got {type(value).__name__}")
    return value


def chunk_count(size: int, chunk_size: int) -> int:
    return (size + chunk_size - 1) // chunk_size


class ManifestBuilder:
    """Builds a manifest from a byte stream fed in any block sizes."""

    def __init__(self, chunk_size: int = CHUNK_SIZE) -> None:
        self.chunk_size = chunk_size
        self._digests: list[bytes] = []
        self._pending = bytearray()
        self._size = 0

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        self._size += len(data)
        view = memoryview(data)
        while view:
            take = min(len(view), self.chunk_size - len(self._pending))
            if not self._pending and take == self.chunk_size:
                self._digests.append(chunk_digest(view[:take]))
            else:
                self._pending += view[:take]
                if len(self._pending) == self.chunk_size:
                    self._digests.append(chunk_digest(self._pending))
                    self._pending.clear()
            view = view[take:]

    def finish(self, content_id: ContentId | None, kind: str, origin: str) -> Manifest:
        """The manifest; without a content id, one is derived from the digests."""
        if self._pending:
            self._digests.append(chunk_digest(self._pending))
            self._pending.clear()
        if content_id is None:
            h = xxhash.xxh3_128()
            for d in self._digests:
                h.update(d)
            content_id = ContentId(f"x3-{h.hexdigest()}-{self._size}")
        return Manifest(content_id, kind, self._size, self.chunk_size, tuple(self._digests), origin)
