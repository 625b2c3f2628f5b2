"""The mirror's HTTP side: the read half of the OCI distribution API (see p2p.mirror)."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from p2p.content import ContentId
from p2p.mirror.blobs import BlobSource
from p2p.mirror.upstream import (
    MirrorError,
    Passthrough,
    Upstream,
    parse_upstream,
    pick_upstream,
)
from p2p.origin.oci_manifest import MAX_MANIFEST_BYTES, ManifestError
from p2p.origin.oci_manifest import manifest_media_type as media_type_of
from p2p.origin.oci_ref import check_digest
from p2p.session import ContentFailed
from p2p.store import MissingChunk, StoreError
from p2p.tracker_client import TrackerUnavailable

log = logging.getLogger(__name__)

API_VERSION = {"Docker-Distribution-Api-Version": "registry/2.0"}
# /v2/<repository>/<manifests|blobs>/<reference>: repository components as distribution
# allows them (lowercase, separators), a tag or a digest.
_PATH = re.compile(r"/v2/(?P<repo>[a-z0-9]+(?:[._/-][a-z0-9]+)*)/(?P<kind>manifests|blobs)/"
                   r"(?P<ref>[A-Za-z0-9_][A-Za-z0-9._-]{0,127}|sha256:[0-9a-f]{64})")
_RANGE = re.compile(r"bytes=(\d+)-(\d*)")


class Mirror:
    """The handlers, over one agent (its tracker, store and swarm)."""

    def __init__(self, agent: Any, default_upstream: Upstream | None, spool: Path,
                 max_manifest_bytes: int = MAX_MANIFEST_BYTES) -> None:
        self.agent = agent
        self.default = default_upstream
        self.passthrough = Passthrough(max_manifest_bytes)
        self.blobs = BlobSource(agent, self.passthrough, spool)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("GET", "/v2/", self._base)
        app.router.add_route("HEAD", "/v2/", self._base)
        app.router.add_route("*", "/v2/{tail:.+}", self._dispatch)
        app.on_cleanup.append(lambda _: self.passthrough.close())
        return app

    async def _base(self, request: web.Request) -> web.Response:
        return web.json_response({}, headers=API_VERSION)

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        if request.method not in ("GET", "HEAD"):
            return _error(405, "UNSUPPORTED", "this mirror serves pulls only (GET and HEAD)")
        match = _PATH.fullmatch(request.path)
        if match is None:
            return _error(404, "NAME_UNKNOWN", f"no such path on a registry mirror: "
                                               f"{request.path}")
        try:
            upstream = pick_upstream(request.query.get("ns"), self.default)
            repo, ref = match["repo"], match["ref"]
            if match["kind"] == "manifests":
                return await self._manifest(request, upstream, repo, ref)
            return await self._blob(request, upstream, repo, check_digest(ref))
        except MirrorError as exc:
            log.warning("mirror %s %s: %s", request.method, request.path, exc)
            return _error(exc.status, "UNAVAILABLE" if exc.status >= 500 else "DENIED",
                          str(exc))
        except ValueError as exc:
            return _error(400, "DIGEST_INVALID", str(exc))

    async def _manifest(self, request: web.Request, upstream: Upstream, repo: str,
                        ref: str) -> web.Response:
        status, headers, body = await self.passthrough.manifest(
            request.method, upstream, repo, ref, request.headers)
        if status == 200 and request.method == "GET":
            try:
                media_type_of(body, headers.get("Content-Type"))
            except ManifestError as exc:
                raise MirrorError(502, f"manifest {repo}:{ref} from {upstream.base}: "
                                       f"{exc}") from None
        resp = web.Response(status=status, body=body if request.method == "GET" else None,
                            headers={**headers, **API_VERSION})
        if request.method == "HEAD" and "Content-Length" in headers:
            resp.content_length = int(headers["Content-Length"])
        return resp

    async def _blob(self, request: web.Request, upstream: Upstream, repo: str,
                    digest: str) -> web.StreamResponse:
        # The client's right to the blob is the upstream's to decide, every time: nothing
        # held here is served to a client the registry would refuse.
        try:
            asked = {k: v for k, v in request.headers.items() if k != "Range"}
            head = await self.passthrough.request("HEAD", upstream,
                                                  f"/v2/{repo}/blobs/{digest}", asked)
        except MirrorError:
            if digest not in self.blobs.known:
                raise
            log.warning("upstream %s unreachable; serving blob %s from the swarm",
                        upstream.base, digest)
        else:
            async with head:
                if head.status != 200:
                    headers = {k: head.headers[k] for k in ("WWW-Authenticate",)
                               if k in head.headers}
                    return web.Response(status=head.status if head.status < 500 else 502,
                                        headers={**headers, **API_VERSION})
        content = await self.blobs.content(upstream, repo, digest, request.headers)
        return await self._serve(request, content, digest)

    async def _serve(self, request: web.Request, content: ContentId,
                     digest: str) -> web.StreamResponse:
        session = await self.agent.ensure(content, lazy=bool(request.headers.get("Range")))
        size = session.manifest.size
        offset, end = 0, size
        status = 200
        headers = {"Content-Type": "application/octet-stream", "Docker-Content-Digest": digest,
                   "Accept-Ranges": "bytes", **API_VERSION}
        wanted = request.headers.get("Range")
        if wanted:
            match = _RANGE.fullmatch(wanted.strip())
            if match is None or int(match[1]) >= size:
                return web.Response(status=416, headers={"Content-Range": f"bytes */{size}"})
            offset = int(match[1])
            end = min(size, int(match[2]) + 1) if match[2] else size
            status = 206
            headers["Content-Range"] = f"bytes {offset}-{end - 1}/{size}"
        resp = web.StreamResponse(status=status, headers=headers)
        resp.content_length = end - offset
        if request.method == "HEAD" or end == offset:
            await resp.prepare(request)
            await resp.write_eof()
            return resp
        pieces = self.agent.read(content, offset, end - offset)
        first = await anext(pieces)  # failures up to here get a status and a message
        await resp.prepare(request)
        try:
            await resp.write(first)
            del first
            async for piece in pieces:
                await resp.write(piece)
        except (ContentFailed, MissingChunk, StoreError, TrackerUnavailable) as exc:
            log.warning("blob %s cut short: %s", digest, exc)
            if request.transport is not None:
                request.transport.close()  # short of Content-Length: the client sees it
            return resp
        await resp.write_eof()
        return resp


def _error(status: int, code: str, message: str) -> web.Response:
    return web.json_response({"errors": [{"code": code, "message": message}]}, status=status,
                             headers=API_VERSION)


@dataclass(frozen=True, slots=True)
class RunningMirror:
    runner: web.AppRunner
    mirror: Mirror
    url: str  # http://HOST:PORT, the port chosen if 0 was asked for


async def serve_mirror(agent: Any, address: str, upstream_url: str | None) -> RunningMirror:
    """Start the mirror on `address` (HOST:PORT); clean up its runner to stop it.
    ValueError for a bad address or upstream URL, OSError if it cannot listen."""
    from p2p.peer import listen_socket

    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"mirror address {address!r} must be HOST:PORT")
    default = parse_upstream(upstream_url) if upstream_url else None
    # A dot directory: the chunk store skips it when it scans its root.
    mirror = Mirror(agent, default, Path(agent.config.store_dir) / ".mirror-spool")
    sock = listen_socket(host.strip("[]") or "0.0.0.0", int(port))
    runner = web.AppRunner(mirror.app(), access_log=None)
    await runner.setup()
    await web.SockSite(runner, sock).start()
    return RunningMirror(runner, mirror, f"http://{host}:{sock.getsockname()[1]}")
