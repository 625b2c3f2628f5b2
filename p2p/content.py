"""The content model: ids, manifests and chunk geometry.

A content is an immutable byte sequence. Its manifest names it, gives its
size and chunk size, the digest algorithm and the digest of every chunk, and
where the origin copy lives. Manifests come from trusted places only (the
publisher, the origin, or the tracker over an authenticated channel), never
from a peer: a peer can only ever hand us bytes that we check against a
manifest we already trust.

Content ids certify themselves. An id is `c1-` and the SHA-256, in hex, of the
manifest's canonical form: size, chunk size, digest algorithm and the chunk
digests (not the kind or the origin URL, which say where the bytes are, not
what they are). A manifest whose id does not match is refused wherever it is
parsed, so whoever registers an id first cannot bind it to other bytes: the id
pins every chunk. Where the bytes live is not pinned: besides its first
`origin`, a manifest may carry more (`origins`, added by any holder of the
cluster secret after the first publisher). An origin can only ever hand over
bytes that are then checked against the digests, so a dead or lying one costs
time, never correctness, and a node tries the others. Human names (image
references, snapshot keys) map to ids in the tracker's separate name space.

Two chunk digests: `xxh3-128` (the default; non-cryptographic and very fast,
enough when every node holding the cluster secret is trusted not to forge
collisions) and `blake3` (cryptographic, for clusters that do not trust every
node). The id's SHA-256 covers whichever digests the manifest lists.

This module does no I/O; hashing a buffer is the only computation it does.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NewType, Protocol

import blake3
import xxhash

from p2p.errors import RemoteError
from p2p.units import MiB

ContentId = NewType("ContentId", str)
PeerId = NewType("PeerId", str)

CHUNK_SIZE = 4 * MiB
MAX_CHUNK_SIZE = 64 * MiB
MAX_FIELD_CHARS = 4096
MAX_ORIGINS = 16  # of one content, the first included: bounds the manifest the tracker serves
MAX_CHUNKS = 1 << 20  # 4 TiB at the default chunk size; bounds a manifest's size
ID_PREFIX = "c1-"
_ID_PATTERN = re.compile(r"c1-[0-9a-f]{64}")

Digester = Callable[[bytes | bytearray | memoryview], bytes]


def _blake3_digest(data: bytes | bytearray | memoryview) -> bytes:
    return blake3.blake3(data).digest()


# Algorithm name -> (digest bytes, function). The name is a manifest field.
DIGESTS: dict[str, tuple[int, Digester]] = {
    "xxh3-128": (16, xxhash.xxh3_128_digest),
    "blake3": (32, _blake3_digest),
}
DEFAULT_DIGEST = "xxh3-128"


class Hasher(Protocol):
    """A digest computed over bytes fed in pieces (`update`), then read (`digest`)."""

    def update(self, data: bytes | bytearray | memoryview, /) -> object: ...
    def digest(self) -> bytes: ...


# The same digests, fed a chunk in pieces as it arrives (p2p.spool).
HASHERS: dict[str, Callable[[], Hasher]] = {"xxh3-128": xxhash.xxh3_128, "blake3": blake3.blake3}
DIGEST_SIZE = DIGESTS[DEFAULT_DIGEST][0]


class ManifestError(RemoteError, ValueError):
    """A manifest is malformed or inconsistent with itself."""


def chunk_digest(data: bytes | bytearray | memoryview, algorithm: str = DEFAULT_DIGEST) -> bytes:
    """The digest a chunk is verified against, under the manifest's algorithm."""
    return DIGESTS[algorithm][1](data)


def check_content_id(text: object) -> ContentId:
    """`text` as a content id, or ManifestError if it is not a well-formed one.

    Use it wherever an id arrives from outside (a URL, a request body, a file
    name), so that nothing else (a path, `%2F`, `..`) ever passes for one.
    """
    if not isinstance(text, str) or not _ID_PATTERN.fullmatch(text):
        shown = text[:80] if isinstance(text, str) else type(text).__name__
        raise ManifestError(f"{shown!r} is not a content id ({ID_PREFIX} and 64 hex digits)")
    return ContentId(text)


def derive_content_id(size: int, chunk_size: int, digest: str,
                      digests: tuple[bytes, ...]) -> ContentId:
    """The id that certifies a manifest's bytes: SHA-256 over its canonical form."""
    h = hashlib.sha256(b"bootseer-content-v1\0")
    h.update(f"{size}\0{chunk_size}\0{digest}\0{len(digests)}\0".encode())
    for d in digests:
        h.update(d)
    return ContentId(ID_PREFIX + h.hexdigest())


@dataclass(frozen=True, slots=True)
class Manifest:
    """What a node must know, from a trusted source, to fetch and verify a content."""

    content_id: ContentId
    kind: str
    size: int
    chunk_size: int
    digests: tuple[bytes, ...]
    origin: str  # URL of the origin copy: http(s)://... or file:///...
    digest: str = DEFAULT_DIGEST  # the chunk digest algorithm, a key of DIGESTS
    origins: tuple[str, ...] = ()  # more origin copies, tried when `origin` fails

    def __post_init__(self) -> None:
        if self.size < 0:
            raise ManifestError(f"negative size {self.size}")
        if not 0 < self.chunk_size <= MAX_CHUNK_SIZE:
            raise ManifestError(f"chunk size {self.chunk_size} outside 1..{MAX_CHUNK_SIZE}")
        chunks = chunk_count(self.size, self.chunk_size)
        if chunks > MAX_CHUNKS:
            raise ManifestError(f"{chunks} chunks is more than {MAX_CHUNKS}; use larger chunks")
        if len(self.digests) != chunks:
            raise ManifestError(f"{len(self.digests)} digests for {chunks} chunks")
        if self.digest not in DIGESTS:
            raise ManifestError(f"unknown digest algorithm {self.digest[:40]!r}; "
                                f"known: {', '.join(DIGESTS)}")
        width = DIGESTS[self.digest][0]
        if any(len(d) != width for d in self.digests):
            raise ManifestError(f"every digest must be {width} bytes ({self.digest})")
        if max(len(self.kind), *map(len, self.sources)) > MAX_FIELD_CHARS:
            raise ManifestError(f"kind and origins are limited to {MAX_FIELD_CHARS} characters")
        if len(self.sources) > MAX_ORIGINS:
            raise ManifestError(f"{len(self.sources)} origins is more than {MAX_ORIGINS}")
        derived = derive_content_id(self.size, self.chunk_size, self.digest, self.digests)
        if check_content_id(self.content_id) != derived:
            raise ManifestError(f"content id {self.content_id} does not match its manifest "
                                f"(the digests give {derived})")

    @property
    def chunks(self) -> int:
        return len(self.digests)

    @property
    def sources(self) -> tuple[str, ...]:
        """Every origin URL, the first publisher's first."""
        return (self.origin, *self.origins)

    def with_origins(self, extra: tuple[str, ...]) -> Manifest:
        """This manifest with the origins of `extra` it does not list yet, in order."""
        known = set(self.sources)
        new = tuple(dict.fromkeys(u for u in extra if u not in known))
        return self if not new else Manifest(
            self.content_id, self.kind, self.size, self.chunk_size, self.digests,
            self.origin, self.digest, self.origins + new)

    def chunk_length(self, index: int) -> int:
        """Bytes in chunk `index`; only the last chunk may be short."""
        if not 0 <= index < self.chunks:
            raise IndexError(f"chunk {index} outside 0..{self.chunks - 1}")
        return min(self.chunk_size, self.size - index * self.chunk_size)

    def chunk_offset(self, index: int) -> int:
        return index * self.chunk_size

    def chunks_for_range(self, offset: int, length: int) -> range:
        """The chunks that hold bytes [offset, offset + length)."""
        return chunks_for_range(self.size, self.chunk_size, offset, length)

    def verify(self, index: int, data: bytes | bytearray | memoryview) -> bool:
        return (len(data) == self.chunk_length(index)
                and chunk_digest(data, self.digest) == self.digests[index])

    def hasher(self) -> Hasher:
        """A fresh hasher of this manifest's digest, for a chunk fed in pieces."""
        return HASHERS[self.digest]()

    def matches(self, index: int, length: int, digest: bytes) -> bool:
        """Whether `length` bytes whose digest (from `hasher`) is `digest` are chunk `index`."""
        return length == self.chunk_length(index) and digest == self.digests[index]

    def to_dict(self) -> dict[str, Any]:
        return {
            "content_id": self.content_id,
            "kind": self.kind,
            "size": self.size,
            "chunk_size": self.chunk_size,
            "digests": [d.hex() for d in self.digests],
            "origin": self.origin,
            "digest": self.digest,
            **({"origins": list(self.origins)} if self.origins else {}),
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
                digest=_typed(raw.get("digest", DEFAULT_DIGEST), str),
                origins=tuple(_typed(u, str) for u in _typed(raw.get("origins", []), list)),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            if isinstance(exc, ManifestError):
                raise
            raise ManifestError(f"malformed manifest: {exc!r}") from exc


def _typed(value: Any, kind: type) -> Any:
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise TypeError(f"expected {kind.__name__}, got {type(value).__name__}")
    return value


def chunks_for_range(size: int, chunk_size: int, offset: int, length: int) -> range:
    """The chunks of `chunk_size` that hold bytes [offset, offset + length) of `size`
    bytes; ValueError if the range is not inside them."""
    if offset < 0 or length < 0 or offset + length > size:
        raise ValueError(f"range {offset}+{length} outside content of {size} bytes")
    if length == 0:
        return range(0)
    return range(offset // chunk_size, (offset + length - 1) // chunk_size + 1)


def chunk_count(size: int, chunk_size: int) -> int:
    return (size + chunk_size - 1) // chunk_size


class ManifestBuilder:
    """Builds a manifest from a byte stream fed in any block sizes."""

    def __init__(self, chunk_size: int = CHUNK_SIZE, digest: str = DEFAULT_DIGEST) -> None:
        if digest not in DIGESTS:
            raise ManifestError(f"unknown digest algorithm {digest!r}; known: {', '.join(DIGESTS)}")
        self.chunk_size = chunk_size
        self.digest = digest
        self._hash = DIGESTS[digest][1]
        self._digests: list[bytes] = []
        self._pending = bytearray()
        self._size = 0

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        self._size += len(data)
        view = memoryview(data)
        while view:
            take = min(len(view), self.chunk_size - len(self._pending))
            if not self._pending and take == self.chunk_size:
                self._digests.append(self._hash(view[:take]))
            else:
                self._pending += view[:take]
                if len(self._pending) == self.chunk_size:
                    self._digests.append(self._hash(self._pending))
                    self._pending.clear()
            view = view[take:]

    def finish(self, kind: str, origin: str) -> Manifest:
        """The manifest, with the content id its digests certify."""
        if self._pending:
            self._digests.append(self._hash(self._pending))
            self._pending.clear()
        digests = tuple(self._digests)
        content_id = derive_content_id(self._size, self.chunk_size, self.digest, digests)
        return Manifest(content_id, kind, self._size, self.chunk_size, digests, origin,
                        self.digest)
