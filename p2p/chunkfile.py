"""Small helpers for chunk files: reading them whole, naming them, recognising them.

No locks of its own except the buffer pool's; no knowledge of manifests or budgets
(that is `p2p.store`).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator

CHUNK_SUFFIX = ".chunk"

StatKey = tuple[int, int, int, int]  # st_ino, st_size, st_mtime_ns, st_ctime_ns


class BufferPool:
    """Reused buffers for checking chunk files, safe to share between threads."""

    def __init__(self, keep: int = 4) -> None:
        self._keep = keep
        self._free: dict[int, list[bytearray]] = {}
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def buffer(self, size: int) -> Iterator[memoryview]:
        with self._lock:
            free = self._free.get(size)
            buf = free.pop() if free else bytearray(size)
        try:
            yield memoryview(buf)
        finally:
            with self._lock:
                free = self._free.setdefault(size, [])
                if len(free) < self._keep:
                    free.append(buf)


def stat_key(st: os.stat_result) -> StatKey:
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def read_full(fd: int, buf: memoryview, offset: int = 0) -> int:
    """pread into `buf` until it is full or the file ends; returns the bytes read."""
    got = 0
    while got < len(buf):
        n = os.preadv(fd, [buf[got:]], offset + got)
        if n == 0:
            break
        got += n
    return got


def pread_upto(fd: int, n: int, offset: int = 0) -> bytes:
    """Up to `n` bytes from `offset` (fewer only where the file ends), in new bytes.

    `os.pread` fills a new bytes object without clearing it first; reading into a
    `bytearray(n)` pays for zeroing it, which was 8 % of a FUSE mount's CPU here."""
    data = os.pread(fd, n, offset)
    if len(data) == n or not data:
        return data
    parts = [data]
    got = len(data)
    while got < n and (more := os.pread(fd, n - got, offset + got)):
        parts.append(more)
        got += len(more)
    return b"".join(parts)


def chunk_index(name: str, chunks: int) -> int | None:
    """The index in "<index>.chunk" if it is a canonical decimal below `chunks`."""
    stem = name[: -len(CHUNK_SUFFIX)]
    if not stem.isdigit() or str(int(stem)) != stem or int(stem) >= chunks:
        return None
    return int(stem)
