"""Hot-frame records: which pack frames the first mounts of a key read, in what order.

Why. A lazy mount's first `import pandas` reads about 160 of the snapshot's
1 MiB frames spread over a dozen packs, and each read of a frame whose chunk
is not local waits for the agent to fetch it: one round trip after another.
Which frames an import reads does not change from node to node, so, as
images do with hot blocks (`fusefs.image.record`), the first mount of a key
records them and every later mount hands the agent their chunks as prefetch
lists before it has even built its tree: the import then finds them local.

What. A `HotRecord` is an access record (`fusefs.record`) whose subject is
the snapshot key and whose pieces are (pack content id, frame index): the
tree pins both (a key has one tree; a pack's frames are listed in it), and a
frame, unlike a chunk, names only bytes that were read. Records of several
mounts merge (median first access orders them).

Where. `hot/<key>.json` in the snapshot origin directory, beside the key
record (`depsnap.record`): written by a mount in record mode (read, merged,
written to a temporary name and renamed: two mounts saving at once lose one
of the two runs, never the file; a record is a hint, not data), read by
every mount at the origin URL (`http(s)://`, `file://`).

Trust. The record comes from the origin, which any node that can publish can
write: it is size-bounded and type-checked (`fusefs.record`), must be the
record of the key asked for, and may name only packs of the snapshot and
frames they have. A bad record is ignored with a warning, never fatal: the
mount then loads everything on demand, as with no record.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import tempfile
from pathlib import Path

from depsnap.frames import stored_offsets
from depsnap.key import KEY_HEX, check_key
from depsnap.record import read_origin_file
from depsnap.snapshot import Pack, Snapshot
from fusefs.record import Record, RecordError, RecordKind
from p2p.origin.base import OriginError

log = logging.getLogger(__name__)

HOT = "hot"
HOT_FRAMES = RecordKind("hot-frame record", "key", "frames",
                        re.compile(f"[0-9a-f]{{{KEY_HEX}}}"), re.compile(r"c1-[0-9a-f]{64}"))

# About 60 bytes a frame: room for 130,000 frames (130 GB of packs), and parsing a hostile
# record of this size is quick enough not to hold up a mount noticeably.
MAX_HOT_BYTES = 8 << 20

Frame = tuple[Pack, int]  # (pack, frame index)


class HotRecord(Record):
    """The frames mounts of snapshot `key` read first: first-access times per frame."""

    __slots__ = ()
    KIND = HOT_FRAMES


def hot_path(key: str) -> str:
    """The record's path under the origin directory (or URL)."""
    return f"{HOT}/{check_key(key)}.json"


def frames_of(record: HotRecord, snapshot: Snapshot) -> list[Frame]:
    """The record's frames in order; RecordError unless each is a frame of the snapshot."""
    record.for_subject(snapshot.key)
    packs = {p.content: p for p in snapshot.packs}
    out = []
    for content, index in record.order():
        pack = packs.get(content)
        if pack is None or not 0 <= index < len(pack.frames):
            raise RecordError(f"the {HOT_FRAMES.name} of key {snapshot.key} names frame "
                              f"{index} of {content}, which its snapshot does not have")
        out.append((pack, index))
    return out


def chunk_plan(frames: list[Frame], chunk_bytes: dict[str, int]) -> dict[str, list[int]]:
    """The chunks under `frames`, per pack, in the frames' order, each once; packs in the
    order of their first frame. `chunk_bytes` gives each pack content's chunk size."""
    plan: dict[str, list[int]] = {}
    seen: set[tuple[str, int]] = set()
    offsets: dict[str, list[int]] = {}
    for pack, index in frames:
        at = offsets.get(pack.content)
        if at is None:
            at = offsets[pack.content] = stored_offsets(pack)
        size = chunk_bytes[pack.content]
        for chunk in range(at[index] // size, (at[index + 1] - 1) // size + 1):
            if (pack.content, chunk) not in seen:
                seen.add((pack.content, chunk))
                plan.setdefault(pack.content, []).append(chunk)
    return plan


async def load_hot(origin_url: str, key: str) -> HotRecord | None:
    """The key's record at `origin_url`, or None if there is none or it is unusable (a
    warning says why: the mount then fetches on demand)."""
    where = f"{origin_url.rstrip('/')}/{hot_path(key)}"
    try:
        data = await read_origin_file(origin_url, hot_path(key), MAX_HOT_BYTES)
        if data is None:
            return None
        return HotRecord.from_bytes(data, where).for_subject(key)
    except (OriginError, RecordError) as exc:
        log.warning("ignoring the hot-frame record of key %s: %s", key, exc)
        return None


def save_hot(origin_dir: Path, record: HotRecord, snapshot: Snapshot) -> HotRecord:
    """Merge `record` into the key's record in `origin_dir` (one that is unusable, or
    does not fit `snapshot`, is replaced) and write it back by rename; the merged record.
    OSError if the directory is not writable."""
    directory = origin_dir / HOT
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / f"{check_key(record.subject)}.json"
    merged = record
    try:
        with open(final, "rb") as file:
            old = HotRecord.from_bytes(file.read(MAX_HOT_BYTES + 1), str(final))
        frames_of(old, snapshot)
        merged = old.merge(record)
    except FileNotFoundError:
        pass
    except RecordError as exc:
        log.warning("the stored hot-frame record is unusable (%s); replacing it", exc)
    fd, tmp = tempfile.mkstemp(prefix=".hot-", dir=directory)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(merged.to_bytes())
        os.chmod(tmp, 0o644)
        os.replace(tmp, final)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    return merged
