"""Hot-block records: which layer chunks a launch touched, in what order.

An image's record is an access record (`fusefs.record`: first accesses
within a window, merged over launches by median first access, checked as it
is read) whose subject is the image manifest digest and whose pieces are
(layer digest, compressed chunk index) pairs.

Chunks are named by layer digest (the registry's sha256), never by swarm
content id: the digest is what the image names, and a layer's chunking is
fixed by its index, which is itself keyed by the layer digest. A record for
another image is refused by `for_image`. No I/O, no clock.
"""

from __future__ import annotations

import re

from fusefs.record import (
    MAX_RECORD_BYTES,
    MAX_RUNS,
    WINDOW_S,
    RecordError,
    RecordKind,
)
from fusefs.record import Record as AccessRecord
from fusefs.record import Recorder as AccessRecorder

__all__ = ["MAX_RECORD_BYTES", "MAX_RUNS", "WINDOW_S", "Record", "RecordError", "Recorder"]

_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
HOT_BLOCKS = RecordKind("hot-block record", "image", "chunks", _DIGEST, _DIGEST)

ChunkKey = tuple[str, int]  # (layer digest, chunk index)


class Record(AccessRecord):
    """The chunks launches of `image` touched: first-access times per chunk, in seconds."""

    __slots__ = ()
    KIND = HOT_BLOCKS

    @property
    def image(self) -> str:
        return self.subject

    def by_layer(self) -> dict[str, list[int]]:
        """The chunks of each layer, each list in prefetch order."""
        return self.by_part()

    def for_image(self, image: str) -> Record:
        """This record if it is `image`'s; RecordError otherwise (never use another's)."""
        return self.for_subject(image)


class Recorder(AccessRecorder):
    """First accesses of one launch of `image`, from `start` for `window_s` seconds."""

    def __init__(self, image: str, start: float, window_s: float = WINDOW_S) -> None:
        super().__init__(Record, image, start, window_s)
        self.image = image

    def record(self) -> Record:
        record = super().record()
        assert isinstance(record, Record)
        return record
