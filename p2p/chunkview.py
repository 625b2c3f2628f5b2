"""Verified reads of a store's chunk files by a process beside the agent that owns it.

The FUSE mounts and the snapshot extractors read chunks straight from the agent's
store directory: no round trip through the agent for bytes already on disk. A
`ChunkView` applies the store's own rule to them (`p2p.store.read_checked`): a
chunk file is hashed against the manifest the first time it is read, and trusted
after that only while it keeps the stat it had when it passed. It never writes,
deletes or counts anything in the store; damage is left for the owner, whose own
check catches it.

`RecentChunks` keeps the last few whole chunks that passed a check in memory,
shared by the views of one reader. A sequential reader asks for 1 MiB at a time
(a FUSE read) of chunks of 4-8 MiB: the read that checks a chunk has to read it
whole, and without this the next reads of the same chunk read its file again
(on a 1 GiB file through a mount: about twice the bytes copied out of the page
cache per byte served). Kept bytes are served under the same rule as the file's:
only while the file keeps the stat it had when they passed, so a chunk file
damaged on disk is still found (and reported to the agent by its next check)
as soon as it is read, as without the memory.
"""

from __future__ import annotations

import json
import os
import threading
from collections import OrderedDict
from pathlib import Path

from p2p.chunkfile import CHUNK_SUFFIX, StatKey, stat_key
from p2p.content import ContentId, Manifest, ManifestError, check_content_id
from p2p.store import MANIFEST_NAME, DamagedChunk, MissingChunk, place, read_checked
from p2p.units import MiB

RECENT_CHUNK_BYTES = 32 * MiB  # four 8 MiB stripes, eight 4 MiB chunks


class RecentChunks:
    """Whole chunks that passed their check, newest last, within `max_bytes`.
    Safe to share between threads."""

    def __init__(self, max_bytes: int = RECENT_CHUNK_BYTES) -> None:
        self.max_bytes = max_bytes
        self.hits = 0
        self._chunks: OrderedDict[tuple[ContentId, int], tuple[StatKey, bytes]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, content: ContentId, index: int, key: StatKey) -> bytes | None:
        """The chunk if it is kept and passed its check when its file had stat `key`."""
        with self._lock:
            kept = self._chunks.get((content, index))
            if kept is None or kept[0] != key:
                return None
            self._chunks.move_to_end((content, index))
            self.hits += 1
            return kept[1]

    def put(self, content: ContentId, index: int, key: StatKey, data: bytes) -> None:
        if len(data) > self.max_bytes:
            return
        with self._lock:
            old = self._chunks.pop((content, index), None)
            self._bytes += len(data) - (len(old[1]) if old is not None else 0)
            self._chunks[(content, index)] = (key, data)
            while self._bytes > self.max_bytes:
                _, (_, evicted) = self._chunks.popitem(last=False)
                self._bytes -= len(evicted)


class ChunkView:
    """Verified, read-only reads of one content's chunk files in a store another process
    (the agent) owns (see the module docstring). An absent file is MissingChunk; a file
    that fails its check is DamagedChunk and is left in place for the owner, whose own
    check catches it on its next read of that chunk (the file changed since it last
    passed there too), deletes it and fetches it again. Safe to call from threads.
    """

    def __init__(self, root: Path, manifest: Manifest,
                 recent: RecentChunks | None = None) -> None:
        self.manifest = manifest
        self.directory = Path(root) / check_content_id(manifest.content_id)
        self.recent = recent
        self._checked: dict[int, StatKey] = {}
        self._lock = threading.Lock()

    @classmethod
    def load(cls, root: Path, content_id: ContentId,
             recent: RecentChunks | None = None) -> ChunkView:
        """The view of `content_id` from its manifest file in the store, which must certify
        that id (`Manifest.from_dict` refuses a manifest whose digests give another).
        FileNotFoundError if the store has no manifest for it yet; ManifestError if the file
        is not a manifest of that content."""
        path = Path(root) / check_content_id(content_id) / MANIFEST_NAME
        try:
            manifest = Manifest.from_dict(json.loads(path.read_bytes()))
        except (ValueError, UnicodeDecodeError) as exc:
            if isinstance(exc, ManifestError):
                raise
            raise ManifestError(f"{path} is not a manifest ({exc})") from exc
        if manifest.content_id != content_id:
            raise ManifestError(f"{path} is the manifest of {manifest.content_id}, not of "
                                f"{content_id}")
        return cls(root, manifest, recent)

    def read_chunk(self, index: int, lo: int, hi: int,
                   into: memoryview | None = None) -> memoryview:
        """Bytes [lo, hi) of chunk `index`, verified (in `into` if given); MissingChunk if
        its file is absent, DamagedChunk if the file fails the check or cannot be read."""
        name = self.directory / f"{index}{CHUNK_SUFFIX}"
        if self.recent is not None:
            whole = self._kept(name, index)
            if whole is not None:
                return place(memoryview(whole)[lo:hi], into)
        try:
            fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise MissingChunk(f"chunk {index} of {self.manifest.content_id} is not in the "
                               "store") from None
        except OSError as exc:
            raise DamagedChunk(f"cannot open {name} ({exc.strerror})") from exc
        try:
            with self._lock:
                known = self._checked.get(index)
            checked = read_checked(fd, self.manifest, index, lo, hi, known, into)
        except OSError as exc:
            raise DamagedChunk(f"cannot read {name} ({exc.strerror})") from exc
        finally:
            os.close(fd)
        with self._lock:
            if checked.data is None:
                self._checked.pop(index, None)
            elif checked.key != known:
                self._checked[index] = checked.key
        if checked.data is None:
            raise DamagedChunk(f"{name} fails its check ({checked.hashed} bytes); not using it")
        if checked.whole is not None and self.recent is not None:
            self.recent.put(self.manifest.content_id, index, checked.key, checked.whole)
        return checked.data

    def _kept(self, name: Path, index: int) -> bytes | None:
        """The kept copy of chunk `index`, if its file is as it was when the copy passed."""
        assert self.recent is not None
        try:
            key = stat_key(os.stat(name))
        except OSError:
            return None  # gone or unreadable: the read from the file says which
        return self.recent.get(self.manifest.content_id, index, key)
