"""The agent's local API: HTTP over a Unix socket, for FUSE mounts, depsnap,
hdfs_stripe and the CLI on the same node.

    POST /v1/contents/{id}/ensure          wait until the whole content is local
    GET  /v1/contents/{id}/read?offset&length   verified bytes of a range
    POST /v1/contents/{id}/prefetch        {"chunks": [ordered chunk indices]}
    GET  /v1/status                        progress of every content, as JSON
    GET  /metrics                          Prometheus exposition

A content first asked for by `read` or `prefetch` is fetched lazily: only the
chunks read and the chunks prefetched (an image is gigabytes, a launch reads a
few per cent). `ensure` fetches every chunk, turning a lazy content eager.
Status says which (`mode`), and per content what came from peers and from the
origin (see `Session.status`).

A Unix socket keeps the API local and lets file permissions decide who may
use it: the socket is mode 0660 in a directory of mode 0750 (group
`api_group` if set), whatever the umask, and it is bound only where nothing
else is: a live socket of another agent, a regular file or anything that is
not our own stale socket is refused with a clear error (`bind_api_socket`).
Content ids are checked with `check_content_id` and quoted in URLs.

Reads stream: each chunk's piece is read, verified and written out on its
own, so a read of any size holds about a chunk in memory. An error before the
first byte comes back as JSON `{"error": ...}` with a 4xx/5xx status (the
client, `p2p.agentclient.AgentClient`, raises `AgentError` with the same
message); an error after it cuts the connection, which the client also reports
as `AgentError`.
"""

from __future__ import annotations

import contextlib
import errno
import grp
import json
import logging
import os
import socket
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web

from p2p.auth import AuthError
from p2p.content import ContentId, ManifestError, check_content_id
from p2p.session import AgentStopping, ContentFailed
from p2p.store import MissingChunk, StoreError
from p2p.tracker_client import TrackerError, TrackerUnavailable

if TYPE_CHECKING:  # clients (every mount) need not load the agent
    from p2p.agent import Agent

log = logging.getLogger(__name__)
MAX_READ_BYTES = 256 * 1024 * 1024
SOCKET_MODE = 0o660
DIR_MODE = 0o750


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


def _fail(status: int, message: str, **more: object) -> web.Response:
    return web.json_response({"error": message, **more}, status=status)


@web.middleware
async def _errors(request: web.Request, handler: Any) -> web.StreamResponse:
    try:
        return await handler(request)  # type: ignore[no-any-return]
    except AgentStopping as exc:  # the client may ask the agent that starts next
        return _fail(503, str(exc), stopping=True)
    except TrackerUnavailable as exc:
        return _fail(503, str(exc))
    except TrackerError as exc:
        return _fail(404 if exc.status == 404 else 502, str(exc))
    except (ContentFailed, StoreError, AuthError, ManifestError) as exc:
        return _fail(502, str(exc))
    except (ValueError, MissingChunk) as exc:
        return _fail(400, str(exc))


def _content(request: web.Request) -> ContentId:
    try:
        return check_content_id(request.match_info["content"])
    except ManifestError as exc:
        raise ValueError(str(exc)) from None  # the caller's mistake: 400, not 502


async def _ensure(request: web.Request) -> web.Response:
    agent: Agent = request.app["agent"]
    session = await agent.wait_complete(_content(request))
    return web.json_response(agent.status()["contents"][session.content])  # type: ignore[index]


async def _read(request: web.Request) -> web.StreamResponse:
    agent: Agent = request.app["agent"]
    try:
        offset = int(request.query["offset"])
        length = int(request.query["length"])
    except (KeyError, ValueError):
        return _fail(400, "read needs integer query parameters offset and length")
    if offset < 0 or not 0 <= length <= MAX_READ_BYTES:
        return _fail(400, f"read 0..{MAX_READ_BYTES} bytes at a non-negative offset")
    pieces = agent.read(_content(request), offset, length)
    first = await anext(pieces, None)  # errors up to here get a status and a message
    resp = web.StreamResponse(headers={"Content-Type": "application/octet-stream",
                                       "Content-Length": str(length)})
    await resp.prepare(request)
    try:
        if first is not None:
            await resp.write(first)
            del first
        async for piece in pieces:
            await resp.write(piece)
    except (ContentFailed, MissingChunk, StoreError, TrackerUnavailable) as exc:
        log.warning("read of %s cut short: %s", request.match_info["content"], exc)
        if request.transport is not None:
            request.transport.close()  # short of Content-Length: the client sees an error
        return resp
    await resp.write_eof()
    return resp


MAX_PREFETCH = 1 << 20  # chunk indices in one prefetch list


async def _prefetch(request: web.Request) -> web.Response:
    agent: Agent = request.app["agent"]
    content = _content(request)
    usage = 'prefetch needs a JSON body {"chunks": [chunk index, ...]}'
    try:
        chunks = (await request.json())["chunks"]
    except RecursionError:  # json nests in C recursion: a deep body is bad input, not a bug
        return _fail(400, f"{usage}; the body nests too deeply")
    except (json.JSONDecodeError, KeyError, TypeError):
        return _fail(400, usage)
    if not isinstance(chunks, list) or len(chunks) > MAX_PREFETCH or not all(
            isinstance(c, int) and not isinstance(c, bool) for c in chunks):
        return _fail(400, f"{usage}, at most {MAX_PREFETCH} of them")
    session = await agent.ensure(content, lazy=True)
    bad = [c for c in chunks if not 0 <= c < session.manifest.chunks]
    if bad:
        return _fail(400, f"chunk {bad[0]} is outside content {content} "
                          f"(0..{session.manifest.chunks - 1})")
    agent.prefetch(session, tuple(chunks))
    return web.json_response({"queued": len(chunks)})


async def _status(request: web.Request) -> web.Response:
    return web.json_response(request.app["agent"].status())


async def _metrics(request: web.Request) -> web.Response:
    body = request.app["agent"].metrics.exposition()
    return web.Response(body=body, content_type="text/plain", charset="utf-8")


# ---- the socket -------------------------------------------------------------------


class ApiSocketError(Exception):
    """The local API socket cannot be opened safely; the message says why and what to do."""


def bind_api_socket(path: Path, group: str | None = None) -> tuple[socket.socket, os.stat_result]:
    """A listening Unix socket at `path`, mode 0660 in a 0750 directory, umask or not.

    Only our own stale socket (ours, and nobody answers on it) is replaced; anything
    else at `path` is refused. The bind itself fails on anything that appears
    meanwhile, so nothing is ever unlinked by mistake. Returns the socket and its
    stat, for `release_api_socket`.
    """
    gid = _group_id(group)
    _own_directory(path.parent, gid)
    _clear_stale(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(path))
        os.chmod(path, SOCKET_MODE)
        if gid is not None:
            os.chown(path, -1, gid)
        sock.listen(128)
        sock.setblocking(False)
        return sock, os.stat(path)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise ApiSocketError(f"{path} appeared while the agent started; refusing to "
                                 "replace it") from exc
        raise ApiSocketError(f"cannot open the local API socket {path}: {exc.strerror}") \
            from exc


def release_api_socket(path: Path, bound: os.stat_result) -> None:
    """Unlink the socket at `path` only if it is still the one we bound."""
    with contextlib.suppress(OSError):
        now = os.lstat(path)
        if (now.st_dev, now.st_ino) == (bound.st_dev, bound.st_ino):
            os.unlink(path)


def _group_id(group: str | None) -> int | None:
    if not group:
        return None
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        raise ApiSocketError(f"api_group {group!r} is not a group on this node") from None


def _own_directory(directory: Path, gid: int | None) -> None:
    """Create `directory` 0750, or tighten ours to 0750; refuse a shared one."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        st = os.stat(directory)
    except OSError as exc:
        raise ApiSocketError(f"cannot create the API socket's directory {directory}: "
                             f"{exc.strerror}") from exc
    if st.st_uid != os.geteuid() or st.st_mode & stat.S_ISVTX:
        raise ApiSocketError(
            f"the API socket's directory {directory} is shared (owner uid {st.st_uid}, mode "
            f"{stat.S_IMODE(st.st_mode):o}); give the socket a directory of its own, e.g. "
            "/run/bootseer/agent.sock")
    os.chmod(directory, DIR_MODE)
    if gid is not None:
        os.chown(directory, -1, gid)


def _clear_stale(path: Path) -> None:
    """Remove our own dead socket at `path`; refuse anything else."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        kind = "a directory" if stat.S_ISDIR(st.st_mode) else (
            "a symlink" if stat.S_ISLNK(st.st_mode) else "a regular file"
            if stat.S_ISREG(st.st_mode) else "not a socket")
        raise ApiSocketError(f"{path} exists and is {kind}; refusing to replace it with the "
                             "API socket: remove it or set another api_socket")
    if st.st_uid != os.geteuid():
        raise ApiSocketError(f"{path} is a socket of uid {st.st_uid}, not ours; refusing to "
                             "replace it")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(1.0)
        probe.connect(str(path))
    except (ConnectionRefusedError, FileNotFoundError):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # stale: left by an agent that died
        return
    except OSError as exc:
        raise ApiSocketError(f"cannot tell whether {path} is in use ({exc.strerror}); "
                             "refusing to replace it") from exc
    finally:
        probe.close()
    raise ApiSocketError(f"another agent is serving on {path}; stop it first or set another "
                         "api_socket")
