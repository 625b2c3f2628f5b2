"""One fetch of a blob from the registry for the whole cluster.

A blob's swarm content is the one named `layer/v1/<digest>` on the tracker (published by
`image index`, or by a mirror before). For a blob nobody published, the mirrors that are
asked for it race to bind `mirror-claim/v1/<digest>` (names never change, so exactly one
binding wins). The winner streams the blob from the registry into a spool file, checks
its sha256 (a mismatch is never served nor published), stores its chunks, starts seeding
it and then publishes the name. The others poll for the name; if the winner stays silent
for CLAIM_WAIT_S (it died, or its registry read hangs), they fetch it themselves.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from p2p.content import DEFAULT_DIGEST, ContentId, Manifest, ManifestBuilder
from p2p.mirror.upstream import MirrorError, Passthrough, Upstream
from p2p.origin.oci_origin import LAYER_CHUNK_BYTES, blob_url, layer_name
from p2p.origin.oci_ref import ImageRef
from p2p.tracker_client import TrackerError, TrackerUnavailable

log = logging.getLogger(__name__)

CLAIM_WAIT_S = 120.0  # how long a loser waits for the winner's publication
POLL_S = 0.5  # how often it asks the tracker meanwhile
BLOCK_BYTES = 1 << 20


def claim_name(digest: str) -> str:
    return f"mirror-claim/v1/{digest}"


class BlobSource:
    """Blob digest -> swarm content, fetching and publishing it at most once (see above)."""

    def __init__(self, agent: Any, passthrough: Passthrough, spool: Path) -> None:
        self._agent = agent
        self._pass = passthrough
        self._spool = spool
        self._resolving: dict[str, asyncio.Task[ContentId]] = {}
        self.known: dict[str, ContentId] = {}  # digests this agent has seen published
        self.fetched = 0  # blobs this node fetched from a registry

    async def content(self, upstream: Upstream, repository: str, digest: str,
                      headers: Mapping[str, str]) -> ContentId:
        """The content holding blob `digest`; one resolution per digest on this node."""
        if digest in self.known:
            return self.known[digest]
        task = self._resolving.get(digest)
        if task is None:
            task = asyncio.ensure_future(self._resolve(upstream, repository, digest, headers))
            self._resolving[digest] = task
            task.add_done_callback(lambda _: self._resolving.pop(digest, None))
        content = await asyncio.shield(task)
        self.known[digest] = content
        return content

    async def _resolve(self, upstream: Upstream, repository: str, digest: str,
                       headers: Mapping[str, str]) -> ContentId:
        found = await self._named(digest)
        if found is not None:
            return found
        if not await self._claim(digest):
            loop = asyncio.get_running_loop()
            deadline = loop.time() + CLAIM_WAIT_S
            while loop.time() < deadline:
                await asyncio.sleep(POLL_S)
                found = await self._named(digest)
                if found is not None:
                    return found
            log.warning("no mirror published blob %s within %.0f s of claiming it; "
                        "fetching it here", digest, CLAIM_WAIT_S)
        return await self._fetch_and_publish(upstream, repository, digest, headers)

    async def _named(self, digest: str) -> ContentId | None:
        try:
            content: ContentId = await self._agent.tracker.get_name(layer_name(digest))
            return content
        except TrackerError as exc:
            if exc.status == 404:
                return None
            raise MirrorError(503, f"the tracker refused the lookup of {digest}: {exc}") from None
        except TrackerUnavailable as exc:
            raise MirrorError(503, str(exc)) from None

    async def _claim(self, digest: str) -> bool:
        """True if this node won the right to fetch `digest` from the registry."""
        builder = ManifestBuilder(LAYER_CHUNK_BYTES, DEFAULT_DIGEST)
        builder.feed(f"{digest} {self._agent.me.peer} {secrets.token_hex(16)}".encode())
        token = builder.finish("mirror-claim", "file:///dev/null")
        tracker = self._agent.tracker
        try:
            await tracker.put_manifest(token)
            await tracker.put_name(claim_name(digest), token.content_id)
        except TrackerError as exc:
            if exc.status == 409:
                return False
            raise MirrorError(503, f"the tracker refused the claim of {digest}: {exc}") from None
        except TrackerUnavailable as exc:
            raise MirrorError(503, str(exc)) from None
        return True

    async def _fetch_and_publish(self, upstream: Upstream, repository: str, digest: str,
                                 headers: Mapping[str, str]) -> ContentId:
        self._spool.mkdir(parents=True, exist_ok=True)
        path = self._spool / f"{digest.removeprefix('sha256:')}.{secrets.token_hex(4)}"
        try:
            manifest = await self._download(upstream, repository, digest, headers, path)
            await asyncio.to_thread(_store_all, self._agent.store, manifest, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        self.fetched += 1
        await self._agent.ensure(manifest.content_id, manifest)  # seeding before it is named
        tracker = self._agent.tracker
        try:
            await tracker.put_manifest(manifest)
            await tracker.put_name(layer_name(digest), manifest.content_id)
        except TrackerError as exc:
            if exc.status != 409:
                raise MirrorError(503, f"the tracker refused {digest}: {exc}") from None
            # Published meanwhile (chunked another way): serve what we hold all the same.
        except TrackerUnavailable as exc:
            log.warning("blob %s is served but not published: %s", digest, exc)
        return manifest.content_id

    async def _download(self, upstream: Upstream, repository: str, digest: str,
                        headers: Mapping[str, str], path: Path) -> Manifest:
        resp = await self._pass.request("GET", upstream, f"/v2/{repository}/blobs/{digest}",
                                        {k: v for k, v in headers.items() if k != "Range"})
        hasher = hashlib.sha256()
        builder = ManifestBuilder(LAYER_CHUNK_BYTES, DEFAULT_DIGEST)
        async with resp:
            if resp.status != 200:
                raise MirrorError(resp.status if resp.status in (401, 403, 404) else 502,
                                  f"upstream registry {upstream.base} answered {resp.status} "
                                  f"for blob {digest} of {repository}")
            with open(path, "wb") as out:
                async for block in resp.content.iter_chunked(BLOCK_BYTES):
                    hasher.update(block)
                    builder.feed(block)
                    out.write(block)
        got = "sha256:" + hasher.hexdigest()
        if got != digest:
            raise MirrorError(502, f"blob {digest} of {repository} from {upstream.base} does "
                                   f"not match its digest (its bytes hash to {got}): not served, "
                                   "not published")
        origin = blob_url(ImageRef(upstream.host, repository), digest, upstream.plain_http)
        return builder.finish("oci-layer", origin)


def _store_all(store: Any, manifest: Manifest, path: Path) -> None:
    """Every chunk of the verified blob at `path` into the store (a worker thread)."""
    store.attach(manifest)
    fd = os.open(path, os.O_RDONLY)
    try:
        for index in range(manifest.chunks):
            data = os.pread(fd, manifest.chunk_size, index * manifest.chunk_size)
            store.put(manifest.content_id, index, data)
    finally:
        os.close(fd)
