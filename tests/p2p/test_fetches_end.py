"""Fetches that end: a content whose origin cannot serve it fails with the origin's
answer, and a content can gain origins so that a dead first one blocks nothing.

Real processes on loopback: a tracker, a `bootseer origin` HTTP server and an
agent (p2p.testing.localcluster). Every wait is bounded; the bound is a generous cap so a
hang fails the test instead of stalling it, not a timing claim.
"""

from __future__ import annotations

import asyncio
import random
import subprocess
from pathlib import Path

import pytest

from p2p.agentclient import AgentError
from p2p.content import PeerId
from p2p.swarm.config import SwarmConfig
from p2p.swarm.events import Abort, ChunkFailed, FetchFromOrigin, PeerJoined, PeersFound
from p2p.swarm.swarm import Swarm
from p2p.testing.localcluster import (
    LocalCluster,
    bootseer_command,
    manifest_of_file,
    write_random_file,
)
from p2p.tracker_client import TrackerClient, TrackerError
from p2p.units import MiB


def _drive(s: Swarm, first: list[object], definite: bool, until_s: float
           ) -> tuple[list[Abort], float]:
    """Fail every origin fetch `s` makes, following its timer, until it aborts or until_s."""
    now, acts, aborts = 0.0, first, []
    while now < until_s:
        while acts:  # failing a fetch may start another, or end the content at once
            a = acts.pop(0)
            aborts += [a] if isinstance(a, Abort) else []
            if isinstance(a, FetchFromOrigin):
                acts += s.handle(ChunkFailed(a.chunk, None, "origin x answered HTTP 404",
                                             definite), now)
        if aborts or (t := s.next_timer()) is None:
            break
        now = t
        acts = list(s.handle_timer(now))
    return aborts, now


def _fetcher() -> tuple[Swarm, list[object]]:
    s = Swarm(PeerId("me"), "r", 2, [False, False], 100, SwarmConfig(), random.Random(1), 0.0)
    return s, list(s.handle(PeersFound((), origin_slot=0, origin_slots=1), 0.0))


def test_definite_answers_abort_within_origin_refused_s_transient_ones_do_not() -> None:
    s, first = _fetcher()
    aborts, when = _drive(s, first, definite=True, until_s=60.0)
    assert aborts and "origin cannot serve" in aborts[0].reason and "HTTP 404" in aborts[0].reason
    assert when <= SwarmConfig().origin_refused_s + SwarmConfig().backoff_max_s
    s, first = _fetcher()
    assert _drive(s, first, definite=False, until_s=60.0)[0] == []  # the 180 s rule only


def test_a_peer_that_holds_a_missing_chunk_keeps_the_content_alive() -> None:
    s, first = _fetcher()
    s.handle(PeerJoined(PeerId("p"), "r", (False, True)), 0.0)
    aborts, _ = _drive(s, first, definite=True, until_s=60.0)
    assert not any("origin cannot serve" in a.reason for a in aborts)


SIZE = 6 * MiB
CHUNK = 1 * MiB
# Far below the agent's 180 s no-source deadline: only the origin's answer can end it.
BOUND_S = 60.0


async def _cluster(tmp_path: Path) -> tuple[LocalCluster, Path]:
    served = tmp_path / "served"
    served.mkdir()
    write_random_file(served / "blob.bin", SIZE, seed=7)
    cluster = LocalCluster(tmp_path / "cluster")
    await cluster.start_tracker()
    await cluster.start_origin(served)
    return cluster, served / "blob.bin"


@pytest.mark.parametrize("answer", ["404", "refused"])
async def test_a_get_whose_origin_cannot_serve_fails_with_the_origins_answer(
        tmp_path: Path, answer: str) -> None:
    cluster, path = await _cluster(tmp_path)
    try:
        dead = (f"{cluster.origin_url}/no-such-file.bin" if answer == "404"
                else "http://127.0.0.1:9/blob.bin")  # the discard port: nothing listens
        manifest = await cluster.publish(path, CHUNK, origin=dead)
        agent = await cluster.start_agent(0, "rack0")
        async with agent.client() as api:
            with pytest.raises(AgentError) as failed:
                await asyncio.wait_for(api.ensure(manifest.content_id), BOUND_S)
        message = str(failed.value)
        assert "origin cannot serve" in message, message
        assert ("answered HTTP 404" if answer == "404" else "127.0.0.1:9") in message, message
        assert "no chunk arrived" not in message  # not the 180 s deadline
    finally:
        await cluster.stop()


async def test_a_content_gains_an_origin_and_a_dead_first_one_blocks_nothing(
        tmp_path: Path) -> None:
    cluster, path = await _cluster(tmp_path)
    try:
        # An insider publishes the real digests first, with an origin that answers 404.
        squatted = await cluster.publish(path, CHUNK, origin=f"{cluster.origin_url}/gone.bin")
        # The real publisher's manifest: same id, its own origin. It is added, not refused.
        real = manifest_of_file(path, CHUNK, f"{cluster.origin_url}/blob.bin")
        assert real.content_id == squatted.content_id
        async with TrackerClient(cluster.tracker_url, cluster.secret) as tracker:
            assert await tracker.put_manifest(real) is False
            served = await tracker.get_manifest(real.content_id)
            assert served.sources == (squatted.origin, real.origin)
            # Another kind is still refused, and the refusal says what to do.
            other = manifest_of_file(path, CHUNK, f"{cluster.origin_url}/blob.bin")
            object.__setattr__(other, "kind", "layer")
            with pytest.raises(TrackerError) as refused:
                await tracker.put_manifest(other)
            assert refused.value.status == 409
            assert "publish it with kind 'blob' to add an origin" in str(refused.value)
        agent = await cluster.start_agent(0, "rack0")
        async with agent.client() as api:
            await asyncio.wait_for(api.ensure(real.content_id), BOUND_S)
            got = await api.read(real.content_id, 0, SIZE)
        assert got == path.read_bytes()
    finally:
        await cluster.stop()


async def test_publish_refuses_an_origin_that_cannot_serve_the_file(tmp_path: Path) -> None:
    cluster, path = await _cluster(tmp_path)
    try:
        published = await asyncio.to_thread(
            subprocess.run,
            [*bootseer_command(), "publish", str(path), "--origin",
             f"{cluster.origin_url}/mistyped.bin", "--tracker", cluster.tracker_url],
            env=cluster.env, capture_output=True, text=True, timeout=60)
        assert published.returncode != 0
        assert "Traceback" not in published.stderr
        assert "answered HTTP 404" in published.stderr, published.stderr
        assert "nothing was published" in published.stderr
        content = manifest_of_file(path, 4 * MiB, "unused").content_id
        async with TrackerClient(cluster.tracker_url, cluster.secret) as tracker:
            with pytest.raises(TrackerError) as missing:
                await tracker.get_manifest(content)
        assert missing.value.status == 404
    finally:
        await cluster.stop()
