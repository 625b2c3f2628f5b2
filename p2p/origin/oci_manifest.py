"""Manifests and indexes: media types, strict parsing, platform choice.

No I/O. A registry's answer is untrusted input: `parse_manifest` accepts only
the four media types below, `schemaVersion` 2, and descriptors whose digest is
`sha256:<64 hex>` and whose size is a non-negative integer; anything else is a
`ManifestError` saying what was wrong. Size caps are applied by the caller
before the bytes reach this module (`MAX_MANIFEST_BYTES`).

Media type: the body's `mediaType` field when present, else the HTTP
`Content-Type`; if both are present and differ, the manifest is refused (a
registry that says one thing and serves another is not guessed at).

An index (OCI index or Docker manifest list) is resolved to one image manifest
by `pick_platform`: the first entry whose os and architecture match, and whose
variant matches when one was asked for. Nested indexes are refused.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from p2p.errors import RemoteError
from p2p.origin.oci_ref import ImageRefError, check_digest
from p2p.units import MiB

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
IMAGE_MANIFEST_TYPES = (OCI_MANIFEST, DOCKER_MANIFEST)
INDEX_TYPES = (OCI_INDEX, DOCKER_LIST)
MANIFEST_TYPES = (*IMAGE_MANIFEST_TYPES, *INDEX_TYPES)

MAX_MANIFEST_BYTES = 4 * MiB  # the limit distribution and containerd apply too


class ManifestError(RemoteError, ValueError):
    """A manifest or index that is malformed or not of a supported type."""


@dataclass(frozen=True, slots=True)
class Platform:
    os: str
    architecture: str
    variant: str | None = None

    def __str__(self) -> str:
        return "/".join(p for p in (self.os, self.architecture, self.variant) if p)


def parse_platform(text: str) -> Platform:
    """`os/arch[/variant]`, e.g. `linux/amd64` or `linux/arm64/v8`."""
    parts = text.split("/")
    if not 2 <= len(parts) <= 3 or not all(parts):
        raise ManifestError(f"bad platform {text!r}: expected os/arch or os/arch/variant")
    return Platform(parts[0], parts[1], parts[2] if len(parts) == 3 else None)


DEFAULT_PLATFORM = Platform("linux", "amd64")


@dataclass(frozen=True, slots=True)
class Descriptor:
    media_type: str
    digest: str
    size: int
    platform: Platform | None = None
    annotations: tuple[tuple[str, str], ...] = ()

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"mediaType": self.media_type, "digest": self.digest,
                               "size": self.size}
        if self.platform is not None:
            out["platform"] = {"os": self.platform.os, "architecture": self.platform.architecture}
            if self.platform.variant:
                out["platform"]["variant"] = self.platform.variant
        if self.annotations:
            out["annotations"] = dict(self.annotations)
        return out


@dataclass(frozen=True, slots=True)
class ImageManifest:
    media_type: str
    config: Descriptor
    layers: tuple[Descriptor, ...]
    artifact_type: str | None = None


@dataclass(frozen=True, slots=True)
class ImageIndex:
    media_type: str
    manifests: tuple[Descriptor, ...]


Manifest = ImageManifest | ImageIndex


def manifest_media_type(body: bytes, content_type: str | None) -> str:
    """The media type of a manifest body, by the rule in the module docstring."""
    declared = _load(body).get("mediaType")
    header = (content_type or "").split(";")[0].strip() or None
    if declared is not None and not isinstance(declared, str):
        raise ManifestError("manifest mediaType is not a string")
    if declared and header and header != declared and header not in _GENERIC_TYPES:
        raise ManifestError(f"manifest says mediaType {declared!r} but was served as {header!r}")
    media_type = declared or header
    if media_type not in MANIFEST_TYPES:
        raise ManifestError(f"unsupported manifest media type {media_type!r} (supported: "
                            f"{', '.join(MANIFEST_TYPES)})")
    return media_type


_GENERIC_TYPES = ("application/json", "application/octet-stream", "text/plain")


def parse_manifest(body: bytes, media_type: str) -> Manifest:
    """Parse a manifest or index of a media type `manifest_media_type` accepted."""
    doc = _load(body)
    if doc.get("schemaVersion") != 2:
        raise ManifestError(f"manifest schemaVersion {doc.get('schemaVersion')!r} is not 2")
    if media_type in INDEX_TYPES:
        entries = _list(doc, "manifests")
        return ImageIndex(media_type, tuple(_descriptor(e, "manifests[]") for e in entries))
    if media_type in IMAGE_MANIFEST_TYPES:
        config = _descriptor(doc.get("config"), "config")
        layers = tuple(_descriptor(e, "layers[]") for e in _list(doc, "layers"))
        artifact = doc.get("artifactType")
        return ImageManifest(media_type, config, layers,
                             artifact if isinstance(artifact, str) else None)
    raise ManifestError(f"unsupported manifest media type {media_type!r}")


def pick_platform(index: ImageIndex, want: Platform) -> Descriptor:
    """The image manifest of `index` for `want`, or ManifestError listing what there is."""
    for entry in index.manifests:
        have = entry.platform
        if have is None or (have.os, have.architecture) != (want.os, want.architecture):
            continue
        if want.variant is not None and have.variant != want.variant:
            continue
        if entry.media_type not in IMAGE_MANIFEST_TYPES:
            raise ManifestError(f"the {want} entry is a {entry.media_type!r}, not an image "
                                "manifest (nested indexes are not supported)")
        return entry
    available = ", ".join(str(e.platform) for e in index.manifests if e.platform) or "none"
    raise ManifestError(f"no manifest for platform {want} (available: {available})")


def _load(body: bytes) -> dict[str, Any]:
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ManifestError(f"manifest is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ManifestError("manifest is not a JSON object")
    return doc


def _list(doc: dict[str, Any], key: str) -> list[Any]:
    value = doc.get(key)
    if not isinstance(value, list):
        raise ManifestError(f"manifest field {key!r} is missing or not a list")
    return value


def _descriptor(raw: Any, where: str) -> Descriptor:
    if not isinstance(raw, dict):
        raise ManifestError(f"manifest {where} is not an object")
    media_type, digest, size = raw.get("mediaType"), raw.get("digest"), raw.get("size")
    if not isinstance(media_type, str) or not media_type:
        raise ManifestError(f"manifest {where} has no mediaType")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise ManifestError(f"manifest {where} has a bad size {size!r}")
    try:
        digest = check_digest(digest if isinstance(digest, str) else repr(digest))
    except ImageRefError as exc:
        raise ManifestError(f"manifest {where}: {exc}") from None
    annotations = raw.get("annotations") or {}
    if not isinstance(annotations, dict):
        raise ManifestError(f"manifest {where} annotations are not an object")
    return Descriptor(media_type, digest, size, _platform(raw.get("platform"), where),
                      tuple(sorted((str(k), str(v)) for k, v in annotations.items())))


def _platform(raw: Any, where: str) -> Platform | None:
    if raw is None:
        return None
    if not isinstance(raw, dict) or not isinstance(raw.get("os"), str) \
            or not isinstance(raw.get("architecture"), str):
        raise ManifestError(f"manifest {where} has a malformed platform")
    variant = raw.get("variant")
    return Platform(raw["os"], raw["architecture"], variant if isinstance(variant, str) else None)
