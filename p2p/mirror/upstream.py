"""Requests passed through to the upstream registry with the client's own credentials.

The mirror holds no registry credentials for its clients: their `Authorization` header
(Basic, or a bearer token they got from the registry's token service after the
upstream's 401 challenge, passed back to them unchanged) goes upstream as sent.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

import aiohttp

from p2p.origin.oci_manifest import MANIFEST_TYPES

# Headers of the client's request that the upstream needs to answer it as the client.
FORWARDED_REQUEST = ("Authorization", "Accept", "Range", "If-None-Match")
# Headers of the upstream's answer the client needs (auth challenges, digests, types).
FORWARDED_REPLY = ("Content-Type", "Docker-Content-Digest", "WWW-Authenticate",
                   "Docker-Distribution-Api-Version", "Content-Range", "Accept-Ranges",
                   "ETag", "Location")
DOCKER_HUB_API = {"docker.io": "registry-1.docker.io"}
CONNECT_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 60.0


class MirrorError(Exception):
    """A request the mirror cannot answer; `status` is the HTTP status the client gets."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class Upstream:
    """One registry endpoint: `base` is its URL (scheme, host, port), `host` its name."""

    base: str
    host: str

    @property
    def plain_http(self) -> bool:
        return self.base.startswith("http://")

    def url(self, repository: str, kind: str, reference: str) -> str:
        return f"{self.base}/v2/{repository}/{kind}/{reference}"


def parse_upstream(url: str) -> Upstream:
    """`https://host[:port]` (or http://) as an Upstream; ValueError naming the URL."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.path.strip("/"):
        raise ValueError(f"mirror upstream {url!r} must be http(s)://HOST[:PORT]")
    return Upstream(f"{parts.scheme}://{parts.netloc}", parts.netloc)


def pick_upstream(ns: str | None, default: Upstream | None) -> Upstream:
    """The registry containerd names in `ns=` (HTTPS unless it is on loopback), else the
    configured default; a 400 if neither names one."""
    if ns:
        # containerd names Docker Hub by its image-reference name; its API is elsewhere.
        ns = DOCKER_HUB_API.get(ns, ns)
        host = ns.rsplit(":", 1)[0].strip("[]") if ns.count(":") <= 1 else ns.strip("[]")
        try:
            loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = False
        return Upstream(f"{'http' if loopback else 'https'}://{ns}", ns)
    if default is None:
        raise MirrorError(400, "this mirror has no default upstream (mirror_upstream) and the "
                               "request names none (ns=); configure one of the two")
    return default


class Passthrough:
    """One HTTP client for every upstream; see the module docstring."""

    def __init__(self, max_manifest_bytes: int) -> None:
        self.max_manifest_bytes = max_manifest_bytes
        self._http = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(sock_connect=CONNECT_TIMEOUT_S,
                                          sock_read=READ_TIMEOUT_S),
            auto_decompress=False)

    async def close(self) -> None:
        await self._http.close()

    async def request(self, method: str, upstream: Upstream, path: str,
                      headers: Mapping[str, str]) -> aiohttp.ClientResponse:
        """The upstream's response (the caller releases it); MirrorError 502 naming the
        upstream when it cannot be reached."""
        sent = {k: v for k, v in headers.items() if k in FORWARDED_REQUEST}
        try:
            return await self._http.request(method, f"{upstream.base}{path}", headers=sent,
                                            allow_redirects=True)
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise MirrorError(502, f"upstream registry {upstream.base} is unreachable: "
                                   f"{exc or type(exc).__name__}") from None

    async def manifest(self, method: str, upstream: Upstream, repository: str,
                       reference: str, headers: Mapping[str, str]
                       ) -> tuple[int, dict[str, str], bytes]:
        """(status, forwarded headers, body) of a manifest request; a body over the cap is
        a 502, never passed on in part."""
        wanted = dict(headers)
        wanted.setdefault("Accept", ", ".join(MANIFEST_TYPES))
        path = f"/v2/{repository}/manifests/{reference}"
        resp = await self.request(method, upstream, path, wanted)
        async with resp:
            reply = {k: resp.headers[k] for k in FORWARDED_REPLY if k in resp.headers}
            limit = self.max_manifest_bytes
            if resp.status == 200 and (resp.content_length or 0) > limit:
                raise MirrorError(502, f"manifest {repository}:{reference} from {upstream.base} "
                                       f"is {resp.content_length} bytes, over the {limit}-byte "
                                       "limit: refused")
            body = bytearray()
            async for block in resp.content.iter_chunked(64 * 1024):
                body += block
                if len(body) > limit and resp.status == 200:
                    raise MirrorError(502, f"manifest {repository}:{reference} from "
                                           f"{upstream.base} is over the {limit}-byte limit: "
                                           "refused")
            if resp.status == 200 and method == "HEAD" and resp.content_length is not None:
                reply["Content-Length"] = str(resp.content_length)
            return resp.status, reply, bytes(body)
