"""From an HDFS file to a swarm content: find it by name, or index it as its first reader.

`resolve(uri)` answers the content id of the file's current version:

1. GETFILESTATUS gives the version (length, mtime, file id), and CHECKACCESS
   that this user may read the file: the swarm must not hand a file's bytes to
   someone HDFS would refuse them to (and the refusal is reported here, clearly);
2. the tracker's name for that version (`naming.content_name`) gives the id if
   any node indexed this version before: nothing is read from HDFS;
3. otherwise this node is the first reader. It reads the file from HDFS in
   stripes, `parallel` at a time spread evenly over the DataNodes holding the
   file, each DataNode working through its own queue (`stripe.Schedule`), and
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

   Before the name is written, the local agent is asked to attach the content
   (`attach`), so that it announces every stripe and the readers that find the
   name find a peer too.

Many first readers at once (a job resuming on thousands of nodes, nobody having
read the checkpoint yet) must not all read it from HDFS. So a first reader
*claims* the indexing: it publishes a tiny claim content (16 random bytes,
never fetched) and names it `<name>/claim/<time bucket>`; names are write-once,
so exactly one reader wins. The others poll the tracker for the name, then
load the file from the winner's agent and from each other. A winner that dies
is outlived by its claim only until the bucket (`CLAIM_WAIT_S`) ends: a reader
that waited that long, or comes in the next bucket, claims again. Two readers
that index at once anyway compute the same manifest (the id is a hash of the
bytes and the stripe size), so the second `put_name` is a no-op.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import shutil
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from hdfs_stripe.naming import KIND, HdfsUri, Version, check_same, content_name, origin_url
from hdfs_stripe.reader import StripeReader
from hdfs_stripe.stripe import Schedule
from p2p.chunkfile import CHUNK_SUFFIX
from p2p.content import (
    DEFAULT_DIGEST,
    ContentId,
    Manifest,
    ManifestBuilder,
    chunk_digest,
    derive_content_id,
)
from p2p.store import MANIFEST_NAME, ORIGIN_READ_NAME
from p2p.tracker_client import TrackerClient, TrackerError

log = logging.getLogger(__name__)

PARALLEL_READS = 8
CLAIM_WAIT_S = 600.0  # a claim not followed by the name within this long is given up
POLL_S = 0.5
Attach = Callable[[ContentId], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Resolved:
    uri: HdfsUri
    version: Version
    content_id: ContentId
    indexed: bool  # True if this call read the file to index it
    hdfs_bytes: int  # bytes this call read from HDFS


async def resolve(reader: StripeReader, tracker: TrackerClient, uri: HdfsUri,
                  store_dir: Path | None, parallel: int = PARALLEL_READS,
                  digest: str = DEFAULT_DIGEST, attach: Attach | None = None,
                  claim_wait_s: float = CLAIM_WAIT_S) -> Resolved:
    """The content id of the file's current version (see the module docstring)."""
    version = await reader.current(uri)
    await reader.hdfs.check_access(uri.path, "r--")
    name = content_name(uri, version)
    found = await _named(tracker, name)
    if found is None and not await _claim(tracker, name, claim_wait_s):
        found = await _wait_for(tracker, name, claim_wait_s)
    if found is not None:
        return Resolved(uri, version, found, False, 0)
    before = reader.bytes_read
    manifest = await index(reader, uri, version, store_dir, parallel, digest)
    await tracker.put_manifest(manifest)
    if attach is not None:
        await attach(manifest.content_id)
    await tracker.put_name(name, manifest.content_id)
    return Resolved(uri, version, manifest.content_id, True, reader.bytes_read - before)


async def _named(tracker: TrackerClient, name: str) -> ContentId | None:
    try:
        return await tracker.get_name(name)
    except TrackerError as exc:
        if exc.status != 404:
            raise
        return None


async def _claim(tracker: TrackerClient, name: str, claim_wait_s: float) -> bool:
    """True if this reader won the right to index `name` in the current time bucket."""
    builder = ManifestBuilder(chunk_size=16)
    builder.feed(secrets.token_bytes(16))
    claim = builder.finish("hdfs-index-claim", f"claim:{name}")
    await tracker.put_manifest(claim)
    bucket = int(time.time() // claim_wait_s)
    try:
        await tracker.put_name(f"{name}/claim/{bucket}", claim.content_id)
    except TrackerError as exc:
        if exc.status != 409:
            raise
        return False
    return True


async def _wait_for(tracker: TrackerClient, name: str, claim_wait_s: float) -> ContentId | None:
    """The name once another reader has indexed the file; None if it did not in time."""
    deadline = time.monotonic() + claim_wait_s
    while time.monotonic() < deadline:
        await asyncio.sleep(POLL_S)
        found = await _named(tracker, name)
        if found is not None:
            return found
    log.warning("%s: the reader that claimed the indexing did not finish within %g s; "
                "indexing it here", name, claim_wait_s)
    return None


async def index(reader: StripeReader, uri: HdfsUri, version: Version, store_dir: Path | None,
                parallel: int = PARALLEL_READS, digest: str = DEFAULT_DIGEST) -> Manifest:
    """Read every stripe of this version, digest it, stage it in `store_dir`; the manifest."""
    plan = (await reader.layout(uri, version)).plan
    staging = _staging(store_dir)
    before = reader.bytes_read
    try:
        digests: list[bytes] = [b""] * len(plan.stripes)
        schedule = Schedule(plan, range(len(plan.stripes)), reader.down_nodes())

        async def worker(node: str) -> None:
            while (i := schedule.next_for(node)) is not None:
                stripe = plan.stripes[i]
                buf = bytearray(stripe.length)
                await reader.read(uri, version, stripe.offset, memoryview(buf), check=False,
                                  prefer=node)
                digests[i] = chunk_digest(buf, digest)
                if staging is not None:
                    await asyncio.to_thread((staging / f"{i}{CHUNK_SUFFIX}").write_bytes, buf)

        nodes = schedule.nodes()
        per_node = -(-parallel // max(len(nodes), 1))
        async with asyncio.TaskGroup() as tasks:
            for node in nodes:
                for _ in range(per_node):
                    tasks.create_task(worker(node))
        check_same(uri, version, await reader.current(uri))
        ids = tuple(digests)
        cid = derive_content_id(version.length, plan.stripe_size, digest, ids)
        manifest = Manifest(cid, KIND, version.length, plan.stripe_size, ids,
                            origin_url(uri, version), digest)
        if staging is not None and store_dir is not None:
            _hand_over(staging, store_dir, manifest, reader.bytes_read - before)
        return manifest
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)


def _staging(store_dir: Path | None) -> Path | None:
    """A staging directory in the store (a dot name: the store's scan skips it)."""
    if store_dir is None or not store_dir.is_dir():
        return None
    return Path(tempfile.mkdtemp(prefix=".hdfs-index-", dir=store_dir))


def _hand_over(staging: Path, store_dir: Path, manifest: Manifest, hdfs_bytes: int) -> None:
    """Make the staged stripes the store's copy of the content, unless it has one; with a
    note of the bytes read from HDFS for them, which the agent counts as origin bytes (so
    the tracker's origin egress includes the indexing read)."""
    (staging / MANIFEST_NAME).write_text(json.dumps(manifest.to_dict()))
    (staging / ORIGIN_READ_NAME).write_text(str(hdfs_bytes))
    target = store_dir / manifest.content_id
    with contextlib.suppress(OSError):  # already there (another reader): keep theirs
        os.rename(staging, target)
