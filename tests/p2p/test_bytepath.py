"""The byte movers (p2p.bytepath), C and Python alike: over a real socket pair into a real file."""

from __future__ import annotations

import asyncio
import errno
import os
import socket
import threading
import time
from pathlib import Path

import pytest
import xxhash

from p2p import bytepath
from p2p.bytepath import CLOSED, DRAINED, FILLED, Hasher, Workers
from p2p.units import KiB, MiB

WAKE = 512 * KiB


def hasher() -> Hasher:
    return bytepath.xxh3_hasher() or xxhash.xxh3_128()


def send_later(sock: socket.socket, data: bytes, *, close: bool = False) -> threading.Thread:
    def run() -> None:
        sock.sendall(data)
        if close:
            sock.shutdown(socket.SHUT_WR)
    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_the_native_hasher_gives_xxhash_digests(byte_path: str) -> None:
    data = os.urandom(3 * MiB + 17)
    h = hasher()
    for start in range(0, len(data), 100_001):
        h.update(data[start:start + 100_001])
    assert h.digest() == xxhash.xxh3_128(data).digest()
    assert (type(h).__module__ == "p2p._bytepath") == (byte_path == "c")


def test_a_payload_is_received_hashed_and_written_in_one_call(
        byte_path: str, tcp_pair: tuple[socket.socket, socket.socket], tmp_path: Path) -> None:
    sender, receiver = tcp_pair
    data = os.urandom(4 * MiB)
    buf = memoryview(bytearray(len(data) + 100))
    head = 3000  # bytes a header read brought along, in the buffer but not yet taken
    buf[:head] = data[:head]
    thread = send_later(sender, data[head:])
    fd = os.open(tmp_path / "chunk", os.O_RDWR | os.O_CREAT)
    h = hasher()
    pulled = bytepath.pull(receiver.fileno(), buf, 0, head, len(data), h, fd, 0,
                           wake=WAKE, lowat=1, linger_s=2.0)
    thread.join()
    os.close(fd)
    assert (pulled.filled, pulled.state, pulled.write_errno) == (len(data), FILLED, 0)
    assert bytes(buf[:len(data)]) == data
    assert h.digest() == xxhash.xxh3_128(data).digest()
    assert (tmp_path / "chunk").read_bytes() == data


def test_a_silent_socket_gives_the_thread_back_and_the_next_call_goes_on(
        byte_path: str, tcp_pair: tuple[socket.socket, socket.socket], tmp_path: Path) -> None:
    sender, receiver = tcp_pair
    data = os.urandom(1 * MiB)
    buf = memoryview(bytearray(len(data)))
    fd = os.open(tmp_path / "chunk", os.O_RDWR | os.O_CREAT)
    h = hasher()
    sender.sendall(data[:300 * KiB])
    time.sleep(0.05)
    began = time.monotonic()
    first = bytepath.pull(receiver.fileno(), buf, 0, 0, len(data), h, fd, 0,
                          wake=WAKE, lowat=1, linger_s=0.05)
    assert first.state == DRAINED and first.filled == 300 * KiB
    assert time.monotonic() - began < 5  # it lingered, it did not wait for the rest
    assert first.lowat == WAKE  # the poll waited for a wake's worth, not for a segment
    thread = send_later(sender, data[300 * KiB:])
    second = bytepath.pull(receiver.fileno(), buf, first.filled, first.filled, len(data), h,
                           fd, first.filled, wake=WAKE, lowat=first.lowat, linger_s=2.0)
    thread.join()
    os.close(fd)
    assert (second.filled, second.state) == (len(data), FILLED)
    assert h.digest() == xxhash.xxh3_128(data).digest()
    assert (tmp_path / "chunk").read_bytes() == data


def test_a_peer_that_closes_early_ends_the_pull(
        byte_path: str, tcp_pair: tuple[socket.socket, socket.socket]) -> None:
    sender, receiver = tcp_pair
    buf = memoryview(bytearray(MiB))
    send_later(sender, b"x" * 1000, close=True).join()
    pulled = bytepath.pull(receiver.fileno(), buf, 0, 0, len(buf), hasher(), -1, 0,
                           wake=WAKE, lowat=1, linger_s=2.0)
    assert (pulled.filled, pulled.state) == (1000, CLOSED)


def test_a_refused_write_stops_writing_not_hashing(
        byte_path: str, tcp_pair: tuple[socket.socket, socket.socket], tmp_path: Path) -> None:
    sender, receiver = tcp_pair
    data = os.urandom(512 * KiB)
    (tmp_path / "ro").write_bytes(b"")
    fd = os.open(tmp_path / "ro", os.O_RDONLY)  # every write fails (EBADF)
    h = hasher()
    buf = memoryview(bytearray(len(data)))
    thread = send_later(sender, data)
    pulled = bytepath.pull(receiver.fileno(), buf, 0, 0, len(data), h, fd, 0,
                           wake=WAKE, lowat=1, linger_s=2.0)
    thread.join()
    os.close(fd)
    assert (pulled.filled, pulled.state, pulled.write_errno) == (len(data), FILLED, errno.EBADF)
    assert h.digest() == xxhash.xxh3_128(data).digest()


def test_a_pull_rejects_a_range_outside_its_buffer(byte_path: str) -> None:
    with pytest.raises(ValueError):
        bytepath.pull(0, memoryview(bytearray(10)), 0, 5, 11, hasher(), -1, 0,
                      wake=WAKE, lowat=1)


async def test_a_cancelled_run_returns_only_once_its_call_has_ended() -> None:
    workers = Workers(1)
    ended = threading.Event()

    def slow() -> None:
        time.sleep(0.3)
        ended.set()

    task = asyncio.ensure_future(workers.run(slow))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert ended.is_set()  # the buffer and socket it used are the caller's again
    workers.close()


def test_data_workers_default_to_the_cores_a_node_can_spare() -> None:
    from p2p.config import AgentConfig
    assert AgentConfig().data_threads == max(1, min(8, len(os.sched_getaffinity(0)) - 1))
    assert AgentConfig(data_workers=3).data_threads == 3
    with pytest.raises(ValueError, match="data_workers"):
        AgentConfig(data_workers=-1)
