"""What a publisher computes from a local file: its manifest, read once in large blocks."""

from __future__ import annotations

from pathlib import Path

from p2p.content import DEFAULT_DIGEST, Manifest, ManifestBuilder


def manifest_of_file(path: Path, chunk_size: int, origin: str,
                     digest: str = DEFAULT_DIGEST) -> Manifest:
    builder = ManifestBuilder(chunk_size, digest)
    with open(path, "rb") as f:
        while block := f.read(16 * chunk_size):
            builder.feed(block)
    return builder.finish("blob", origin)
