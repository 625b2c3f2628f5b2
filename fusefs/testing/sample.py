"""Sample OCI images for the tests and the image benchmark, ready to push.

An image here is a `BuiltImage`: its layers (gzip tars), its OCI config and
its OCI manifest, as the registry will hold them. Three builders:

- `busybox_image(arch)`: Debian's `busybox-static` binary and a few applet
  symlinks in one small layer, built in memory in milliseconds. Tars and
  gzip streams are deterministic (fixed times and owners, gzip mtime 0), so
  the same inputs give the same digests. `arch` is recorded in the config and
  in `/etc/bootseer-platform`, so two platforms have distinct layers.
- `python3_image(...)` (async): a Debian bookworm minbase tree with python3
  from debootstrap (`fusefs.testing.debian`, built once per machine and
  cached), an optional small layer on top (a few files and one whiteout of a
  base file, so a reader must merge layers), and an optional layer holding
  one incompressible file of `big_file_bytes` for read-throughput tests.
- `big_file_layer(n, seed)`: that last layer on its own, cached too.

Small layers live in memory (`Layer.blob` is bytes); big ones in a cache
file (`Layer.blob` is a Path). `push_sample` pushes the blobs and then the
manifest with the project's `RegistryClient`; that client uploads a blob in
one request, so a file layer is read into memory for its push.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import json
import random
import tarfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

from fusefs.image.tool import ToolError
from fusefs.testing import debian
from p2p.origin.oci import RegistryClient, sha256_digest
from p2p.origin.oci_manifest import OCI_MANIFEST, Descriptor, Platform
from p2p.origin.oci_ref import ImageRef
from p2p.units import MiB

BUSYBOX = Path("/bin/busybox")
APPLETS = ("sh", "ls", "cat", "echo", "true", "env", "id", "pwd", "touch", "mkdir", "sleep",
           "kill")
LAYER_TYPE = "application/vnd.oci.image.layer.v1.tar+gzip"
PLAIN_LAYER_TYPE = "application/vnd.oci.image.layer.v1.tar"
CONFIG_TYPE = "application/vnd.oci.image.config.v1+json"
FIXED_MTIME = 1_700_000_000
BIG_FILE_PATH = "data/big.bin"
WHITED_OUT = "etc/motd"  # shipped by Debian's base-files; hidden by the top layer
DEBIAN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Level 1: random bytes do not compress at any level, and level 6 is ~3x slower on them.
BIG_GZIP_LEVEL = 1
BIG_RECIPE = 1  # bump when the big layer's contents change for the same inputs


@dataclass(frozen=True, slots=True)
class Layer:
    """One tar layer (gzip unless `media_type` says otherwise): its bytes (small) or the
    file holding them (big)."""

    blob: bytes | Path
    digest: str  # sha256 of the gzip stream: the registry's name for it
    diff_id: str  # sha256 of the tar: the config's name for it
    size: int
    media_type: str = LAYER_TYPE

    def read(self) -> bytes:
        return self.blob if isinstance(self.blob, bytes) else self.blob.read_bytes()

    @classmethod
    def cached(cls, path: Path) -> Layer:
        """A layer built into the cache (`fusefs.testing.debian.record`)."""
        info = debian.cached(path)
        if info is None:
            raise ToolError(f"cached layer {path} is incomplete; delete it and build again")
        return cls(path, *info)

    @classmethod
    def of_tar(cls, tar: bytes) -> Layer:
        layer = gzip.compress(tar, compresslevel=6, mtime=0)
        return cls(layer, sha256_digest(layer), sha256_digest(tar), len(layer))

    @classmethod
    def of_plain_tar(cls, tar: bytes) -> Layer:
        """An uncompressed layer (for incompressible contents, gzip only costs time)."""
        digest = sha256_digest(tar)
        return cls(tar, digest, digest, len(tar), PLAIN_LAYER_TYPE)


@dataclass(frozen=True, slots=True)
class BuiltImage:
    platform: Platform
    layers: tuple[Layer, ...]
    config: bytes
    manifest: bytes

    @property
    def digest(self) -> str:
        return sha256_digest(self.manifest)

    def descriptor(self) -> Descriptor:
        return Descriptor(OCI_MANIFEST, self.digest, len(self.manifest), self.platform)

    def config_json(self) -> dict[str, object]:
        """The config's `config` object (Env, Cmd, User...), as `runtime` reads it."""
        return dict(json.loads(self.config)["config"])


def assemble(platform: Platform, layers: Iterable[Layer], run: Mapping[str, object]) -> BuiltImage:
    """An image of `layers` (bottom first) whose config's `config` object is `run`."""
    layers = tuple(layers)
    config = json.dumps({
        "architecture": platform.architecture, "os": platform.os, "config": dict(run),
        "rootfs": {"type": "layers", "diff_ids": [layer.diff_id for layer in layers]},
    }, sort_keys=True).encode()
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": OCI_MANIFEST,
        "config": {"mediaType": CONFIG_TYPE, "digest": sha256_digest(config),
                   "size": len(config)},
        "layers": [{"mediaType": layer.media_type, "digest": layer.digest,
                    "size": layer.size} for layer in layers],
    }, sort_keys=True).encode()
    return BuiltImage(platform, layers, config, manifest)


async def push_sample(client: RegistryClient, ref: ImageRef, image: BuiltImage) -> str:
    """Push `image` under `ref` (its tag or its digest); the manifest digest."""
    for layer in image.layers:
        await client.push_blob(ref, layer.read())
    await client.push_blob(ref, image.config)
    return await client.put_manifest(ref, image.manifest, OCI_MANIFEST)


# -- tar entries -----------------------------------------------------------------------------

def entry(name: str, kind: bytes, mode: int, size: int = 0, link: str = "") -> tarfile.TarInfo:
    """A tar header owned by root with a fixed mtime (deterministic layers)."""
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.size, info.mtime = kind, mode, size, FIXED_MTIME
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    info.linkname = link
    return info


def add_file(tar: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    tar.addfile(entry(name, tarfile.REGTYPE, mode, len(data)), io.BytesIO(data))


def add_dirs(tar: tarfile.TarFile, *names: str) -> None:
    for name in names:
        tar.addfile(entry(name, tarfile.DIRTYPE, 0o755))


# -- busybox ---------------------------------------------------------------------------------

def busybox_tar(arch: str) -> bytes:
    if not BUSYBOX.is_file():
        raise ToolError("busybox is not installed (Debian package busybox-static: "
                               "apt-get install busybox-static)")
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        add_dirs(tar, "bin", "etc")
        add_file(tar, "bin/busybox", BUSYBOX.read_bytes(), 0o755)
        for applet in APPLETS:
            tar.addfile(entry(f"bin/{applet}", tarfile.SYMTYPE, 0o777, link="busybox"))
        add_file(tar, "etc/bootseer-platform", f"linux/{arch}\n".encode())
    return out.getvalue()


def busybox_image(arch: str = "amd64") -> BuiltImage:
    layer = Layer.of_tar(busybox_tar(arch))
    return assemble(Platform("linux", arch), [layer], {"Cmd": ["/bin/sh"], "Env": ["PATH=/bin"]})


# -- python3 ---------------------------------------------------------------------------------

def top_tar() -> bytes:
    """A few files over the Debian base, and a whiteout of one base file."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        add_dirs(tar, "app", "etc")
        add_file(tar, "app/hello.py", b'print("hello from the bootseer sample")\n')
        add_file(tar, "app/settings.json", b'{"sample": true}\n')
        add_file(tar, "etc/bootseer-sample", b"python3 sample, top layer\n")
        parent, _, name = WHITED_OUT.rpartition("/")
        add_file(tar, f"{parent}/.wh.{name}", b"")
    return out.getvalue()


async def python3_image(*, big_file_bytes: int = 0, big_file_plain: bool = False,
                        top_layer: bool = True,
                        cache_dir: Path | None = None, arch: str = "amd64",
                        packages: tuple[str, ...] = debian.INCLUDE) -> BuiltImage:
    """Debian bookworm minbase + `packages` (python3); optional top layer and big-file
    layer (see above)."""
    cache = cache_dir or debian.default_cache_dir()
    layers = [Layer.cached(await debian.python3_base_layer(cache, arch, packages))]
    if top_layer:
        layers.append(Layer.of_tar(top_tar()))
    if big_file_bytes:
        layers.append(big_file_layer(big_file_bytes, cache, plain=big_file_plain))
    run = {"Env": [f"PATH={DEBIAN_PATH}", "LANG=C.UTF-8"], "Cmd": ["python3"],
           "WorkingDir": "/"}
    return assemble(Platform("linux", arch), layers, run)


# -- the big file ----------------------------------------------------------------------------

class _PrngReader:
    """`size` bytes from a seeded PRNG, as a file to read (incompressible, repeatable)."""

    def __init__(self, size: int, seed: int) -> None:
        self._left, self._rng = size, random.Random(seed)

    def read(self, n: int = -1) -> bytes:
        n = self._left if n < 0 else min(n, self._left)
        self._left -= n
        return self._rng.randbytes(n)


class _Sink(Protocol):
    def write(self, data: bytes, /) -> int: ...
    def flush(self) -> None: ...


class _HashingWriter:
    """Writes through to `sink` while hashing and counting what passes."""

    def __init__(self, sink: _Sink) -> None:
        self.sink, self.sha, self.size = sink, hashlib.sha256(), 0

    def write(self, data: bytes) -> int:
        self.sha.update(data)
        self.size += len(data)
        return self.sink.write(data)

    def flush(self) -> None:
        self.sink.flush()


def big_file_layer(size: int, cache_dir: Path, seed: int = 0, plain: bool = False) -> Layer:
    """A layer with one file of `size` PRNG bytes at `BIG_FILE_PATH`, cached by its inputs;
    gzip (level 1), or with `plain` an uncompressed tar layer."""
    name = f"big-{size}-{seed}-r{BIG_RECIPE}"
    path = cache_dir / (f"{name}-plain.tar" if plain else f"{name}.tar.gz")
    if debian.cached(path) is None:
        cache_dir.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".partial")
        with partial.open("wb") as raw:
            blob_hash = _HashingWriter(raw)
            with contextlib.ExitStack() as stack:
                sink: _Sink = blob_hash if plain else stack.enter_context(gzip.GzipFile(
                    fileobj=blob_hash, mode="wb", compresslevel=BIG_GZIP_LEVEL, mtime=0))
                tar_hash = _HashingWriter(sink)
                with tarfile.open(fileobj=tar_hash, mode="w|",  # type: ignore[call-overload]
                                  format=tarfile.PAX_FORMAT, bufsize=4 * MiB) as tar:
                    add_dirs(tar, "data")
                    tar.addfile(entry(BIG_FILE_PATH, tarfile.REGTYPE, 0o644, size),
                                _PrngReader(size, seed))
        partial.rename(path)
        debian.record(path, "sha256:" + blob_hash.sha.hexdigest(),
                      "sha256:" + tar_hash.sha.hexdigest(), blob_hash.size)
    layer = Layer.cached(path)
    return replace(layer, media_type=PLAIN_LAYER_TYPE) if plain else layer
