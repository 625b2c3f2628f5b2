"""Relays: a chunk served to peers while it still arrives from the origin.

First the pieces without processes (p2p.relay: what a relay sends and when,
how a receiver puts the parts together); then two real agents, a real
tracker and a rate-capped HTTP origin on loopback: chunks are relayed, every
copy is exact, and a chunk the origin corrupts ends its relays without any
peer being blamed, banned or left holding a bad byte.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from helpers.promtext import metric
from helpers.waiting import until

from p2p.agentclient import AgentError
from p2p.content import ContentId
from p2p.relay import RELAY_HOLD_BYTES, RELAY_PART_BYTES, Filling, Parts, RelayFailed, relay
from p2p.session import BufferPool
from p2p.testing.demo import distribute
from p2p.testing.localcluster import AgentHandle, LocalCluster, write_random_file
from p2p.units import KiB, MiB


class Sink:
    """What a relay sent: (offset, bytes) per Piece, and how much was verified then."""

    def __init__(self, filling: Filling) -> None:
        self.filling = filling
        self.parts: list[tuple[int, bytes, bool]] = []

    async def send(self, off: int, data: memoryview) -> None:
        self.parts.append((off, bytes(data), self.filling.ok))


async def feed(filling: Filling, data: bytes, step: int) -> None:
    for end in range(step, len(data) + step, step):
        filling.buf[:min(end, len(data))] = data[:min(end, len(data))]
        filling.advance(min(end, len(data)))
        await asyncio.sleep(0)


async def test_a_relay_sends_in_order_and_the_tail_only_once_verified() -> None:
    data = bytes(range(256)) * (4 * MiB // 256)
    given: list[bytearray] = []
    filling = Filling(bytearray(len(data)), given.append)
    sink = Sink(filling)
    sending = asyncio.create_task(relay(filling.acquire(), sink.send, lambda: True))
    await feed(filling, data, 100 * KiB)
    await asyncio.sleep(0)
    # All but the held tail (and less than a part before it) is out before the chunk is
    # verified...
    early = b"".join(p for _, p, _ in sink.parts)
    assert early == data[:len(early)]
    assert len(data) - RELAY_HOLD_BYTES - RELAY_PART_BYTES < len(early)
    assert len(early) <= len(data) - RELAY_HOLD_BYTES
    assert all(not ok for _, _, ok in sink.parts)
    assert all(len(p) >= RELAY_PART_BYTES for _, p, _ in sink.parts)
    filling.verified()
    assert await sending
    # ... and the tail after, in order, without gaps.
    offsets = [off for off, _, _ in sink.parts]
    assert offsets == sorted(offsets) and sink.parts[-1][2]
    assert b"".join(p for _, p, _ in sink.parts) == data
    assert given == []  # the fetcher still holds the buffer
    filling.release()
    assert given == [filling.buf]
    # A fetch cancelled while a worker thread may still use its buffer never returns it.
    abandoned = Filling(bytearray(10), given.append)
    abandoned.abandon()
    abandoned.release()
    assert given == [filling.buf]


async def test_a_failed_fetch_ends_the_relay_and_a_cancelled_one_stops() -> None:
    data = b"x" * (1 * MiB)
    filling = Filling(bytearray(len(data)), lambda buf: None)
    sink = Sink(filling)
    sending = asyncio.create_task(relay(filling.acquire(), sink.send, lambda: True))
    await feed(filling, data[:600 * KiB], 600 * KiB)
    filling.failed("origin said 503")
    with pytest.raises(RelayFailed, match="503"):
        await sending
    assert sum(len(p) for _, p, _ in sink.parts) <= 600 * KiB

    wanted = [True]
    other = Filling(bytearray(len(data)), lambda buf: None)
    sink = Sink(other)
    stopping = asyncio.create_task(relay(other.acquire(), sink.send, lambda: wanted[0]))
    await feed(other, data[:300 * KiB], 300 * KiB)
    wanted[0] = False
    other.verified()
    assert await stopping is False
    assert len(sink.parts) == 1  # the part before the receiver cancelled


def test_parts_come_in_order_or_not_at_all() -> None:
    parts = Parts(lambda n: bytearray(n))
    key = (1, 7)
    view = parts.place(key, 0, 10, 25)
    view[:] = b"a" * 10
    assert parts.received(key, 10) is None
    with pytest.raises(ValueError, match="when 10 bytes are in"):
        parts.place(key, 11, 5, 25)  # a gap
    with pytest.raises(ValueError):
        parts.place(key, 10, 16, 25)  # past the chunk
    parts.place(key, 10, 15, 25)[:] = b"b" * 15
    assert parts.received(key, 15) == b"a" * 10 + b"b" * 15
    assert not parts.holds(key) and parts.drop(key) == 0
    parts.place((2, 8), 0, 5, 25)
    parts.received((2, 8), 5)
    assert parts.holds((2, 8)) and parts.drop_link(2) == 5 and not parts.holds((2, 8))


def test_buffer_pool_reuses_up_to_keep_buffers_of_each_size() -> None:
    pool = BufferPool(keep=2)
    taken = [pool.take(8) for _ in range(3)]
    for buf in taken:
        pool.give(buf)
    again = [pool.take(8) for _ in range(3)]
    assert sum(any(b is t for t in taken) for b in again) == 2  # the third was not kept
    assert len(pool.take(5)) == 5  # another size: a buffer of its own


# ---- real agents -----------------------------------------------------------------

CHUNK = 4 * MiB
ORIGIN_MBPS = 8.0  # slow enough that every chunk is still arriving when a peer asks


async def two_agents(tmp_path: Path, cluster: LocalCluster,
                     chunks: int) -> tuple[Path, list[AgentHandle], ContentId]:
    source = tmp_path / "origin" / "content.bin"
    await asyncio.to_thread(write_random_file, source, chunks * CHUNK, 5)
    await cluster.start_tracker()
    await cluster.start_origin(source.parent, ORIGIN_MBPS)
    manifest = await cluster.publish(source, CHUNK)
    agents = [await cluster.start_agent(i, "rack0") for i in range(2)]
    return source, agents, manifest.content_id


async def metrics(agent: AgentHandle) -> str:
    async with agent.client(10.0) as client:
        return await client.metrics()


async def test_two_fetchers_relay_their_chunks_to_each_other(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path / "cluster")
    try:
        source, agents, content = await two_agents(tmp_path, cluster, chunks=4)
        async with asyncio.timeout(120):
            result = await distribute(cluster, agents, source, content, 4 * CHUNK,
                                      progress=False, verify=True)
        assert result.failures == [] and result.verified
        texts = [await metrics(a) for a in agents]
        # Each byte left the origin once; whatever a node did not read there itself came
        # from the other, and at least one chunk of it while still arriving.
        assert result.origin_bytes == 4 * CHUNK
        assert sum(metric(t, "bootseer_relays_total", result="sent") for t in texts) >= 1
        for text in texts:
            assert metric(text, "bootseer_chunks_rejected_total") == 0
            assert metric(text, "bootseer_peers_dropped_total") == 0
    finally:
        await cluster.stop()


async def test_a_chunk_the_origin_corrupts_ends_its_relays_and_blames_no_peer(
        tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path / "cluster")
    try:
        source, agents, content = await two_agents(tmp_path, cluster, chunks=2)
        good = source.read_bytes()
        with source.open("r+b") as f:  # the origin now serves chunk 0 wrong
            f.seek(CHUNK // 2)
            f.write(b"\xff" * 1024)
        ensures = [asyncio.create_task(_ensure(a, content)) for a in agents]

        async def relay_ended() -> bool:
            texts = [await metrics(a) for a in agents]
            return sum(metric(t, "bootseer_relays_total", result="ended") for t in texts) >= 1

        await until(relay_ended, timeout_s=90.0,
                    what="a peer's relay of the corrupt chunk ended with a Reject")
        results = await asyncio.wait_for(asyncio.gather(*ensures, return_exceptions=True), 200)
        # The content fails (the origin keeps serving bad bytes), on both nodes, and says so.
        assert all(isinstance(r, AgentError) for r in results), results
        for agent in agents:
            text = await metrics(agent)
            assert metric(text, "bootseer_peers_dropped_total") == 0
            assert metric(text, "bootseer_chunks_rejected_total", source="peer") == 0
            assert not (agent.store_dir / content / "0.chunk").exists()
        # Repaired, the origin serves the chunk and a new try completes, byte for byte.
        source.write_bytes(good)
        async with asyncio.timeout(120):
            result = await distribute(cluster, agents, source, content, len(good),
                                      progress=False, verify=True)
        assert result.failures == [] and result.verified
    finally:
        await cluster.stop()


async def _ensure(agent: AgentHandle, content: str) -> None:
    async with agent.client(None) as client:
        await client.ensure(content)


async def test_a_chunk_still_arriving_from_a_peer_is_relayed_on(tmp_path: Path,
                                                               byte_path: str) -> None:
    """`relay_fetching`: B and C fetch from a slow seed A; each announces what it is
    fetching, and the other asks it to relay those chunks while they arrive. Every copy
    is exact, nothing is rejected, and the origin served the content once (to A)."""
    cluster = LocalCluster(tmp_path / "cluster")
    try:
        source = tmp_path / "origin" / "content.bin"
        await asyncio.to_thread(write_random_file, source, 8 * CHUNK, 9)
        await cluster.start_tracker()
        await cluster.start_origin(source.parent, 200.0)
        content = (await cluster.publish(source, CHUNK)).content_id
        # ... by the byte movers (p2p.bytepath), in C and in Python
        relaying = {"swarm": {"relay_fetching": True}, "byte_movers": True}
        seed = await cluster.start_agent(0, "rack0", {**relaying, "upload_mbps": 12.0})
        async with asyncio.timeout(120):
            first = await distribute(cluster, [seed], source, content, 8 * CHUNK,
                                     progress=False, verify=True)
        assert first.verified and first.origin_bytes == 8 * CHUNK
        others = [await cluster.start_agent(i, "rack0", relaying) for i in (1, 2)]
        async with asyncio.timeout(120):
            result = await distribute(cluster, others, source, content, 8 * CHUNK,
                                      progress=False, verify=True)
        assert result.failures == [] and result.verified
        assert result.origin_bytes == 0
        texts = [await metrics(a) for a in others]
        assert sum(metric(t, "bootseer_relays_total", result="sent") for t in texts) >= 1
        for text in [await metrics(seed), *texts]:
            assert metric(text, "bootseer_chunks_rejected_total") == 0
            assert metric(text, "bootseer_peers_dropped_total") == 0
    finally:
        await cluster.stop()
