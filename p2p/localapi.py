"""The agent's local API: HTTP over a Unix socket, for FUSE mounts, depsnap,
hdfs_stripe and the CLI on the same node.

    POST /v1/contents/{id}/ensure          wait until the whole content is local
    GET  /v1/contents/{id}/read?offset&length   verified bytes of a range
    POST /v1/contents/{id}/prefetch        {"chunks": [ordered chunk indices]}
    GET  /v1/status                        progress of every content, as JSON
    GET  /metrics                          Prometheus exposition

A Unix socket keeps the API local and lets file permissions decide who may
use it. Errors come back as JSON `{"error": ...}` with a 4xx/5xx status; the
client turns them into `AgentError` with the same message.
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp
from aiohttp import web

from p2p.agent import Agent
from p2p.auth import AuthError
from p2p.content import ContentId, ManifestError
from p2p.session import ContentFailed
from p2p.store import MissingChunk, StoreFullError
from p2p.tracker_client import TrackerError, TrackerUnavailable

MAX_READ_BYTES = 256 * 1024 * 1024


def make_app(agent: Agent) -> web.Application:
    app = web.Application(middlewares=[_errors])
    app["agent"] = agent
    app.router.add_post("/v1/contents/{content}/ensure", _ensure)
    app.router.add_get("/v1/contents/{content}/read", _read)
    app.router.add_post("/v1/contents/{content}/prefetch", _prefetch)
    app.router.add_get("/v1/status", _status)
    app.router.add_get("/metrics", _metrics)
    return app


def make_metrics_app(agent: Agent) -> web.Application:
    """Only GET /metrics, for a TCP port that Prometheus scrapes."""
    app = web.Application()
    app["agent"] = agent
    app.router.add_get("/metrics", _metrics)
    return app


def _fail(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


@web.middleware
async def _errors(request: web.Request, handler: Any) -> web.StreamResponse:
    try:
        return await handler(request)  # type: ignore[no-any-return]
    except TrackerUnavailable as exc:
        return _fail(503, str(exc))
    except TrackerError as exc:
        return _fail(404 if exc.status == 404 else 502, str(exc))
    except (ContentFailed, StoreFullError, AuthError, ManifestError) as exc:
        return _fail(502, str(exc))
    except (ValueError, MissingChunk) as exc:
        return _fail(400, str(exc))


def _content(request: web.Request) -> ContentId:
    return ContentId(request.match_info["content"])


async def _ensure(request: web.Request) -> web.Response:
    agent: Agent = request.app["agent"]
    session = await agent.wait_complete(_content(request))
    return web.json_response(agent.status()["contents"][session.content])  # type: ignore[index]


async def _read(request: web.Request) -> web.Response:
    agent: Agent = request.app["agent"]
    try:
        offset = int(request.query["offset"])
        length = int(request.query["length"])
    except (KeyError, ValueError):
        return _fail(400, "read needs integer query parameters offset and length")
    if length > MAX_READ_BYTES:
        return _fail(400, f"read at most {MAX_READ_BYTES} bytes at a time")
    data = await agent.read(_content(request), offset, length)
    return web.Response(body=data, content_type="application/octet-stream")


async def _prefetch(request: web.Request) -> web.Response:
    agent: Agent = request.app["agent"]
    try:
        chunks = (await request.json())["chunks"]
        if not all(isinstance(c, int) for c in chunks):
            raise TypeError
    except (json.JSONDecodeError, KeyError, TypeError):
        return _fail(400, 'prefetch needs a JSON body {"chunks": [int, ...]}')
    session = await agent.ensure(_content(request))
    agent.prefetch(session, tuple(chunks))
    return web.json_response({"queued": len(chunks)})


async def _status(request: web.Request) -> web.Response:
    return web.json_response(request.app["agent"].status())


async def _metrics(request: web.Request) -> web.Response:
    body = request.app["agent"].metrics.exposition()
    return web.Response(body=body, content_type="text/plain", charset="utf-8")


class AgentError(Exception):
    """The local agent refused or failed a request; the message says why."""


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

    async def _call(self, method: str, path: str, **kwargs: Any) -> aiohttp.ClientResponse:
        try:
            resp = await self._session.request(method, f"http://agent{path}", **kwargs)
        except aiohttp.ClientConnectionError as exc:
            raise AgentError(f"no agent is listening on {self.socket_path} ({exc}); start one "
                             "with `bootseer agent`") from exc
        if resp.status >= 400:
            try:
                message = (await resp.json())["error"]
            except (aiohttp.ContentTypeError, json.JSONDecodeError, KeyError):
                message = await resp.text()
            raise AgentError(message)
        return resp

    async def ensure(self, content: str) -> dict[str, Any]:
        resp = await self._call("POST", f"/v1/contents/{content}/ensure")
        return await resp.json()  # type: ignore[no-any-return]

    async def read(self, content: str, offset: int, length: int) -> bytes:
        resp = await self._call("GET", f"/v1/contents/{content}/read",
                                params={"offset": offset, "length": length})
        return await resp.read()

    async def prefetch(self, content: str, chunks: list[int]) -> None:
        await self._call("POST", f"/v1/contents/{content}/prefetch", json={"chunks": chunks})

    async def status(self) -> dict[str, Any]:
        resp = await self._call("GET", "/v1/status")
        return await resp.json()  # type: ignore[no-any-return]

    async def metrics(self) -> str:
        resp = await self._call("GET", "/metrics")
        return await resp.text()
