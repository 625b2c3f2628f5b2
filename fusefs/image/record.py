"""Hot-block records: which layer chunks a launch touched, in what order.

Theory of operation
-------------------
While an image is mounted in record mode, every read the filesystem serves
reports the compressed layer chunks it needed (`Recorder.touched`, with `now`
from the caller's clock). The recorder keeps the first access of each
(layer digest, chunk) pair, relative to the start of the recording, until the
window closes (`window_s`, default 60 s): later touches are ignored, so a
long-running job does not record its whole working set.

A `Record` belongs to one image manifest digest. Records of several launches
merge: the union of their chunks, each ordered by the median of its
first-access times over the runs that touched it (a chunk only one launch in
ten touched goes late, not early). Per chunk the last `MAX_RUNS` times are
kept, so merging stays bounded and a changed workload ages out.

Chunks are named by layer digest (the registry's sha256), never by swarm
content id: the digest is what the image names, and a layer's chunking is
fixed by its index, which is itself keyed by the layer digest.

`from_bytes` is a trust boundary (the record comes from the registry): sizes,
types and digests are checked, and a record for another image is refused by
`for_image`. No I/O, no clock.
"""

from __future__ import annotations

import json
import re
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

FORMAT_VERSION = 1
WINDOW_S = 60.0
MAX_RUNS = 15  # first-access times kept per chunk
MAX_CHUNKS = 1 << 20  # entries in one record, against a hostile file
MAX_RECORD_BYTES = 64 << 20
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")

ChunkKey = tuple[str, int]  # (layer digest, chunk index)


class RecordError(ValueError):
    """A record file is unusable, or is for another image."""


@dataclass(frozen=True, slots=True)
class Record:
    """The chunks launches of `image` touched: first-access times per chunk, in seconds."""

    image: str
    runs: int
    times: Mapping[ChunkKey, tuple[float, ...]]

    def order(self) -> list[ChunkKey]:
        """Every chunk, by median first access (ties: layer, then chunk index)."""
        return sorted(self.times, key=lambda k: (statistics.median(self.times[k]), k))

    def by_layer(self) -> dict[str, list[int]]:
        """The chunks of each layer, each list in prefetch order."""
        out: dict[str, list[int]] = {}
        for layer, chunk in self.order():
            out.setdefault(layer, []).append(chunk)
        return out

    def merge(self, other: Record) -> Record:
        if other.image != self.image:
            raise RecordError(f"cannot merge a record of {other.image} into one of {self.image}")
        times: dict[ChunkKey, tuple[float, ...]] = dict(self.times)
        for key, ts in other.times.items():
            times[key] = (times.get(key, ()) + ts)[-MAX_RUNS:]
        return Record(self.image, self.runs + other.runs, times)

    def for_image(self, image: str) -> Record:
        """This record if it is `image`'s; RecordError otherwise (never use another's)."""
        if self.image != image:
            raise RecordError(f"the record is for image {self.image}, not {image}")
        return self

    def to_bytes(self) -> bytes:
        chunks = [[layer, chunk, [round(t, 4) for t in self.times[(layer, chunk)]]]
                  for layer, chunk in self.order()]
        doc = {"version": FORMAT_VERSION, "image": self.image, "runs": self.runs,
               "chunks": chunks}
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes, name: str = "record") -> Record:
        if len(data) > MAX_RECORD_BYTES:
            raise RecordError(f"{name}: {len(data)} bytes, more than a record may have")
        try:
            doc = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise RecordError(f"{name}: not JSON ({exc})") from None
        if not isinstance(doc, dict) or doc.get("version") != FORMAT_VERSION:
            raise RecordError(f"{name}: not a version {FORMAT_VERSION} hot-block record")
        image, runs, chunks = doc.get("image"), doc.get("runs"), doc.get("chunks")
        if not (isinstance(image, str) and _is_digest(image) and isinstance(runs, int)
                and _is_count(runs) and isinstance(chunks, list) and len(chunks) <= MAX_CHUNKS):
            raise RecordError(f"{name}: bad image, runs or chunks field")
        return cls(image, runs, dict(_entry(item, name) for item in chunks))


def _entry(item: Any, name: str) -> tuple[ChunkKey, tuple[float, ...]]:
    if not (isinstance(item, list) and len(item) == 3 and _is_digest(item[0])
            and _is_count(item[1]) and isinstance(item[2], list)
            and 0 < len(item[2]) <= MAX_RUNS
            and all(isinstance(t, int | float) and 0 <= t < 1e9 for t in item[2])):
        raise RecordError(f"{name}: bad chunk entry {str(item)[:80]}")
    return (item[0], item[1]), tuple(float(t) for t in item[2])


def _is_digest(value: Any) -> bool:
    return isinstance(value, str) and _DIGEST.fullmatch(value) is not None


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 40


class Recorder:
    """First accesses of one launch, from `start` for `window_s` seconds."""

    def __init__(self, image: str, start: float, window_s: float = WINDOW_S) -> None:
        if not _is_digest(image):
            raise RecordError(f"{image!r} is not an image manifest digest")
        self.image = image
        self.start = start
        self.window_s = window_s
        self._first: dict[ChunkKey, float] = {}

    def touched(self, layer: str, chunks: Iterable[int], now: float) -> None:
        elapsed = now - self.start
        if elapsed > self.window_s:
            return
        for chunk in chunks:
            self._first.setdefault((layer, chunk), max(elapsed, 0.0))

    def __len__(self) -> int:
        return len(self._first)

    def record(self) -> Record:
        return Record(self.image, 1, {k: (t,) for k, t in self._first.items()})
