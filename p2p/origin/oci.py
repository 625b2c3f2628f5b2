"""An async client for OCI distribution registries (docker-registry, Harbor, Docker Hub...).

`RegistryClient` pulls manifests (picking a platform out of an index), reads
blobs whole, streamed or by byte range, and pushes blobs, manifests and tags.
Everything it reads is checked: manifests fetched by digest must hash to it,
manifests fetched by tag report their digest (and must match the registry's
`Docker-Content-Digest`), manifests are capped at `max_manifest_bytes`, and a
blob read whole or streamed to its end must hash to its digest.

Requests, authentication (anonymous, Basic, Bearer tokens), retries and the
plain-HTTP rule live in `oci_session`; every failure is a `RegistryError`
(an `OriginError`) naming the image and the registry, with the fix.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import AsyncIterator, Collection
from dataclasses import dataclass
from urllib.parse import urlencode, urljoin

import aiohttp

from p2p.origin.base import BLOCK_BYTES, Progress, receive_into
from p2p.origin.oci_auth import find_credentials
from p2p.origin.oci_http import RegistryError, RetryPolicy
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
from p2p.origin.oci_session import CredentialLookup, RegistrySession

__all__ = ["PulledManifest", "RawManifest", "RegistryClient", "RegistryError", "sha256_digest"]

MAX_TAG_PAGES = 100


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



class RegistryClient:
    """See the module docstring. Use as `async with RegistryClient() as client:`."""

    def __init__(self, *, platform: Platform = DEFAULT_PLATFORM,
                 credentials: CredentialLookup | None = None,
                 plain_http: Collection[str] = (), retry: RetryPolicy | None = None,
                 max_manifest_bytes: int = MAX_MANIFEST_BYTES) -> None:
        self.platform = platform
        self.max_manifest_bytes = max_manifest_bytes
        self._http = RegistrySession(
            credentials or (lambda registry: find_credentials(registry, os.environ)),
            plain_http, retry or RetryPolicy())

    async def __aenter__(self) -> RegistryClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._http.close()

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
        async with self._http.open("GET", ref, f"manifests/{ref.reference}", what,
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
        async with self._http.open("PUT", ref, f"manifests/{ref.reference}", what, push=True,
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
            async with self._http.open("GET", ref, path, f"tags of {ref.registry}/{ref.repository}"
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
        async with self._http.open("HEAD", ref, f"blobs/{digest}", _blob(ref, digest)) as resp:
            if resp.content_length is None:
                raise RegistryError(f"registry {ref.registry} gave no size for "
                                    f"{_blob(ref, digest)}")
            return resp.content_length

    async def has_blob(self, ref: ImageRef, digest: str, *, push: bool = False) -> bool:
        async with self._http.open("HEAD", ref, f"blobs/{digest}", _blob(ref, digest), push=push,
                              expect=(200, 404)) as resp:
            return resp.status == 200

    async def stream_blob(self, ref: ImageRef, digest: str) -> AsyncIterator[bytes]:
        """The blob's bytes in blocks; RegistryError at the end if they miss the digest.

        Read it to the end (or `aclose()` it): the check needs every byte, and the
        connection is held until then.
        """
        what = _blob(ref, digest)
        hasher = hashlib.sha256()
        async with self._http.open("GET", ref, f"blobs/{digest}", what) as resp:
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
                              view: memoryview, progress: Progress | None = None) -> None:
        """Fill `view` with the blob's bytes from `offset` (one Range GET, 206 expected),
        telling `progress` as it fills.

        A part cannot be checked against the blob's digest; the caller checks the
        whole once it has seen it (the swarm's chunk digests cover the parts).
        """
        what = _blob(ref, digest)
        headers = {"Range": f"bytes={offset}-{offset + len(view) - 1}"}
        async with self._http.open("GET", ref, f"blobs/{digest}", what, headers=headers,
                              expect=(206,)) as resp:
            start = resp.headers.get("Content-Range", "").removeprefix("bytes ").split("-")[0]
            if start != str(offset):
                raise RegistryError(f"registry {ref.registry} answered a range of {what} from "
                                    f"byte {start!r}, not {offset}")
            done = await receive_into(resp.content, view, progress)
        if done > len(view):
            raise RegistryError(f"registry {ref.registry} sent more of {what} than "
                                "the range asked for")
        if done != len(view):
            raise RegistryError(f"registry {ref.registry} sent {done} of the {len(view)} "
                                f"bytes asked for from {what}")

    async def push_blob(self, ref: ImageRef, data: bytes) -> str:
        """Upload a blob monolithically (POST, then PUT with its digest) unless present."""
        digest = sha256_digest(data)
        if await self.has_blob(ref, digest, push=True):
            return digest
        what = f"upload of {_blob(ref, digest)}"
        async with self._http.open("POST", ref, "blobs/uploads/", what, push=True,
                              expect=(202,)) as resp:
            location = resp.headers.get("Location")
            base = str(resp.url)
        if not location:
            raise RegistryError(f"registry {ref.registry} gave no upload location for {what}")
        url = urljoin(base, location)
        url += ("&" if "?" in url else "?") + urlencode({"digest": digest})
        async with self._http.open("PUT", ref, url, what, push=True, data=data, expect=(201,),
                              headers={"Content-Type": "application/octet-stream"}):
            pass
        return digest


def _blob(ref: ImageRef, digest: str) -> str:
    return f"blob {digest} of {ref.registry}/{ref.repository}"
