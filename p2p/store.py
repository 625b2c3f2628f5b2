"""The chunk store: verified chunks on local disk, within a byte budget.

Layout. `root/<content_id>/manifest.json` holds the manifest; each verified
chunk is one file `root/<content_id>/<index>.chunk`. Both are written to a
temp file (`.<name>.<random>.tmp`) in the same directory and then renamed
over the final name with `os.replace`, so a crash leaves either no chunk or a
whole one, never half of one. Stray temp files are deleted when a store opens.

Verification. A chunk is checked against the manifest before it is written
(`put`); `attach` re-checks every chunk file already on disk the first time a
content is attached in this process, and deletes the damaged or wrong-sized
ones. A content found on disk but not yet attached is only *known*: its bytes
are counted against the budget but never served. So nothing this store
returns is unverified, and a restart never refetches a good chunk.

Durability. No fsync, on purpose: a chunk torn by a power loss is caught by
the re-verification in `attach` and fetched again, which costs less than an
fsync per chunk on every write.

Budget. `used_bytes` counts chunk files only (manifests are small). A `put`
that would exceed `budget_bytes` first evicts whole contents, least recently
used first (put, read, open_chunk and attach count as use), skipping pinned
ones (`attach` pins, `detach` unpins); if nothing is left to evict it raises
StoreFullError. A full disk (ENOSPC, EDQUOT) is handled the same way: the
temp file is removed, unpinned contents are evicted one at a time while the
write is retried, and StoreFullError is raised if none is left.

Threads. Every public method may be called from worker threads (for example
through asyncio.to_thread): bookkeeping and writes happen under one lock,
hashing and reads outside it. The store does no asyncio and reads no clock.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import shutil
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

from p2p.content import ContentId, Manifest, ManifestError

log = logging.getLogger(__name__)

MANIFEST_NAME = "manifest.json"
CHUNK_SUFFIX = ".chunk"
TEMP_SUFFIX = ".tmp"
_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


class StoreFullError(Exception):
    """A chunk does not fit: the byte budget or the disk is full of pinned contents."""


class MissingChunk(Exception):
    """The chunk (or a chunk of the byte range) is not in the store."""


class CorruptChunk(Exception):
    """The bytes offered to `put` do not match the manifest; nothing was written."""


class UnknownContent(LookupError):
    """The content has not been attached since this store was opened."""


class _Content:
    """What the store knows about one content directory (mutable, under the lock)."""

    __slots__ = ("manifest", "nbytes", "pins", "present")

    def __init__(self, manifest: Manifest, nbytes: int) -> None:
        self.manifest = manifest
        self.nbytes = nbytes  # bytes of chunk files in its directory
        self.pins = 0
        self.present: list[bool] | None = None  # None until verified in this process


class ChunkStore:
    """Verified chunks of many contents under `root`, within `budget_bytes`."""

    def __init__(self, root: Path, budget_bytes: int,
                 on_evict: Callable[[ContentId], None] | None = None) -> None:
        """`on_evict` is called (under the store's lock) with each content evicted
        to make room, so the owner can stop serving it."""
        if budget_bytes <= 0:
            raise ValueError(f"store budget must be positive, got {budget_bytes} bytes")
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._budget = budget_bytes
        self._on_evict = on_evict
        self._used = 0
        self._lock = threading.RLock()
        self._contents: OrderedDict[ContentId, _Content] = OrderedDict()  # oldest use first
        self._scan()

    @property
    def budget_bytes(self) -> int:
        return self._budget

    @property
    def used_bytes(self) -> int:
        """Bytes of chunk files on disk, verified or merely known."""
        return self._used

    # -- contents ---------------------------------------------------------------

    def attach(self, manifest: Manifest) -> list[bool]:
        """Register and pin `manifest`'s content; return which chunks are present.

        The first attach in this process re-verifies every chunk file on disk
        (deleting bad ones), under the store lock; later attaches only pin.
        """
        cid = manifest.content_id
        with self._lock:
            entry = self._contents.get(cid)
            if entry is None or entry.manifest != manifest:
                self._write_manifest(manifest)
                if entry is None:
                    entry = self._contents[cid] = _Content(manifest, 0)
                entry.manifest, entry.present = manifest, None
            if entry.present is None:
                entry.present = self._verify_all(entry)
            entry.pins += 1
            self._contents.move_to_end(cid)
            return list(entry.present)

    def detach(self, content_id: ContentId) -> None:
        """Unpin the content; once no pins remain it may be evicted."""
        with self._lock:
            entry = self._contents.get(content_id)
            if entry is None or entry.pins == 0:
                raise ValueError(f"content {content_id} is not attached")
            entry.pins -= 1

    def remove(self, content_id: ContentId) -> None:
        """Delete an unpinned content and all its chunks now."""
        with self._lock:
            entry = self._contents.get(content_id)
            if entry is not None and entry.pins:
                raise ValueError(f"content {content_id} is attached; detach it first")
            if entry is not None:
                self._evict(content_id, entry)

    def known(self) -> list[Manifest]:
        """Manifests of every content on disk, attached or not, sorted by id."""
        with self._lock:
            return [self._contents[cid].manifest for cid in sorted(self._contents)]

    def has(self, content_id: ContentId, index: int) -> bool:
        """Whether chunk `index` is present and verified (False for unattached contents)."""
        with self._lock:
            entry = self._contents.get(content_id)
            return bool(entry and entry.present and entry.present[index])

    def present(self, content_id: ContentId) -> list[bool]:
        """Which chunks of an attached content are present (UnknownContent if not attached
        since the store opened)."""
        with self._lock:
            return list(self._verified(content_id).present or ())

    # -- chunks -----------------------------------------------------------------

    def put(self, content_id: ContentId, index: int, data: bytes | bytearray | memoryview) -> None:
        """Verify `data` as chunk `index`, then store it atomically (no-op if present).

        CorruptChunk if it does not match the manifest (nothing is written);
        StoreFullError if it fits neither the budget nor the disk after
        evicting every unpinned content.
        """
        manifest = self._verified(content_id).manifest
        if not manifest.verify(index, data):
            raise CorruptChunk(
                f"chunk {index} of {content_id}: {len(data)} bytes do not match the manifest "
                f"(want {manifest.chunk_length(index)} bytes with digest "
                f"{manifest.digests[index].hex()})"
            )
        with self._lock:
            entry = self._verified(content_id)
            assert entry.present is not None
            if not entry.present[index]:
                self._make_room(content_id, index, len(data))
                self._write_chunk(content_id, index, data)
                entry.present[index] = True
                entry.nbytes += len(data)
                self._used += len(data)
            self._contents.move_to_end(content_id)

    def open_chunk(self, content_id: ContentId, index: int) -> tuple[int, int]:
        """(fd, length) of a present chunk, opened read-only for sendfile; the caller closes
        the fd. The fd stays readable even if the content is evicted meanwhile."""
        with self._lock:
            entry = self._contents.get(content_id)
            if not (entry and entry.present and entry.present[index]):
                raise MissingChunk(f"chunk {index} of {content_id} is not in the store")
            try:
                fd = os.open(self._dir(content_id) / f"{index}{CHUNK_SUFFIX}",
                             os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:  # deleted behind our back
                entry.present[index] = False
                entry.nbytes -= entry.manifest.chunk_length(index)
                self._used -= entry.manifest.chunk_length(index)
                raise MissingChunk(f"chunk {index} of {content_id} vanished from disk") from None
            self._contents.move_to_end(content_id)
            return fd, entry.manifest.chunk_length(index)

    def read(self, content_id: ContentId, offset: int, length: int) -> bytes:
        """Bytes [offset, offset + length) of the content; MissingChunk if any needed chunk
        is absent, ValueError if the range is outside the content, UnknownContent if it
        was not attached since the store opened."""
        manifest = self._verified(content_id).manifest
        parts = []
        for index in manifest.chunks_for_range(offset, length):
            start = manifest.chunk_offset(index)
            lo, hi = max(offset - start, 0), min(offset + length - start, manifest.chunk_size)
            fd, _ = self.open_chunk(content_id, index)
            try:
                part = os.pread(fd, hi - lo, lo)
            finally:
                os.close(fd)
            if len(part) != hi - lo:
                raise MissingChunk(f"chunk {index} of {content_id} was truncated on disk")
            parts.append(part)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    # -- internals ----------------------------------------------------------------

    def _dir(self, content_id: str) -> Path:
        if not content_id or content_id.startswith(".") or "/" in content_id or "\0" in content_id:
            raise ValueError(f"content id {content_id!r} cannot name a store directory")
        return self.root / content_id

    def _verified(self, content_id: ContentId) -> _Content:
        entry = self._contents.get(content_id)
        if entry is None or entry.present is None:
            raise UnknownContent(f"content {content_id} is not attached to the store; attach "
                                 "its manifest first")
        return entry

    def _scan(self) -> None:
        """Load the contents already on disk, oldest-modified first, and drop temp files."""
        dirs = [d for d in self.root.iterdir() if d.is_dir() and not d.name.startswith(".")]
        for path in sorted(dirs, key=lambda d: (d.stat().st_mtime, d.name)):
            nbytes = 0
            for item in os.scandir(path):
                if item.name.startswith(".") and item.name.endswith(TEMP_SUFFIX):
                    os.unlink(item.path)
                elif item.name.endswith(CHUNK_SUFFIX):
                    nbytes += item.stat().st_size
            try:
                raw = json.loads((path / MANIFEST_NAME).read_bytes())
                manifest = Manifest.from_dict(raw)
            except (OSError, ValueError, ManifestError) as exc:
                log.warning("ignoring %s: no usable %s (%s)", path, MANIFEST_NAME, exc)
                continue
            if manifest.content_id != path.name:
                log.warning("ignoring %s: its manifest is for %s", path, manifest.content_id)
                continue
            self._contents[manifest.content_id] = _Content(manifest, nbytes)
            self._used += nbytes

    def _verify_all(self, entry: _Content) -> list[bool]:
        """Check every chunk file of a content; delete the bad ones; recount its bytes."""
        manifest = entry.manifest
        present = [False] * manifest.chunks
        buf = memoryview(bytearray(manifest.chunk_size + 1))
        nbytes = 0
        for item in os.scandir(self._dir(manifest.content_id)):
            if not item.name.endswith(CHUNK_SUFFIX) or item.name.startswith("."):
                continue
            index = _chunk_index(item.name, manifest.chunks)
            with open(item.path, "rb", buffering=0) as f:
                n = f.readinto(buf)
            if index is not None and not present[index] and manifest.verify(index, buf[:n]):
                present[index] = True
                nbytes += n
            else:
                log.warning("deleting %s: does not match the manifest", item.path)
                os.unlink(item.path)
        self._used += nbytes - entry.nbytes
        entry.nbytes = nbytes
        return present

    def _write_manifest(self, manifest: Manifest) -> None:
        cid = manifest.content_id
        try:
            self._dir(cid).mkdir(exist_ok=True)
            self._write_atomic(cid, MANIFEST_NAME, json.dumps(manifest.to_dict()).encode())
        except OSError as exc:
            if exc.errno not in _DISK_FULL:
                raise
            raise StoreFullError(f"disk full writing the manifest of {cid} under {self.root} "
                                 f"({exc.strerror}); free disk space") from exc

    def _make_room(self, content_id: ContentId, index: int, size: int) -> None:
        if self._used + size <= self._budget:
            return
        pinned = self._used - sum(e.nbytes for cid, e in self._contents.items()
                                  if not e.pins and cid != content_id)
        if pinned + size > self._budget:  # check first: evict nothing in vain
            raise StoreFullError(
                f"chunk {index} of {content_id} needs {size} bytes, but {pinned} of the "
                f"store's {self._budget}-byte budget hold contents still attached; raise the "
                "store budget or detach contents that are done"
            )
        while self._used + size > self._budget:
            self._evict_one(keep=content_id)

    def _write_chunk(self, content_id: ContentId, index: int,
                     data: bytes | bytearray | memoryview) -> None:
        while True:
            try:
                self._write_atomic(content_id, f"{index}{CHUNK_SUFFIX}", data)
                return
            except OSError as exc:
                if exc.errno not in _DISK_FULL:
                    raise
                if not self._evict_one(keep=content_id):
                    free = shutil.disk_usage(self.root).free
                    raise StoreFullError(
                        f"disk full writing chunk {index} of {content_id} ({len(data)} bytes, "
                        f"{free} bytes free on {self.root}, {exc.strerror}) and every cached "
                        "content is attached; free disk space or lower the store budget "
                        "below the free space"
                    ) from exc

    def _evict_one(self, keep: ContentId) -> bool:
        """Delete the least recently used unpinned content other than `keep`."""
        for cid, entry in self._contents.items():
            if entry.pins == 0 and cid != keep:
                self._evict(cid, entry)
                if self._on_evict is not None:
                    self._on_evict(cid)
                return True
        return False

    def _evict(self, content_id: ContentId, entry: _Content) -> None:
        log.info("evicting %s (%d bytes)", content_id, entry.nbytes)
        shutil.rmtree(self._dir(content_id), ignore_errors=True)
        del self._contents[content_id]
        self._used -= entry.nbytes

    def _write_atomic(self, content_id: str, name: str,
                      data: bytes | bytearray | memoryview) -> None:
        """Write `data` to a temp file beside `name`, then rename it over `name`."""
        directory = self._dir(content_id)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{name}.", suffix=TEMP_SUFFIX)
        try:
            view = memoryview(data).cast("B")
            while view:
                view = view[os.write(fd, view):]
            os.close(fd)
            fd = -1
            os.replace(tmp, directory / name)
        except BaseException:
            if fd >= 0:
                os.close(fd)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise


def _chunk_index(name: str, chunks: int) -> int | None:
    """The index in "<index>.chunk" if it is a canonical decimal below `chunks`."""
    stem = name[: -len(CHUNK_SUFFIX)]
    if not stem.isdigit() or str(int(stem)) != stem or int(stem) >= chunks:
        return None
    return int(stem)
