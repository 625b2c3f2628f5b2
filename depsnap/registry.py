"""Publish a snapshot's packs and tree to an OCI registry, as one tagged artifact.

The registry is the origin of record where a cluster already runs one (the
images issue's `RegistryClient`, credentials from the environment as for
images). Each pack and the tree manifest, already written under their
content ids in a staging directory by `capture`, is pushed as a blob of the
repository; their swarm manifests' origins become the blobs' `oci://` URLs,
so agents read any chunk no peer has with a Range GET on the blob. Then one
artifact manifest listing every blob (tree first) is tagged
`depsnap-<first 40 hex digits of the key>`: a tagged manifest is what keeps
blobs through the registry's garbage collection, and an operator can see
which snapshots a repository holds. The tracker's name for the key is still
bound last (`publish`), so nothing half-published is ever found.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from depsnap.publish import PACKED_KIND, TREES
from fusefs.image.artifact import tag_artifact
from p2p.content import Manifest
from p2p.origin.oci import RegistryClient, sha256_digest
from p2p.origin.oci_origin import blob_url
from p2p.origin.oci_ref import ImageRef

SNAPSHOT_TYPE = "application/vnd.bootseer.depsnap.v1"
TREE_TYPE = "application/vnd.bootseer.depsnap-tree.v1+json"
PACK_TYPE = "application/vnd.bootseer.depsnap-pack.v1"
PACKED_TREE_TYPE = "application/vnd.bootseer.depsnap-packed-tree.v1"
TAG_HEX = 40


def snapshot_tag(key: str) -> str:
    return f"depsnap-{key[:TAG_HEX]}"


async def push_snapshot(client: RegistryClient, repo: ImageRef, key: str, staging: Path,
                        manifests: list[Manifest]) -> tuple[list[Manifest], int]:
    """Push the packs and the tree (the last manifest) from `staging`: the manifests with
    their origins pointing at the pushed blobs, in the same order, and the pack bytes the
    registry did not have yet."""
    pushed: list[Manifest] = []
    layers: list[tuple[str, str, int]] = []
    new_bytes = 0
    for manifest in manifests:
        is_tree = manifest is manifests[-1]
        is_pack = not is_tree and manifest.kind != PACKED_KIND  # the packed mount tree
        data = (staging / ("packs" if is_pack else TREES) / manifest.content_id).read_bytes()
        if is_pack and not await client.has_blob(repo, sha256_digest(data), push=True):
            new_bytes += len(data)
        digest = await client.push_blob(repo, data)
        pushed.append(replace(manifest, origin=blob_url(repo, digest)))
        kind = TREE_TYPE if is_tree else PACK_TYPE if is_pack else PACKED_TREE_TYPE
        layers.append((kind, digest, manifest.size))
    layers.insert(0, layers.pop())  # the tree first: what a reader of the tag wants
    await tag_artifact(client, repo.with_tag(snapshot_tag(key)), SNAPSHOT_TYPE, layers)
    return pushed, new_bytes
