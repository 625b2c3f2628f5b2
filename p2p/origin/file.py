"""Local files as an origin (`file:///path`): shared filesystems, tests, the demo."""

from __future__ import annotations

import asyncio
import os
from urllib.parse import unquote, urlsplit

from p2p.origin.base import OriginError, Progress


class FileOrigin:
    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint

    async def read_into(self, url: str, offset: int, view: memoryview,
                        progress: Progress | None = None) -> None:
        """One read in a worker thread: a local file needs no relay (no progress)."""
        path = unquote(urlsplit(url).path)
        await asyncio.to_thread(_pread_exactly, path, offset, view)

    async def close(self) -> None:
        pass


def _pread_exactly(path: str, offset: int, view: memoryview) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        raise OriginError(f"cannot open origin file {path}: {exc.strerror}",
                          definite=isinstance(exc, FileNotFoundError | PermissionError)) from exc
    try:
        done = 0
        while done < len(view):
            n = os.preadv(fd, [view[done:]], offset + done)
            if n == 0:
                raise OriginError(f"origin file {path} ends before byte {offset + len(view)}",
                                  definite=True)
            done += n
    except OSError as exc:
        raise OriginError(f"reading origin file {path}: {exc.strerror}") from exc
    finally:
        os.close(fd)
