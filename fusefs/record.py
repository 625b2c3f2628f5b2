"""Access records: which pieces of which contents a launch read first, in what order.

Theory of operation
-------------------
A mount in record mode reports, for every read it serves, the pieces it
needed (`Recorder.touched`, with `now` from the caller's clock): a piece is
`(part, index)`, e.g. (layer digest, compressed chunk) for an image,
(pack content id, zstd frame) for a dependency snapshot. The recorder keeps
the first access of each piece, relative to the start of the recording,
until the window closes (`window_s`, default 60 s): later touches are
ignored, so a long-running job does not record its whole working set.

A `Record` belongs to one *subject* (an image manifest digest, a snapshot
key). Records of several launches merge: the union of their pieces, each
ordered by the median of its first-access times over the runs that touched
it (a piece only one launch in ten touched goes late, not early). Per piece
the last `MAX_RUNS` times are kept, so merging stays bounded and a changed
workload ages out.

What a subject and a part look like, and what the JSON fields are called,
is a `RecordKind`; each kind is a subclass of `Record` that sets `KIND`
(`fusefs.image.record`, `depsnap.hot`). `from_bytes` is a trust boundary
(records come from a registry or an origin): sizes, types and ids are
checked against the kind, and a record for another subject is refused by
`for_subject`. No I/O, no clock.
"""

from __future__ import annotations

import json
import re
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from p2p.errors import UserError

FORMAT_VERSION = 1
WINDOW_S = 60.0
MAX_RUNS = 15  # first-access times kept per piece
MAX_PIECES = 1 << 20  # entries in one record, against a hostile file
MAX_RECORD_BYTES = 64 << 20

PieceKey = tuple[str, int]  # (part, index)
R = TypeVar("R", bound="Record")


class RecordError(UserError, ValueError):
    """A record file is unusable, or is for another subject."""


@dataclass(frozen=True, slots=True)
class RecordKind:
    """One kind of record: its name for people, its JSON field names, its id shapes."""

    name: str  # e.g. "hot-block record"
    subject_field: str  # the JSON field naming the subject, e.g. "image"
    pieces_field: str  # the JSON field listing the pieces, e.g. "chunks"
    subject: re.Pattern[str]
    part: re.Pattern[str]

    def is_subject(self, value: Any) -> bool:
        return isinstance(value, str) and self.subject.fullmatch(value) is not None

    def is_part(self, value: Any) -> bool:
        return isinstance(value, str) and self.part.fullmatch(value) is not None


@dataclass(frozen=True, slots=True)
class Record:
    """The pieces launches of `subject` read: first-access times per piece, in seconds."""

    KIND: ClassVar[RecordKind]

    subject: str
    runs: int
    times: Mapping[PieceKey, tuple[float, ...]]

    def order(self) -> list[PieceKey]:
        """Every piece, by median first access (ties: part, then index)."""
        return sorted(self.times, key=lambda k: (statistics.median(self.times[k]), k))

    def by_part(self) -> dict[str, list[int]]:
        """The pieces of each part, each list in order; parts by their first piece."""
        out: dict[str, list[int]] = {}
        for part, index in self.order():
            out.setdefault(part, []).append(index)
        return out

    def merge(self: R, other: R) -> R:
        if other.subject != self.subject:
            raise RecordError(f"cannot merge a record of {other.subject} into one of "
                              f"{self.subject}")
        times: dict[PieceKey, tuple[float, ...]] = dict(self.times)
        for key, ts in other.times.items():
            times[key] = (times.get(key, ()) + ts)[-MAX_RUNS:]
        return type(self)(self.subject, self.runs + other.runs, times)

    def for_subject(self: R, subject: str) -> R:
        """This record if it is `subject`'s; RecordError otherwise (never use another's)."""
        if self.subject != subject:
            raise RecordError(f"the record is for {self.KIND.subject_field} {self.subject}, "
                              f"not {subject}")
        return self

    def to_bytes(self) -> bytes:
        pieces = [[part, index, [round(t, 4) for t in self.times[(part, index)]]]
                  for part, index in self.order()]
        doc = {"version": FORMAT_VERSION, self.KIND.subject_field: self.subject,
               "runs": self.runs, self.KIND.pieces_field: pieces}
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls: type[R], data: bytes, name: str = "record") -> R:
        kind = cls.KIND
        if len(data) > MAX_RECORD_BYTES:
            raise RecordError(f"{name}: {len(data)} bytes, more than a record may have")
        try:
            doc = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise RecordError(f"{name}: not JSON ({exc})") from None
        if not isinstance(doc, dict) or doc.get("version") != FORMAT_VERSION:
            raise RecordError(f"{name}: not a version {FORMAT_VERSION} {kind.name}")
        subject, runs = doc.get(kind.subject_field), doc.get("runs")
        pieces = doc.get(kind.pieces_field)
        if not (isinstance(subject, str) and kind.is_subject(subject)
                and isinstance(runs, int) and _is_count(runs)
                and isinstance(pieces, list) and len(pieces) <= MAX_PIECES):
            raise RecordError(f"{name}: bad {kind.subject_field}, runs or "
                              f"{kind.pieces_field} field")
        return cls(subject, runs, dict(_entry(kind, item, name) for item in pieces))


def _entry(kind: RecordKind, item: Any, name: str) -> tuple[PieceKey, tuple[float, ...]]:
    if not (isinstance(item, list) and len(item) == 3 and kind.is_part(item[0])
            and _is_count(item[1]) and isinstance(item[2], list)
            and 0 < len(item[2]) <= MAX_RUNS
            and all(isinstance(t, int | float) and not isinstance(t, bool) and 0 <= t < 1e9
                    for t in item[2])):
        raise RecordError(f"{name}: bad entry {str(item)[:80]}")
    return (item[0], item[1]), tuple(float(t) for t in item[2])


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 40


class Recorder:
    """First accesses of one launch of `subject`, from `start` for `window_s` seconds."""

    def __init__(self, record_type: type[Record], subject: str, start: float,
                 window_s: float = WINDOW_S) -> None:
        if not record_type.KIND.is_subject(subject):
            raise RecordError(f"{subject!r} is not a {record_type.KIND.subject_field}")
        self.record_type = record_type
        self.subject = subject
        self.start = start
        self.window_s = window_s
        self._first: dict[PieceKey, float] = {}

    def touched(self, part: str, indexes: Iterable[int], now: float) -> None:
        elapsed = now - self.start
        if elapsed > self.window_s:
            return
        for index in indexes:
            self._first.setdefault((part, index), max(elapsed, 0.0))

    def closed(self, now: float) -> bool:
        """Whether the window is over at `now` (nothing more will be recorded)."""
        return now - self.start > self.window_s

    def __len__(self) -> int:
        return len(self._first)

    def record(self) -> Record:
        return self.record_type(self.subject, 1, {k: (t,) for k, t in self._first.items()})
