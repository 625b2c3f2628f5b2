"""Where an image's Bootseer side lives, and how a node finds it.

An image stays exactly what was pushed. For each layer (gzip or plain tar),
`index_image`
(`bootseer image index REF`, once per image, by someone with push rights):

1. streams the blob from the registry (sha256 checked end to end) to a work
   file, computing the layer's swarm manifest on the way (1 MiB chunks, whose
   origin is the registry blob itself, `oci://registry/repo@sha256:...`);
2. builds the layer index (`gzindex`: tar table of contents and zran access
   points) and pushes it to the image's repository as an artifact
   (`artifact.index_tag`), so the index's own origin is the registry too;
3. publishes both manifests to the tracker and names them there:
   `layer/v1/<layer digest>` -> the layer's content id and
   `layer-index/v1/<layer digest>` -> the index's. Names are write-once and the
   build is deterministic, so a second indexer of the same layer agrees with
   the first; a layer indexed for another image is not indexed again.

`open_image` (every node, at mount time) resolves the reference to its image
manifest and config, looks the two names up for each layer (the tracker's
signed answers), and reads each index through the local agent: from peers,
and from the registry only if no peer has it. The layer contents are left to
the mount, which reads them lazily.

Hot-block records are artifacts too (`artifact.record_tag(image digest)`):
read by every mount that prefetches, merged and written back by a mount that
records. Indexing also writes the image's card (`card`: manifest and config in
the swarm), which opens an image pinned by digest while the registry is down.
"""

from __future__ import annotations

import asyncio
import json
import logging
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fusefs.image.artifact import (
    INDEX_TYPE,
    RECORD_TYPE,
    index_tag,
    publish_artifact,
    pull_artifact,
    push_artifact,
    record_tag,
)
from fusefs.image.card import CardError, hold_card, load_card, publish_card
from fusefs.image.gzindex import build_index
from fusefs.image.layerindex import LayerIndex
from fusefs.image.record import MAX_RECORD_BYTES, Record
from fusefs.image.toc import LayerError
from fusefs.tree import Layer, TreeError, build_tree
from p2p.agentclient import AgentClient
from p2p.content import DEFAULT_DIGEST, ContentId, Manifest, ManifestBuilder
from p2p.errors import UserError
from p2p.origin.oci import PulledManifest, RegistryClient, RegistryError
from p2p.origin.oci_manifest import Descriptor
from p2p.origin.oci_origin import blob_url
from p2p.origin.oci_ref import ImageRef
from p2p.tracker_client import TrackerClient, TrackerError
from p2p.units import MiB

log = logging.getLogger(__name__)

LAYER_CHUNK_BYTES = 1 * MiB  # measured: the python3 startup set needs 23 MB at 1 MiB, 46 at 4
GZIP_LAYER_TYPES = ("application/vnd.oci.image.layer.v1.tar+gzip",
                    "application/vnd.docker.image.rootfs.diff.tar.gzip")
TAR_LAYER_TYPES = ("application/vnd.oci.image.layer.v1.tar",
                   "application/vnd.docker.image.rootfs.diff.tar")
MAX_CONFIG_BYTES = 4 * MiB
MAX_INDEX_BYTES = 256 * MiB


class ImageError(UserError):
    """The image cannot be indexed or opened; the message names the image and the fix."""


def layer_name(digest: str) -> str:
    return f"layer/v1/{digest}"


def index_name(digest: str) -> str:
    return f"layer-index/v1/{digest}"


@dataclass(frozen=True, slots=True)
class ImageLayer:
    digest: str
    content_id: ContentId
    index: LayerIndex


@dataclass(frozen=True, slots=True)
class Image:
    ref: ImageRef  # pinned to the image manifest's digest
    digest: str
    config: dict[str, Any]
    layers: tuple[ImageLayer, ...]


async def resolve(client: RegistryClient, ref: ImageRef) -> tuple[PulledManifest, dict[str, Any]]:
    """The image manifest `ref` names (for this platform) and its config."""
    pulled, raw = await _resolve_raw(client, ref)
    return pulled, _config(pulled, raw)


async def _resolve_raw(client: RegistryClient, ref: ImageRef) -> tuple[PulledManifest, bytes]:
    """The image manifest `ref` names, and its config's bytes."""
    pulled = await client.get_manifest(ref)
    raw = await client.get_blob(pulled.ref, pulled.manifest.config.digest,
                                max_bytes=MAX_CONFIG_BYTES)
    for layer in pulled.manifest.layers:
        _check_layer_type(pulled.ref, layer)
    return pulled, raw


def _config(pulled: PulledManifest, raw: bytes) -> dict[str, Any]:
    try:
        config = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ImageError(f"image {pulled.ref}: its config is not JSON ({exc})") from None
    if not isinstance(config, dict):
        raise ImageError(f"image {pulled.ref}: its config is not a JSON object")
    return config


def _check_layer_type(ref: ImageRef, layer: Descriptor) -> None:
    if layer.media_type not in GZIP_LAYER_TYPES + TAR_LAYER_TYPES:
        raise ImageError(f"image {ref}: layer {layer.digest} has media type "
                         f"{layer.media_type!r}; Bootseer serves gzip and plain tar layers "
                         f"({', '.join(GZIP_LAYER_TYPES + TAR_LAYER_TYPES)})")


# ---- indexing (once per image) --------------------------------------------------------


Progress = Callable[[dict[str, Any]], None]


async def index_image(client: RegistryClient, tracker: TrackerClient, ref: ImageRef, *,
                      plain_http: bool = False, digest: str = DEFAULT_DIGEST,
                      workdir: Path | None = None, progress: Progress | None = None
                      ) -> list[dict[str, Any]]:
    """Index every layer of `ref` not indexed yet, and write the image's card (`card`); one
    summary dict per layer."""
    pulled, raw_config = await _resolve_raw(client, ref)
    _config(pulled, raw_config)
    done = []
    with tempfile.TemporaryDirectory(prefix="bootseer-index-", dir=workdir) as scratch:
        for layer in pulled.manifest.layers:
            summary = await _index_layer(client, tracker, pulled.ref, layer, Path(scratch),
                                         plain_http, digest)
            if progress is not None:
                progress(summary)
            done.append(summary)
    await publish_card(client, tracker, pulled, raw_config, plain_http, digest)
    return done


async def _index_layer(client: RegistryClient, tracker: TrackerClient, ref: ImageRef,
                       layer: Descriptor, scratch: Path, plain_http: bool,
                       digest: str) -> dict[str, Any]:
    try:
        layer_id = await tracker.get_name(layer_name(layer.digest))
        index_id = await tracker.get_name(index_name(layer.digest))
        return {"layer": layer.digest, "content": layer_id, "index": index_id, "new": False}
    except TrackerError as exc:
        if exc.status != 404:
            raise
    path = scratch / layer.digest.removeprefix("sha256:")
    manifest = await _download(client, ref, layer, path, plain_http, digest)
    index = await asyncio.to_thread(_checked_index, ref, layer, path)
    data = index.to_bytes()
    path.unlink()
    index_manifest = await publish_artifact(client, ref, index_tag(layer.digest), INDEX_TYPE,
                                            data, "layer-index", plain_http, digest)
    for m in (manifest, index_manifest):
        await tracker.put_manifest(m)
    await tracker.put_name(layer_name(layer.digest), manifest.content_id)
    await tracker.put_name(index_name(layer.digest), index_manifest.content_id)
    return {"layer": layer.digest, "content": manifest.content_id,
            "index": index_manifest.content_id, "new": True, "layer_bytes": layer.size,
            "index_bytes": len(data), "members": len(index.members)}


def _checked_index(ref: ImageRef, layer: Descriptor, path: Path) -> LayerIndex:
    """The layer's index, once its tree is known to be servable (paths inside the root,
    no duplicates, hard links to earlier files): refused now, not at every mount."""
    try:
        with open(path, "rb") as blob:
            index = build_index(blob, layer.digest,
                                compressed=layer.media_type in GZIP_LAYER_TYPES)
        build_tree([Layer(layer.digest, index.entries(ContentId("c1-" + "0" * 64)))])
    except (LayerError, TreeError) as exc:
        raise ImageError(f"image {ref}: {exc}") from None
    return index


async def _download(client: RegistryClient, ref: ImageRef, layer: Descriptor, path: Path,
                    plain_http: bool, digest: str) -> Manifest:
    """Stream the blob to `path`, returning its swarm manifest. Its sha256 is checked by
    `stream_blob` (a mismatch raises at the end) and again by `build_index`."""
    builder = ManifestBuilder(LAYER_CHUNK_BYTES, digest)
    with open(path, "wb") as out:
        async for block in client.stream_blob(ref, layer.digest):
            builder.feed(block)
            out.write(block)
    return builder.finish("oci-layer", blob_url(ref, layer.digest, plain_http))


# ---- opening (every node) -------------------------------------------------------------


async def open_image(client: RegistryClient, tracker: TrackerClient, agent: AgentClient,
                     ref: ImageRef) -> Image:
    """The image `ref` names, with the index of each layer, read through the local agent.
    With the registry unreachable, a reference pinned by digest is opened from its card."""
    try:
        pulled, config = await resolve(client, ref)
    except RegistryError as exc:
        if exc.status is not None:  # it answered: its answer stands
            raise
        log.warning("%s; opening %s from its card in the swarm", exc, ref)
        try:
            pulled, config = await load_card(tracker, agent, ref)
        except CardError as card_exc:
            raise ImageError(f"{exc}; and {card_exc}") from None
    holding = asyncio.ensure_future(hold_card(tracker, agent, pulled.digest))
    try:
        layers = await asyncio.gather(*(_open_layer(tracker, agent, pulled.ref, layer)
                                        for layer in pulled.manifest.layers))
    finally:
        await holding
    return Image(pulled.ref, pulled.digest, config, tuple(layers))


async def _open_layer(tracker: TrackerClient, agent: AgentClient, ref: ImageRef,
                      layer: Descriptor) -> ImageLayer:
    try:
        layer_id = await tracker.get_name(layer_name(layer.digest))
        index_id = await tracker.get_name(index_name(layer.digest))
    except TrackerError as exc:
        if exc.status == 404:
            raise ImageError(f"image {ref}: layer {layer.digest} is not indexed; run "
                             f"`bootseer image index {ref}` once (it needs push rights)") \
                from None
        raise
    info = await agent.ensure(index_id)  # small, and needed whole: fetch it all
    if info["size"] > MAX_INDEX_BYTES:
        raise ImageError(f"image {ref}: the index of layer {layer.digest} has "
                         f"{info['size']} bytes, more than {MAX_INDEX_BYTES}")
    data = await agent.read(index_id, 0, info["size"])
    try:
        index = await asyncio.to_thread(LayerIndex.from_bytes, data,
                                        f"index of {layer.digest}", layer.digest)
    except LayerError as exc:
        raise ImageError(f"image {ref}: {exc}") from None
    return ImageLayer(layer.digest, layer_id, index)


async def load_record(client: RegistryClient, image: Image) -> Record | None:
    """The image's hot-block record, or None if no launch recorded one yet (or the registry,
    where records live, cannot be reached: the launch then loads lazily)."""
    try:
        data = await pull_artifact(client, image.ref, record_tag(image.digest), RECORD_TYPE,
                                   MAX_RECORD_BYTES)
    except RegistryError as exc:
        if exc.status is not None:
            raise
        log.warning("no hot-block record for %s: %s", image.ref, exc)
        return None
    if data is None:
        return None
    return Record.from_bytes(data, f"hot-block record of {image.ref}").for_image(image.digest)


async def save_record(client: RegistryClient, image: Image, record: Record) -> Record:
    """Merge `record` into the image's stored record and write it back; the merged one.
    Two launches writing at once: the last write wins (a record is a hint, not data)."""
    try:
        old = await load_record(client, image)
    except (RegistryError, ValueError) as exc:
        log.warning("the stored hot-block record of %s is unusable (%s); replacing it",
                    image.ref, exc)
        old = None
    merged = record if old is None else old.merge(record)
    await push_artifact(client, image.ref, record_tag(image.digest), RECORD_TYPE,
                        merged.to_bytes())
    return merged
