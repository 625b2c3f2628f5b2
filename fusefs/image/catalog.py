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
   `layer-index/v1/<layer digest>` -> the index's. Names are write-once and
   first-come, so they are never trusted as the layer's: every layer is
   indexed from its bytes (unless this image's bindings already list it);
4. merges the layers into the image's tree once, packs it (`fusefs.packedtree`)
   and pushes it as an artifact, published to the tracker like the indexes;
5. pushes the image's *bindings* (`binding`): each layer digest with its
   content id and its index's, and the packed tree's content id, as an
   artifact tagged by the image digest.

`open_image` (every node, at mount time) resolves the reference to its image
manifest and config, reads the image's bindings from the registry (the
tracker's names only for an image indexed before bindings existed, or opened
from its card), and reads each index through the local agent: from peers,
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
    TREE_TYPE,
    index_tag,
    publish_artifact,
    pull_artifact,
    push_artifact,
    record_tag,
    tree_tag,
)
from fusefs.image.binding import (
    Binding,
    BindingError,
    Bindings,
    pull_bindings,
    push_bindings,
)
from fusefs.image.card import CardError, hold_card, load_card, publish_card
from fusefs.image.gzindex import build_index
from fusefs.image.layerindex import LayerIndex
from fusefs.image.record import MAX_RECORD_BYTES, Record
from fusefs.image.toc import LayerError
from fusefs.packedtree import PackedTree, pack_checked
from fusefs.tree import Layer, TreeError, build_tree
from p2p.agentclient import AgentClient
from p2p.content import DEFAULT_DIGEST, ContentId, Manifest, ManifestBuilder
from p2p.errors import UserError
from p2p.origin.oci import PulledManifest, RegistryClient, RegistryError
from p2p.origin.oci_manifest import Descriptor
from p2p.origin.oci_origin import LAYER_CHUNK_BYTES, blob_url, layer_name
from p2p.origin.oci_ref import ImageRef
from p2p.tracker_client import TrackerClient, TrackerError
from p2p.units import MiB

log = logging.getLogger(__name__)

GZIP_LAYER_TYPES = ("application/vnd.oci.image.layer.v1.tar+gzip",
                    "application/vnd.docker.image.rootfs.diff.tar.gzip")
TAR_LAYER_TYPES = ("application/vnd.oci.image.layer.v1.tar",
                   "application/vnd.docker.image.rootfs.diff.tar")
MAX_CONFIG_BYTES = 4 * MiB
MAX_INDEX_BYTES = 256 * MiB
MAX_TREE_BYTES = 1024 * MiB
# Layers in one image. Runtimes stack far fewer (overlayfs on Linux 6.x: 500 lower
# layers), and past this an image is a mistake or an attack, to be said as such, not
# a mount that fails on whatever breaks first (a tracker flooded with lookups).
MAX_LAYERS = 500
OPENING_LAYERS = 32  # layers opened at once: each is an index read through the agent


class ImageError(UserError):
    """The image cannot be indexed or opened; the message names the image and the fix."""


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
    tree: PackedTree | None = None  # packed at index time (None: merge the layers' members)


async def resolve(client: RegistryClient, ref: ImageRef) -> tuple[PulledManifest, dict[str, Any]]:
    """The image manifest `ref` names (for this platform) and its config."""
    pulled, raw = await _resolve_raw(client, ref)
    return pulled, _config(pulled, raw)


async def _resolve_raw(client: RegistryClient, ref: ImageRef) -> tuple[PulledManifest, bytes]:
    """The image manifest `ref` names, and its config's bytes."""
    pulled = await client.get_manifest(ref)
    raw = await client.get_blob(pulled.ref, pulled.manifest.config.digest,
                                max_bytes=MAX_CONFIG_BYTES)
    check_layers(pulled)
    return pulled, raw


def check_layers(pulled: PulledManifest) -> None:
    """ImageError unless the image has at most MAX_LAYERS layers, each of a type we serve."""
    count = len(pulled.manifest.layers)
    if count > MAX_LAYERS:
        raise ImageError(f"image {pulled.ref} has {count} layers, more than the "
                         f"{MAX_LAYERS} Bootseer serves; squash it (runtimes stack fewer)")
    for layer in pulled.manifest.layers:
        _check_layer_type(pulled.ref, layer)


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
    known = await _known_bindings(client, pulled)
    done = []
    bound: dict[str, Binding] = {}
    indexes: dict[str, LayerIndex | None] = {}
    with tempfile.TemporaryDirectory(prefix="bootseer-index-", dir=workdir) as scratch:
        for layer in pulled.manifest.layers:
            summary, indexes[layer.digest] = await _index_layer(
                client, tracker, pulled.ref, layer, Path(scratch), plain_http, digest, known)
            if progress is not None:
                progress(summary)
            done.append(summary)
            bound[layer.digest] = Binding(summary["content"], summary["index"])
    tree = known.tree if known is not None and known.layers == bound else None
    if tree is None or not await _tracker_holds(tracker, tree):
        tree = await _publish_tree(client, tracker, pulled, bound, indexes, plain_http, digest)
    if known is None or known.layers != bound or known.tree != tree:
        await push_bindings(client, pulled.ref, Bindings(pulled.digest, bound, tree))
    await publish_card(client, tracker, pulled, raw_config, plain_http, digest)
    return done


async def _publish_tree(client: RegistryClient, tracker: TrackerClient,
                        pulled: PulledManifest, bound: dict[str, Binding],
                        indexes: dict[str, LayerIndex | None], plain_http: bool,
                        digest: str) -> ContentId:
    """Merge the layers into the image's tree, pack it (`fusefs.packedtree`: a mount then
    opens it in milliseconds instead of merging every tar entry again), check what was
    packed, and push it as an artifact published to the tracker; its content id. A layer
    indexed by an earlier run has its index read back from the registry."""
    layers = []
    for layer in pulled.manifest.layers:
        index = indexes.get(layer.digest) or await _pull_index(client, pulled.ref,
                                                                 layer.digest)
        layers.append(Layer(layer.digest, index.entries(bound[layer.digest].layer)))

    try:
        data = await asyncio.to_thread(lambda: pack_checked(build_tree(layers),
                                                            f"tree of {pulled.ref}"))
    except TreeError as exc:
        raise ImageError(f"image {pulled.ref}: {exc}") from None
    manifest = await publish_artifact(client, pulled.ref, tree_tag(pulled.digest), TREE_TYPE,
                                      data, "image-tree", plain_http, digest)
    await tracker.put_manifest(manifest)
    return manifest.content_id


async def _pull_index(client: RegistryClient, ref: ImageRef, layer_digest: str) -> LayerIndex:
    data = await pull_artifact(client, ref, index_tag(layer_digest), INDEX_TYPE,
                               MAX_INDEX_BYTES)
    if data is None:
        raise ImageError(f"image {ref}: the index of layer {layer_digest} is gone from the "
                         "registry; run `bootseer image index` again")
    try:
        return LayerIndex.from_bytes(data, f"index of {layer_digest}", layer_digest)
    except LayerError as exc:
        raise ImageError(f"image {ref}: {exc}") from None


async def _known_bindings(client: RegistryClient, pulled: PulledManifest) -> Bindings | None:
    """The bindings an earlier `image index` of this image pushed (None: none, or unusable:
    this run replaces them)."""
    try:
        return await pull_bindings(client, pulled.ref, pulled.digest)
    except BindingError as exc:
        log.warning("%s; indexing again", exc)
        return None


async def _index_layer(client: RegistryClient, tracker: TrackerClient, ref: ImageRef,
                       layer: Descriptor, scratch: Path, plain_http: bool,
                       digest: str, known: Bindings | None
                       ) -> tuple[dict[str, Any], LayerIndex | None]:
    """Index `layer` from its bytes: the names in the tracker are first-come, so they are
    never taken as the layer's (`binding`); only this image's bindings, in the registry,
    spare the work, and only while this tracker still holds the manifests they name (a
    registry outlives a tracker that keeps no state). The layer's index, if built here."""
    if known is not None and layer.digest in known.layers:
        was = known.layers[layer.digest]
        if await _tracker_holds(tracker, was.layer, was.index):
            return {"layer": layer.digest, "content": was.layer, "index": was.index,
                    "new": False}, None
    path = scratch / layer.digest.removeprefix("sha256:")
    manifest = await _download(client, ref, layer, path, plain_http, digest)
    index = await asyncio.to_thread(_checked_index, ref, layer, path)
    data = index.to_bytes()
    path.unlink()
    index_manifest = await publish_artifact(client, ref, index_tag(layer.digest), INDEX_TYPE,
                                            data, "layer-index", plain_http, digest)
    for m in (manifest, index_manifest):
        await tracker.put_manifest(m)
    named = [await _name(tracker, name(layer.digest), content)
             for name, content in ((layer_name, manifest.content_id),
                                   (index_name, index_manifest.content_id))]
    return {"layer": layer.digest, "content": manifest.content_id,
            "index": index_manifest.content_id, "new": all(n is True for n in named),
            "squatted": any(n is None for n in named), "layer_bytes": layer.size,
            "index_bytes": len(data), "members": len(index.members)}, index


async def _tracker_holds(tracker: TrackerClient, *contents: ContentId) -> bool:
    """Whether the tracker has a manifest for every one of `contents`."""
    for content in contents:
        try:
            await tracker.get_manifest(content)
        except TrackerError as exc:
            if exc.status == 404:
                return False
            raise
    return True


async def _name(tracker: TrackerClient, name: str, content: ContentId) -> bool | None:
    """Name `content`: True if new, False if it was named so already, None if the name is
    held by other bytes (first-come, by someone else: the registry's bindings override)."""
    try:
        return await tracker.put_name(name, content)
    except TrackerError as exc:
        if exc.status != 409:
            raise
        log.warning("the tracker's name %s is held by another content, not %s (the bytes "
                    "of the layer); nodes use the image's bindings in the registry", name,
                    content)
        return None


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
    from_registry = True
    try:
        pulled, config = await resolve(client, ref)
    except RegistryError as exc:
        if exc.status is not None:  # it answered: its answer stands
            raise
        from_registry = False
        log.warning("%s; opening %s from its card in the swarm, its layers by the "
                    "tracker's names (first-come)", exc, ref)
        try:
            pulled, config = await load_card(tracker, agent, ref)
        except CardError as card_exc:
            raise ImageError(f"{exc}; and {card_exc}") from None
    if not from_registry:
        check_layers(pulled)  # a card is checked against its digest, not for its size
    bindings = await _bindings(client, pulled) if from_registry else None
    holding = asyncio.ensure_future(hold_card(tracker, agent, pulled.digest))
    slots = asyncio.Semaphore(OPENING_LAYERS)

    packed = bindings.tree if bindings is not None else None

    async def open_one(layer: Descriptor) -> ImageLayer:
        async with slots:
            return await _open_layer(tracker, agent, pulled.ref, layer, bindings,
                                     with_members=packed is None)

    try:
        layers, tree = await asyncio.gather(
            asyncio.gather(*(open_one(layer) for layer in pulled.manifest.layers)),
            _read_tree(agent, pulled.ref, packed))
    finally:
        await holding
    return Image(pulled.ref, pulled.digest, config, tuple(layers), tree)


async def _read_tree(agent: AgentClient, ref: ImageRef, tree_id: ContentId | None
                     ) -> PackedTree | None:
    """The image's merged tree as packed by `image index`, read through the agent (None:
    the image was indexed before trees were packed)."""
    if tree_id is None:
        return None
    info = await agent.ensure(tree_id)  # needed whole: its digest covers all of it
    if info["size"] > MAX_TREE_BYTES:
        raise ImageError(f"image {ref}: its packed tree has {info['size']} bytes, more than "
                         f"{MAX_TREE_BYTES}")
    data = await agent.read(tree_id, 0, info["size"])
    try:
        return PackedTree(data, f"tree of {ref}")
    except TreeError as exc:
        raise ImageError(f"image {ref}: {exc}; run `bootseer image index` again") from None


async def _bindings(client: RegistryClient, pulled: PulledManifest) -> Bindings | None:
    """The image's layer bindings from the registry (`binding`); None, with a warning, for
    an image indexed before they existed or a registry gone since it answered."""
    try:
        found = await pull_bindings(client, pulled.ref, pulled.digest)
    except BindingError as exc:
        raise ImageError(f"image {pulled.ref}: {exc}; run `bootseer image index` again") \
            from None
    except RegistryError as exc:
        if exc.status is not None:
            raise
        log.warning("%s; using the tracker's names for the layers of %s", exc, pulled.ref)
        return None
    if found is None:
        log.warning("image %s has no layer bindings in the registry (indexed by an older "
                    "Bootseer): its layers are taken by the tracker's first-come names; run "
                    "`bootseer image index` again to pin them", pulled.ref)
    return found


async def _open_layer(tracker: TrackerClient, agent: AgentClient, ref: ImageRef,
                      layer: Descriptor, bindings: Bindings | None,
                      with_members: bool = True) -> ImageLayer:
    if bindings is not None:
        bound = bindings.layers.get(layer.digest)
        if bound is None:
            raise ImageError(f"image {ref}: layer {layer.digest} is not in the image's "
                             f"bindings; run `bootseer image index {ref}` again")
        return await _read_index(agent, ref, layer, bound.layer, bound.index, with_members)
    try:
        layer_id = await tracker.get_name(layer_name(layer.digest))
        index_id = await tracker.get_name(index_name(layer.digest))
    except TrackerError as exc:
        if exc.status == 404:
            raise ImageError(f"image {ref}: layer {layer.digest} is not indexed; run "
                             f"`bootseer image index {ref}` once (it needs push rights)") \
                from None
        raise
    return await _read_index(agent, ref, layer, layer_id, index_id)


async def _read_index(agent: AgentClient, ref: ImageRef, layer: Descriptor,
                      layer_id: ContentId, index_id: ContentId,
                      with_members: bool = True) -> ImageLayer:
    info = await agent.ensure(index_id)  # small, and needed whole: fetch it all
    if info["size"] > MAX_INDEX_BYTES:
        raise ImageError(f"image {ref}: the index of layer {layer.digest} has "
                         f"{info['size']} bytes, more than {MAX_INDEX_BYTES}")
    data = await agent.read(index_id, 0, info["size"])
    try:
        index = await asyncio.to_thread(LayerIndex.from_bytes, data,
                                        f"index of {layer.digest}", layer.digest, with_members)
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
