"""HTTP(S) origins read with Range requests (any static server, object stores)."""

from __future__ import annotations

import aiohttp

from p2p.origin.base import OriginError

CONNECT_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 20.0  # no byte for this long: the read is stuck, retry it


class HttpOrigin:
    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            timeout = aiohttp.ClientTimeout(sock_connect=CONNECT_TIMEOUT_S,
                                            sock_read=READ_TIMEOUT_S)
            self._session = aiohttp.ClientSession(timeout=timeout, auto_decompress=False)
        return self._session

    async def read_into(self, url: str, offset: int, view: memoryview) -> None:
        headers = {"Range": f"bytes={offset}-{offset + len(view) - 1}"}
        try:
            async with self._client().get(url, headers=headers) as resp:
                if resp.status != 206:
                    raise OriginError(f"origin {url} answered HTTP {resp.status} to a range "
                                      f"request (expected 206)")
                done = 0
                async for block in resp.content.iter_chunked(1 << 20):
                    if done + len(block) > len(view):
                        raise OriginError(f"origin {url} sent more than the {len(view)} "
                                          "bytes asked for")
                    view[done:done + len(block)] = block
                    done += len(block)
                if done != len(view):
                    raise OriginError(f"origin {url} sent {done} of {len(view)} bytes")
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise OriginError(f"origin {url} unreachable: {exc or type(exc).__name__}") from exc

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
