"""Chunks written as they arrive (p2p.spool), on a real disk: stored only once verified."""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
from pathlib import Path

import pytest

from p2p import bytepath
from p2p import spool as spool_module
from p2p.content import Manifest, ManifestBuilder
from p2p.spool import Spool, Streamer
from p2p.store import ChunkStore, CorruptChunk, UnknownContent
from p2p.units import KiB

CHUNK = 256 * KiB


def make(size: int = 2 * CHUNK + 1000) -> tuple[Manifest, bytes]:
    data = os.urandom(size)
    builder = ManifestBuilder(CHUNK)
    builder.feed(data)
    return builder.finish("test", "file:///nowhere"), data


def files(root: Path, manifest: Manifest) -> list[str]:
    """Every file in the content's directory but its manifest (temp files included)."""
    return sorted(p.name for p in (root / manifest.content_id).iterdir()
                  if p.name != "manifest.json")


def write_in_parts(spool: Spool, data: bytes, parts: int = 5) -> None:
    step = -(-len(data) // parts)
    for start in range(0, len(data), step):
        spool.write(memoryview(data)[start:start + step])


def test_a_chunk_written_in_parts_is_stored_once_it_verifies(tmp_path: Path) -> None:
    manifest, data = make()
    store = ChunkStore(tmp_path, 1 << 30)
    store.attach(manifest)
    chunk = data[CHUNK:2 * CHUNK]
    spool = Spool(store, manifest.content_id, 1)
    write_in_parts(spool, chunk)
    assert not store.has(manifest.content_id, 1)  # written, not stored: never served yet
    spool.commit(memoryview(chunk))
    assert store.has(manifest.content_id, 1)
    assert store.read(manifest.content_id, CHUNK, CHUNK) == chunk
    assert store.used_bytes == CHUNK
    assert files(tmp_path, manifest) == ["1.chunk"]  # no temp file left


def test_bytes_that_do_not_verify_are_never_stored(tmp_path: Path) -> None:
    manifest, data = make()
    store = ChunkStore(tmp_path, 1 << 30)
    store.attach(manifest)
    bad = bytearray(data[:CHUNK])
    bad[CHUNK // 2] ^= 1
    spool = Spool(store, manifest.content_id, 0)
    write_in_parts(spool, bytes(bad))
    with pytest.raises(CorruptChunk):
        spool.commit(memoryview(bad))
    assert not store.has(manifest.content_id, 0)
    assert store.used_bytes == 0 and files(tmp_path, manifest) == []
    short = Spool(store, manifest.content_id, 0)  # a prefix of the right bytes is not it
    write_in_parts(short, data[:CHUNK - 1])
    with pytest.raises(CorruptChunk):
        short.commit(memoryview(data[:CHUNK - 1]))
    assert files(tmp_path, manifest) == []


def test_a_chunk_the_temp_file_refused_is_stored_from_the_buffer(tmp_path: Path) -> None:
    manifest, data = make()
    store = ChunkStore(tmp_path, 1 << 30)
    store.attach(manifest)
    chunk = data[:CHUNK]
    spool = Spool(store, manifest.content_id, 0)
    os.close(spool._fd)  # the disk refuses every write from now on (EBADF)
    spool._fd = os.open(os.devnull, os.O_RDONLY)
    write_in_parts(spool, chunk)
    assert spool.error is not None
    spool.commit(memoryview(chunk))
    assert store.read(manifest.content_id, 0, CHUNK) == chunk
    assert files(tmp_path, manifest) == ["0.chunk"]


def test_a_chunk_present_already_is_not_counted_twice(tmp_path: Path) -> None:
    manifest, data = make()
    store = ChunkStore(tmp_path, 1 << 30)
    store.attach(manifest)
    store.put(manifest.content_id, 0, data[:CHUNK])
    spool = Spool(store, manifest.content_id, 0)
    write_in_parts(spool, data[:CHUNK])
    spool.commit(memoryview(data[:CHUNK]))
    assert store.used_bytes == CHUNK and files(tmp_path, manifest) == ["0.chunk"]


def test_a_content_evicted_meanwhile_leaves_nothing(tmp_path: Path) -> None:
    manifest, data = make()
    store = ChunkStore(tmp_path, 1 << 30)
    store.attach(manifest)
    spool = Spool(store, manifest.content_id, 0)
    write_in_parts(spool, data[:CHUNK])
    store.detach(manifest.content_id)
    store.remove(manifest.content_id)
    with pytest.raises(UnknownContent):
        spool.commit(memoryview(data[:CHUNK]))
    assert not (tmp_path / manifest.content_id).exists()


async def test_a_streamer_writes_parts_as_they_arrive(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spool_module, "STREAM_STEP", 64 * KiB)
    manifest, data = make()
    store = ChunkStore(tmp_path, 1 << 30)
    store.attach(manifest)
    buf = bytearray(CHUNK)
    stream = Streamer(Spool(store, manifest.content_id, 1), buf)
    writes: list[int] = []
    real_write = stream.spool.write
    stream.spool.write = lambda part: (writes.append(len(part)), real_write(part))[1]  # type: ignore[method-assign]
    for filled in range(0, CHUNK + 1, 16 * KiB):  # 16 KiB at a time, like socket reads
        buf[:filled] = data[CHUNK:CHUNK + filled]
        stream.advance(filled)
        await asyncio.sleep(0.001)
    await stream.commit()
    assert sum(writes) == CHUNK and len(writes) >= 3  # written along the way, not at the end
    assert all(n >= 64 * KiB for n in writes[:-1])
    assert store.read(manifest.content_id, CHUNK, CHUNK) == data[CHUNK:2 * CHUNK]


async def test_an_aborted_streamer_removes_its_file(tmp_path: Path) -> None:
    manifest, data = make()
    store = ChunkStore(tmp_path, 1 << 30)
    store.attach(manifest)
    buf = bytearray(data[:CHUNK])
    stream = Streamer(Spool(store, manifest.content_id, 0), buf)
    stream.advance(CHUNK // 2)  # a write is under way in a worker thread
    stream.abort()
    for _ in range(100):
        if not files(tmp_path, manifest):
            break
        await asyncio.sleep(0.01)
    assert files(tmp_path, manifest) == []
    assert not store.has(manifest.content_id, 0)


def pull_all(spool: Spool, receiver: socket.socket, buf: bytearray, n: int) -> None:
    while spool.written < n:
        pulled = spool.pull(receiver.fileno(), memoryview(buf), spool.written, n,
                            wake=64 * KiB, lowat=1)
        assert pulled.state != 2  # CLOSED


def test_a_chunk_pulled_from_a_socket_is_stored_once_it_verifies(
        byte_path: str, tcp_pair: tuple[socket.socket, socket.socket], tmp_path: Path) -> None:
    sender, receiver = tcp_pair
    manifest, data = make()
    store = ChunkStore(tmp_path, 1 << 30)
    store.attach(manifest)
    chunk, buf = data[CHUNK:2 * CHUNK], bytearray(CHUNK)
    spool = Spool(store, manifest.content_id, 1)
    sender.sendall(chunk)
    pull_all(spool, receiver, buf, CHUNK)
    assert not store.has(manifest.content_id, 1)  # written, not stored: never served yet
    spool.commit(memoryview(buf))
    assert store.read(manifest.content_id, CHUNK, CHUNK) == chunk
    assert files(tmp_path, manifest) == ["1.chunk"]


def test_pulled_bytes_that_do_not_verify_are_never_stored(
        byte_path: str, tcp_pair: tuple[socket.socket, socket.socket], tmp_path: Path) -> None:
    sender, receiver = tcp_pair
    manifest, data = make()
    store = ChunkStore(tmp_path, 1 << 30)
    store.attach(manifest)
    bad = bytearray(data[:CHUNK])
    bad[CHUNK - 1] ^= 1
    buf = bytearray(CHUNK)
    spool = Spool(store, manifest.content_id, 0)
    sender.sendall(bad)
    pull_all(spool, receiver, buf, CHUNK)
    with pytest.raises(CorruptChunk):
        spool.commit(memoryview(buf))
    assert not store.has(manifest.content_id, 0)
    assert store.used_bytes == 0 and files(tmp_path, manifest) == []


def test_an_abort_during_a_pull_removes_the_file_once_the_pull_returns(
        byte_path: str, tcp_pair: tuple[socket.socket, socket.socket], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    sender, receiver = tcp_pair
    manifest, data = make()
    store = ChunkStore(tmp_path, 1 << 30)
    store.attach(manifest)
    spool = Spool(store, manifest.content_id, 0)
    sender.sendall(data[:1000])
    puller = threading.Thread(target=lambda: spool.pull(
        receiver.fileno(), memoryview(bytearray(CHUNK)), 0, CHUNK, wake=64 * KiB, lowat=1))
    monkeypatch.setattr(bytepath, "LINGER_S", 0.5)
    puller.start()
    time.sleep(0.2)  # the pull is polling the silent socket, its file open
    spool.abort()
    assert len(files(tmp_path, manifest)) == 1  # not closed under the pull's feet
    puller.join()
    assert files(tmp_path, manifest) == []
