"""An async client for OCI distribution registries (docker-registry, Harbor, Docker Hub...).

`RegistryClient` pulls manifests (picking a platform out of an index), reads
blobs whole, streamed or by byte range, and pushes blobs, manifests and tags.
Everything it reads is checked: manifests fetched by digest must hash to it,
manifests fetched by tag report their digest (and must match the registry's
`Docker-Content-Digest`), manifests are capped at `max_manifest_bytes`, and a
blob read whole or streamed to its end must hash to its digest.

Authentication follows the registry's 401 challenge (see `oci_auth`); a 401
on a request that carried credentials drops the token and re-authenticates
once. 429, 5xx and connection failures are retried by `RetryPolicy`. Every
failure is a `RegistryError` naming the image and the registry.

Transport: plain HTTP for loopback registries (`localhost`, `127.0.0.0/8`,
`::1`) and for those passed in `plain_http`; HTTPS for the rest.
"""

from __future__ import annotations

import asyncio
import hashlib
import ipaddress
import os
import time
from collections.abc import AsyncIterator, Callable, Collection
from contextlib import asynccontextmanager
from dataclasses import dataclass
from urllib.parse import urlencode, urljoin

import aiohttp

from p2p.origin.oci_auth import (
    Challenge,
    Credentials,
    TokenCache,
    find_credentials,
    parse_challenge,
    repository_scope,
    token_from_answer,
)
from p2p.origin.oci_http import (
    MAX_ERROR_BODY_BYTES,
    RETRY_STATUSES,
    Failure,
    RegistryError,
    RetryPolicy,
    error_detail,
    error_for_status,
    parse_retry_after,
    unreachable,
)
from p2p.origin.oci_manifest import (
    DEFAULT_PLATFORM,
    IMAGE_MANIFEST_TYPES,
    MANIFEST_TYPES,
    MAX_MANIFEST_BYTES,
    ImageIndex,
    ImageManifest,
    ManifestError,
    Platform,
    manifest_media_type,
    parse_manifest,
    pick_platform,
)
from p2p.origin.oci_ref import ImageRef

__all__ = ["PulledManifest", "RawManifest", "RegistryClient", "RegistryError", "sha256_digest"]

CONNECT_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 30.0
BLOCK_BYTES = 1 << 20
MAX_TAG_PAGES = 100

CredentialLookup = Callable[[str], Credentials | None]


def sha256_digest(data: bytes | bytearray | memoryview) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass(frozen=True, slots=True)
class RawManifest:
    """One manifest or index as served, verified against `digest`."""

    ref: ImageRef  # pinned: ref.digest == digest
    digest: str
    media_type: str
    body: bytes


@dataclass(frozen=True, slots=True)
class PulledManifest:
    """An image manifest, and the index it was picked from if the reference named one."""

    ref: ImageRef  # pinned to the image manifest's digest
    digest: str
    media_type: str
    body: bytes
    manifest: ImageManifest
    index_digest: str | None = None


def _is_loopback(endpoint: str) -> bool:
    host = endpoint.rsplit(":", 1)[0] if endpoint.count(":") == 1 or "]" in endpoint \
        else endpoint
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class RegistryClient:
    """See the module docstring. Use as `async with RegistryClient() as client:`."""

    def __init__(self, *, platform: Platform = DEFAULT_PLATFORM,
                 credentials: CredentialLookup | None = None,
                 plain_http: Collection[str] = (), retry: RetryPolicy | None = None,
                 max_manifest_bytes: int = MAX_MANIFEST_BYTES) -> None:
        self.platform = platform
        self.retry = retry or RetryPolicy()
        self.max_manifest_bytes = max_manifest_bytes
        self._credentials = credentials or (lambda reg: find_credentials(reg, os.environ))
        self._plain_http = frozenset(plain_http)
        self._session: aiohttp.ClientSession | None = None
        self._challenges: dict[str, Challenge] = {}
        self._tokens = TokenCache()
        self._token_locks: dict[tuple[str, str], asyncio.Lock] = {}

    async def __aenter__(self) -> RegistryClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    # -- manifests ---------------------------------------------------------------------------

    async def get_manifest(self, ref: ImageRef, platform: Platform | None = None) \
            -> PulledManifest:
        """The image manifest `ref` names; an index is resolved to `platform`'s entry."""
        raw = await self.get_manifest_raw(ref)
        index_digest = None
        if raw.media_type not in IMAGE_MANIFEST_TYPES:
            index = self._parse(raw)
            assert isinstance(index, ImageIndex)
            want = platform or self.platform
            try:
                entry = pick_platform(index, want)
            except ManifestError as exc:
                raise RegistryError(f"image {ref} on registry {ref.registry}: {exc}") from None
            index_digest = raw.digest
            raw = await self.get_manifest_raw(ref.with_digest(entry.digest))
            if raw.media_type not in IMAGE_MANIFEST_TYPES:
                raise RegistryError(f"image {raw.ref} on registry {ref.registry}: the index "
                                    f"entry for {want} is a {raw.media_type}, not a manifest")
        manifest = self._parse(raw)
        assert isinstance(manifest, ImageManifest)
        return PulledManifest(raw.ref, raw.digest, raw.media_type, raw.body, manifest,
                              index_digest)

    async def get_manifest_raw(self, ref: ImageRef) -> RawManifest:
        """The manifest or index `ref` names, size-capped, type-checked and digest-checked."""
        what = f"image {ref}"
        headers = {"Accept": ", ".join(MANIFEST_TYPES)}
        async with self._open("GET", ref, f"manifests/{ref.reference}", what,
                              headers=headers) as resp:
            body = await self._read_capped(resp, what)
            content_type = resp.headers.get("Content-Type")
            served_digest = resp.headers.get("Docker-Content-Digest")
        digest = sha256_digest(body)
        if ref.digest is not None and digest != ref.digest:
            raise RegistryError(f"manifest of {what} from registry {ref.registry} does not "
                                f"match its digest: its bytes hash to {digest}")
        if ref.digest is None and served_digest and served_digest != digest:
            raise RegistryError(f"manifest of {what} from registry {ref.registry} hashes to "
                                f"{digest}, but the registry says {served_digest}")
        try:
            media_type = manifest_media_type(body, content_type)
        except ManifestError as exc:
            raise RegistryError(f"{what} on registry {ref.registry} refused: {exc}") from None
        return RawManifest(ref.with_digest(digest), digest, media_type, body)

    def _parse(self, raw: RawManifest) -> ImageManifest | ImageIndex:
        try:
            return parse_manifest(raw.body, raw.media_type)
        except ManifestError as exc:
            raise RegistryError(f"image {raw.ref} on registry {raw.ref.registry}: "
                                f"{exc}") from None

    async def _read_capped(self, resp: aiohttp.ClientResponse, what: str) -> bytes:
        limit = self.max_manifest_bytes
        if resp.content_length is not None and resp.content_length > limit:
            raise RegistryError(f"manifest of {what} is {resp.content_length} bytes, over the "
                                f"{limit}-byte limit: refused")
        body = bytearray()
        async for block in resp.content.iter_chunked(BLOCK_BYTES):
            body += block
            if len(body) > limit:
                raise RegistryError(f"manifest of {what} is over the {limit}-byte limit: "
                                    "refused")
        return bytes(body)

    async def put_manifest(self, ref: ImageRef, body: bytes, media_type: str) -> str:
        """Store a manifest under `ref`'s tag (or its digest); returns the digest."""
        digest = sha256_digest(body)
        if ref.digest is not None and ref.digest != digest:
            raise RegistryError(f"manifest for {ref} hashes to {digest}, not to the digest "
                                "it is pushed under")
        what = f"manifest push to {ref}"
        async with self._open("PUT", ref, f"manifests/{ref.reference}", what, push=True,
                              headers={"Content-Type": media_type}, data=body,
                              expect=(201,)) as resp:
            served = resp.headers.get("Docker-Content-Digest")
        if served and served != digest:
            raise RegistryError(f"registry {ref.registry} stored {what} as {served}, but its "
                                f"bytes hash to {digest}")
        return digest

    async def list_tags(self, ref: ImageRef) -> list[str]:
        """Every tag of `ref`'s repository, following the registry's pagination."""
        tags: list[str] = []
        path = "tags/list"
        for _ in range(MAX_TAG_PAGES):
            async with self._open("GET", ref, path, f"tags of {ref.registry}/{ref.repository}"
                                  ) as resp:
                doc = await resp.json(content_type=None)
                link = resp.links.get("next")
            tags.extend(t for t in (doc.get("tags") or []) if isinstance(t, str))
            if not link:
                return tags
            url = str(link.get("url"))
            path = url.split(f"/v2/{ref.repository}/", 1)[-1]
        return tags

    # -- blobs --------------------------------------------------------------------------------

    async def blob_size(self, ref: ImageRef, digest: str) -> int:
        """The size of a blob (HEAD); RegistryError 404 if the registry does not have it."""
        async with self._open("HEAD", ref, f"blobs/{digest}", _blob(ref, digest)) as resp:
            if resp.content_length is None:
                raise RegistryError(f"registry {ref.registry} gave no size for "
                                    f"{_blob(ref, digest)}")
            return resp.content_length

    async def has_blob(self, ref: ImageRef, digest: str, *, push: bool = False) -> bool:
        async with self._open("HEAD", ref, f"blobs/{digest}", _blob(ref, digest), push=push,
                              expect=(200, 404)) as resp:
            return resp.status == 200

    async def stream_blob(self, ref: ImageRef, digest: str) -> AsyncIterator[bytes]:
        """The blob's bytes in blocks; RegistryError at the end if they miss the digest."""
        what = _blob(ref, digest)
        hasher = hashlib.sha256()
        async with self._open("GET", ref, f"blobs/{digest}", what) as resp:
            async for block in resp.content.iter_chunked(BLOCK_BYTES):
                hasher.update(block)
                yield block
        got = "sha256:" + hasher.hexdigest()
        if got != digest:
            raise RegistryError(f"{what} from registry {ref.registry} does not match its "
                                f"digest: its bytes hash to {got}")

    async def get_blob(self, ref: ImageRef, digest: str, max_bytes: int | None = None) -> bytes:
        """A whole blob, verified against its digest (config blobs, small artifacts)."""
        data = bytearray()
        async for block in self.stream_blob(ref, digest):
            data += block
            if max_bytes is not None and len(data) > max_bytes:
                raise RegistryError(f"{_blob(ref, digest)} is over the {max_bytes}-byte limit")
        return bytes(data)

    async def read_blob_range(self, ref: ImageRef, digest: str, offset: int,
                              view: memoryview) -> None:
        """Fill `view` with the blob's bytes from `offset` (one Range GET, 206 expected).

        A part cannot be checked against the blob's digest; the caller checks the
        whole once it has seen it (the swarm's chunk digests cover the parts).
        """
        what = _blob(ref, digest)
        headers = {"Range": f"bytes={offset}-{offset + len(view) - 1}"}
        async with self._open("GET", ref, f"blobs/{digest}", what, headers=headers,
                              expect=(206,)) as resp:
            start = resp.headers.get("Content-Range", "").removeprefix("bytes ").split("-")[0]
            if start != str(offset):
                raise RegistryError(f"registry {ref.registry} answered a range of {what} from "
                                    f"byte {start!r}, not {offset}")
            done = 0
            async for block in resp.content.iter_chunked(BLOCK_BYTES):
                if done + len(block) > len(view):
                    raise RegistryError(f"registry {ref.registry} sent more of {what} than "
                                        "the range asked for")
                view[done:done + len(block)] = block
                done += len(block)
        if done != len(view):
            raise RegistryError(f"registry {ref.registry} sent {done} of the {len(view)} "
                                f"bytes asked for from {what}")

    async def push_blob(self, ref: ImageRef, data: bytes) -> str:
        """Upload a blob monolithically (POST, then PUT with its digest) unless present."""
        digest = sha256_digest(data)
        if await self.has_blob(ref, digest, push=True):
            return digest
        what = f"upload of {_blob(ref, digest)}"
        async with self._open("POST", ref, "blobs/uploads/", what, push=True,
                              expect=(202,)) as resp:
            location = resp.headers.get("Location")
            base = str(resp.url)
        if not location:
            raise RegistryError(f"registry {ref.registry} gave no upload location for {what}")
        url = urljoin(base, location)
        url += ("&" if "?" in url else "?") + urlencode({"digest": digest})
        async with self._open("PUT", ref, url, what, push=True, data=data, expect=(201,),
                              headers={"Content-Type": "application/octet-stream"}):
            pass
        return digest

    # -- requests, auth, retries ---------------------------------------------------------------

    def _url(self, ref: ImageRef, path: str) -> str:
        if path.startswith(("http://", "https://")):
            return path
        endpoint = ref.endpoint
        plain = endpoint in self._plain_http or _is_loopback(endpoint)
        return f"{'http' if plain else 'https'}://{endpoint}/v2/{ref.repository}/{path}"

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            timeout = aiohttp.ClientTimeout(sock_connect=CONNECT_TIMEOUT_S,
                                            sock_read=READ_TIMEOUT_S)
            self._session = aiohttp.ClientSession(timeout=timeout, auto_decompress=False)
        return self._session

    @asynccontextmanager
    async def _open(self, method: str, ref: ImageRef, path: str, what: str, *,
                    push: bool = False, headers: dict[str, str] | None = None,
                    data: bytes | None = None, expect: tuple[int, ...] = (200,)) \
            -> AsyncIterator[aiohttp.ClientResponse]:
        """One request, authenticated and retried; yields a response whose status is expected."""
        url = self._url(ref, path)
        reauthed = False
        attempt = 0
        while True:
            attempt += 1
            auth, user = await self._authorization(ref, push, what)
            try:
                resp = await self._client().request(method, url, data=data,
                                                    headers={**(headers or {}), **auth})
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                await self._pause(attempt, None, unreachable(what, ref.registry,
                                                             str(exc) or type(exc).__name__,
                                                             attempt))
                continue
            try:
                if resp.status in expect:
                    try:
                        yield resp
                    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                        raise RegistryError(f"connection to registry {ref.registry} broke "
                                            f"while reading {what}: {exc or type(exc).__name__}"
                                            ) from exc
                    return
                body = await resp.content.read(MAX_ERROR_BODY_BYTES)
            finally:
                resp.release()
            challenge = parse_challenge(resp.headers.get("WWW-Authenticate"))
            failure = Failure(what, ref.registry, resp.status, error_detail(body), attempt,
                              user, push, challenge is not None and user is not None
                              and challenge.param("error") == "insufficient_scope")
            if resp.status == 401 and not reauthed and self._learn(ref, resp, push):
                reauthed, attempt = True, attempt - 1
                continue
            if 200 <= resp.status < 300:
                raise RegistryError(f"registry {ref.registry} answered HTTP {resp.status} for "
                                    f"{what} where HTTP {' or '.join(map(str, expect))} was "
                                    "expected", resp.status)
            if resp.status not in RETRY_STATUSES:
                raise error_for_status(failure)
            after = parse_retry_after(resp.headers.get("Retry-After"), time.time())
            await self._pause(attempt, after, error_for_status(failure))

    async def _pause(self, attempt: int, retry_after_s: float | None,
                     error: RegistryError) -> None:
        delay = self.retry.delay(attempt, retry_after_s)
        if delay is None:
            raise error
        await asyncio.sleep(delay)

    def _learn(self, ref: ImageRef, resp: aiohttp.ClientResponse, push: bool) -> bool:
        """Note the registry's challenge; True if a new attempt could authenticate."""
        challenge = parse_challenge(resp.headers.get("WWW-Authenticate"))
        if challenge is None:
            return False
        self._challenges[ref.endpoint] = challenge
        self._tokens.drop(ref.endpoint, repository_scope(ref.repository, push))
        return challenge.scheme == "bearer" or self._creds(ref) is not None

    def _creds(self, ref: ImageRef) -> Credentials | None:
        try:
            return self._credentials(ref.registry)
        except ValueError as exc:
            raise RegistryError(f"registry credentials for {ref.registry}: {exc}") from None

    async def _authorization(self, ref: ImageRef, push: bool, what: str) \
            -> tuple[dict[str, str], str | None]:
        """Headers to send and the user they speak for, by what the registry asked."""
        challenge = self._challenges.get(ref.endpoint)
        if challenge is None:
            return {}, None
        creds = self._creds(ref)
        user = creds.username if creds else None
        if challenge.scheme == "basic":
            return ({"Authorization": creds.basic_header()}, user) if creds else ({}, None)
        token = await self._token(ref, challenge, repository_scope(ref.repository, push),
                                  creds, what)
        return {"Authorization": f"Bearer {token}"}, user

    async def _token(self, ref: ImageRef, challenge: Challenge, scope: str,
                     creds: Credentials | None, what: str) -> str:
        key = (ref.endpoint, scope)
        async with self._token_locks.setdefault(key, asyncio.Lock()):
            now = asyncio.get_running_loop().time()
            token = self._tokens.get(ref.endpoint, scope, now)
            if token is None:
                token, lifetime = await self._fetch_token(ref, challenge, scope, creds, what)
                self._tokens.put(ref.endpoint, scope, token, lifetime, now)
            return token

    async def _fetch_token(self, ref: ImageRef, challenge: Challenge, scope: str,
                           creds: Credentials | None, what: str) -> tuple[str, float]:
        realm = challenge.param("realm") or ""
        if not realm.startswith(("https://", "http://")):
            raise RegistryError(f"registry {ref.registry} asked for a token from {realm!r}, "
                                f"which is not an http(s) URL ({what})")
        query = {"scope": scope, **({"service": s} if (s := challenge.param("service")) else {})}
        headers = {"Authorization": creds.basic_header()} if creds else {}
        token_what = f"a token for {what} from {realm}"
        for attempt in range(1, self.retry.attempts + 1):
            try:
                async with self._client().get(realm, params=query, headers=headers) as resp:
                    body = await resp.content.read(MAX_ERROR_BODY_BYTES)
                    status, after = resp.status, resp.headers.get("Retry-After")
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                await self._pause(attempt, None, unreachable(token_what, ref.registry,
                                                             str(exc) or type(exc).__name__,
                                                             attempt))
                continue
            if status == 200:
                try:
                    return token_from_answer(body)
                except ValueError as exc:
                    raise RegistryError(f"{token_what}: {exc}") from None
            failure = Failure(token_what, ref.registry, status, error_detail(body), attempt,
                              creds.username if creds else None, scope.endswith(",push"))
            if status not in RETRY_STATUSES:
                raise error_for_status(failure)
            await self._pause(attempt, parse_retry_after(after, time.time()),
                              error_for_status(failure))
        raise AssertionError("unreachable: _pause raises on the last attempt")


def _blob(ref: ImageRef, digest: str) -> str:
    return f"blob {digest} of {ref.registry}/{ref.repository}"
