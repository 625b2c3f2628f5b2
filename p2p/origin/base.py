"""The origin adapter interface, and the HTTP plumbing the adapters share."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import aiohttp

from p2p.errors import RemoteError

CONNECT_TIMEOUT_S = 10.0
BLOCK_BYTES = 1 << 20  # what one read of a response body takes at most


class OriginError(RemoteError):
    """The origin could not deliver a range; the message says why and where.

    `definite` marks an answer that retrying soon will not change: the origin
    refused the connection, does not have the file (HTTP 4xx), or holds one of
    another length. A time-out, a reset or a 5xx is transient (`definite` False).
    """

    def __init__(self, message: str, *, definite: bool = False) -> None:
        super().__init__(message)
        self.definite = definite


Progress = Callable[[int], None]  # told how many bytes of the view are in so far


class Origin(Protocol):
    async def read_into(self, url: str, offset: int, view: memoryview,
                        progress: Progress | None = None) -> None:
        """Fill `view` with the bytes of `url` starting at `offset`, or raise OriginError.
        An adapter that streams calls `progress` as the view fills, in order, so that
        peers can be sent the bytes in already (p2p.relay); others may not call it."""
        ...

    async def close(self) -> None: ...


def http_session(read_timeout_s: float) -> aiohttp.ClientSession:
    """A client session for an origin: bounded connect, no byte for `read_timeout_s`
    means the read is stuck; bodies are bytes, never decompressed."""
    timeout = aiohttp.ClientTimeout(sock_connect=CONNECT_TIMEOUT_S, sock_read=read_timeout_s)
    return aiohttp.ClientSession(timeout=timeout, auto_decompress=False)


async def receive_into(body: aiohttp.StreamReader, view: memoryview,
                       progress: Progress | None = None) -> int:
    """Copy a response body into `view`, telling `progress` as it fills; the bytes
    received. A body longer than `view` stops the copy and returns len(view) + 1, so
    the caller can say so."""
    done = 0
    async for block in body.iter_chunked(BLOCK_BYTES):
        if done + len(block) > len(view):
            return len(view) + 1
        view[done:done + len(block)] = block
        done += len(block)
        if progress is not None:
            progress(done)
    return done
