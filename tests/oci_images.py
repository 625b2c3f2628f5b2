"""Small real images for the registry tests (not a test module).

`busybox_image(arch)` packs Debian's `busybox-static` binary (`/bin/busybox`)
and a few applet symlinks into one gzip tar layer, with an OCI image config
(whose `diff_ids` is the sha256 of the uncompressed tar) and an OCI image
manifest. Tars and gzip streams are deterministic (fixed times, owners), so
the same inputs give the same digests. The `arch` label is recorded in the
config and in `/etc/bootseer-platform`, so two platforms have distinct layers.

Such images reach a registry two ways, both tested: `write_oci_layout` +
`skopeo_copy` (skopeo reading an OCI layout directory), and `push_image`
(our own client).
"""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import io
import json
import shutil
import tarfile
from dataclasses import dataclass
from pathlib import Path

from p2p.origin.oci import RegistryClient, sha256_digest
from p2p.origin.oci_manifest import OCI_INDEX, OCI_MANIFEST, Descriptor, Platform
from p2p.origin.oci_ref import ImageRef

BUSYBOX = Path("/bin/busybox")
APPLETS = ("sh", "ls", "cat", "echo", "true")
LAYER_TYPE = "application/vnd.oci.image.layer.v1.tar+gzip"
CONFIG_TYPE = "application/vnd.oci.image.config.v1+json"


@dataclass(frozen=True)
class BuiltImage:
    platform: Platform
    layer: bytes  # gzip tar
    config: bytes
    manifest: bytes

    @property
    def layer_digest(self) -> str:
        return sha256_digest(self.layer)

    @property
    def digest(self) -> str:
        return sha256_digest(self.manifest)

    def descriptor(self) -> Descriptor:
        return Descriptor(OCI_MANIFEST, self.digest, len(self.manifest), self.platform)


def _tar(arch: str) -> bytes:
    if not BUSYBOX.is_file():
        raise AssertionError("busybox not installed: apt-get install busybox-static")
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in ("bin", "etc"):
            tar.addfile(_info(name, tarfile.DIRTYPE, 0o755))
        data = BUSYBOX.read_bytes()
        tar.addfile(_info("bin/busybox", tarfile.REGTYPE, 0o755, len(data)), io.BytesIO(data))
        for applet in APPLETS:
            link = _info(f"bin/{applet}", tarfile.SYMTYPE, 0o777)
            link.linkname = "busybox"
            tar.addfile(link)
        label = f"linux/{arch}\n".encode()
        tar.addfile(_info("etc/bootseer-platform", tarfile.REGTYPE, 0o644, len(label)),
                    io.BytesIO(label))
    return out.getvalue()


def _info(name: str, kind: bytes, mode: int, size: int = 0) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.size, info.mtime = kind, mode, size, 1_700_000_000
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


def busybox_image(arch: str = "amd64") -> BuiltImage:
    tar = _tar(arch)
    layer = gzip.compress(tar, compresslevel=6, mtime=0)
    config = json.dumps({
        "architecture": arch, "os": "linux",
        "config": {"Cmd": ["/bin/sh"], "Env": ["PATH=/bin"]},
        "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(tar).hexdigest()]},
    }, sort_keys=True).encode()
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": OCI_MANIFEST,
        "config": {"mediaType": CONFIG_TYPE, "digest": sha256_digest(config),
                   "size": len(config)},
        "layers": [{"mediaType": LAYER_TYPE, "digest": sha256_digest(layer),
                    "size": len(layer)}],
    }, sort_keys=True).encode()
    return BuiltImage(Platform("linux", arch), layer, config, manifest)


def index_of(images: list[BuiltImage]) -> bytes:
    return json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX,
                       "manifests": [i.descriptor().to_json() for i in images]},
                      sort_keys=True).encode()


def write_oci_layout(directory: Path, tag: str, images: list[BuiltImage]) -> None:
    """An OCI image layout; `tag` names the image, or an index if there are several."""
    blobs = directory / "blobs" / "sha256"
    blobs.mkdir(parents=True, exist_ok=True)
    for image in images:
        for blob in (image.layer, image.config, image.manifest):
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


async def push_image(client: RegistryClient, ref: ImageRef, image: BuiltImage) -> str:
    """Push one image with our own client under `ref` (its tag or its digest)."""
    await client.push_blob(ref, image.layer)
    await client.push_blob(ref, image.config)
    return await client.put_manifest(ref, image.manifest, OCI_MANIFEST)


async def push_index(client: RegistryClient, ref: ImageRef, images: list[BuiltImage]) -> str:
    """Push several images by digest and an index of them under `ref`'s tag."""
    for image in images:
        await push_image(client, ref.with_digest(image.digest), image)
    return await client.put_manifest(ref, index_of(images), OCI_INDEX)
