"""An image's card: its manifest and config, kept in the swarm so a launch outlives the registry.

A mount needs three things from the registry before it serves: the image
manifest, the config, and the hot-block record. The layers and their indexes
already come from peers. `image index` therefore also writes a *card*: the
exact bytes of the image manifest and of the config, in one small JSON blob,
pushed as an artifact (`card_tag`) so its origin is the registry like every
other content's, and named in the tracker as `image-card/v1/<digest>` for the
image manifest's digest and, if the reference named an index, the index's.

When the registry cannot be reached (not when it refuses), `open_image` reads
the card of a reference pinned by digest from peers instead. The card is
checked, not trusted: the manifest's bytes must hash to the digest it is named
by (or, for an index, to the card's own manifest digest) and the config's to
the digest the manifest gives. A tag cannot be resolved without the registry;
a launcher resolves it once and starts every node with `REPO@sha256:...`.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any

from fusefs.image.artifact import CARD_TYPE, card_tag, publish_artifact
from p2p.agentclient import AgentClient
from p2p.content import DEFAULT_DIGEST, ContentId
from p2p.errors import UserError
from p2p.origin.oci import PulledManifest, RegistryClient, sha256_digest
from p2p.origin.oci_manifest import ImageManifest, ManifestError, parse_manifest
from p2p.origin.oci_ref import ImageRef
from p2p.tracker_client import TrackerClient, TrackerError
from p2p.units import MiB

MAX_CARD_BYTES = 16 * MiB


class CardError(UserError):
    """A card is missing or does not match what it claims; the message says which."""


def card_name(digest: str) -> str:
    return f"image-card/v1/{digest}"


@dataclass(frozen=True, slots=True)
class Card:
    digest: str  # the image manifest's
    media_type: str
    manifest: bytes
    config: bytes
    index_digest: str | None = None

    def to_bytes(self) -> bytes:
        return json.dumps({"digest": self.digest, "media_type": self.media_type,
                           "index_digest": self.index_digest,
                           "manifest": base64.b64encode(self.manifest).decode(),
                           "config": base64.b64encode(self.config).decode()},
                          sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes, named: str) -> Card:
        """The card in `data`, found under digest `named`; CardError unless it checks out."""
        try:
            raw = json.loads(data)
            card = cls(str(raw["digest"]), str(raw["media_type"]),
                       base64.b64decode(raw["manifest"], validate=True),
                       base64.b64decode(raw["config"], validate=True), raw.get("index_digest"))
            manifest = parse_manifest(card.manifest, card.media_type)
        except (ValueError, KeyError, TypeError, ManifestError) as exc:
            raise CardError(f"the image card of {named} is malformed: {exc}") from None
        if named not in (card.digest, card.index_digest):
            raise CardError(f"the image card named {named} is the card of {card.digest}")
        if sha256_digest(card.manifest) != card.digest:
            raise CardError(f"the image card of {named}: its manifest does not hash to "
                            f"{card.digest}")
        if not isinstance(manifest, ImageManifest) \
                or sha256_digest(card.config) != manifest.config.digest:
            raise CardError(f"the image card of {named}: its config does not match the "
                            "manifest's config digest")
        return card

    def pulled(self, ref: ImageRef) -> tuple[PulledManifest, dict[str, Any]]:
        """What `resolve` would have returned for `ref` from the registry."""
        manifest = parse_manifest(self.manifest, self.media_type)
        assert isinstance(manifest, ImageManifest)
        config = json.loads(self.config)
        return (PulledManifest(ref.with_digest(self.digest), self.digest, self.media_type,
                               self.manifest, manifest, self.index_digest), config)


async def publish_card(client: RegistryClient, tracker: TrackerClient, pulled: PulledManifest,
                       config: bytes, plain_http: bool, digest: str = DEFAULT_DIGEST) -> bool:
    """Push and name the card of `pulled` unless it is named already; whether it was new."""
    names = [card_name(d) for d in (pulled.digest, pulled.index_digest) if d]
    try:
        for name in names:
            await tracker.get_name(name)
        return False
    except TrackerError as exc:
        if exc.status != 404:
            raise
    data = Card(pulled.digest, pulled.media_type, pulled.body, config,
                pulled.index_digest).to_bytes()
    manifest = await publish_artifact(client, pulled.ref, card_tag(pulled.digest), CARD_TYPE,
                                      data, "image-card", plain_http, digest)
    await tracker.put_manifest(manifest)
    for name in names:
        try:
            await tracker.put_name(name, manifest.content_id)
        except TrackerError as exc:
            if exc.status != 409:  # named by another indexer at the same time: theirs holds
                raise
    return True


async def hold_card(tracker: TrackerClient, agent: AgentClient, digest: str) -> None:
    """Have the local agent hold the card of the image `digest` (a node that opened the
    image from the registry), so peers can open it from the swarm if the registry goes.
    Best effort: an image indexed before cards existed has none."""
    try:
        await agent.ensure(ContentId(await tracker.get_name(card_name(digest))))
    except TrackerError as exc:
        if exc.status != 404:
            raise


async def load_card(tracker: TrackerClient, agent: AgentClient, ref: ImageRef
                    ) -> tuple[PulledManifest, dict[str, Any]]:
    """The manifest and config of `ref` (pinned by digest) from its card, through peers."""
    if ref.digest is None:
        raise CardError(f"image {ref} names a tag, which only the registry can resolve; "
                        "launch with REPO@sha256:... when the registry may be unreachable")
    try:
        content = ContentId(await tracker.get_name(card_name(ref.digest)))
    except TrackerError as exc:
        if exc.status == 404:
            raise CardError(f"image {ref} has no card; run `bootseer image index` once "
                            "(it writes one) while the registry is up") from None
        raise
    info = await agent.ensure(content)
    if info["size"] > MAX_CARD_BYTES:
        raise CardError(f"the image card of {ref} has {info['size']} bytes, more than "
                        f"{MAX_CARD_BYTES}")
    card = Card.from_bytes(await agent.read(content, 0, info["size"]), ref.digest)
    return card.pulled(ref)
