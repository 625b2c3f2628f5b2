"""Soak: everything at once, for a bounded time, against real processes on loopback.

Eight agents (127.0.0.1) fetch one content from a capped origin, through two
tracker replicas on a real redis-server, while
- a corrupting peer (127.0.0.2, holding the cluster secret) announces itself
  as a complete seeder and answers every request with garbage;
- a flooding client (127.0.0.3) keeps opening idle and garbage-sending
  connections to every agent's peer port;
- agents are killed with SIGKILL at random (seeded) moments and restarted on
  the same store;
- malformed entries are written into the replicas' log in Redis (one of them
  under a valid MAC, as an insider who can reach Redis could), and a tracker
  replica is killed with SIGKILL and restarted on its port, reading the same
  poisoned log.
At the end every agent holds the content, every copy is byte-identical to the
original (read back through each agent's API), every agent still serves an
honest peer, the agents' logs say what happened to the corrupting peer, and
both replicas are healthy, having skipped every poisoned entry.
Every wait is bounded and nothing asserts on elapsed time.

Also here: a content published by the CLI with the cryptographic digest and
a name reaches every agent.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import signal
import subprocess
from pathlib import Path
from typing import Any

import aiohttp
import msgpack
from helpers.hostile import HostilePeer, RawClient, fetch_chunk
from helpers.promtext import metric

from p2p.content import ContentId, Manifest
from p2p.testing.demo import distribute
from p2p.testing.localcluster import (
    AgentHandle,
    Child,
    LocalCluster,
    bootseer_command,
    write_random_file,
)
from p2p.tracker_client import TrackerClient
from p2p.units import MiB
from tracker import replicas
from tracker.testing.redisproc import RedisServer

SIZE = 48 * MiB
CHUNK = 1 * MiB
NODES = 8
CAPPED: dict[str, Any] = {"download_mbps": 12.0, "upload_mbps": 24.0}
KILLS = 4
ROUND_TIMEOUT_S = 180.0
FLOOD_HOST = "127.0.0.3"
FLOOD_ROUNDS = 40  # each: up to 30 connections to every agent, held for a moment
SEED = 20261122


async def start(cluster: LocalCluster, tmp_path: Path,
                redis: RedisServer) -> tuple[Path, Manifest, list[Child]]:
    source = tmp_path / "origin" / "content.bin"
    await asyncio.to_thread(write_random_file, source, SIZE, 5)
    trackers = await cluster.start_replicas(redis.url, 2, *redis.replica_args[2:])
    await cluster.start_origin(source.parent, rate_mbps=24.0)
    return source, await cluster.publish(source, CHUNK), trackers


def poison(secret: bytes) -> list[dict[str, bytes]]:
    """Log entries that are not ops: no MAC, a wrong one, and wrong types under a good one."""
    bad: bytes = msgpack.packb(["a", "evil", "10.9.9.9", "10.9.9.9:1", "r0", [[1, "x"]]])
    return [{"x": b"y"}, {"e": msgpack.packb(["t"]), "w": b""},
            {"e": bad, "w": b"", "m": replicas.mac(replicas.mac_key(secret), b"e", bad, b"")}]


async def poison_and_restart_a_replica(cluster: LocalCluster, redis: RedisServer,
                                       trackers: list[Child], log: list[str]) -> None:
    """Write the poison into the live log, then SIGKILL replica 0 and restart it on its port."""
    client = redis.client()
    for fields in poison(cluster.secret):
        await client.xadd("bootseer:log", fields)
    await client.aclose()
    urls = cluster.tracker_url
    port = trackers[0].ready["url"].rpartition(":")[2]
    await trackers[0].stop(signal.SIGKILL)
    trackers[0] = await cluster.start_tracker(*redis.replica_args, "--port", port,
                                              name="tracker0")
    cluster.tracker_url = urls  # start_tracker names only itself; the agents know both
    log.append("poisoned the log, killed and restarted tracker0")


async def flood(agents: list[AgentHandle], stop: asyncio.Event) -> int:
    """Connections that never authenticate (some send garbage); how many were opened."""
    opened = 0
    for _ in range(FLOOD_ROUNDS):
        if stop.is_set():
            break
        clients = []
        for agent in list(agents):  # the live list: restarted agents listen elsewhere
            addr = str(agent.child.ready["addr"])
            for i in range(30):
                with contextlib.suppress(OSError):
                    client = await RawClient.open(addr, bind_host=FLOOD_HOST)
                    opened += 1
                    clients.append(client)
                    if i % 3 == 0:
                        with contextlib.suppress(OSError):
                            await client.send(b"\xff" * 64)
        await asyncio.sleep(0.2)
        for client in clients:
            client.close()
    return opened


async def chaos(cluster: LocalCluster, agents: list[AgentHandle], rng: random.Random,
                log: list[str], tracker_fault: asyncio.Future[None] | None = None) -> None:
    """SIGKILL an agent at a random moment, restart it on its store; KILLS times (the
    tracker fault, if any, runs after the first kill)."""
    for kill in range(KILLS):
        if kill == 1 and tracker_fault is not None:
            await tracker_fault
        await asyncio.sleep(rng.uniform(0.5, 2.0))
        slot = rng.randrange(len(agents))
        victim = agents[slot]
        await victim.child.stop(signal.SIGKILL)
        agents[slot] = await cluster.start_agent(victim.index, f"rack{victim.index % 2}",
                                                 CAPPED, store_dir=victim.store_dir,
                                                 name=f"agent{victim.index}")
        log.append(f"killed and restarted agent{victim.index}")


async def fetch_everywhere(agents: list[AgentHandle], content: ContentId,
                           stop: asyncio.Event) -> None:
    """Keep every agent asked for the content while agents come and go."""
    async def ask(agent: AgentHandle) -> None:
        with contextlib.suppress(Exception):  # a killed agent drops the request; we ask again
            async with agent.client(ROUND_TIMEOUT_S) as client:
                await client.ensure(content)

    while not stop.is_set():
        await asyncio.gather(*(ask(a) for a in list(agents)))
        await asyncio.sleep(0.1)


async def test_soak_kills_corruption_and_a_flood_end_with_verified_copies(
        tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path / "cluster")
    redis = await RedisServer(tmp_path / "redis", persistent=True).start()
    hostile: HostilePeer | None = None
    stop = asyncio.Event()
    try:
        source, manifest, trackers = await start(cluster, tmp_path, redis)
        content = manifest.content_id
        hostile = HostilePeer(manifest, cluster.secret, cluster.tracker_url, cluster.secret,
                              peer_id="corrupter", host="127.0.0.2")
        await hostile.start()
        agents = list(await asyncio.gather(*(
            cluster.start_agent(i, f"rack{i % 2}", CAPPED) for i in range(NODES))))
        events: list[str] = []
        flooding = asyncio.ensure_future(flood(agents, stop))
        fetching = asyncio.ensure_future(fetch_everywhere(agents, content, stop))
        async with asyncio.timeout(ROUND_TIMEOUT_S):
            await chaos(cluster, agents, random.Random(SEED), events, asyncio.ensure_future(
                poison_and_restart_a_replica(cluster, redis, trackers, events)))
        assert len(events) == KILLS + 1

        async with asyncio.timeout(ROUND_TIMEOUT_S):
            result = await distribute(cluster, agents, source, content, SIZE, progress=False,
                                      verify=True)
        stop.set()
        opened = await flooding
        fetching.cancel()
        await asyncio.gather(fetching, return_exceptions=True)

        assert result.failures == [], result.failures
        assert result.verified  # every byte every reader got matched the original
        assert opened > 0
        assert sum(hostile.log.garbage_sent.values()) > 0, "the corrupter was never asked"
        for agent in agents:  # still accepting and serving honest peers after all that
            addr = str(agent.child.ready["addr"])
            served = await fetch_chunk(addr, cluster.secret, content, 0, CHUNK,
                                       bind_host="127.0.0.1")
            assert served == source.read_bytes()[:CHUNK]
        logs = "".join(p.read_text(errors="replace")
                       for p in cluster.workdir.glob("agent*.log"))
        assert "failed verification" in logs or "banning address 127.0.0.2" in logs
        rejected = 0.0
        for agent in agents:
            async with agent.client(10.0) as client:
                rejected += metric(await client.metrics(), "bootseer_chunks_rejected_total")
        assert rejected <= 2 * NODES, (
            f"{rejected} corrupt chunks were received: the corrupter was not dropped")
        async with aiohttp.ClientSession() as http:
            for t in trackers:  # both healthy, each having skipped the whole poison
                url = t.ready["url"]
                async with http.get(url + "/healthz") as resp:
                    assert resp.status == 200, await resp.text()
                    assert json.loads(await resp.text())["peers"] >= NODES
                async with http.get(url + "/metrics") as resp:
                    skipped = metric(await resp.text(),
                                     "bootseer_tracker_log_entries_skipped_total")
                assert skipped == len(poison(cluster.secret)), (url, skipped)
    finally:
        stop.set()
        if hostile is not None:
            await hostile.stop()
        await cluster.stop()
        await redis.stop()


async def test_a_blake3_content_published_by_the_cli_under_a_name_reaches_every_agent(
        tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path / "cluster")
    try:
        source = tmp_path / "origin" / "model.bin"
        await asyncio.to_thread(write_random_file, source, 24 * MiB, 9)
        await cluster.start_tracker()
        await cluster.start_origin(source.parent)
        published = await asyncio.to_thread(
            subprocess.run,
            [*bootseer_command(), "publish", str(source), "--origin",
             f"{cluster.origin_url}/model.bin", "--tracker", cluster.tracker_url,
             "--digest", "blake3", "--chunk-size-mb", "1", "--name", "models/demo:v1"],
            env=cluster.env, capture_output=True, text=True, timeout=60)
        assert published.returncode == 0, published.stderr
        content = ContentId(published.stdout.strip())
        async with TrackerClient(cluster.tracker_url, cluster.secret) as tracker:
            assert await tracker.get_name("models/demo:v1") == content
            manifest = await tracker.get_manifest(content)
        assert manifest.digest == "blake3" and len(manifest.digests[0]) == 32
        agents = list(await asyncio.gather(*(
            cluster.start_agent(i, f"rack{i % 2}") for i in range(3))))
        async with asyncio.timeout(ROUND_TIMEOUT_S):
            result = await distribute(cluster, agents, source, content, 24 * MiB,
                                      progress=False, verify=True)
        assert result.failures == [] and result.verified
        taken = await asyncio.to_thread(
            subprocess.run,
            [*bootseer_command(), "publish", str(source), "--origin", "file:///elsewhere",
             "--no-origin-check", "--tracker", cluster.tracker_url, "--name", "models/demo:v1",
             "--chunk-size-mb", "2"],
            env=cluster.env, capture_output=True, text=True, timeout=60)
        assert taken.returncode != 0
        assert "Traceback" not in taken.stderr
        assert "models/demo:v1" in taken.stderr, taken.stderr
    finally:
        await cluster.stop()
