"""Backing files that passthrough can hand to the kernel, written only from verified
bytes.

Passthrough maps a FUSE file onto one backing file, byte for byte; the store keeps
a content as chunk files. So a file that is one range of a content (a checkpoint
file: all of it; a file of a plain tar layer: its member's bytes) gets, once the
chunks under it are all in the store, one more file beside them:
`<store>/<content>/content.whole` for the whole content, `extent-<offset>-<length>.whole`
for a range. It is built by copying the range out of the chunk files into a temp file,
which is checked against the manifest (below) before it is renamed into place:
only bytes that passed reach the kernel. The agent's store ignores these
names (not chunks: not counted, never verified by it) and removes them with the
content's directory when it evicts the content; their bytes are not in its budget.

The store's rule for trusting a file holds here too: a backing file is checked
the first time this process hands it out, and after that trusted only while it
keeps the stat it had when it passed (the one this process wrote it with, or the
one it had when checked). "This process" is every mount it serves: the stats
that passed are kept once per store per process (`checked_in`), so a mount
server (`fusefs.mounthost`) that serves a second mount of a checkpoint hands its
file out without hashing it again, as a second open in one mount always did.
The check hashes every chunk the range covers whole against the manifest; a
chunk the range covers only in part (its first and last) is read from its chunk
file, verified, and compared byte for byte. A file that fails is deleted and
built again from the chunks. What passthrough cannot do is check a file while it
is open: the kernel reads it without us. A disk that changes a file under an open
file is caught at the next open, whichever mount it comes through, not at the
next read (the handler path checks at every read).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import mmap
import os
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

from fusefs.tree import Extent
from p2p.chunkfile import CHUNK_SUFFIX, StatKey, stat_key
from p2p.chunkview import ChunkView
from p2p.content import ContentId, Manifest, ManifestError
from p2p.store import MissingChunk

log = logging.getLogger(__name__)

WHOLE_NAME = "content.whole"
TEMP_SUFFIX = ".tmp"  # the store deletes `.<name>.tmp` files it finds at start
# A decoded copy (of a snapshot file, of a file of a gzip image layer) only for files at
# least this large: a smaller file is one READ through the handler, and its copy would
# cost a file creation on the node's disk for at most that round trip.
MIN_COPY_BYTES = 128 << 10
# A file at least this large whose chunks are all local but whose backing file is not
# built yet (the first open after a prefetch) waits for its build, then reads by
# passthrough; a smaller one is read through the handler while its copy is built for
# the next open. benchmarks/fuse_read.py, `unbuilt_*`, measures the first read.
BUILD_AT_OPEN_BYTES = 64 << 20


def write_read_only(path: Path, fill: Callable[[int], None]) -> StatKey:
    """Make `path` whole or not at all: `fill(fd)` writes a temp file beside it, which is
    then made read-only and renamed into place (a reader never sees part of it); its
    stat key. On any error the temp file is removed and the error raised."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=TEMP_SUFFIX)
    try:
        fill(fd)
        os.fchmod(fd, 0o444)
        os.replace(tmp, path)
        return stat_key(os.fstat(fd))
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    finally:
        os.close(fd)


class CheckedFiles:
    """The stat each backing file of one store had when it last passed its check in this
    process (the trust rule's memory, see the module docstring); thread-safe: checks run
    on worker threads."""

    def __init__(self) -> None:
        self._keys: dict[Path, StatKey] = {}
        self._lock = threading.Lock()

    def trusted(self, path: Path, key: StatKey) -> bool:
        """Whether `path`, with the stat `key`, passed its check here and kept that stat."""
        with self._lock:
            return self._keys.get(path) == key

    def passed(self, path: Path, key: StatKey) -> None:
        with self._lock:
            self._keys[path] = key

    def open(self, path: Path, passes: Callable[[int], bool]) -> tuple[int | None, bool]:
        """An fd of the file at `path` that passes its check, for the caller to close (None:
        there is no such file; one that fails is deleted), and whether it was checked now:
        `passes(fd)` runs only if this process has not seen the file pass with its stat."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None, False
        checking = False
        try:
            key = stat_key(os.fstat(fd))
            checking = not self.trusted(path, key)
            if checking and not passes(fd):
                log.warning("%s fails its check; deleting it", path)
                with contextlib.suppress(OSError):
                    os.unlink(path)
                os.close(fd)
                return None, True
            self.passed(path, key)
            return fd, checking
        except OSError:
            os.close(fd)
            return None, checking


_checked_by_store: dict[Path, CheckedFiles] = {}
_by_store_lock = threading.Lock()


def checked_in(store_dir: Path) -> CheckedFiles:
    """This process's `CheckedFiles` of the store at `store_dir`: one, shared by every
    mount the process serves of that store."""
    where = Path(os.path.realpath(store_dir))
    with _by_store_lock:
        return _checked_by_store.setdefault(where, CheckedFiles())


class WholeFiles:
    """Verified whole-content files in the store at `store_dir` (see the module
    docstring). Methods block on disk: call them from a worker thread."""

    def __init__(self, store_dir: Path, only: frozenset[str] | None = None) -> None:
        """`only`: the contents whose bytes are the file bytes (None: all); an image's
        compressed layers are decoded, so their ranges are not copies of chunk bytes."""
        self.store_dir = Path(store_dir)
        self.only = only
        self.built = 0
        self.checked = 0  # files this object hashed at an open: not trusted by then
        self.hashed_bytes = 0
        self._checked = checked_in(self.store_dir)

    def eligible(self, content: str) -> bool:
        return self.only is None or content in self.only

    def path(self, content: ContentId, offset: int = 0, length: int | None = None) -> Path:
        name = WHOLE_NAME if offset == 0 and length is None else f"extent-{offset}-{length}.whole"
        return self.store_dir / content / name

    def manifest(self, content: ContentId) -> Manifest | None:
        """The store's manifest of `content` (None if it has none that certifies it)."""
        try:
            return ChunkView.load(self.store_dir, content).manifest
        except (OSError, ManifestError):
            return None

    def open_verified(self, manifest: Manifest, offset: int, length: int) -> int | None:
        """An fd of the backing file of bytes [offset, +length) of the content, which
        passed its check; None if there is no such file (a failing one is deleted). The
        caller closes the fd."""
        path = self._path(manifest, offset, length)
        fd, checked = self._checked.open(
            path, lambda fd: self._passes(fd, manifest, offset, length))
        self.checked += checked
        return fd

    def complete(self, manifest: Manifest, offset: int, length: int) -> bool:
        """Whether every chunk file under the range is in the store (not yet checked)."""
        directory = self.store_dir / manifest.content_id
        return all((directory / f"{i}.chunk").exists()
                   for i in manifest.chunks_for_range(offset, length))

    def build(self, manifest: Manifest, offset: int = 0, length: int | None = None) -> bool:
        """Write the backing file of the range from the chunk files, then check what was
        written (as `open_verified` does) before it is renamed into place; False (and
        nothing left behind) if a chunk is missing or the result fails.

        The copy is `copy_file_range` (in the kernel) and the check hashes the result
        through a mapping: writing 1 GiB from Python buffers cost 1.7 CPU-s here, the
        kernel's copy 0.4, the check 0.1. Checking the written file, not the chunks read
        on the way, is also the stronger check: it is the file the kernel will read."""
        length = manifest.size - offset if length is None else length
        path = self._path(manifest, offset, length)

        def fill(fd: int) -> None:
            for index, lo, hi in _pieces(manifest, offset, length):
                self._copy_chunk(manifest, index, lo, hi, fd)
            if not self._passes(fd, manifest, offset, length):
                raise MissingChunk(f"the copy of {path.name} fails its check")

        try:
            key = write_read_only(path, fill)
        except (MissingChunk, OSError) as exc:
            log.info("no backing file for %s yet: %s", path, exc)
            return False
        self._checked.passed(path, key)
        self.built += 1
        return True

    def _copy_chunk(self, manifest: Manifest, index: int, lo: int, hi: int, out: int) -> None:
        name = self.store_dir / manifest.content_id / f"{index}{CHUNK_SUFFIX}"
        try:
            src = os.open(name, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise MissingChunk(f"chunk {index} is not in the store") from None
        try:
            at = lo
            while at < hi:
                n = os.copy_file_range(src, out, hi - at, at)
                if n == 0:
                    raise MissingChunk(f"{name} is shorter than its chunk")
                at += n
        finally:
            os.close(src)

    def _path(self, manifest: Manifest, offset: int, length: int) -> Path:
        whole = offset == 0 and length == manifest.size
        return self.path(manifest.content_id, offset, None if whole else length)

    def _passes(self, fd: int, manifest: Manifest, offset: int, length: int) -> bool:
        """Whether the file at `fd` holds the range's bytes. Hashed through a mapping of
        the file, not read into a buffer: the copy out of the page cache was half of a
        serving process's CPU per GiB read by passthrough here (0.23 -> 0.11 s/GiB). A
        mapped file truncated meanwhile would fault; the store never truncates a file
        (it writes new ones and renames them), and this file is read-only."""
        if os.fstat(fd).st_size != length:
            return False
        view = ChunkView(self.store_dir, manifest)
        with mmap.mmap(fd, 0, prot=mmap.PROT_READ) as mapped:
            data = memoryview(mapped)
            try:
                return all(self._piece_passes(manifest, view, index, lo, hi,
                                              data[at:at + hi - lo])
                           for index, lo, hi, at in _placed(manifest, offset, length))
            finally:
                data.release()

    def _piece_passes(self, manifest: Manifest, view: ChunkView, index: int, lo: int, hi: int,
                      piece: memoryview) -> bool:
        self.hashed_bytes += len(piece)
        if hi - lo == manifest.chunk_length(index):
            return manifest.verify(index, piece)
        try:  # an edge chunk: compare with its verified chunk file
            return view.read_chunk(index, lo, hi) == piece
        except MissingChunk:
            return False


class WholeBacking:
    """A `fusefs.kernelfs.Backing` over `WholeFiles`: an extent's backing file is the
    range's file in the store, checked at its first open by this process. One not built
    yet is built once every chunk under it is in the store: an open of a large file
    (`BUILD_AT_OPEN_BYTES`) waits for it, a smaller one is served by the handler
    meanwhile. One build per extent, however many opens ask for it."""

    def __init__(self, whole: WholeFiles) -> None:
        self.whole = whole
        self._manifests: dict[str, Manifest | None] = {}
        self._building: dict[tuple[str, int, int], asyncio.Task[bool]] = {}

    @property
    def built(self) -> int:
        return self.whole.built

    @property
    def checked(self) -> int:
        return self.whole.checked

    async def open(self, extent: Extent) -> int | None:
        if not self.whole.eligible(extent.content):
            return None
        manifest = await self._manifest(extent.content)
        if manifest is None or extent.offset + extent.length > manifest.size:
            return None
        fd = await asyncio.to_thread(self.whole.open_verified, manifest, extent.offset,
                                     extent.length)
        if fd is None:
            building = self._build_later(manifest, extent)
            if building is not None and extent.length >= BUILD_AT_OPEN_BYTES and \
                    await asyncio.shield(building):
                fd = await asyncio.to_thread(self.whole.open_verified, manifest,
                                             extent.offset, extent.length)
        return fd

    async def _manifest(self, content: str) -> Manifest | None:
        if content not in self._manifests:
            self._manifests[content] = await asyncio.to_thread(self.whole.manifest,
                                                               ContentId(content))
        return self._manifests[content]

    def _build_later(self, manifest: Manifest, extent: Extent) -> asyncio.Task[bool] | None:
        """The build of `extent`'s backing file, started now if it is not under way (None:
        a chunk under it is not in the store yet)."""
        whole = self.whole
        key = (extent.content, extent.offset, extent.length)
        if key in self._building:
            return self._building[key]
        if not whole.complete(manifest, extent.offset, extent.length):
            return None

        async def build() -> bool:
            return await asyncio.to_thread(whole.build, manifest, extent.offset, extent.length)

        task = asyncio.get_running_loop().create_task(build())
        self._building[key] = task
        task.add_done_callback(lambda t: self._building.pop(key, None))
        return task

    async def close(self) -> None:
        for task in self._building.values():
            task.cancel()
        await asyncio.gather(*self._building.values(), return_exceptions=True)


def _placed(manifest: Manifest, offset: int, length: int) -> list[tuple[int, int, int, int]]:
    """`_pieces`, each with where its bytes are in the range."""
    out, at = [], 0
    for index, lo, hi in _pieces(manifest, offset, length):
        out.append((index, lo, hi, at))
        at += hi - lo
    return out


def _pieces(manifest: Manifest, offset: int, length: int) -> list[tuple[int, int, int]]:
    """(chunk, lo, hi): the part of each chunk that bytes [offset, +length) cover."""
    out = []
    for index in manifest.chunks_for_range(offset, length):
        start = manifest.chunk_offset(index)
        out.append((index, max(offset - start, 0),
                    min(offset + length - start, manifest.chunk_length(index))))
    return out


def write_all(fd: int, data: memoryview) -> None:
    """Write all of `data` at `fd` (a decoded copy's bytes, into `write_read_only`'s file)."""
    while data:
        data = data[os.write(fd, data):]
