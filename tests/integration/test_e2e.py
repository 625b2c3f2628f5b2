"""End to end: a tracker, an HTTP origin and 8 agent processes on loopback.

One 256 MiB content (4 MiB chunks) goes from the origin to every agent
through `p2p.testing.demo.distribute`, which checks every copy byte for byte through
each agent's read API. Origin egress is what the origin server itself counts
(its /stats), not what the agents claim. Then each agent's Prometheus
metrics must tell the same story as its status.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from helpers.promtext import metric

from p2p.content import CHUNK_SIZE
from p2p.testing.demo import distribute
from p2p.testing.localcluster import AgentHandle, LocalCluster, write_random_file
from p2p.units import MiB

NODES = 8
SIZE = 256 * MiB
ROUND_TIMEOUT_S = 240.0
MAX_ORIGIN_RATIO = 1.1




async def start_swarm(cluster: LocalCluster, tmp_path: Path,
                      nodes: int) -> tuple[list[AgentHandle], Path]:
    source = tmp_path / "origin" / "content.bin"
    await asyncio.to_thread(write_random_file, source, SIZE, 7)
    await cluster.start_tracker()
    await cluster.start_origin(source.parent)
    agents = await asyncio.gather(*(cluster.start_agent(i, f"rack{i % 2}")
                                    for i in range(nodes)))
    return list(agents), source


async def test_eight_agents_get_identical_copies_with_origin_egress_about_once(
        tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path / "cluster")
    try:
        agents, source = await start_swarm(cluster, tmp_path, NODES)
        manifest = await cluster.publish(source, CHUNK_SIZE)
        async with asyncio.timeout(ROUND_TIMEOUT_S):
            result = await distribute(cluster, agents, source, manifest.content_id, SIZE,
                                      progress=False, verify=True)
        assert result.failures == []
        assert result.verified
        assert result.peer_bytes > 0
        assert result.origin_bytes >= SIZE
        per_node = {i: r["origin_bytes"] // MiB for i, r in result.per_node.items()}
        assert result.origin_bytes <= MAX_ORIGIN_RATIO * SIZE, (
            f"the origin sent {result.origin_bytes / SIZE:.3f} x the content "
            f"(MiB from the origin per node: {per_node})")
        for index, info in result.per_node.items():
            assert info["complete"] and info["have"] == manifest.chunks, (index, info)
        async with asyncio.timeout(60):
            served = 0.0
            for agent in agents:
                served += await check_metrics_match_status(agent, manifest.content_id,
                                                           manifest.chunks)
        # Every byte an agent got from a peer, some agent served (cancelled pieces too).
        assert served >= result.peer_bytes
    finally:
        await cluster.stop()


async def check_metrics_match_status(agent: AgentHandle, content: str, chunks: int) -> float:
    """Check the agent's metrics against its status; return the bytes it served."""
    async with agent.client(30.0) as client:
        status = await client.status()
        text = await client.metrics()
    info: dict[str, Any] = status["contents"][content]
    origin = metric(text, "bootseer_origin_bytes_total")
    peer = metric(text, "bootseer_peer_bytes_total")
    verified = metric(text, "bootseer_chunks_verified_total")
    where = f"agent {agent.index}: status {info}, metrics {origin=} {peer=} {verified=}"
    assert origin == info["origin_bytes"], where
    assert peer == info["peer_bytes"], where
    assert origin + peer >= info["size"], where
    # Every chunk that arrived whole (from a peer or the origin) was verified, once.
    assert verified == (origin + peer) // CHUNK_SIZE, where
    assert verified >= chunks, where
    assert metric(text, "bootseer_chunks_rejected_total") == 0, where
    assert metric(text, "bootseer_peers_dropped_total") == 0, where
    assert metric(text, "bootseer_contents") == len(status["contents"]) == 1, where
    return metric(text, "bootseer_served_bytes_total")
