"""Registry test helpers around the sample images of `fusefs.testing.sample` (not a test module).

The images themselves (`busybox_image`, `BuiltImage`) come from
`fusefs.testing.sample`, the one place images are built. Here: an OCI image
index over several of them, an OCI layout directory on disk, and the two ways
such images reach a registry in the tests: `write_oci_layout` + `skopeo_copy`
(skopeo reading an OCI layout directory), and `push_sample`/`push_index`
(our own client).
"""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

from fusefs.testing.sample import BuiltImage, busybox_image, push_sample
from p2p.origin.oci import RegistryClient, sha256_digest
from p2p.origin.oci_manifest import OCI_INDEX
from p2p.origin.oci_ref import ImageRef

__all__ = ["BuiltImage", "busybox_image", "index_of", "push_index", "push_sample",
           "skopeo_copy", "write_oci_layout"]


def index_of(images: list[BuiltImage]) -> bytes:
    return json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX,
                       "manifests": [i.descriptor().to_json() for i in images]},
                      sort_keys=True).encode()


def write_oci_layout(directory: Path, tag: str, images: list[BuiltImage]) -> None:
    """An OCI image layout; `tag` names the image, or an index if there are several."""
    blobs = directory / "blobs" / "sha256"
    blobs.mkdir(parents=True, exist_ok=True)
    for image in images:
        for blob in (*[layer.read() for layer in image.layers], image.config, image.manifest):
            (blobs / sha256_digest(blob).removeprefix("sha256:")).write_bytes(blob)
    if len(images) == 1:
        top = images[0].descriptor().to_json()
        top.pop("platform")
    else:
        index = index_of(images)
        (blobs / sha256_digest(index).removeprefix("sha256:")).write_bytes(index)
        top = {"mediaType": OCI_INDEX, "digest": sha256_digest(index), "size": len(index)}
    top["annotations"] = {"org.opencontainers.image.ref.name": tag}
    (directory / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    (directory / "index.json").write_text(json.dumps(
        {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [top]}))


async def skopeo_copy(source: str, dest: str, *, creds: str | None = None,
                      all_platforms: bool = False, docker_format: bool = False) -> None:
    """`skopeo copy` between transports (`oci:DIR:TAG`, `docker://HOST/REPO:TAG`)."""
    if shutil.which("skopeo") is None:
        raise AssertionError("skopeo not installed: apt-get install skopeo")
    args = ["skopeo", "--insecure-policy", "copy", "--src-tls-verify=false",
            "--dest-tls-verify=false"]
    if creds is not None:
        flag = "--dest-creds" if dest.startswith("docker://") else "--src-creds"
        args.append(f"{flag}={creds}")
    if all_platforms:
        args.append("--all")
    if docker_format:
        args.append("--format=v2s2")  # Docker schema 2 manifest (and manifest list)
    process = await asyncio.create_subprocess_exec(*args, source, dest,
                                                   stdout=asyncio.subprocess.PIPE,
                                                   stderr=asyncio.subprocess.STDOUT)
    output, _ = await process.communicate()
    if process.returncode != 0:
        raise AssertionError(f"{' '.join(args)} {source} {dest} failed:\n{output.decode()}")


async def push_index(client: RegistryClient, ref: ImageRef, images: list[BuiltImage]) -> str:
    """Push several images by digest and an index of them under `ref`'s tag."""
    for image in images:
        await push_sample(client, ref.with_digest(image.digest), image)
    return await client.put_manifest(ref, index_of(images), OCI_INDEX)
