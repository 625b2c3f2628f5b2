"""Lazy contents on real agents: a read or a prefetch fetches only its chunks.

Origin egress is what the origin server counts (its /stats), and what a node
holds is what its store directory holds, not only what its status claims.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from helpers.waiting import until

from p2p.testing.localcluster import AgentHandle, LocalCluster, write_random_file
from p2p.units import MiB

CHUNK = 1 * MiB
CHUNKS = 8
# A reader's chunk goes to the origin once the swarm has settled; on a loaded
# machine a peer's Join can take longer than the default half second, and the
# chunks these tests read must come from that peer.
PATIENT = {"swarm": {"settle_s": 30.0, "origin_patience_s": 30.0}}


def chunk_files(agent: AgentHandle, content: str) -> list[int]:
    return sorted(int(p.name.split(".")[0]) for p in (agent.store_dir / content).glob("*.chunk"))


async def status_of(agent: AgentHandle, content: str) -> dict[str, Any]:
    async with agent.client(30.0) as client:
        info: dict[str, Any] = (await client.status())["contents"][content]
        return info


@contextlib.asynccontextmanager
async def published(tmp_path: Path) -> AsyncIterator[tuple[LocalCluster, bytes, str]]:
    """A tracker and an origin serving one published content: its bytes and id."""
    cluster = LocalCluster(tmp_path / "cluster")
    try:
        source = tmp_path / "origin" / "image.bin"
        write_random_file(source, CHUNKS * CHUNK, seed=5)
        await cluster.start_tracker()
        await cluster.start_origin(source.parent)
        manifest = await cluster.publish(source, CHUNK)
        yield cluster, source.read_bytes(), manifest.content_id
    finally:
        await cluster.stop()


async def read_back(agent: AgentHandle, content: str, data: bytes, offset: int,
                    length: int) -> None:
    async with agent.client(120) as client:
        assert await client.read(content, offset, length) == data[offset:offset + length]


async def test_read_and_prefetch_fetch_only_their_chunks_from_peers_then_ensure_all(
        tmp_path: Path) -> None:
    async with published(tmp_path) as (cluster, data, content):
        a = await cluster.start_agent(0, "r1")
        b = await cluster.start_agent(1, "r1", PATIENT)
        async with a.client(120) as client:
            assert (await client.ensure(content))["mode"] == "eager"
        from_origin = await cluster.origin_bytes()
        assert from_origin >= len(data)

        await read_back(b, content, data, 2 * CHUNK + 100, CHUNK)  # chunks 2 and 3
        async with b.client(120) as client:
            info = await status_of(b, content)
            assert (info["mode"], info["have"], info["wanted"]) == ("lazy", 2, 2), info
            assert (info["peer_bytes"], info["origin_bytes"]) == (2 * CHUNK, 0), info
            assert not info["complete"]
            assert chunk_files(b, content) == [2, 3]
            assert await cluster.origin_bytes() == from_origin

            await client.prefetch(content, [5, 6])

            async def prefetched() -> bool:
                return (await status_of(b, content))["have"] == 4
            await until(prefetched, "B holds the two prefetched chunks")
            info = await status_of(b, content)
            assert (info["wanted"], info["peer_bytes"]) == (4, 4 * CHUNK), info
            assert chunk_files(b, content) == [2, 3, 5, 6]

            info = await client.ensure(content)
            assert (info["mode"], info["have"], info["complete"]) == ("eager", CHUNKS, True)
            assert (info["peer_bytes"], info["origin_bytes"]) == (CHUNKS * CHUNK, 0), info
            assert chunk_files(b, content) == list(range(CHUNKS))
        assert await cluster.origin_bytes() == from_origin


async def test_lazy_read_no_peer_can_serve_reads_just_its_chunk_from_the_origin(
        tmp_path: Path) -> None:
    async with published(tmp_path) as (cluster, data, content):
        agent = await cluster.start_agent(0, "r1")
        await read_back(agent, content, data, 4 * CHUNK + 7, 1000)
        info = await status_of(agent, content)
        assert (info["mode"], info["have"], info["origin_bytes"]) == ("lazy", 1, CHUNK), info
        assert chunk_files(agent, content) == [4]
        assert await cluster.origin_bytes() == CHUNK
        # Idle now, it still serves what it holds: a second reader's chunk comes from it.
        second = await cluster.start_agent(1, "r1", PATIENT)
        await read_back(second, content, data, 4 * CHUNK, 10)
        info = await status_of(second, content)
        assert (info["peer_bytes"], info["origin_bytes"]) == (CHUNK, 0), info
        assert await cluster.origin_bytes() == CHUNK
