"""The client of the agent's local API (`p2p.localapi`): HTTP over its Unix socket.

What the FUSE mounts, depsnap, hdfs_stripe and the CLI use to ask the node's
agent for contents. It lives apart from the API's server side so that a
process that only talks to the agent (a mount's serving process starts on
every launch) does not import the agent's runtime.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

import aiohttp

from p2p.errors import RemoteError


class AgentError(RemoteError):
    """The local agent refused or failed a request; the message says why."""


class AgentUnreachable(AgentError):
    """No agent answered on the socket, it went away mid-read, or it is stopping: it may
    be restarting, so a caller that can wait (a mount server) asks again."""


class AgentClient:
    """Talks to the local agent over its Unix socket."""

    def __init__(self, socket_path: str, timeout_s: float | None = None) -> None:
        self.socket_path = socket_path
        self._session = aiohttp.ClientSession(
            connector=aiohttp.UnixConnector(path=socket_path),
            timeout=aiohttp.ClientTimeout(total=timeout_s))

    async def __aenter__(self) -> AgentClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._session.close()

    @staticmethod
    def _path(content: str, verb: str) -> str:
        return f"/v1/contents/{quote(content, safe='')}/{verb}"

    async def _call(self, method: str, path: str, **kwargs: Any) -> aiohttp.ClientResponse:
        try:
            resp = await self._session.request(method, f"http://agent{path}", **kwargs)
        except aiohttp.ClientConnectionError as exc:
            raise AgentUnreachable(f"no agent is listening on {self.socket_path} ({exc}); "
                                   "start one with `bootseer agent`") from exc
        if resp.status >= 400:
            try:
                body = await resp.json()
                message, stopping = body["error"], body.get("stopping") is True
            except (aiohttp.ContentTypeError, json.JSONDecodeError, KeyError, TypeError):
                message, stopping = await resp.text(), False
            if stopping:
                raise AgentUnreachable(f"the agent on {self.socket_path} is stopping "
                                       f"({message})")
            raise AgentError(message)
        return resp

    async def ensure(self, content: str) -> dict[str, Any]:
        resp = await self._call("POST", self._path(content, "ensure"))
        return await resp.json()  # type: ignore[no-any-return]

    async def read(self, content: str, offset: int, length: int) -> bytes:
        buf = bytearray()
        await self.read_to(content, offset, length, buf.extend)
        return bytes(buf)

    async def read_to(self, content: str, offset: int, length: int,
                      write: Any, block: int = 1 << 20) -> None:
        """Stream verified bytes [offset, offset + length) to `write(bytes)`."""
        resp = await self._call("GET", self._path(content, "read"),
                                params={"offset": offset, "length": length})
        try:
            async for data in resp.content.iter_chunked(block):
                write(data)
        except aiohttp.ClientError as exc:
            raise AgentUnreachable(f"the agent cut the read of {content} short ({exc}); "
                                   "its log says why") from exc

    async def prefetch(self, content: str, chunks: list[int]) -> None:
        await self._call("POST", self._path(content, "prefetch"), json={"chunks": chunks})

    async def status(self) -> dict[str, Any]:
        resp = await self._call("GET", "/v1/status")
        return await resp.json()  # type: ignore[no-any-return]

    async def metrics(self) -> str:
        resp = await self._call("GET", "/metrics")
        return await resp.text()
