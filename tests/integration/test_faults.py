"""Faults and bad input against real processes on loopback.

Each test starts a tracker, an HTTP origin and a few agent processes
(p2p.testing.localcluster), distributes a 64 MiB content in 1 MiB chunks, and breaks
something while the transfer runs: agents die, the tracker restarts, a peer
serves garbage, a process holds the wrong cluster secret, a connection sends
malformed frames or drips bytes. Agents are capped (`download_mbps`) so
that a transfer lasts long enough to be interrupted. Every wait is bounded;
nothing asserts on elapsed time. Copies are checked byte for byte through the
agents' read API (p2p.testing.demo.distribute).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import pytest
from helpers.cluster import (
    CAPPED,
    CHUNK,
    CHUNKS,
    PROBE,
    ROUND_TIMEOUT_S,
    SIZE,
    TIMEOUTS,
    Background,
    agent_metrics,
    chunk_files,
    info,
    round_of,
    start_agents,
    start_cluster,
    tracker_metrics,
    transfer_under_way,
)
from helpers.hostile import HostilePeer, RawClient, fetch_chunk
from helpers.promtext import metric
from helpers.waiting import until

from p2p.agentclient import AgentError
from p2p.auth import AuthError
from p2p.content import PeerId
from p2p.peer import connect
from p2p.testing.localcluster import (
    AgentHandle,
    LocalCluster,
    to_toml,
    wait_all_complete,
)
from p2p.wire import PROTOCOL_VERSION, Bye, Hello, Request

# ---- agents die -------------------------------------------------------------------


async def test_two_of_eight_agents_killed_mid_transfer_the_other_six_finish(
        tmp_path: Path, background: Background) -> None:
    cluster = LocalCluster(tmp_path / "cluster")
    try:
        source, manifest = await start_cluster(cluster, tmp_path)
        content = manifest.content_id
        agents = await start_agents(cluster, range(8), CAPPED)
        victims = [agents[2], agents[5]]
        survivors = [a for a in agents if a not in victims]
        survivors_round = background.start(round_of(cluster, survivors, source, content))
        victims_round = background.start(wait_all_complete(victims, content, 60.0))

        async def everyone_started() -> bool:
            return all([(await info(a, content)).get("have", 0) >= 2 for a in agents])

        await until(everyone_started, "every agent holds 2 chunks")
        for victim in victims:
            await victim.child.stop(signal.SIGKILL)
            assert victim.child.proc.returncode == -signal.SIGKILL
            assert len(chunk_files(victim, content)) < CHUNKS, "killed after it finished"

        result = await survivors_round
        assert sorted(result.per_node) == sorted(a.index for a in survivors)
        for index, outcome in (await victims_round).items():
            assert "error" in outcome, f"killed agent {index} reported {outcome}"
    finally:
        await cluster.stop()


@pytest.mark.parametrize("swarm_done", [False, True], ids=["swarm-running", "swarm-done"])
async def test_killed_agent_restarted_resumes_without_refetching_verified_chunks(
        tmp_path: Path, background: Background, swarm_done: bool) -> None:
    """After a restart the agent fetches exactly the chunks it lacks, once each.

    What it lacks: the chunks it had not verified when it was killed, and two
    that we damage on its disk meanwhile (re-verified away at start).

    swarm-running: it comes back while the others are still fetching.
    swarm-done: it comes back once the others hold everything, and the origin
    has become slow (busy with other work).
    """
    # End-game duplicates are a deliberate double transfer of a chunk that is not
    # yet held; they are off here so that the byte count below can be exact.
    config = {**CAPPED, "swarm": {"endgame_duplicates": 0}}
    cluster = LocalCluster(tmp_path / "cluster")
    try:
        source, manifest = await start_cluster(cluster, tmp_path)
        content = manifest.content_id
        agents = await start_agents(cluster, range(4), config)
        others = background.start(wait_all_complete(agents[1:], content, ROUND_TIMEOUT_S))
        victim = agents[0]
        background.start(wait_all_complete([victim], content, ROUND_TIMEOUT_S))

        async def a_quarter_done() -> bool:
            return int((await info(victim, content)).get("have", 0)) >= CHUNKS // 4

        await until(a_quarter_done, "the victim holds a quarter of the chunks")
        have_before = (await info(victim, content))["have"]
        await victim.child.stop(signal.SIGKILL)
        files = chunk_files(victim, content)  # exactly what was verified when it died
        assert have_before <= len(files) < CHUNKS
        # Damage two of them, as a power loss could: those no longer count as verified.
        flipped, torn = sorted(files)[:2]
        with open(flipped, "r+b") as f:
            first = f.read(1)
            f.seek(0)
            f.write(bytes([first[0] ^ 0xFF]))
        os.truncate(torn, CHUNK // 2)
        held = len(files) - 2
        if swarm_done:
            async with asyncio.timeout(ROUND_TIMEOUT_S):
                assert all("error" not in r for r in (await others).values())
            await restart_origin(cluster, source.parent, rate_mbps=1.0)

        again = await cluster.start_agent(victim.index, "rack0", config,
                                          store_dir=victim.store_dir, name="agent0")
        resumed = await info(again, content)  # it reopens what its store holds by itself
        assert resumed.get("have", 0) >= held, (held, resumed)
        assert not [p for p in (victim.store_dir / content).iterdir() if p.name.endswith(".tmp")]

        async with asyncio.timeout(ROUND_TIMEOUT_S), again.client() as client:
            done = await client.ensure(content)
        fetched = done["origin_bytes"] + done["peer_bytes"]
        missing = (CHUNKS - held) * CHUNK
        assert fetched <= missing, (
            f"held {held} of {CHUNKS} good chunks when killed; after the restart it "
            f"fetched {fetched / CHUNK:.2f} chunks' worth ({done}), not {CHUNKS - held}")
        assert fetched >= missing, (fetched, missing, done)
        await round_of(cluster, [again, *agents[1:]], source, content)
    finally:
        await cluster.stop()


async def restart_origin(cluster: LocalCluster, root: Path, rate_mbps: float) -> None:
    """The same origin (same URL, same files), now capped at `rate_mbps`."""
    old = next(c for c in cluster.children if c.name == "origin")
    assert await old.stop() == 0
    port = cluster.origin_url.rsplit(":", 1)[1]
    new = await cluster.spawn("origin-slow", ["origin", str(root), "--port", port,
                                              "--rate-mbps", str(rate_mbps)])
    assert new.ready["url"] == cluster.origin_url


async def test_seeder_joining_mid_transfer_every_chunk_arrives_once(
        tmp_path: Path, background: Background) -> None:
    """An agent pulls from a slow origin; a node that holds the whole content joins.

    The agent should switch to the seeder for what it lacks, and take every
    chunk once: a chunk already on its way from the origin must not also be
    fetched from the seeder (or its origin fetch must be dropped when the
    seeder's copy lands).
    """
    config = {**CAPPED, "swarm": {"endgame_duplicates": 0}}  # no deliberate duplicates
    cluster = LocalCluster(tmp_path / "cluster")
    try:
        source, manifest = await start_cluster(cluster, tmp_path)
        content = manifest.content_id
        (seeder,) = await start_agents(cluster, range(1))
        await round_of(cluster, [seeder], source, content)
        assert await seeder.child.stop() == 0  # SIGTERM: it leaves the swarm
        await restart_origin(cluster, source.parent, rate_mbps=2.0)

        (puller,) = await start_agents(cluster, range(1, 2), config)
        pulling = background.start(wait_all_complete([puller], content, ROUND_TIMEOUT_S))

        async def under_way() -> bool:
            return int((await info(puller, content)).get("have", 0)) >= 1

        await until(under_way, "the puller got a chunk from the origin")
        back = await cluster.start_agent(0, "rack0", store_dir=seeder.store_dir, name="agent0")
        async with asyncio.timeout(ROUND_TIMEOUT_S):
            done = (await pulling)[1]
        assert "error" not in done, done
        assert done["peer_bytes"] > 0, f"never used the seeder: {done}"
        fetched = done["origin_bytes"] + done["peer_bytes"]
        assert fetched == SIZE, (
            f"took {fetched / CHUNK:.0f} chunks for {CHUNKS} "
            f"({done['origin_bytes'] // CHUNK} from the origin, "
            f"{done['peer_bytes'] // CHUNK} from the seeder)")
        await round_of(cluster, [back, puller], source, content)
    finally:
        await cluster.stop()


# ---- a peer that sends garbage ------------------------------------------------------


@pytest.mark.parametrize("pieces", ["whole", "parts", "gap"])
async def test_peer_serving_garbage_is_dropped_reported_and_no_bad_byte_is_kept(
        tmp_path: Path, pieces: str) -> None:
    """Garbage in one Piece, in a relay's parts, or as parts out of order (a gap)."""
    cluster = LocalCluster(tmp_path / "cluster")
    hostile: HostilePeer | None = None
    try:
        source, manifest = await start_cluster(cluster, tmp_path)
        content = manifest.content_id
        hostile = HostilePeer(manifest, cluster.secret, cluster.tracker_url, cluster.secret,
                              pieces=pieces)
        await hostile.start()
        agents = await start_agents(cluster, range(4), CAPPED)
        await round_of(cluster, agents, source, content)

        fooled = set(hostile.log.garbage_sent)
        assert fooled, f"no agent asked the hostile peer for a chunk: {hostile.log}"
        # Requests carry their node's due, relative to their sending (p2p.swarm.uploads):
        # seconds, not the default 0, and never a clock's absolute reading.
        dues = hostile.log.dues
        assert any(dues) and all(abs(d) < 60_000 for d in dues), dues

        async def all_hung_up() -> bool:
            return fooled <= set(hostile.log.closed_by_peer)

        await until(all_hung_up, timeout_s=20.0,
                    what=f"agents that got garbage drop the hostile peer: {hostile.log}")
        by_peer = {PeerId(a.peer): a for a in agents}
        for peer in fooled:
            text = await agent_metrics(by_peer[peer])
            if pieces != "gap":  # a gap is refused before any byte is checked
                assert metric(text, "bootseer_chunks_rejected_total", source="peer") >= 1, peer
            assert metric(text, "bootseer_peers_dropped_total") >= 1, peer

        async def reported() -> bool:
            return metric(await tracker_metrics(cluster),
                          "bootseer_tracker_reports_total") >= len(fooled)

        await until(reported, timeout_s=20.0, what="every fooled agent reported the hostile peer")

        # Nothing bad on disk, and nothing bad served to a peer.
        original = source.read_bytes()
        for agent in agents:
            files = chunk_files(agent, content)
            assert len(files) == CHUNKS
            for path in files:
                index = int(path.name.removesuffix(".chunk"))
                assert manifest.verify(index, path.read_bytes()), path
        async with asyncio.timeout(60):
            for chunk in range(CHUNKS):
                agent = agents[chunk % len(agents)]
                got = await fetch_chunk(agent.child.ready["addr"], cluster.secret, content,
                                        chunk, CHUNK)
                assert got == original[chunk * CHUNK:(chunk + 1) * CHUNK], (agent.index, chunk)
    finally:
        if hostile is not None:
            await hostile.stop()
        await cluster.stop()


async def test_a_peer_that_never_answers_costs_timeouts_not_the_transfer(
        tmp_path: Path) -> None:
    """A peer that takes requests and sends nothing: the agents give up on each request
    after swarm.request_timeout_s (bootseer_request_timeouts_total counts it), ask
    others, and every agent completes with the right bytes."""
    cluster = LocalCluster(tmp_path / "cluster")
    hostile: HostilePeer | None = None
    try:
        source, manifest = await start_cluster(cluster, tmp_path)
        hostile = HostilePeer(manifest, cluster.secret, cluster.tracker_url, cluster.secret,
                              pieces="silent")
        await hostile.start()
        agents = await start_agents(cluster, range(4),
                                    {**CAPPED, "swarm": {"request_timeout_s": 2.0}})
        await round_of(cluster, agents, source, manifest.content_id)

        stalled = set(hostile.log.ignored)
        assert stalled, f"no agent asked the silent peer for a chunk: {hostile.log}"
        by_peer = {PeerId(a.peer): a for a in agents}
        for peer in stalled:
            text = await agent_metrics(by_peer[peer])
            assert metric(text, "bootseer_request_timeouts_total") >= 1, peer
    finally:
        if hostile is not None:
            await hostile.stop()
        await cluster.stop()


# ---- the wrong cluster secret -------------------------------------------------------


async def start_agent_with_secret(cluster: LocalCluster, index: int,
                                  secret: bytes) -> AgentHandle:
    """Like LocalCluster.start_agent, but the process gets `secret` as BOOTSEER_SECRET."""
    name = f"agent{index}"
    workdir = cluster.workdir / name
    workdir.mkdir(parents=True, exist_ok=True)
    store, sock, cfg = workdir / "store", str(workdir / "api.sock"), workdir / "agent.toml"
    cfg.write_text(to_toml({"tracker": cluster.tracker_url, "host": "127.0.0.1", "port": 0,
                            "rack": "rack0", "peer_id": name, "store_dir": str(store),
                            "api_socket": sock}))
    child = await cluster.spawn(name, ["agent", "--config", str(cfg)],
                                env={**cluster.env, "BOOTSEER_SECRET": secret.decode()})
    return AgentHandle(index, child, sock, store, cfg)


async def test_agent_without_the_cluster_secret_gets_nothing_and_serves_nothing(
        tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path / "cluster")
    wrong = secrets.token_hex(32).encode()
    liar: HostilePeer | None = None
    try:
        source, manifest = await start_cluster(cluster, tmp_path)
        content = manifest.content_id
        (seeder,) = await start_agents(cluster, range(1))
        await round_of(cluster, [seeder], source, content)

        outsider = await start_agent_with_secret(cluster, 1, wrong)
        with pytest.raises(AgentError) as refused:
            async with asyncio.timeout(30), outsider.client() as client:
                await client.ensure(content)
        message = str(refused.value)
        assert "401" in message and "secret" in message.lower(), message
        async with outsider.client(10.0) as client:
            assert (await client.status())["contents"] == {}
        assert chunk_files(outsider, content) == []

        # Neither side of a peer connection gets past the handshake with the wrong secret.
        with pytest.raises(AuthError):
            await connect(seeder.child.ready["addr"], PROBE, wrong, TIMEOUTS)
        with pytest.raises(AuthError):
            await connect(outsider.child.ready["addr"], PROBE, cluster.secret, TIMEOUTS)

        # An honest agent handed a wrong-secret listener cannot use it, and still finishes.
        liar = HostilePeer(manifest, wrong, cluster.tracker_url, cluster.secret, "liar")
        await liar.start()
        (honest,) = await start_agents(cluster, range(2, 3), CAPPED)
        await round_of(cluster, [seeder, honest], source, content)

        async def liar_refused() -> bool:
            return bool(liar and liar.log.auth_failures)

        await until(liar_refused, timeout_s=20.0,
                    what="the honest agent tried the wrong-secret listener")
        assert liar.log.joined == set()
        assert not liar.log.garbage_sent
    finally:
        if liar is not None:
            await liar.stop()
        await cluster.stop()


# ---- malformed frames and slow drips ------------------------------------------------


async def hung_up(client: RawClient, timeout_s: float = 30.0) -> str:
    try:
        async with asyncio.timeout(timeout_s):
            return await client.closed_by_peer()
    finally:
        client.close()


async def send_then_hung_up(client: RawClient, data: bytes) -> str:
    with contextlib.suppress(OSError):  # already closed on us: fine
        await client.send(data)
    return await hung_up(client)


async def gather(*coros: Coroutine[Any, Any, Any]) -> list[Any]:
    return list(await asyncio.gather(*coros))


async def drip_then_hung_up(client: RawClient, frame: bytes) -> tuple[str, int]:
    """Drip `frame` at one byte a second; (how the agent hung up, bytes it let through)."""
    drip = asyncio.ensure_future(client.drip(frame))
    try:
        how = await hung_up(client)
    finally:
        drip.cancel()
        await asyncio.gather(drip, return_exceptions=True)
    return how, client.dripped


async def test_malformed_frames_and_slow_drips_are_cut_off_while_the_agent_serves_others(
        tmp_path: Path, background: Background) -> None:
    cluster = LocalCluster(tmp_path / "cluster")
    try:
        source, manifest = await start_cluster(cluster, tmp_path)
        content = manifest.content_id
        (seeder,) = await start_agents(cluster, range(1))
        await round_of(cluster, [seeder], source, content)
        # From now on the seeder is the only source: the origin answers 404.
        source = source.rename(tmp_path / "original.bin")
        addr, secret = seeder.child.ready["addr"], cluster.secret

        async def authed() -> RawClient:
            return await RawClient.authenticated(addr, secret, f"raw{os.urandom(4).hex()}")

        long_bye = Bye("x" * 200).encode()  # a frame that would take minutes to drip
        hello = Hello(PROTOCOL_VERSION, "dripper", "", "rack0", os.urandom(16)).encode()
        junk = os.urandom(4096)
        garbage_header = (32).to_bytes(4, "big") + os.urandom(32)
        oversized = b"\xff\xff\xff\xff" + Request(content, 0, 1).encode()
        quick = [
            send_then_hung_up(await RawClient.open(addr), junk),
            send_then_hung_up(await RawClient.open(addr), garbage_header),
            send_then_hung_up(await RawClient.open(addr), oversized),
            send_then_hung_up(await authed(), junk),
            send_then_hung_up(await authed(), garbage_header),
            send_then_hung_up(await authed(), oversized),
        ]
        drips = [drip_then_hung_up(await RawClient.open(addr), hello),
                 drip_then_hung_up(await authed(), long_bye)]
        bad = background.start(gather(*quick, *drips))

        # Meanwhile, another agent gets the whole content from the seeder.
        (fresh,) = await start_agents(cluster, range(1, 2), CAPPED)
        result = await round_of(cluster, [fresh], source, content)
        assert result.per_node[1]["peer_bytes"] == SIZE
        assert result.origin_bytes == 0

        outcomes = await bad
        for how in outcomes[:len(quick)]:
            assert how in ("eof", "reset")
        for (how, sent), frame in zip(outcomes[len(quick):], (hello, long_bye), strict=True):
            assert how in ("eof", "reset")
            assert 0 < sent < len(frame), f"{sent} of {len(frame)} bytes dripped before the cut"
        assert seeder.child.proc.returncode is None
        assert (await info(seeder, content))["complete"]
    finally:
        await cluster.stop()


# ---- the tracker restarts -----------------------------------------------------------


async def test_tracker_restarted_mid_transfer_the_transfer_completes(
        tmp_path: Path, background: Background) -> None:
    cluster = LocalCluster(tmp_path / "cluster")
    try:
        source, manifest = await start_cluster(cluster, tmp_path)
        content = manifest.content_id
        tracker = next(c for c in cluster.children if c.name == "tracker")
        slow = {**CAPPED, "download_mbps": 10.0}  # >= 6 s a copy: the restart falls inside
        agents = await start_agents(cluster, range(4), slow)
        first = await transfer_under_way(agents, content, background)
        progress = [(await info(a, content))["have"] for a in agents]
        assert await tracker.stop(signal.SIGTERM) == 0
        assert min(progress) < CHUNKS // 2, progress
        await asyncio.sleep(2.0)  # agents announce to nobody for a while

        port = cluster.tracker_url.rsplit(":", 1)[1]
        again = await cluster.spawn("tracker2", ["tracker", "--port", port, "--state-dir",
                                                 str(cluster.workdir / "tracker")])
        assert again.ready["url"] == cluster.tracker_url
        # A newcomer needs the manifest the first tracker persisted, and peers from this one.
        (late,) = await start_agents(cluster, range(4, 5), slow)
        await round_of(cluster, [*agents, late], source, content)
        assert all("error" not in r for r in (await first).values()), await first
        assert metric(await tracker_metrics(cluster), "bootseer_tracker_announces_total") > 0
    finally:
        await cluster.stop()
