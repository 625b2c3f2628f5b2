"""The chunk store: verified chunks on local disk, within a byte budget.

Layout. `root/<content_id>/manifest.json` holds the manifest; each verified
chunk is one file `root/<content_id>/<index>.chunk`. Both are written to a
temp file (`.<name>.<random>.tmp`) in the same directory and then renamed
over the final name with `os.replace`, so a crash leaves either no chunk or a
whole one, never half of one. Stray temp files are deleted when a store opens.

Verification. A chunk is checked against the manifest before it is written
(`put`), or, written to a temp file as it arrived (`temp_file`, p2p.spool),
before that file is renamed into place (`adopt`); `attach` re-checks every
chunk file already on disk the first time a content is attached in this
process, and deletes the damaged or wrong-sized ones. A content found on disk
but not yet attached is only *known*: its bytes are counted against the budget
but never served. A disk can lie after that too, so a chunk file is checked
again whenever it leaves the store, for a peer (`open_cached`, else
`open_verified`) or a local reader (`read_chunk`), unless the file is
unchanged since it last passed a check: same (st_ino, st_size, st_mtime_ns,
st_ctime_ns) as when it was written from verified bytes or last hashed (see
`read_chunk` for what that leaves out). xxh3-128 of a 4 MiB chunk costs 0.06
ms in memory and 0.18 ms including the read from the page cache on this
machine (about 20 GB/s); what a check costs on the upload path is the trip to
a worker thread, which delays the reply to the peer, so an unchanged file is
served without one (measured: with a full check in a thread on every send, 8 x
256 MiB uncapped ran at 0.90 x the unchecked rate). A file that fails a check,
is short, or has vanished is *damaged*: it is deleted, marked absent, logged,
counted (`damaged_chunks`) and reported to the owner through `on_damaged`, who
fetches it again. So nothing this store returns is unverified, and a restart
never refetches a good chunk.

Errors. A bad chunk file is never an error to the caller of a read: it is
damage, handled as above, and the caller sees MissingChunk (DamagedChunk).
Any other failure of the disk (EACCES, EIO, a vanished or replaced directory)
raises StoreError naming the path, the error and what to do; the content's
verification is then forgotten, so the next `attach` checks its directory
from scratch (recreating it) instead of trusting what may be gone.

Durability. No fsync, on purpose: a chunk torn by a power loss is caught by
the re-verification in `attach` and fetched again, which costs less than an
fsync per chunk on every write.

Budget. `used_bytes` counts chunk files only (manifests are small). A `put`
that would exceed `budget_bytes` first evicts whole contents, least recently
used first (put, reads, opens for peers and attach count as use), skipping pinned
ones (`attach` pins, `detach` unpins); if nothing is left to evict it raises
StoreFullError. A full disk (ENOSPC, EDQUOT) is handled the same way: the
temp file is removed, unpinned contents are evicted one at a time while the
write is retried, and StoreFullError is raised if none is left.

Threads. Every public method may be called from worker threads (for example
through asyncio.to_thread): bookkeeping and writes happen under one lock,
hashing and reads outside it. Callbacks (`on_evict`, `on_damaged`) run in
whichever thread found the reason, so an asyncio owner must hop to its loop.
The store does no asyncio and reads no clock.
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
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from p2p.chunkfile import (
    CHUNK_SUFFIX,
    BufferPool,
    StatKey,
    chunk_index,
    pread_upto,
    read_full,
    stat_key,
)
from p2p.content import ContentId, Manifest, ManifestError

log = logging.getLogger(__name__)

MANIFEST_NAME = "manifest.json"
# Written by a tool that put a content's chunks here itself after reading them from its
# origin (the checkpoint indexer): how many bytes that read took, counted once by the
# session that opens the content next (`take_origin_read`), so the origin's egress is told.
ORIGIN_READ_NAME = ".origin-read"
TEMP_SUFFIX = ".tmp"
_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
# Chunk files are written at most this many bytes per write(2). On this
# project's VMs (ext4 on virtio, the host's free-page reporting on), writes of
# 1 MiB and more cost about 10x the kernel CPU of the same bytes in writes of
# 512 KiB or less (280-480 against 1,950-4,200 MB/s per core, 1 GiB of new
# files; our reading: larger writes get larger page-cache folios, from free
# blocks the host took back and faults in on first touch). Elsewhere the
# slices only add a few syscalls.
WRITE_SLICE_BYTES = 256 * 1024


def write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    """Write all of `data` to `fd`, at most WRITE_SLICE_BYTES per write(2)."""
    view = memoryview(data).cast("B")
    while view:
        view = view[os.write(fd, view[:WRITE_SLICE_BYTES]):]


class StoreError(Exception):
    """The store's disk failed (not a bad chunk); the message names the path, the error
    and what to do."""


class StoreFullError(StoreError):
    """A chunk does not fit: the byte budget or the disk is full of pinned contents."""


class MissingChunk(Exception):
    """The chunk (or a chunk of the byte range) is not in the store."""


class DamagedChunk(MissingChunk):
    """The chunk file failed its check on the way out; it was deleted and reported."""


class CorruptChunk(Exception):
    """The bytes offered to `put` do not match the manifest; nothing was written."""


class UnknownContent(LookupError):
    """The content has not been attached since this store was opened."""


class _Content:
    """What the store knows about one content directory (mutable, under the lock)."""

    __slots__ = ("checked", "manifest", "nbytes", "pins", "present")

    def __init__(self, manifest: Manifest, nbytes: int) -> None:
        self.manifest = manifest
        self.nbytes = nbytes  # bytes of chunk files in its directory
        self.pins = 0
        self.present: list[bool] | None = None  # None until verified in this process
        self.checked: dict[int, StatKey] = {}  # chunk -> its file when it last passed


class ChunkStore:
    """Verified chunks of many contents under `root`, within `budget_bytes`."""

    def __init__(self, root: Path, budget_bytes: int,
                 on_evict: Callable[[ContentId], None] | None = None,
                 on_damaged: Callable[[ContentId, int], None] | None = None) -> None:
        """`on_evict` is called (under the store's lock) with each content evicted
        to make room, so the owner can stop serving it; `on_damaged` with each chunk
        found damaged and deleted, so the owner can fetch it again."""
        if budget_bytes <= 0:
            raise ValueError(f"store budget must be positive, got {budget_bytes} bytes")
        self.root = Path(root)
        self._root = os.fspath(self.root)
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            os.listdir(self.root)
        except OSError as exc:
            raise _store_error(exc, "opening the store", self.root) from exc
        self._budget = budget_bytes
        self._on_evict = on_evict
        self._on_damaged = on_damaged
        self._used = 0
        self.damaged_chunks = 0
        self._lock = threading.RLock()
        self._contents: OrderedDict[ContentId, _Content] = OrderedDict()  # oldest use first
        self._buffers = BufferPool()
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

        The first attach in this process (or the first after a StoreError) re-verifies
        every chunk file on disk (deleting bad ones), under the store lock, recreating
        the content's directory if it is gone; later attaches only pin. StoreError if
        the directory cannot be made or read.
        """
        cid = manifest.content_id
        with self._lock:
            entry = self._contents.get(cid)
            if entry is None or entry.manifest != manifest or entry.present is None:
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

    def take_origin_read(self, content_id: ContentId) -> int:
        """The bytes read from the origin by whoever put this content's chunks here
        (ORIGIN_READ_NAME), once: the note is removed. 0 without one."""
        path = self._dir(content_id) / ORIGIN_READ_NAME
        with self._lock:
            try:
                text = path.read_text()
                path.unlink()
            except OSError:
                return 0
        return int(text) if text.strip().isdigit() else 0

    def known(self) -> list[Manifest]:
        """Manifests of every content on disk, attached or not, sorted by id."""
        with self._lock:
            return [self._contents[cid].manifest for cid in sorted(self._contents)]

    def has(self, content_id: ContentId, index: int) -> bool:
        """Whether chunk `index` is present and verified (False for unattached contents
        and for indices outside the content)."""
        with self._lock:
            entry = self._contents.get(content_id)
            present = entry.present if entry else None
            return bool(present and 0 <= index < len(present) and present[index])

    def present(self, content_id: ContentId) -> list[bool]:
        """Which chunks of an attached content are present (UnknownContent if not attached
        since the store opened)."""
        with self._lock:
            return list(self._verified(content_id).present or ())

    # -- chunks in ----------------------------------------------------------------

    def put(self, content_id: ContentId, index: int, data: bytes | bytearray | memoryview) -> None:
        """Verify `data` as chunk `index`, then store it atomically (no-op if present).

        CorruptChunk if it does not match the manifest (nothing is written);
        StoreFullError if it fits neither the budget nor the disk after
        evicting every unpinned content; StoreError for any other disk failure
        (the content must then be attached again).
        """
        manifest = self._verified(content_id).manifest
        if not 0 <= index < manifest.chunks or not manifest.verify(index, data):
            raise CorruptChunk(
                f"chunk {index} of {content_id}: {len(data)} bytes do not match the manifest")
        with self._lock:
            entry = self._verified(content_id)
            assert entry.present is not None
            if not entry.present[index]:
                self._make_room(content_id, index, len(data))
                key = self._write_chunk(entry, index, data)
                entry.present[index] = True
                entry.checked[index] = key  # the file holds exactly the bytes just verified
                entry.nbytes += len(data)
                self._used += len(data)
            self._contents.move_to_end(content_id)

    def temp_file(self, content_id: ContentId, index: int) -> tuple[Manifest, int, str]:
        """The manifest, and a new temp file (fd, path) beside chunk `index`'s, to write
        the chunk into as its bytes arrive; `adopt` stores it once verified (p2p.spool).
        UnknownContent if the content is not attached, IndexError outside it, StoreError
        if the file cannot be made. The budget is checked at `adopt`: until then, the
        bytes are not counted (at most the chunks being received)."""
        manifest = self._verified(content_id).manifest
        if not 0 <= index < manifest.chunks:
            raise IndexError(f"no chunk {index} in {content_id}")
        directory = self._dir(content_id)
        try:
            fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{index}{CHUNK_SUFFIX}.",
                                       suffix=TEMP_SUFFIX)
        except OSError as exc:
            raise _store_error(exc, f"making a file for chunk {index} of {content_id}",
                               directory) from exc
        return manifest, fd, tmp

    def adopt(self, content_id: ContentId, index: int, tmp: str, length: int) -> None:
        """Make the closed temp file `tmp`, whose `length` bytes the caller verified as
        chunk `index`, the chunk's file (a spool's commit); it is removed instead if the
        chunk is present already, and on any error. UnknownContent if the content was
        evicted or failed meanwhile; StoreFullError, StoreError as `put`."""
        renamed = False
        try:
            with self._lock:
                entry = self._verified(content_id)
                assert entry.present is not None
                if not entry.present[index]:
                    self._make_room(content_id, index, length)
                    path = self._chunk_path(content_id, index)
                    try:
                        os.replace(tmp, path)
                        renamed = True
                        key = stat_key(os.stat(path))
                    except OSError as exc:
                        entry.present = None  # whatever was on disk may be gone: check again
                        raise _store_error(exc, f"storing chunk {index} of {content_id}",
                                           self._dir(content_id)) from exc
                    entry.present[index] = True
                    entry.checked[index] = key  # the file holds exactly the verified bytes
                    entry.nbytes += length
                    self._used += length
                self._contents.move_to_end(content_id)
        finally:
            if not renamed:
                with contextlib.suppress(OSError):  # gone with its directory, or the like
                    os.unlink(tmp)  # not needed, or not storable

    # -- chunks out ---------------------------------------------------------------

    def open_cached(self, content_id: ContentId, index: int) -> tuple[int, int] | None:
        """(fd, length) of chunk `index` if its file is unchanged since it last passed a
        check (cheap: an open and an fstat, fine on the event loop); None if it must be
        checked again (then use `open_verified`). MissingChunk if absent."""
        manifest, fd = self._open(content_id, index)
        try:
            key = stat_key(os.fstat(fd))
        except OSError:
            os.close(fd)
            return None
        with self._lock:
            entry = self._contents.get(content_id)
            known = entry.checked.get(index) if entry is not None else None
        if key != known:
            os.close(fd)
            return None
        return fd, manifest.chunk_length(index)

    def open_verified(self, content_id: ContentId, index: int) -> tuple[int, int]:
        """(fd, length) of chunk `index`, just checked in full against the manifest.

        The whole file is hashed (into a reused buffer, no per-chunk allocation): for
        peers when `open_cached` says the file changed, because a bad byte sent to a
        peer gets this node banned and reported. The caller closes the fd; it stays
        readable even if the content is evicted meanwhile. MissingChunk if absent,
        DamagedChunk if the file failed the check (it is then deleted and reported
        through `on_damaged`).
        """
        manifest, fd = self._open(content_id, index)
        length = manifest.chunk_length(index)
        try:
            key = stat_key(os.fstat(fd))
            with self._buffers.buffer(length + 1) as buf:
                n = read_full(fd, buf)
                ok = manifest.verify(index, buf[:n])
        except OSError as exc:
            os.close(fd)
            raise self._damaged(content_id, index, None, f"unreadable ({exc.strerror})") \
                from exc
        if not ok:
            os.close(fd)
            raise self._damaged(content_id, index, key, f"{n} bytes fail the check")
        self._remember(content_id, index, key)
        return fd, length


    def read_chunk(self, content_id: ContentId, index: int, lo: int, hi: int) -> memoryview:
        """Bytes [lo, hi) of chunk `index`, verified, in a buffer of their own.

        The chunk is hashed in full unless its file has the same (st_ino, st_size,
        st_mtime_ns, st_ctime_ns) as when it last passed a check; a change of any of
        them forces a new check. What this does not catch: a write that lands within
        the filesystem's timestamp granularity of the last check and keeps the size
        (ctime cannot be set from user space, but coarse clocks repeat; kernels with
        multigrain timestamps, Linux 6.13+ on ext4, xfs, btrfs and tmpfs, give a change
        that follows a stat a fresh ctime, which closes that gap), and damage below
        the filesystem (a disk returning other bytes for unchanged metadata).
        Peers get the same rule (`open_cached`); a peer that still receives a bad byte
        rejects it, and the chunk is checked again when the content is next attached.
        """
        manifest, fd = self._open(content_id, index)
        try:
            with self._lock:
                entry = self._contents.get(content_id)
                known = entry.checked.get(index) if entry is not None else None
            checked = read_checked(fd, manifest, index, lo, hi, known)
        except OSError as exc:
            raise self._damaged(content_id, index, None, f"unreadable ({exc.strerror})") \
                from exc
        finally:
            os.close(fd)
        if checked.data is None:
            raise self._damaged(content_id, index, checked.key,
                                f"{checked.hashed} bytes fail the check")
        if checked.key != known:
            self._remember(content_id, index, checked.key)
        return checked.data

    def read_range(self, content_id: ContentId, offset: int,
                   length: int) -> Iterator[tuple[int, int, int]]:
        """(chunk, lo, hi) pieces of bytes [offset, offset + length), in order; ValueError
        if the range is outside the content, UnknownContent if not attached."""
        manifest = self._verified(content_id).manifest
        for index in manifest.chunks_for_range(offset, length):
            start = manifest.chunk_offset(index)
            yield (index, max(offset - start, 0),
                   min(offset + length - start, manifest.chunk_length(index)))

    def read(self, content_id: ContentId, offset: int, length: int) -> bytes:
        """Bytes [offset, offset + length) of the content, joined (for small ranges and
        tests; readers of large ranges stream `read_chunk`). MissingChunk if any needed
        chunk is absent or damaged, ValueError if the range is outside the content,
        UnknownContent if it was not attached since the store opened."""
        return b"".join(self.read_chunk(content_id, index, lo, hi)
                        for index, lo, hi in self.read_range(content_id, offset, length))

    # -- internals ----------------------------------------------------------------

    def _dir(self, content_id: str) -> Path:
        return self.root / _dir_name(content_id)

    def _chunk_path(self, content_id: str, index: int) -> str:
        """The chunk file's path as a string: pathlib's parsing on every chunk sent or
        stored was 2% of an agent's interpreter samples (py-spy, uncapped round)."""
        return f"{self._root}/{_dir_name(content_id)}/{index}{CHUNK_SUFFIX}"

    def _verified(self, content_id: ContentId) -> _Content:
        entry = self._contents.get(content_id)
        if entry is None or entry.present is None:
            raise UnknownContent(f"content {content_id} is not attached to the store; attach "
                                 "its manifest first")
        return entry

    def _open(self, content_id: ContentId, index: int) -> tuple[Manifest, int]:
        """The manifest and a read-only fd of a present chunk; a vanished file is damage."""
        with self._lock:
            if not self.has(content_id, index):
                raise MissingChunk(f"chunk {index} of {content_id} is not in the store")
            self._contents.move_to_end(content_id)
            manifest = self._contents[content_id].manifest
        try:
            fd = os.open(self._chunk_path(content_id, index), os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise self._damaged(content_id, index, None, f"cannot open ({exc.strerror})") \
                from exc
        return manifest, fd

    def _remember(self, content_id: ContentId, index: int, key: StatKey) -> None:
        with self._lock:
            entry = self._contents.get(content_id)
            if entry is not None and entry.present and entry.present[index]:
                entry.checked[index] = key

    def _damaged(self, content_id: ContentId, index: int, key: StatKey | None,
                 why: str) -> DamagedChunk:
        """Forget, delete, log, count and report a chunk file that failed on the way out.

        `key` is the file that failed; if the chunk has been stored again since (a
        new inode), the new file is left alone. Returns the error to raise.
        """
        path = self._dir(content_id) / f"{index}{CHUNK_SUFFIX}"
        with self._lock:
            entry = self._contents.get(content_id)
            if entry is None or not entry.present or not entry.present[index]:
                return DamagedChunk(f"chunk {index} of {content_id} is not in the store")
            with contextlib.suppress(OSError):
                if key is not None and os.stat(path).st_ino != key[0]:
                    return DamagedChunk(f"chunk {index} of {content_id} changed while read")
            entry.present[index] = False
            entry.checked.pop(index, None)
            length = entry.manifest.chunk_length(index)
            entry.nbytes -= length
            self._used -= length
            self.damaged_chunks += 1
            with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                os.unlink(path)
        log.warning("chunk %d of %s on disk is damaged: %s (%s); deleted it, fetching it "
                    "again", index, content_id, why, path)
        if self._on_damaged is not None:
            self._on_damaged(content_id, index)
        return DamagedChunk(f"chunk {index} of {content_id} was damaged on disk ({why}); "
                            "it is being fetched again")

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
        nbytes = 0
        directory = self._dir(manifest.content_id)
        entry.checked.clear()
        try:
            with self._buffers.buffer(manifest.chunk_size + 1) as buf:
                for item in os.scandir(directory):
                    if not item.name.endswith(CHUNK_SUFFIX) or item.name.startswith("."):
                        continue
                    index = chunk_index(item.name, manifest.chunks)
                    with open(item.path, "rb", buffering=0) as f:
                        key = stat_key(os.fstat(f.fileno()))
                        n = f.readinto(buf)
                    if index is not None and not present[index] and manifest.verify(index,
                                                                                    buf[:n]):
                        present[index] = True
                        entry.checked[index] = key
                        nbytes += n
                    else:
                        log.warning("deleting %s: does not match the manifest", item.path)
                        os.unlink(item.path)
        except OSError as exc:
            raise _store_error(exc, f"checking the chunks of {manifest.content_id}",
                               directory) from exc
        self._used += nbytes - entry.nbytes
        entry.nbytes = nbytes
        return present

    def _write_manifest(self, manifest: Manifest) -> None:
        cid = manifest.content_id
        try:
            self._dir(cid).mkdir(parents=True, exist_ok=True)
            self._write_atomic(cid, MANIFEST_NAME, json.dumps(manifest.to_dict()).encode())
        except OSError as exc:
            if exc.errno not in _DISK_FULL:
                raise _store_error(exc, f"writing the manifest of {cid}", self._dir(cid)) \
                    from exc
            raise StoreFullError(f"disk full writing the manifest of {cid} under {self.root} "
                                 f"({exc.strerror}); free disk space") from exc

    def _make_room(self, content_id: ContentId, index: int, size: int) -> None:
        if self._used + size <= self._budget:
            return
        pinned = self._used - sum(e.nbytes for cid, e in self._contents.items()
                                  if not e.pins and cid != content_id)
        if pinned + size > self._budget:  # check first: evict nothing in vain
            raise StoreFullError(
                f"store full: chunk {index} of {content_id} needs {size} bytes, but {pinned} "
                f"of the store's {self._budget}-byte budget hold contents still attached; "
                "raise the store budget or detach contents that are done"
            )
        while self._used + size > self._budget:
            self._evict_one(keep=content_id)

    def _write_chunk(self, entry: _Content, index: int,
                     data: bytes | bytearray | memoryview) -> StatKey:
        """Write the chunk file; its stat key, to recognise it unchanged later."""
        content_id = entry.manifest.content_id
        name = f"{index}{CHUNK_SUFFIX}"
        while True:
            try:
                self._write_atomic(content_id, name, data)
                return stat_key(os.stat(self._chunk_path(content_id, index)))
            except OSError as exc:
                if exc.errno not in _DISK_FULL:
                    entry.present = None  # whatever was on disk may be gone: check again
                    raise _store_error(exc, f"writing chunk {index} of {content_id}",
                                       self._dir(content_id)) from exc
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
            write_all(fd, data)
            os.close(fd)
            fd = -1
            os.replace(tmp, directory / name)
        except BaseException:
            if fd >= 0:
                os.close(fd)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise


@dataclass(frozen=True, slots=True)
class Checked:
    """What `read_checked` found: the bytes asked for (None: the file fails its check),
    the file's stat key, the bytes hashed (0 if the file was trusted by its key), and the
    whole chunk when it was read whole and passed (for a caller that keeps it)."""

    data: memoryview | None
    key: StatKey
    hashed: int
    whole: bytes | None = None


def read_checked(fd: int, manifest: Manifest, index: int, lo: int, hi: int,
                 known: StatKey | None, into: memoryview | None = None) -> Checked:
    """Bytes [lo, hi) of chunk `index`, whose file is open at `fd`, in a buffer of their own
    (or in `into`, which must hold hi - lo bytes: one request's buffer for several chunks).

    The whole file is hashed against `manifest` unless its stat key is still `known`
    (the key it had when it last passed a check). ValueError for a range outside the
    chunk; OSError as raised by the disk.
    """
    length = manifest.chunk_length(index)
    if not 0 <= lo <= hi <= length or (into is not None and len(into) != hi - lo):
        raise ValueError(f"range {lo}..{hi} outside chunk {index} of {length} bytes")
    key = stat_key(os.fstat(fd))
    if key == known:
        if into is None:
            data = pread_upto(fd, hi - lo, lo)
            if len(data) == hi - lo:
                return Checked(memoryview(data), key, 0)
        elif read_full(fd, into, lo) == hi - lo:
            return Checked(into, key, 0)
    whole = pread_upto(fd, length + 1)  # one byte more: a too-long file shows
    if not manifest.verify(index, whole):
        return Checked(None, key, len(whole))
    return Checked(place(memoryview(whole)[lo:hi], into), key, len(whole), whole)


def place(data: memoryview, into: memoryview | None) -> memoryview:
    """`data`, copied into `into` if the caller gave a buffer for it."""
    if into is None:
        return data
    into[:] = data
    return into


def _dir_name(content_id: str) -> str:
    if not content_id or content_id.startswith(".") or "/" in content_id or "\0" in content_id:
        raise ValueError(f"content id {content_id!r} cannot name a store directory")
    return content_id


def _store_error(exc: OSError, doing: str, path: Path) -> StoreError:
    name = errno.errorcode.get(exc.errno or 0, "error")
    return StoreError(
        f"chunk store failed {doing} in {path}: {exc.strerror or exc} ({name}); check that "
        "the store directory exists, is a directory writable by the agent, and that its disk "
        "is healthy; the content is checked and fetched again on the next request")
