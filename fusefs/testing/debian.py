"""A Debian root filesystem with python3, from debootstrap, packed as one cached gzip layer.

`python3_base_layer(cache_dir, arch)` runs

    debootstrap --variant=minbase --include=python3 --arch=ARCH bookworm ROOT MIRROR

removes what a container does not need (apt caches and lists, logs, the
device nodes debootstrap makes in /dev: a runtime mounts its own /dev), packs
the tree with `tar --numeric-owner --sort=name` and compresses it with
`gzip -6 -n`. The mirror is the one this machine's apt already uses (first
`deb` entry for the suite in /etc/apt/sources.list or
/etc/apt/sources.list.d/*.list|*.sources); no public host is written here, so
a site with its own mirror or proxy builds from it.

debootstrap takes minutes, so the layer is cached under
`~/.cache/bootseer/sample-images/` in a directory named by a key over every
input (suite, variant, packages, mirror, architecture, recipe version): a
second call on the machine returns at once, and a change of any input builds
anew. A cached layer is a `NAME.tar.gz` with a sidecar `NAME.json` holding
its digest, diff_id and size (`record`/`cached`, also used by the big-file
layer); the sidecar is written last, so a half-built layer is never used.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

from fusefs.image.tool import ToolError, run_tool

SUITE = "bookworm"
VARIANT = "minbase"
INCLUDE = ("python3",)
RECIPE = 1  # bump when the build or clean-up steps change
APT_DIR = Path("/etc/apt")
# Paths (relative to the root) whose contents are removed before packing.
CLEANED = ("var/cache/apt", "var/lib/apt/lists", "var/log", "var/cache/debconf",
           "dev", "tmp", "var/tmp", "run")
HASH_BLOCK_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class BaseInputs:
    """Everything the base layer's bytes depend on; its key names the cache entry."""

    suite: str
    variant: str
    include: tuple[str, ...]
    mirror: str
    arch: str
    recipe: int = RECIPE

    def key(self) -> str:
        fields = json.dumps(asdict(self), sort_keys=True).encode()
        return hashlib.sha256(fields).hexdigest()[:16]


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "bootseer" / "sample-images"


# -- the mirror ------------------------------------------------------------------------------

def mirror_from_sources(files: Iterable[tuple[str, str]], suite: str) -> str | None:
    """The URI of the first `deb` source for `suite` in (file name, text) pairs, in order.

    `.list` files hold one-line entries (`deb [opts] URI SUITE COMPONENTS`);
    `.sources` files hold deb822 stanzas (`Types:`, `URIs:`, `Suites:`).
    """
    for name, text in files:
        entries = _deb822(text) if name.endswith(".sources") else _one_line(text)
        for uri, suites in entries:
            if suite in suites:
                return uri
    return None


def _one_line(text: str) -> Iterable[tuple[str, list[str]]]:
    for line in text.splitlines():
        words = line.split("#", 1)[0].split()
        if len(words) >= 3 and words[0] == "deb":
            if words[1].startswith("["):
                close = next((i for i, w in enumerate(words) if w.endswith("]")), len(words))
                words = [words[0], *words[close + 1:]]
            if len(words) >= 3:
                yield words[1], [words[2]]


def _deb822(text: str) -> Iterable[tuple[str, list[str]]]:
    for stanza in text.split("\n\n"):
        fields: dict[str, str] = {}
        for line in stanza.splitlines():
            key, sep, value = line.partition(":")
            if sep and not line.startswith((" ", "#")):
                fields[key.strip().lower()] = value.strip()
        if "deb" in fields.get("types", "").split() and fields.get("enabled", "yes") != "no":
            suites = fields.get("suites", "").split()
            for uri in fields.get("uris", "").split():
                yield uri, suites


def machine_mirror(suite: str = SUITE, apt_dir: Path = APT_DIR) -> str:
    """The mirror this machine's apt uses for `suite`; `ToolError` if it has none."""
    paths = [apt_dir / "sources.list"]
    parts = apt_dir / "sources.list.d"
    if parts.is_dir():
        paths += sorted(p for p in parts.iterdir() if p.suffix in (".list", ".sources"))
    files = [(p.name, p.read_text()) for p in paths if p.is_file()]
    mirror = mirror_from_sources(files, suite)
    if mirror is None:
        raise ToolError(f"no apt source for Debian {suite} in {apt_dir}/sources.list or "
                        f"{parts}/: debootstrap needs a mirror to build the python3 image")
    return mirror


# -- the cache -------------------------------------------------------------------------------

def record(layer: Path, digest: str, diff_id: str, size: int) -> None:
    """Write the sidecar that marks `layer` complete."""
    layer.with_suffix("").with_suffix(".json").write_text(
        json.dumps({"digest": digest, "diff_id": diff_id, "size": size}))


def cached(layer: Path) -> tuple[str, str, int] | None:
    """(digest, diff_id, size) of a complete cached layer, else None."""
    sidecar = layer.with_suffix("").with_suffix(".json")
    if not (layer.is_file() and sidecar.is_file()):
        return None
    info = json.loads(sidecar.read_text())
    return info["digest"], info["diff_id"], int(info["size"])


def file_sha256(path: Path) -> str:
    sha = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(HASH_BLOCK_BYTES):
            sha.update(block)
    return "sha256:" + sha.hexdigest()


# -- the build -------------------------------------------------------------------------------

async def python3_base_layer(cache_dir: Path, arch: str = "amd64",
                             packages: tuple[str, ...] = INCLUDE) -> Path:
    """The cached base layer's `.tar.gz` (see `cached` for its digests), built if absent;
    `packages` are the Debian packages installed on top of minbase."""
    inputs = BaseInputs(SUITE, VARIANT, packages, machine_mirror(SUITE), arch)
    layer = cache_dir / f"python3-{inputs.key()}.tar.gz"
    if cached(layer) is None:
        cache_dir.mkdir(parents=True, exist_ok=True)
        await _build(inputs, layer)
    return layer


async def _build(inputs: BaseInputs, layer: Path) -> None:
    work = layer.with_suffix("").with_suffix(".build")
    shutil.rmtree(work, ignore_errors=True)
    root, tar = work / "root", work / "layer.tar"
    try:
        started = time.monotonic()
        await run_tool(["debootstrap", f"--variant={inputs.variant}",
                        f"--include={','.join(inputs.include)}", f"--arch={inputs.arch}",
                        inputs.suite, str(root), inputs.mirror], "debootstrap")
        debootstrap_s = time.monotonic() - started
        _clean(root)
        names = sorted(p.name for p in root.iterdir())
        await run_tool(["tar", "--numeric-owner", "--sort=name", "-C", str(root), "-cf",
                        str(tar), *names], "packing the python3 layer")
        diff_id = await asyncio.to_thread(file_sha256, tar)
        await run_tool(["gzip", "-6", "-n", str(tar)], "compressing the python3 layer")
        gz = tar.with_suffix(".tar.gz")
        digest = await asyncio.to_thread(file_sha256, gz)
        gz.rename(layer)
        record(layer, digest, diff_id, layer.stat().st_size)
        seconds = layer.with_suffix("").with_suffix(".seconds")
        seconds.write_text(f"debootstrap {debootstrap_s:.1f}\n")
    finally:
        await asyncio.to_thread(shutil.rmtree, work, True)


def _clean(root: Path) -> None:
    """Empty the directories a container does not need (see CLEANED); keep the dirs."""
    for relative in CLEANED:
        directory = root / relative
        if not directory.is_dir() or directory.is_symlink():
            continue
        for child in directory.iterdir():
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()
