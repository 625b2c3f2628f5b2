"""Small Bootseer files kept in an image's own repository as OCI artifacts.

A layer index, an image's packed tree, a hot-block record or an image card is pushed
as one blob plus an OCI image manifest that names it (config: the OCI empty
descriptor; `artifactType` says what it is) under a tag of our own, so the registry
keeps the blob (garbage collection spares what a tagged manifest references) and any
node that can pull the image can find it. Tags, not the referrers API: Debian's
docker-registry (distribution 2.8) has no referrers API, and a tag is what its
fallback schema uses anyway.

Writing needs push rights on the repository; reading needs only pull rights.
"""

from __future__ import annotations

import json

from p2p.content import Manifest, ManifestBuilder
from p2p.origin.oci import RegistryClient, RegistryError, sha256_digest
from p2p.origin.oci_manifest import Descriptor, ImageManifest
from p2p.origin.oci_origin import blob_url
from p2p.origin.oci_ref import ImageRef
from p2p.units import MiB

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
EMPTY_TYPE = "application/vnd.oci.empty.v1+json"
EMPTY_BLOB = b"{}"
INDEX_TYPE = "application/vnd.bootseer.layer-index.v1"
RECORD_TYPE = "application/vnd.bootseer.hot-record.v1+json"
CARD_TYPE = "application/vnd.bootseer.image-card.v1+json"
TREE_TYPE = "application/vnd.bootseer.image-tree.v1"
TAG_HEX = 40  # digest hex digits in a tag (tags are at most 128 characters)
CHUNK_BYTES = 1 * MiB  # of an artifact's swarm manifest


def index_tag(layer_digest: str) -> str:
    return f"bootseer-index-{layer_digest.removeprefix('sha256:')[:TAG_HEX]}"


def record_tag(image_digest: str) -> str:
    return f"bootseer-hot-{image_digest.removeprefix('sha256:')[:TAG_HEX]}"


def tree_tag(image_digest: str) -> str:
    return f"bootseer-tree-{image_digest.removeprefix('sha256:')[:TAG_HEX]}"


def card_tag(image_digest: str) -> str:
    return f"bootseer-card-{image_digest.removeprefix('sha256:')[:TAG_HEX]}"


async def publish_artifact(client: RegistryClient, ref: ImageRef, tag: str, artifact_type: str,
                           data: bytes, kind: str, plain_http: bool, digest: str) -> Manifest:
    """Push `data` as an artifact (`push_artifact`); its swarm manifest, whose origin is the
    pushed blob, for the caller to publish to the tracker."""
    blob = await push_artifact(client, ref, tag, artifact_type, data)
    builder = ManifestBuilder(CHUNK_BYTES, digest)
    builder.feed(data)
    return builder.finish(kind, blob_url(ref, blob, plain_http))


async def push_artifact(client: RegistryClient, ref: ImageRef, tag: str, artifact_type: str,
                        data: bytes) -> str:
    """Push `data` as the one blob of an artifact tagged `tag`; the blob's digest."""
    repo = ref.with_tag(tag)
    digest = await client.push_blob(repo, data)
    await tag_artifact(client, repo, artifact_type, [(artifact_type, digest, len(data))])
    return digest


async def tag_artifact(client: RegistryClient, repo: ImageRef, artifact_type: str,
                       layers: list[tuple[str, str, int]]) -> None:
    """Tag (repo's tag) an artifact manifest listing blobs already pushed, as (media type,
    digest, size): the registry keeps every blob a tagged manifest references."""
    await client.push_blob(repo, EMPTY_BLOB)
    manifest = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "artifactType": artifact_type,
        "config": _descriptor(EMPTY_TYPE, EMPTY_BLOB),
        "layers": [{"mediaType": media, "digest": digest, "size": size}
                   for media, digest, size in layers],
    }
    await client.put_manifest(repo, json.dumps(manifest).encode(), OCI_MANIFEST)


async def pull_artifact(client: RegistryClient, ref: ImageRef, tag: str, artifact_type: str,
                        max_bytes: int) -> bytes | None:
    """The blob of the artifact tagged `tag`, or None if there is no such tag."""
    repo = ref.with_tag(tag)
    try:
        pulled = await client.get_manifest(repo)
    except RegistryError as exc:
        if exc.status == 404:
            return None
        raise
    layer = _only_layer(pulled.manifest, artifact_type, str(repo))
    if layer.size > max_bytes:
        raise RegistryError(f"{repo}: the {artifact_type} artifact has {layer.size} bytes, "
                            f"more than the {max_bytes} allowed")
    return await client.get_blob(repo, layer.digest, max_bytes=max_bytes)


def _only_layer(manifest: ImageManifest, artifact_type: str, where: str) -> Descriptor:
    layers = manifest.layers
    if manifest.artifact_type != artifact_type or len(layers) != 1 \
            or layers[0].media_type != artifact_type:
        raise RegistryError(f"{where} is not a {artifact_type} artifact; delete the tag or "
                            "let Bootseer write it")
    return layers[0]


def _descriptor(media_type: str, data: bytes) -> dict[str, object]:
    return {"mediaType": media_type, "digest": sha256_digest(data), "size": len(data)}

