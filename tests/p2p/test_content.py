"""Content ids certify their manifests; digests are a manifest field."""

from __future__ import annotations

import dataclasses

import pytest

from p2p.content import (
    DIGESTS,
    ContentId,
    Manifest,
    ManifestBuilder,
    ManifestError,
    check_content_id,
)

DATA = bytes(range(256)) * 1000  # 256,000 bytes: 3 full 64 KiB chunks and a short one


def build(data: bytes = DATA, digest: str = "xxh3-128", chunk: int = 65536) -> Manifest:
    builder = ManifestBuilder(chunk, digest)
    for start in range(0, len(data), 10_000):  # fed in blocks unaligned with chunks
        builder.feed(data[start:start + 10_000])
    return builder.finish("blob", "file:///origin")


@pytest.mark.parametrize("digest", sorted(DIGESTS))
def test_builder_derives_an_id_that_round_trips(digest: str) -> None:
    manifest = build(digest=digest)
    assert manifest.chunks == 4 and manifest.digest == digest
    assert len(manifest.digests[0]) == DIGESTS[digest][0]
    assert Manifest.from_dict(manifest.to_dict()) == manifest
    assert check_content_id(manifest.content_id) == manifest.content_id
    assert manifest.verify(3, DATA[3 * 65536:])
    assert not manifest.verify(3, DATA[3 * 65536:-1] + b"\0")


def test_the_id_covers_bytes_geometry_and_algorithm_but_not_the_origin() -> None:
    base = build()
    assert build(DATA[:-1] + b"\0").content_id != base.content_id
    assert build(chunk=32768).content_id != base.content_id
    assert build(digest="blake3").content_id != base.content_id
    moved = dataclasses.replace(base, origin="http://elsewhere/blob", kind="layer")
    assert moved.content_id == base.content_id  # where the bytes live is not what they are


def test_an_id_cannot_name_other_bytes() -> None:
    real, other = build(), build(DATA[::-1])
    forged = {**other.to_dict(), "content_id": real.content_id}
    with pytest.raises(ManifestError, match="does not match its manifest"):
        Manifest.from_dict(forged)
    with pytest.raises(ManifestError, match="does not match its manifest"):
        dataclasses.replace(real, size=real.size - 1, digests=other.digests)


@pytest.mark.parametrize("text", [
    "", "x3-abc-10", "c1-" + "0" * 63, "c1-" + "0" * 65, "c1-" + "G" * 64,
    "c1-" + "0" * 63 + "/", "c1-%2F" + "0" * 60, "../etc/passwd", "C1-" + "0" * 64, 12,
])
def test_malformed_ids_are_refused(text: object) -> None:
    with pytest.raises(ManifestError, match="is not a content id"):
        check_content_id(text)


@pytest.mark.parametrize("field, value, message", [
    ("digest", "md5", "unknown digest algorithm"),
    ("digests", ["00" * 16], "1 digests for 4 chunks"),
    ("content_id", "c1-" + "0" * 64, "does not match"),
    ("size", -1, "negative size"),
    ("chunk_size", 0, "chunk size 0"),
    ("origin", "x" * 5000, "limited to"),
    ("size", "12", "expected int"),
])
def test_malformed_manifests_say_what_is_wrong(field: str, value: object, message: str) -> None:
    raw = {**build().to_dict(), field: value}
    with pytest.raises(ManifestError, match=message):
        Manifest.from_dict(raw)


def test_digests_of_the_wrong_width_for_the_algorithm_are_refused() -> None:
    raw = {**build().to_dict(), "digest": "blake3"}  # 16-byte digests, blake3 wants 32
    with pytest.raises(ManifestError, match="32 bytes"):
        Manifest.from_dict(raw)


def test_an_empty_content_has_no_chunks() -> None:
    manifest = build(b"")
    assert manifest.chunks == 0 and manifest.size == 0
    assert check_content_id(manifest.content_id) == ContentId(manifest.content_id)
