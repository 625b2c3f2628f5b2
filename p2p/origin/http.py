"""HTTP(S) origins read with Range requests (any static server, object stores)."""

from __future__ import annotations

import aiohttp

from p2p.origin.base import OriginError, Progress, http_session, receive_into

READ_TIMEOUT_S = 20.0  # no byte for this long: the read is stuck, retry it
# 4xx answers that say "later", not "no": the others (404, 403, 416...) are definite.
_TRANSIENT = frozenset({408, 425, 429})


def _definite(status: int) -> bool:
    """A 4xx that is not "later", or a 200 (the server ignores ranges): retrying is futile."""
    return status == 200 or (400 <= status < 500 and status not in _TRANSIENT)


def _refused(exc: BaseException) -> bool:
    """Whether the connection was refused: nothing listens there, a definite answer."""
    cause = getattr(exc, "os_error", None) or exc
    return isinstance(cause, ConnectionRefusedError)


class HttpOrigin:
    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = http_session(READ_TIMEOUT_S)
        return self._session

    async def read_into(self, url: str, offset: int, view: memoryview,
                        progress: Progress | None = None) -> None:
        headers = {"Range": f"bytes={offset}-{offset + len(view) - 1}"}
        try:
            async with self._client().get(url, headers=headers) as resp:
                if resp.status != 206:
                    raise OriginError(f"origin {url} answered HTTP {resp.status} to a range "
                                      f"request (expected 206)", definite=_definite(resp.status))
                done = await receive_into(resp.content, view, progress)
                if done > len(view):
                    raise OriginError(f"origin {url} sent more than the {len(view)} "
                                      "bytes asked for", definite=True)
                if done != len(view):
                    raise OriginError(f"origin {url} sent {done} of {len(view)} bytes",
                                      definite=True)
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise OriginError(f"origin {url} unreachable: {exc or type(exc).__name__}",
                              definite=_refused(exc)) from exc

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
