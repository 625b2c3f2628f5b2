"""Tracker replicas sharing a real `redis-server` (started here on 127.0.0.1).

The replicas apply one log (tracker.replicas), so they must answer as one
process fed the same ops would: checked by replaying the log in Redis through
a fresh `Machine` and comparing every reply and the final registries. Then
the faults: Redis restarted, Redis missing at start, a replica killed under
real agents.
"""

from __future__ import annotations

import asyncio
import pickle
import random
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from helpers.cluster import (
    CAPPED,
    CHUNK,
    CHUNKS,
    SIZE,
    Background,
    background,
    info,
    round_of,
    start_agents,
    transfer_under_way,
)
from helpers.promtext import metric
from helpers.waiting import until
from test_tracker_service import SECRET, manifest, start_tracker

from p2p.content import ContentId, PeerId
from p2p.testing.localcluster import LocalCluster, write_random_file
from p2p.tracker_client import ContentState, TrackerClient, TrackerError
from tracker import machine, replicas
from tracker.app import make_app
from tracker.config import TrackerConfig
from tracker.handout import get_policy
from tracker.registry import Registry
from tracker.state import TRACKER, Tracker
from tracker.testing.redisproc import RedisServer

CONTENTS = [ContentId("c1-" + d * 64) for d in "abc"]
__all__ = ["background"]  # the fixture, from test_faults


@pytest.fixture
async def redis_server(tmp_path: Path) -> AsyncIterator[RedisServer]:
    server = await RedisServer(tmp_path / "redis", persistent=False).start()
    yield server
    await server.stop()


class Replica:
    """A tracker app with `redis_url`, served in this process on a free port."""

    def __init__(self, config: TrackerConfig) -> None:
        self.app = make_app(config, SECRET)
        self.runner = web.AppRunner(self.app)
        self.url = ""

    @property
    def t(self) -> Tracker:
        return self.app[TRACKER]

    async def start(self) -> Replica:
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}"
        return self

    async def stop(self) -> None:
        await self.runner.cleanup()


def config(redis: RedisServer, **more: Any) -> TrackerConfig:
    return TrackerConfig(redis_url=redis.url, redis_password_file=str(redis.password_file),
                         peer_ttl_seconds=60.0, origin_fetchers=4,
                         announce_rate_per_second=1e6, announce_burst=10**9,
                         host_rate_per_second=1e6, host_burst=10**9, **more)


@pytest.fixture
async def pair(redis_server: RedisServer) -> AsyncIterator[list[Replica]]:
    pair = [await Replica(config(redis_server)).start() for _ in range(2)]
    yield pair
    for r in pair:
        await r.stop()


def registry_view(reg: Registry) -> dict[str, Any]:
    """What a registry holds that replies depend on, comparable across processes."""
    return {c: ([(m.peer, m.addr, m.rack, m.have, m.complete) for m in reg.members(c)],
                reg.fetchers(c), reg.origin_bytes(c)) for c in reg.contents()}


async def announce(client: TrackerClient, peer: str, rack: str, states: list[ContentState]
                   ) -> dict[ContentId, Any]:
    return await client.announce_all(PeerId(peer), "127.0.0.1:9", rack, states)


async def test_replicas_answer_exactly_as_one_process_applying_the_same_log(
        pair: list[Replica], redis_server: RedisServer) -> None:
    rng = random.Random(5)
    sent: list[tuple[str, int]] = []  # (peer, have of its first content): finds its entry
    replies: dict[tuple[str, int], dict[ContentId, Any]] = {}
    clients = [TrackerClient(r.url, SECRET) for r in pair]

    async def one(i: int) -> None:
        peer, have = f"n{i % 40}", i
        states = [ContentState(c, have, complete=i % 7 == 0,
                               want=rng.choice([0, 5, 30])) for c in
                  rng.sample(CONTENTS, rng.randint(1, 3))]
        sent.append((peer, have))
        replies[(peer, have)] = await announce(clients[i % 2], peer, f"r{i % 5}", states)

    try:
        for start in range(0, 240, 24):  # concurrent batches at both replicas at once
            await asyncio.gather(*(one(i) for i in range(start, start + 24)))
    finally:
        for c in clients:
            await c.close()

    # Replay the log, as it stands in Redis, through one fresh machine.
    r = redis_server.client()
    entries = await r.xrange("bootseer:log")
    seed = await r.get("bootseer:seed")
    await r.aclose()
    cfg = pair[0].t.config
    alone = machine.Machine(Registry(cfg.ban_seconds, origin_fetchers=cfg.origin_fetchers,
                                     fetcher_stall_seconds=cfg.fetcher_stall_seconds,
                                     fetcher_start_seconds=cfg.fetcher_start),
                            get_policy(cfg.handout_policy), cfg.peer_ttl_seconds)
    checked = 0
    for entry_id, fields in entries:
        op = machine.decode(fields[b"e"])
        now = int(entry_id.partition(b"-")[0]) / 1000
        result = alone.apply(op, now, random.Random(seed + b":" + entry_id))
        if isinstance(op, machine.Announce):
            got = replies[(op.peer, op.items[0].have)]
            assert {c: _as_sent(v) for c, v in got.items()} == result, entry_id
            checked += 1
    assert checked == len(sent) == 240
    expected = registry_view(alone.registry)
    assert expected and all(registry_view(r.t.registry) == expected for r in pair)


def _as_sent(reply: Any) -> dict[str, Any]:
    """The client's AnnounceReply back in the tracker's reply form."""
    return {"peers": [{"peer": p.peer, "addr": p.addr, "rack": p.rack, "have": p.have,
                       "complete": p.complete} for p in reply.peers],
            "origin_slot": reply.origin_slot, "origin_slots": reply.origin_slots,
            "origin_filled": reply.origin_filled}


async def test_origin_fetchers_are_appointed_once_across_replicas(pair: list[Replica]) -> None:
    clients = [TrackerClient(r.url, SECRET) for r in pair]
    try:
        got = await asyncio.gather(*(
            announce(clients[i % 2], f"m{i}", "r0", [ContentState(CONTENTS[0], 0, False, want=0)])
            for i in range(40)))
    finally:
        for c in clients:
            await c.close()
    slots = sorted(g[CONTENTS[0]].origin_slot for g in got
                   if g[CONTENTS[0]].origin_slot is not None)
    assert slots == [0, 1, 2, 3]  # two independent trackers would appoint eight
    assert pair[0].t.registry.fetchers(CONTENTS[0]) == pair[1].t.registry.fetchers(CONTENTS[0])


async def test_a_manifest_published_at_one_replica_is_served_by_the_other(
        pair: list[Replica]) -> None:
    m, other = manifest(), manifest(b"another body " * 500)
    async with TrackerClient(pair[0].url, SECRET) as a, TrackerClient(pair[1].url, SECRET) as b:
        created = await asyncio.gather(a.put_manifest(m), b.put_manifest(m))
        assert sorted(created) == [False, True]  # published at once: one of them made it
        assert await b.get_manifest(m.content_id) == m
        await a.put_name("team/model:v1", m.content_id)
        assert await b.get_name("team/model:v1") == m.content_id
        await b.put_manifest(other)
        with pytest.raises(TrackerError) as taken:  # first writer wins, whichever replica
            await b.put_name("team/model:v1", other.content_id)
        assert taken.value.status == 409


async def test_redis_restarted_empty_replicas_start_over_from_the_next_announces(
        pair: list[Replica], redis_server: RedisServer) -> None:
    m = manifest()
    async with TrackerClient(",".join(r.url for r in pair), SECRET) as both, \
            TrackerClient(pair[1].url, SECRET) as b:
        await both.put_manifest(m)
        for i in range(6):
            await announce(both, f"old{i}", "r0", [ContentState(CONTENTS[0], 1, False)])
        await redis_server.stop(signal.SIGKILL)  # not persistent: the log is gone
        with pytest.raises(TrackerError) as refused:
            await announce(both, "new0", "r0", [ContentState(CONTENTS[0], 2, False)])
        assert refused.value.status == 503 and "Redis" in refused.value.message
        await redis_server.start()
        for _ in range(200):  # bounded: the replicas reconnect with back-off
            try:
                await announce(both, "new1", "r1", [ContentState(CONTENTS[0], 3, False)])
                break
            except TrackerError:
                await asyncio.sleep(0.1)
        await announce(both, "new2", "r1", [ContentState(CONTENTS[0], 3, False)])
        views = [registry_view(r.t.registry) for r in pair]
        peers = [p for p, *_ in views[0][CONTENTS[0]][0]]
        assert views[0] == views[1] and "old0" not in peers and "new2" in peers
        assert await b.get_manifest(m.content_id) == m  # written back by a replica


async def test_a_replica_that_joins_late_loads_the_snapshot_and_agrees(
        redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(replicas, "SNAPSHOT_SECONDS", 0.3)
    first = [await Replica(config(redis_server)).start() for _ in range(2)]
    late = None
    try:
        async with TrackerClient(first[0].url, SECRET) as a:
            for round_ in range(3):
                for i in range(30):
                    await announce(a, f"p{i}", f"r{i % 3}",
                                   [ContentState(CONTENTS[i % 2], round_, False, want=0)])
                await asyncio.sleep(0.7)  # a snapshot, and a trim of the log before it
        r = redis_server.client()
        length, snap = await r.xlen("bootseer:log"), await r.hget("bootseer:snapshot", "id")
        await r.aclose()
        assert snap is not None and length < 90, (length, snap)  # trimmed: replay cannot do
        late = await Replica(config(redis_server)).start()
        async with TrackerClient(late.url, SECRET) as c:
            await announce(c, "p0", "r0", [ContentState(CONTENTS[0], 9, False, want=0)])
        views = [registry_view(x.t.registry) for x in [*first, late]]
        assert views[0] == views[1] == views[2] and len(views[0][CONTENTS[1]][0]) == 15
    finally:
        for x in [*first, *([late] if late else [])]:
            await x.stop()


async def test_redis_unreachable_at_start_is_one_line_naming_the_url(tmp_path: Path) -> None:
    from p2p.process import free_port

    url = f"redis://127.0.0.1:{free_port()}/0"
    (tmp_path / "pw").write_text("x")
    t = await start_tracker(tmp_path, "--redis", url, "--redis-password-file", str(tmp_path / "pw"))
    assert not t.url and t.proc.returncode == 2
    err = t.log.read_text()
    assert url in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err


# -- real agents through a replica fault ---------------------------------------------


@pytest.mark.parametrize("fault", ["replica_killed", "redis_restarted"])
async def test_a_transfer_completes_through_a_replica_fault(
        tmp_path: Path, fault: str, background: Background) -> None:
    redis_server = await RedisServer(tmp_path / "redis", persistent=True).start()
    cluster = LocalCluster(tmp_path / "cluster")
    try:
        source = tmp_path / "origin" / "content.bin"
        await asyncio.to_thread(write_random_file, source, SIZE, 11)
        trackers = await cluster.start_replicas(redis_server.url, 2, "--redis-password-file",
                                                str(redis_server.password_file))
        await cluster.start_origin(source.parent)
        content = (await cluster.publish(source, CHUNK)).content_id
        slow = {**CAPPED, "download_mbps": 10.0}  # >= 6 s a copy: the fault falls inside
        agents = await start_agents(cluster, range(3), slow)
        first = await transfer_under_way(agents, content, background)
        live = trackers[1:] if fault == "replica_killed" else trackers

        async def announces() -> float:
            return sum([metric(await _get(f"{t.ready['url']}/metrics"),
                               "bootseer_tracker_announces_total") for t in live])

        before = await announces()
        if fault == "replica_killed":
            assert await trackers[0].stop(signal.SIGKILL) != 0
        else:
            await redis_server.restart()  # persistent: the replicas read on where they were

        async def every_agent_heard() -> bool:  # killed: only the survivor is left to hear
            return await announces() >= before + len(agents)

        await until(every_agent_heard, "the live replicas take every agent's announces")
        progress = [(await info(a, content))["have"] for a in agents]
        assert min(progress) < CHUNKS, progress  # the fault came mid-transfer
        (late,) = await start_agents(cluster, range(3, 4), slow)  # peers, through the replica
        await round_of(cluster, [*agents, late], source, content)
        assert all("error" not in r for r in (await first).values()), await first
        healthz = [await _get(f"{t.ready['url']}/healthz") for t in live]
        assert all('"peers": 4' in h or '"peers":4' in h for h in healthz), healthz
        for t in trackers:
            assert "Traceback" not in t.stderr_path.read_text()
    finally:
        await cluster.stop()
        await redis_server.stop()


async def _get(url: str) -> str:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http, \
            http.get(url) as resp:
        return await resp.text()


async def test_a_snapshot_holding_anything_but_a_registry_is_refused_not_run(
        redis_server: RedisServer) -> None:
    r = redis_server.client()
    await r.hset("bootseer:snapshot", mapping={"id": "1-0", "state": pickle.dumps(Path("/"))})
    await r.aclose()
    replica = await Replica(config(redis_server)).start()  # refused: starts from the log
    try:
        assert replica.t.metrics.snapshots_refused._value.get() == 1
    finally:
        await replica.stop()


async def test_a_single_trackers_state_dir_reaches_every_replica(
        tmp_path: Path, redis_server: RedisServer) -> None:
    m = manifest()
    alone = await Replica(TrackerConfig(state_dir=str(tmp_path / "state"))).start()
    try:
        async with TrackerClient(alone.url, SECRET) as c:
            await c.put_manifest(m)
    finally:
        await alone.stop()
    pair = [await Replica(config(redis_server, state_dir=str(tmp_path / "state"))).start(),
            await Replica(config(redis_server)).start()]
    try:
        async with TrackerClient(pair[1].url, SECRET) as b:
            assert await b.get_manifest(m.content_id) == m
    finally:
        for r in pair:
            await r.stop()
