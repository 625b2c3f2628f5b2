"""A per-content ban for bad bytes is keyed by the address the connection came from,
not by the peer id it claimed: a node with the secret that claims another node's id
and sends garbage gets its own address banned, and the real node is still used.

The core rule first (no sockets), then the attack against real processes: a tracker,
an origin, a seeder, a victim agent and an impostor on 127.0.0.2 (tests/hostile.py).
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

from helpers.hostile import HostilePeer
from helpers.waiting import WAIT_S, until

from p2p.content import ContentId, PeerId
from p2p.swarm.config import SwarmConfig
from p2p.swarm.events import ChunkArrived, Disconnect, PeerJoined, Request
from p2p.swarm.swarm import Swarm
from p2p.testing.localcluster import AgentHandle, LocalCluster, write_random_file
from p2p.tracker_client import TrackerClient
from p2p.units import MiB

SIZE = 8 * MiB
CHUNK = 1 * MiB
A = PeerId("a")


def test_a_ban_holds_the_address_not_the_claimed_id() -> None:
    s = Swarm(PeerId("me"), "r", 2, [False, False], CHUNK, SwarmConfig(use_peers=True),
              random.Random(1), 0.0)
    acts = s.handle(PeerJoined(A, "r", (True, True), (), "10.0.0.9"), 1.0)
    asked = next(a for a in acts if isinstance(a, Request))
    acts = s.handle(ChunkArrived(asked.chunk, A, ok=False), 1.1)
    assert any(isinstance(a, Disconnect) and a.hostile for a in acts)
    # The real `a`, from its own address: accepted, and asked for chunks.
    acts = s.handle(PeerJoined(A, "r", (True, True), (), "10.0.0.1"), 2.0)
    assert any(isinstance(a, Request) and a.peer == A for a in acts)
    # Anyone from the banned address, whatever it claims: refused.
    acts = s.handle(PeerJoined(PeerId("b"), "r", (True, True), (), "10.0.0.9"), 2.1)
    assert acts == [Disconnect(PeerId("b"), "banned for sending corrupt data", hostile=True)]


async def _info(agent: AgentHandle, content: ContentId) -> dict[str, Any]:
    async with agent.client(10.0) as client:
        return dict((await client.status())["contents"].get(content, {}))


async def test_an_impostor_claiming_an_unmet_nodes_id_does_not_cut_the_real_node_off(
        tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path / "cluster")
    impostor: HostilePeer | None = None
    try:
        await cluster.start_tracker()
        (tmp_path / "origin").mkdir()
        source = tmp_path / "origin" / "content.bin"
        await asyncio.to_thread(write_random_file, source, SIZE, 5)
        # The seeder is filled from a fast origin, which then goes away; what is left is a
        # slow one (not a dead one: the victim must not give up meanwhile).
        fast = await cluster.start_origin(tmp_path / "origin")
        manifest = await cluster.publish(source, CHUNK)
        content = manifest.content_id
        seeder_store = tmp_path / "seeder-store"
        seeder = await cluster.start_agent(0, "rack1", store_dir=seeder_store)
        async with seeder.client(WAIT_S) as client:
            await client.ensure(content)
        await seeder.child.stop()
        await fast.stop()
        await cluster.start_origin(tmp_path / "origin", rate_mbps=0.05)
        async with TrackerClient(cluster.tracker_url, cluster.secret) as tracker:
            await tracker.put_manifest(
                manifest.with_origins((f"{cluster.origin_url}/content.bin",)))

        # The victim starts on the content; it has never met the seeder.
        victim = await cluster.start_agent(1, "rack0", {"download_mbps": 1.0})
        reading = asyncio.ensure_future(_read(victim, content))
        await until(lambda: _started(victim, content), "the victim opens the content")
        impostor = HostilePeer(manifest, cluster.secret, cluster.tracker_url, cluster.secret,
                               "impostor", rack="rack0")
        impostor.claim = seeder.peer
        await impostor.dial(str(victim.child.ready["addr"]), seeder.peer)
        assert impostor.log.garbage_sent, impostor.log

        # The real seeder comes back, from its own address, under its own id.
        again = await cluster.start_agent(0, "rack1", store_dir=seeder_store)
        assert again.peer == seeder.peer
        async with again.client(WAIT_S) as client:
            await client.ensure(content)  # from its store: it swarms on it, so it announces

        async def from_the_seeder() -> bool:
            return int((await _info(victim, content)).get("peer_bytes", 0)) > 0

        await until(from_the_seeder, "the victim reads from the real seeder")
        async with asyncio.timeout(WAIT_S):
            assert await reading == source.read_bytes()
    finally:
        await cluster.stop()


async def _started(agent: AgentHandle, content: ContentId) -> bool:
    return bool(await _info(agent, content))


async def _read(agent: AgentHandle, content: ContentId) -> bytes:
    async with agent.client(WAIT_S * 4) as client:
        return await client.read(content, 0, SIZE)
