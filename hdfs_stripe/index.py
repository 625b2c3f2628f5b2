"""From an HDFS file to a swarm content: find it by name, or index it as its first reader.

`resolve(uri)` answers the content id of the file's current version:

1. GETFILESTATUS gives the version (length, mtime, file id), and CHECKACCESS
   that this user may read the file: the swarm must not hand a file's bytes to
   someone HDFS would refuse them to (and the refusal is reported here, clearly);
2. the tracker's name for that version (`naming.content_name`) gives the id if
   any node indexed this version before: nothing is read from HDFS;
3. otherwise this node is the first reader. It reads the file from HDFS in
   stripes, `parallel` at a time, each from the DataNode the plan picks, and
   digests every stripe as it arrives (a chunk digest needs only its own bytes,
   so stripes may complete in any order). The stripes go into a staging
   directory inside the local agent's store, so the bytes read to index are
   not read again to serve: once the manifest is known the staging directory
   becomes `<store>/<content id>/` with its `manifest.json` (the store's
   documented layout), and the agent verifies every chunk file the first time
   it attaches the content, as it does after a restart. Then the file's status
   is read again: if the file changed meanwhile the stripes may mix versions,
   so nothing is published and `FileChanged` is raised. Else the manifest
   (kind "hdfs-file", origin: the version-pinned `hdfs://` URL) goes to the
   tracker, then the name.

Two first readers at once compute the same manifest (the id is a hash of the
bytes and the stripe size), so the second `put_name` is a no-op; each read
HDFS once. (A claim that makes the others wait for the first is not built.)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from hdfs_stripe.naming import KIND, HdfsUri, Version, check_same, content_name, origin_url
from hdfs_stripe.reader import StripeReader
from p2p.chunkfile import CHUNK_SUFFIX
from p2p.content import DEFAULT_DIGEST, ContentId, Manifest, chunk_digest, derive_content_id
from p2p.store import MANIFEST_NAME
from p2p.tracker_client import TrackerClient, TrackerError

PARALLEL_READS = 8


@dataclass(frozen=True, slots=True)
class Resolved:
    uri: HdfsUri
    version: Version
    content_id: ContentId
    indexed: bool  # True if this call read the file to index it
    hdfs_bytes: int  # bytes this call read from HDFS


async def resolve(reader: StripeReader, tracker: TrackerClient, uri: HdfsUri,
                  store_dir: Path | None, parallel: int = PARALLEL_READS,
                  digest: str = DEFAULT_DIGEST) -> Resolved:
    """The content id of the file's current version (see the module docstring)."""
    version = await reader.current(uri)
    await reader.hdfs.check_access(uri.path, "r--")
    name = content_name(uri, version)
    try:
        return Resolved(uri, version, await tracker.get_name(name), False, 0)
    except TrackerError as exc:
        if exc.status != 404:
            raise
    before = reader.bytes_read
    manifest = await index(reader, uri, version, store_dir, parallel, digest)
    await tracker.put_manifest(manifest)
    await tracker.put_name(name, manifest.content_id)
    return Resolved(uri, version, manifest.content_id, True, reader.bytes_read - before)


async def index(reader: StripeReader, uri: HdfsUri, version: Version, store_dir: Path | None,
                parallel: int = PARALLEL_READS, digest: str = DEFAULT_DIGEST) -> Manifest:
    """Read every stripe of this version, digest it, stage it in `store_dir`; the manifest."""
    plan = (await reader.layout(uri, version)).plan
    staging = _staging(store_dir)
    try:
        digests: list[bytes] = [b""] * len(plan.stripes)
        queue = iter(range(len(plan.stripes)))

        async def worker() -> None:
            for i in queue:
                stripe = plan.stripes[i]
                buf = bytearray(stripe.length)
                await reader.read(uri, version, stripe.offset, memoryview(buf), check=False)
                digests[i] = chunk_digest(buf, digest)
                if staging is not None:
                    await asyncio.to_thread((staging / f"{i}{CHUNK_SUFFIX}").write_bytes, buf)

        async with asyncio.TaskGroup() as tasks:
            for _ in range(min(parallel, len(plan.stripes)) or 1):
                tasks.create_task(worker())
        check_same(uri, version, await reader.current(uri))
        ids = tuple(digests)
        cid = derive_content_id(version.length, plan.stripe_size, digest, ids)
        manifest = Manifest(cid, KIND, version.length, plan.stripe_size, ids,
                            origin_url(uri, version), digest)
        if staging is not None and store_dir is not None:
            _hand_over(staging, store_dir, manifest)
        return manifest
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)


def _staging(store_dir: Path | None) -> Path | None:
    """A staging directory in the store (a dot name: the store's scan skips it)."""
    if store_dir is None or not store_dir.is_dir():
        return None
    return Path(tempfile.mkdtemp(prefix=".hdfs-index-", dir=store_dir))


def _hand_over(staging: Path, store_dir: Path, manifest: Manifest) -> None:
    """Make the staged stripes the store's copy of the content, unless it has one."""
    (staging / MANIFEST_NAME).write_text(json.dumps(manifest.to_dict()))
    target = store_dir / manifest.content_id
    with contextlib.suppress(OSError):  # already there (another reader): keep theirs
        os.rename(staging, target)
