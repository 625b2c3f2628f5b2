"""The chunk store on a real disk (and a real, tiny, full tmpfs)."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from p2p.chunkview import ChunkView, RecentChunks
from p2p.content import ContentId, Manifest, ManifestBuilder
from p2p.store import (
    ChunkStore,
    CorruptChunk,
    DamagedChunk,
    MissingChunk,
    StoreFullError,
    UnknownContent,
)
from p2p.units import KiB

CHUNK = 64 * KiB


def make(name: str, size: int, chunk: int = CHUNK, seed: int = 0) -> tuple[Manifest, bytes]:
    seed += sum(name.encode())  # ids are derived from the bytes: differ by name too
    data = bytes((i * 7 + seed + i // 251) % 256 for i in range(size))
    builder = ManifestBuilder(chunk)
    builder.feed(data)
    return builder.finish("test", "file:///nowhere"), data


def chunk_of(manifest: Manifest, data: bytes, index: int) -> bytes:
    start = manifest.chunk_offset(index)
    return data[start:start + manifest.chunk_length(index)]


def fill(store: ChunkStore, manifest: Manifest, data: bytes) -> None:
    for i in range(manifest.chunks):
        store.put(manifest.content_id, i, chunk_of(manifest, data, i))


def chunk_files(root: Path, manifest: Manifest) -> list[str]:
    return sorted(p.name for p in (root / manifest.content_id).glob("*.chunk"))


def test_put_then_read_any_range(tmp_path: Path) -> None:
    manifest, data = make("c1", 3 * CHUNK + 100)
    store = ChunkStore(tmp_path, 1 << 30)
    assert store.attach(manifest) == [False] * 4
    fill(store, manifest, data)
    assert store.present(manifest.content_id) == [True] * 4
    assert store.has(manifest.content_id, 3)
    assert store.used_bytes == len(data)
    for offset, length in [(0, len(data)), (5, 10), (CHUNK - 3, 7), (CHUNK, CHUNK),
                           (len(data) - 1, 1), (10, 0), (CHUNK - 1, 2 * CHUNK + 2)]:
        assert store.read(manifest.content_id, offset, length) == data[offset:offset + length]
    with pytest.raises(ValueError):
        store.read(manifest.content_id, len(data) - 1, 2)


def test_put_is_idempotent(tmp_path: Path) -> None:
    manifest, data = make("c1", CHUNK)
    store = ChunkStore(tmp_path, 1 << 30)
    store.attach(manifest)
    store.put(manifest.content_id, 0, memoryview(data))
    store.put(manifest.content_id, 0, bytearray(data))
    assert store.used_bytes == CHUNK


def test_corrupt_chunk_is_rejected_and_nothing_written(tmp_path: Path) -> None:
    manifest, data = make("c1", 2 * CHUNK)
    store = ChunkStore(tmp_path, 1 << 30)
    store.attach(manifest)
    bad = bytearray(chunk_of(manifest, data, 1))
    bad[17] ^= 1
    with pytest.raises(CorruptChunk):
        store.put(manifest.content_id, 1, bad)
    with pytest.raises(CorruptChunk):
        store.put(manifest.content_id, 1, chunk_of(manifest, data, 1)[:-1])
    assert os.listdir(tmp_path / manifest.content_id) == ["manifest.json"]
    assert not store.has(manifest.content_id, 1)
    assert store.used_bytes == 0


def test_missing_chunks(tmp_path: Path) -> None:
    manifest, data = make("c1", 2 * CHUNK)
    store = ChunkStore(tmp_path, 1 << 30)
    store.attach(manifest)
    store.put(manifest.content_id, 0, chunk_of(manifest, data, 0))
    with pytest.raises(MissingChunk):
        store.read(manifest.content_id, CHUNK - 1, 2)
    with pytest.raises(MissingChunk):
        store.open_verified(manifest.content_id, 1)
    with pytest.raises(UnknownContent):
        store.put(ContentId("other"), 0, b"x")
    assert not store.has(ContentId("other"), 0)


def test_open_verified_gives_a_readable_fd(tmp_path: Path) -> None:
    manifest, data = make("c1", CHUNK + 10)
    store = ChunkStore(tmp_path, 1 << 30)
    store.attach(manifest)
    fill(store, manifest, data)
    fd, length = store.open_verified(manifest.content_id, 1)
    try:
        assert length == 10
        assert os.pread(fd, 100, 0) == data[CHUNK:]
    finally:
        os.close(fd)


def test_restart_keeps_verified_chunks_and_drops_damaged_ones(tmp_path: Path) -> None:
    manifest, data = make("c1", 4 * CHUNK)
    store = ChunkStore(tmp_path, 1 << 30)
    store.attach(manifest)
    fill(store, manifest, data)
    directory = tmp_path / manifest.content_id
    (directory / "1.chunk").write_bytes(b"\x00" + chunk_of(manifest, data, 1)[1:])
    with open(directory / "2.chunk", "r+b") as f:  # torn write after a power loss
        f.truncate(CHUNK // 2)
    (directory / "9.chunk").write_bytes(b"stray")
    (directory / "03.chunk").write_bytes(chunk_of(manifest, data, 3))

    again = ChunkStore(tmp_path, 1 << 30)
    assert again.known() == [manifest]
    assert not again.has(manifest.content_id, 0)  # known, but not served before re-verification
    assert again.attach(manifest) == [True, False, False, True]
    assert chunk_files(tmp_path, manifest) == ["0.chunk", "3.chunk"]
    assert again.used_bytes == 2 * CHUNK
    assert again.read(manifest.content_id, 0, CHUNK) == data[:CHUNK]
    with pytest.raises(MissingChunk):
        again.read(manifest.content_id, CHUNK, 1)


def test_stray_temp_files_are_removed_on_open(tmp_path: Path) -> None:
    manifest, _ = make("c1", CHUNK)
    store = ChunkStore(tmp_path, 1 << 30)
    store.attach(manifest)
    (tmp_path / manifest.content_id / ".0.chunk.abc123.tmp").write_bytes(b"half a chunk")
    (tmp_path / manifest.content_id / ".manifest.json.x.tmp").write_bytes(b"{")
    ChunkStore(tmp_path, 1 << 30)
    assert os.listdir(tmp_path / manifest.content_id) == ["manifest.json"]


def test_damaged_manifest_is_ignored(tmp_path: Path) -> None:
    manifest, _ = make("c1", CHUNK)
    ChunkStore(tmp_path, 1 << 30).attach(manifest)
    (tmp_path / manifest.content_id / "manifest.json").write_text("{not json")
    store = ChunkStore(tmp_path, 1 << 30)
    assert store.known() == []
    assert store.attach(manifest) == [False]  # the trusted manifest rewrites it
    assert ChunkStore(tmp_path, 1 << 30).known() == [manifest]


def test_budget_evicts_least_recently_used_unpinned_contents(tmp_path: Path) -> None:
    (a, da), (b, db), (c, dc), (d, dd) = (make(n, 2 * CHUNK, seed=i) for i, n in
                                          enumerate(["a", "b", "c", "d"]))
    store = ChunkStore(tmp_path, 5 * CHUNK)
    for m, data in ((a, da), (b, db)):
        store.attach(m)
        fill(store, m, data)
        store.detach(m.content_id)
    store.read(a.content_id, 0, 1)  # a is now more recently used than b
    store.attach(c)
    fill(store, c, dc)  # needs room: evicts b, the least recently used
    assert {m.content_id for m in store.known()} == {a.content_id, c.content_id}
    assert not (tmp_path / b.content_id).exists()
    store.attach(d)
    fill(store, d, dd)  # evicts a; c is pinned
    assert {m.content_id for m in store.known()} == {c.content_id, d.content_id}
    assert store.used_bytes == 4 * CHUNK


def test_full_budget_of_pinned_contents_raises(tmp_path: Path) -> None:
    (a, da), (b, db) = make("a", 2 * CHUNK), make("b", 2 * CHUNK, seed=1)
    store = ChunkStore(tmp_path, 3 * CHUNK)
    store.attach(a)
    store.attach(b)
    fill(store, a, da)
    store.put(b.content_id, 0, chunk_of(b, db, 0))
    with pytest.raises(StoreFullError, match="budget"):
        store.put(b.content_id, 1, chunk_of(b, db, 1))
    assert chunk_files(tmp_path, b) == ["0.chunk"]
    assert store.used_bytes == 3 * CHUNK
    store.detach(a.content_id)
    store.put(b.content_id, 1, chunk_of(b, db, 1))
    assert store.present(b.content_id) == [True, True]
    assert {m.content_id for m in store.known()} == {b.content_id}


def test_a_chunk_that_can_never_fit_evicts_nothing(tmp_path: Path) -> None:
    (a, da), (b, db) = make("a", CHUNK), make("b", 3 * CHUNK, chunk=3 * CHUNK)
    store = ChunkStore(tmp_path, 2 * CHUNK)
    store.attach(a)
    fill(store, a, da)
    store.detach(a.content_id)
    store.attach(b)
    with pytest.raises(StoreFullError):
        store.put(b.content_id, 0, db)
    assert {m.content_id for m in store.known()} == {a.content_id, b.content_id}
    assert store.used_bytes == CHUNK


def test_restart_counts_known_contents_against_the_budget(tmp_path: Path) -> None:
    (a, da), (b, db) = make("a", 2 * CHUNK), make("b", 2 * CHUNK, seed=1)
    store = ChunkStore(tmp_path, 3 * CHUNK)
    store.attach(a)
    fill(store, a, da)
    again = ChunkStore(tmp_path, 3 * CHUNK)
    assert again.used_bytes == 2 * CHUNK
    again.attach(b)
    fill(again, b, db)  # a was never attached after the restart: evictable
    assert {m.content_id for m in again.known()} == {b.content_id}


def test_detach_of_unattached_content_is_an_error(tmp_path: Path) -> None:
    store = ChunkStore(tmp_path, 1 << 20)
    with pytest.raises(ValueError):
        store.detach(ContentId("nope"))


@contextlib.contextmanager
def tiny_tmpfs(path: Path, size: str) -> Iterator[Path]:
    path.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True, text=True)
    if done.returncode:
        pytest.fail(f"cannot mount a tmpfs for the disk-full test (needs root): {done.stderr}")
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=True)


def test_disk_full_raises_and_leaves_the_store_consistent(tmp_path: Path) -> None:
    with tiny_tmpfs(tmp_path / "disk", "1m") as root:
        manifest, data = make("big", 40 * CHUNK)  # 2.5 MiB into 1 MiB
        store = ChunkStore(root, 1 << 30)  # the budget is not what stops it
        store.attach(manifest)
        with pytest.raises(StoreFullError, match="disk full"):
            fill(store, manifest, data)
        present = store.present(manifest.content_id)
        stored = [i for i, ok in enumerate(present) if ok]
        assert 0 < len(stored) < manifest.chunks
        assert chunk_files(root, manifest) == sorted(f"{i}.chunk" for i in stored)
        assert not [p for p in (root / manifest.content_id).iterdir() if p.name.endswith(".tmp")]
        assert store.used_bytes == len(stored) * CHUNK
        assert store.read(manifest.content_id, 0, len(stored) * CHUNK) == data[:len(stored) * CHUNK]
        again = ChunkStore(root, 1 << 30)
        assert again.attach(manifest) == present


def test_disk_full_evicts_unpinned_contents_first(tmp_path: Path) -> None:
    with tiny_tmpfs(tmp_path / "disk", "1m") as root:
        (old, dold), (new, dnew) = make("old", 10 * CHUNK), make("new", 10 * CHUNK, seed=1)
        store = ChunkStore(root, 1 << 30)
        store.attach(old)
        fill(store, old, dold)
        store.detach(old.content_id)
        store.attach(new)
        fill(store, new, dnew)
        assert {m.content_id for m in store.known()} == {new.content_id}
        assert store.present(new.content_id) == [True] * 10


def test_a_chunk_is_served_unchecked_only_while_its_file_is_unchanged(tmp_path: Path) -> None:
    """`open_cached` trusts a file only as it was written from verified bytes; any write to
    it (a flipped byte keeps the size but moves mtime and ctime) sends it back through a
    full check, which finds and deletes it."""
    manifest, data = make("c1", 2 * CHUNK)
    store = ChunkStore(tmp_path, 1 << 30)
    store.attach(manifest)
    fill(store, manifest, data)
    opened = store.open_cached(manifest.content_id, 1)
    assert opened is not None
    os.close(opened[0])
    path = tmp_path / manifest.content_id / "1.chunk"
    with open(path, "r+b") as f:
        f.write(b"\xff")
    assert store.open_cached(manifest.content_id, 1) is None
    with pytest.raises(DamagedChunk):
        store.open_verified(manifest.content_id, 1)
    assert not path.exists() and not store.has(manifest.content_id, 1)
    with pytest.raises(MissingChunk):
        store.open_cached(manifest.content_id, 1)


def view_of(tmp_path: Path, name: str, chunks: int,
            recent: RecentChunks | None) -> tuple[ChunkView, bytes]:
    """A store holding `chunks` whole chunks of content `name`, and a view of it."""
    manifest, data = make(name, chunks * CHUNK)
    store = ChunkStore(tmp_path, 1 << 30)
    store.attach(manifest)
    fill(store, manifest, data)
    return ChunkView.load(tmp_path, manifest.content_id, recent), data


def test_a_view_serves_the_next_reads_of_a_chunk_it_checked_from_memory(
        tmp_path: Path) -> None:
    recent = RecentChunks(max_bytes=2 * CHUNK)
    view, data = view_of(tmp_path, "c1", 3, recent)
    quarter = CHUNK // 4
    assert bytes(view.read_chunk(0, 0, quarter)) == data[:quarter]  # checked, kept
    assert recent.hits == 0
    for lo in range(quarter, CHUNK, quarter):
        assert bytes(view.read_chunk(0, lo, lo + quarter)) == data[lo:lo + quarter]
    assert recent.hits == 3
    into = memoryview(bytearray(10))
    assert bytes(view.read_chunk(0, 5, 15, into)) == data[5:15] and recent.hits == 4
    # two more chunks fill the memory: chunk 0 goes, and is read from its file again
    view.read_chunk(1, 0, 1)
    view.read_chunk(2, 0, 1)
    assert bytes(view.read_chunk(0, 0, 10)) == data[:10] and recent.hits == 4


def test_a_kept_chunk_whose_file_changed_goes_back_through_the_check(
        tmp_path: Path) -> None:
    recent = RecentChunks(max_bytes=2 * CHUNK)
    view, _ = view_of(tmp_path, "c1", 2, recent)
    view.read_chunk(0, 0, 10)
    with open(view.directory / "0.chunk", "r+b") as f:
        f.write(b"\xff")  # a flipped byte moves mtime and ctime: damage is found at once
    with pytest.raises(DamagedChunk):
        view.read_chunk(0, 10, 20)
    assert recent.hits == 0


def test_a_view_keeps_nothing_of_a_chunk_that_fails_its_check(tmp_path: Path) -> None:
    recent = RecentChunks(max_bytes=4 * CHUNK)
    view, data = view_of(tmp_path, "c1", 2, recent)
    with open(view.directory / "1.chunk", "r+b") as f:
        f.write(b"\xff")
    for _ in range(2):
        with pytest.raises(DamagedChunk):
            view.read_chunk(1, 0, 10)
    assert recent.hits == 0
    assert bytes(view.read_chunk(0, 0, 10)) == data[:10]  # the good chunk still serves
