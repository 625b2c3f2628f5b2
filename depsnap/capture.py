"""Capture an installed prefix as a snapshot: walk it, hash it, write its packs.

`scan` walks the prefix without following symlinks and lists every
directory, file and symlink with its mode and mtime (files with their size
and BLAKE3 digest, read once). Sockets, FIFOs and devices have no place in an
installed environment and are refused. `write_packs` lays the files out into
packs (`snapshot.layout_packs`), writes each pack as zstd frames
(`depsnap.frames`) into `packs_dir` under its content id, computing its swarm
manifest on the way, and returns the packs and their manifests. A pack that
is already there (the same numpy in another snapshot) is not written again:
same bytes, same id. Each pack is written to a temporary name and renamed, so
a reader never sees half a pack.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import blake3

from depsnap.frames import FRAME_BYTES, FrameWriter
from depsnap.snapshot import PACK_KIND, PERMISSION_BITS, Entry, Pack, PackLayout, layout_packs
from p2p.content import CHUNK_SIZE, Manifest, ManifestBuilder
from p2p.errors import UserError
from p2p.units import MiB

# The swarm's default. Measured side by side (restore of numpy/pandas/pyarrow/scipy from
# one peer, two rounds): 4 MiB chunks 1.4-2.1 s, 1 MiB chunks 2.3-2.7 s (fewer chunk
# round trips and store files); the lazy mount fetches a whole file on its first read
# anyway (depsnap.source), so finer chunks buy it little.
PACK_CHUNK_BYTES = CHUNK_SIZE
BLOCK = 4 * MiB


class CaptureError(UserError):
    """The prefix cannot be captured; the message names the path."""


def scan(prefix: Path) -> list[Entry]:
    """Every path under `prefix`, parents before children, names sorted."""
    entries: list[Entry] = []
    _scan_dir(prefix, "", entries)
    return entries


def _scan_dir(root: Path, rel: str, out: list[Entry]) -> None:
    with os.scandir(root / rel if rel else root) as it:
        items = sorted(it, key=lambda d: d.name)
    for item in items:
        path = f"{rel}/{item.name}" if rel else item.name
        st = item.stat(follow_symlinks=False)
        mode = stat.S_IMODE(st.st_mode) & PERMISSION_BITS
        if stat.S_ISDIR(st.st_mode):
            out.append(Entry(path, "dir", mode, st.st_mtime_ns))
            _scan_dir(root, path, out)
        elif stat.S_ISLNK(st.st_mode):
            out.append(Entry(path, "symlink", mode, st.st_mtime_ns,
                             target=os.readlink(item.path)))
        elif stat.S_ISREG(st.st_mode):
            out.append(Entry(path, "file", mode, st.st_mtime_ns, st.st_size,
                             _digest(Path(item.path))))
        else:
            raise CaptureError(f"{item.path}: neither a file, a directory nor a symlink; "
                               "an installed environment should hold none")


def _digest(path: Path) -> str:
    h = blake3.blake3()
    with open(path, "rb") as f:
        while block := f.read(BLOCK):
            h.update(block)
    return h.hexdigest()


@dataclass(frozen=True, slots=True)
class WrittenPacks:
    packs: tuple[Pack, ...]
    manifests: tuple[Manifest, ...]
    new_bytes: int  # bytes of packs that were not in packs_dir before


def write_packs(prefix: Path, entries: list[Entry], packs_dir: Path, origin_url: str
                ) -> WrittenPacks:
    """Write the packs of `entries` into `packs_dir` (see the module docstring)."""
    files = {e.digest: prefix / e.path for e in entries if e.kind == "file"}
    packs, manifests, new_bytes = [], [], 0
    packs_dir.mkdir(parents=True, exist_ok=True)
    for layout in layout_packs(e for e in entries if e.kind == "file"):
        manifest, frames, fresh = _write_pack(layout, files, packs_dir, origin_url)
        packs.append(Pack(layout.name, manifest.content_id, layout.size, layout.members,
                          FRAME_BYTES, frames))
        manifests.append(manifest)
        new_bytes += manifest.size if fresh else 0
    return WrittenPacks(tuple(packs), tuple(manifests), new_bytes)


def _write_pack(layout: PackLayout, files: dict[str, Path], packs_dir: Path,
                origin_url: str) -> tuple[Manifest, tuple[int, ...], bool]:
    """The pack's manifest, its frames' stored lengths, and whether it is new."""
    builder = ManifestBuilder(PACK_CHUNK_BYTES)
    frames = FrameWriter()
    fd, tmp = tempfile.mkstemp(prefix=".pack-", dir=packs_dir)
    try:
        with os.fdopen(fd, "wb") as out:
            for member in layout.members:
                with open(files[member.digest], "rb") as f:
                    while block := f.read(BLOCK):
                        _write_frames(frames.feed(block), builder, out)
            _write_frames(frames.finish(), builder, out)
        probe = builder.finish(PACK_KIND, "")
        final = packs_dir / probe.content_id
        fresh = not final.exists()
        if fresh:
            os.chmod(tmp, 0o644)
            os.rename(tmp, final)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    url = f"{origin_url.rstrip('/')}/packs/{probe.content_id}"
    return Manifest(probe.content_id, PACK_KIND, probe.size, probe.chunk_size, probe.digests,
                    url, probe.digest), tuple(frames.frames), fresh


def _write_frames(stored: list[bytes], builder: ManifestBuilder, out: IO[bytes]) -> None:
    for frame in stored:
        builder.feed(frame)
        out.write(frame)


def publish_file(data: bytes, directory: Path, origin_url: str, kind: str,
                 subdir: str) -> Manifest:
    """Write `data` (a tree manifest) under its content id; its swarm manifest."""
    builder = ManifestBuilder(PACK_CHUNK_BYTES)
    builder.feed(data)
    probe = builder.finish(kind, "")
    target = directory / subdir
    target.mkdir(parents=True, exist_ok=True)
    final = target / probe.content_id
    if not final.exists():
        fd, tmp = tempfile.mkstemp(prefix=".tree-", dir=target)
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.chmod(tmp, 0o644)
        os.rename(tmp, final)
    url = f"{origin_url.rstrip('/')}/{subdir}/{probe.content_id}"
    return Manifest(probe.content_id, kind, probe.size, probe.chunk_size, probe.digests, url,
                    probe.digest)
