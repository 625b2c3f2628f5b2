"""Registry blobs as an origin: `oci://host[:port]/repository@sha256:<hex>`.

A layer blob becomes a swarm content whose manifest's origin is such a URL;
`read_into` fetches one byte range of it with a Range GET through
`RegistryClient`. `oci://` speaks HTTPS except to loopback registries;
`oci+http://` forces plain HTTP (a registry on a trusted private network).

Credentials come from the environment, as for every `RegistryClient`:
`BOOTSEER_REGISTRY_AUTH=user:password`, else the docker-style config file at
`BOOTSEER_REGISTRY_AUTH_FILE` (default `~/.docker/config.json`), else none.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from p2p.origin.base import OriginError, Progress
from p2p.origin.oci import RegistryClient
from p2p.origin.oci_ref import ImageRef, ImageRefError, check_digest, parse_in_registry
from p2p.units import MiB

SCHEMES = ("oci", "oci+http")
# A layer blob's swarm content: its chunk size and its name on the tracker. `image index`
# and the agent's registry mirror (p2p.mirror) both publish layers this way, so either
# one reuses what the other published.
LAYER_CHUNK_BYTES = 1 * MiB  # measured: the python3 startup set needs 23 MB at 1 MiB, 46 at 4


def layer_name(digest: str) -> str:
    return f"layer/v1/{digest}"


def blob_url(ref: ImageRef, digest: str, plain_http: bool = False) -> str:
    """The origin URL of one blob of `ref`'s repository."""
    scheme = "oci+http" if plain_http else "oci"
    return f"{scheme}://{ref.registry}/{ref.repository}@{check_digest(digest)}"


def parse_blob_url(url: str) -> tuple[ImageRef, str]:
    """(repository reference, blob digest) from an `oci://` URL, or OriginError."""
    parts = urlsplit(url)
    try:
        if parts.scheme not in SCHEMES or not parts.netloc or parts.query or parts.fragment:
            raise ImageRefError("expected oci://host[:port]/repository@sha256:<hex>")
        parsed = parse_in_registry(parts.netloc, parts.path.removeprefix("/"))
        if parsed.digest is None or parsed.tag is not None:
            raise ImageRefError("expected oci://host[:port]/repository@sha256:<hex>")
    except ImageRefError as exc:
        raise OriginError(f"bad registry blob URL {url!r}: {exc}") from None
    return ImageRef(parsed.registry, parsed.repository), parsed.digest


class OciOrigin:
    """One registry endpoint (`oci://host:port` or `oci+http://host:port`) as an origin."""

    def __init__(self, endpoint: str) -> None:
        parts = urlsplit(endpoint)
        self.endpoint = endpoint
        self.client = RegistryClient(
            plain_http=(parts.netloc,) if parts.scheme == "oci+http" else ())

    async def read_into(self, url: str, offset: int, view: memoryview,
                        progress: Progress | None = None) -> None:
        ref, digest = parse_blob_url(url)
        await self.client.read_blob_range(ref, digest, offset, view, progress)

    async def close(self) -> None:
        await self.client.close()
