"""Which swarm contents an image's layers are: bindings the indexer pins in the registry.

A layer's names in the tracker (`layer/v1/<digest>` and `layer-index/v1/<digest>`)
are first-come: any holder of the cluster secret can register them, and the tracker,
which holds no bytes, cannot check that a content reassembles to the layer digest.
So a name is only a hint. What a node trusts comes from where the image itself comes
from: `image index` (push rights on the repository) computes each layer's content id
from the bytes it downloads (their sha256 checked end to end) and the index's by
building it, and pushes the pairs, as an artifact tagged by the image digest
(`bindings_tag`), with the content id of the image's merged tree, packed
(`fusefs.packedtree`; an artifact of its own, `tree_tag`). `open_image` reads it
from the registry beside the image manifest and uses its ids; a tracker name that
disagrees is ignored and logged. Content ids pin bytes, so a binding pins the
layer's bytes and its index's: an insider who registers the names first with other
bytes changes nothing a node serves.

Without the artifact (an image indexed by an older Bootseer, or a registry that
cannot be reached, so the image opens from its card) the names are used, with
a warning: first-come, as the trust model says.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from fusefs.image.artifact import pull_artifact, push_artifact
from p2p.content import ContentId, ManifestError, check_content_id
from p2p.origin.oci import RegistryClient
from p2p.origin.oci_ref import ImageRef

BINDINGS_TYPE = "application/vnd.bootseer.layer-bindings.v1+json"
MAX_BINDINGS_BYTES = 4 << 20
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


def bindings_tag(image_digest: str) -> str:
    return f"bootseer-bind-{image_digest.removeprefix('sha256:')[:40]}"


class BindingError(ValueError):
    """A bindings artifact is malformed or not the image's."""


@dataclass(frozen=True, slots=True)
class Binding:
    layer: ContentId  # the layer's bytes, as a swarm content
    index: ContentId  # its layer index's


@dataclass(frozen=True, slots=True)
class Bindings:
    image: str  # the image manifest's digest
    layers: dict[str, Binding]  # layer digest -> its contents
    tree: ContentId | None = None  # the merged tree, packed (None: indexed before trees)

    def to_bytes(self) -> bytes:
        doc: dict[str, object] = {"image": self.image, "layers": {
            d: {"content": b.layer, "index": b.index} for d, b in self.layers.items()}}
        if self.tree is not None:
            doc["tree"] = self.tree
        return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes, image: str) -> Bindings:
        try:
            raw = json.loads(data)
            layers = {_digest(d): Binding(check_content_id(b["content"]),
                                          check_content_id(b["index"]))
                      for d, b in raw["layers"].items()}
            bound = str(raw["image"])
            tree = check_content_id(raw["tree"]) if "tree" in raw else None
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
            if isinstance(exc, ManifestError | BindingError):
                raise BindingError(f"the layer bindings of {image}: {exc}") from None
            raise BindingError(f"the layer bindings of {image} are malformed: {exc!r}") \
                from None
        if bound != image:
            raise BindingError(f"the layer bindings tagged for {image} are those of {bound}")
        return cls(image, layers, tree)


def _digest(text: object) -> str:
    if not isinstance(text, str) or not _DIGEST.fullmatch(text):
        raise BindingError(f"{str(text)[:80]!r} is not a sha256 layer digest")
    return text


async def push_bindings(client: RegistryClient, ref: ImageRef, bindings: Bindings) -> None:
    await push_artifact(client, ref, bindings_tag(bindings.image), BINDINGS_TYPE,
                        bindings.to_bytes())


async def pull_bindings(client: RegistryClient, ref: ImageRef, image: str) -> Bindings | None:
    """The image's bindings from the registry; None if it has none (indexed before)."""
    data = await pull_artifact(client, ref, bindings_tag(image), BINDINGS_TYPE,
                               MAX_BINDINGS_BYTES)
    return None if data is None else Bindings.from_bytes(data, image)
