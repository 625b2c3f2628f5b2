"""Whole-content files that passthrough can hand to the kernel, written only from
verified bytes.

Passthrough maps a FUSE file onto one backing file, byte for byte; the store keeps
a content as chunk files. So a content whose chunks are all in the store gets one
more file beside them, `<store>/<content>/content.whole`, built by copying every
chunk through `p2p.chunkview.ChunkView` (each chunk hashed against the manifest on
the way) into a temp file that is renamed into place. The agent's store ignores
the name (not a chunk: not counted, never verified by it) and removes it with the
content's directory when it evicts the content.

The store's rule for trusting a file holds here too: a whole file is hashed
against the manifest, chunk by chunk, the first time this process hands it out,
and after that trusted only while it keeps the stat it had when it passed (the
one this process wrote it with, or the one it had when hashed). A file that fails
is deleted and built again from the chunks. What passthrough cannot do is check
a file while it is open: the kernel reads it without us. A disk that changes a
file under an open file is caught at the next open, not at the next read (the
handler path checks at every read).
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import threading
from pathlib import Path

from p2p.chunkfile import StatKey, read_full, stat_key
from p2p.chunkview import ChunkView
from p2p.content import ContentId, Manifest, ManifestError
from p2p.store import MissingChunk

log = logging.getLogger(__name__)

WHOLE_NAME = "content.whole"
TEMP_SUFFIX = ".tmp"  # the store deletes `.<name>.tmp` files it finds at start


class WholeFiles:
    """Verified whole-content files in the store at `store_dir` (see the module
    docstring). Methods block on disk: call them from a worker thread."""

    def __init__(self, store_dir: Path) -> None:
        self.store_dir = Path(store_dir)
        self.built = 0
        self.hashed_bytes = 0
        self._checked: dict[ContentId, StatKey] = {}
        self._lock = threading.Lock()

    def path(self, content: ContentId) -> Path:
        return self.store_dir / content / WHOLE_NAME

    def manifest(self, content: ContentId) -> Manifest | None:
        """The store's manifest of `content` (None if it has none that certifies it)."""
        try:
            return ChunkView.load(self.store_dir, content).manifest
        except (OSError, ManifestError):
            return None

    def open_verified(self, manifest: Manifest) -> int | None:
        """An fd of the content's whole file, which passed its check; None if there is no
        such file (a failing one is deleted). The caller closes the fd."""
        content = manifest.content_id
        try:
            fd = os.open(self.path(content), os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            key = stat_key(os.fstat(fd))
            with self._lock:
                known = self._checked.get(content)
            if key != known and not self._passes(fd, manifest):
                log.warning("%s fails its check; deleting it", self.path(content))
                with contextlib.suppress(OSError):
                    os.unlink(self.path(content))
                os.close(fd)
                return None
            with self._lock:
                self._checked[content] = key
            return fd
        except OSError:
            os.close(fd)
            return None

    def complete(self, manifest: Manifest) -> bool:
        """Whether every chunk file of the content is in the store (not yet checked)."""
        directory = self.store_dir / manifest.content_id
        return all((directory / f"{i}.chunk").exists() for i in range(manifest.chunks))

    def build(self, manifest: Manifest) -> bool:
        """Write the whole file from the chunk files, each checked as it is copied; False
        (and nothing left behind) if a chunk is missing or fails its check."""
        view = ChunkView(self.store_dir, manifest)
        directory = self.store_dir / manifest.content_id
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{WHOLE_NAME}.", suffix=TEMP_SUFFIX)
        try:
            buf = memoryview(bytearray(manifest.chunk_size))
            for index in range(manifest.chunks):
                piece = view.read_chunk(index, 0, manifest.chunk_length(index),
                                        buf[:manifest.chunk_length(index)])
                _write_all(fd, piece)
            os.fchmod(fd, 0o444)
            os.replace(tmp, self.path(manifest.content_id))
            key = stat_key(os.fstat(fd))
        except (MissingChunk, OSError) as exc:
            log.info("no whole file for %s yet: %s", manifest.content_id, exc)
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            return False
        finally:
            os.close(fd)
        with self._lock:
            self._checked[manifest.content_id] = key
            self.built += 1
        return True

    def _passes(self, fd: int, manifest: Manifest) -> bool:
        if os.fstat(fd).st_size != manifest.size:
            return False
        buf = memoryview(bytearray(manifest.chunk_size))
        for index in range(manifest.chunks):
            length = manifest.chunk_length(index)
            got = read_full(fd, buf[:length], manifest.chunk_offset(index))
            self.hashed_bytes += got
            if got != length or not manifest.verify(index, buf[:length]):
                return False
        return True


def _write_all(fd: int, data: memoryview) -> None:
    while data:
        data = data[os.write(fd, data):]
