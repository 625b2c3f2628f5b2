"""Issue 34, finding 2: a replica log that survives its store (a real `redis-server`).

Whoever can write to Redis writes here what the attack wrote: entries that are
not ops, entries MAC'd with the cluster secret (an insider who can also reach
Redis) whose fields have the wrong types, and snapshots of the wrong
structure. Both running replicas, and one restarted onto the same poison,
must go on serving announces; `/healthz` must tell when a replica's log
reader is gone. Redis itself requires AUTH, and a tracker without the
password, or with a wrong one, says so in one line.
"""

from __future__ import annotations

import asyncio
import pickle
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import msgpack
import pytest
from helpers.promtext import metric
from test_tracker_replicas import CONTENTS, Replica, announce, config, registry_view
from test_tracker_service import SECRET, manifest, start_tracker

from p2p.configfile import ConfigError
from p2p.tracker_client import ContentState, TrackerClient, TrackerError
from tracker import replicas, snapshot
from tracker.config import TrackerConfig
from tracker.registry import Registry
from tracker.state import canonical
from tracker.testing.redisproc import RedisServer


@pytest.fixture
async def redis_server(tmp_path: Path) -> AsyncIterator[RedisServer]:
    server = await RedisServer(tmp_path / "redis", persistent=False).start()
    yield server
    await server.stop()


@pytest.fixture
async def pair(redis_server: RedisServer) -> AsyncIterator[list[Replica]]:
    pair = [await Replica(config(redis_server)).start() for _ in range(2)]
    yield pair
    for r in pair:
        await r.stop()


KEY = replicas.mac_key(SECRET)
C = CONTENTS[0]


def signed(value: Any) -> dict[str, bytes]:
    """A log entry as a replica would write it: what a secret holder with Redis can do."""
    entry: bytes = msgpack.packb(value)
    return {"e": entry, "w": b"", "m": replicas.mac(KEY, b"e", entry, b"")}


POISON = [
    {"x": b"not an op"},  # no fields of ours at all
    {"e": msgpack.packb(["t"]), "w": b""},  # a well-formed op without a MAC
    {"e": b"\xc1", "w": b"", "m": b"0" * 16},  # a wrong MAC on bytes that are not msgpack
    signed(["a", "evil", "10.9.9.9", "10.9.9.9:1", "r0", [[C, "12", True, 0, None, 0]]]),
    signed(["a", "evil", "10.9.9.9", "10.9.9.9:1", "r0", [[C, 1, 1, 0, None, 0]]]),
    signed(["a", "evil", "10.9.9.9", "10.9.9.9:1", "r0", {"items": 1}]),
    signed(["a", ["not", "a", "peer"], "10.9.9.9", None, "r0", []]),
    signed(["r", "evil", "n1", "c1-nothex", "bad", "10.9.9.9", None]),
    signed(["r", "evil", "n1", C, {"reason": 1}, "10.9.9.9", None]),
    signed(["t", 1]),
    signed({"a": 1}),
    signed(7),
]


async def poison_log(redis_server: RedisServer) -> None:
    r = redis_server.client()
    for fields in POISON:
        await r.xadd("bootseer:log", fields)
    await r.aclose()


async def skipped(replica: Replica) -> float:
    return await _metric(replica.url, "bootseer_tracker_log_entries_skipped_total")


async def _metric(url: str, name: str) -> float:
    async with aiohttp.ClientSession() as http, http.get(url + "/metrics") as resp:
        return metric(await resp.text(), name)


async def healthz(url: str) -> int:
    async with aiohttp.ClientSession() as http, http.get(url + "/healthz") as resp:
        return resp.status


async def serve_announces(replica: Replica, peer: str, have: int) -> None:
    async with TrackerClient(replica.url, SECRET) as c:
        got = await announce(c, peer, "r0", [ContentState(C, have, False, want=5)])
    assert got[C].origin_slots == 4


async def test_a_poisoned_log_leaves_both_replicas_and_a_restarted_one_serving(
        pair: list[Replica], redis_server: RedisServer) -> None:
    await serve_announces(pair[0], "n1", 1)
    await poison_log(redis_server)
    await serve_announces(pair[1], "n2", 2)  # applied after the poison, at both
    await serve_announces(pair[0], "n3", 3)
    for r in pair:
        assert await skipped(r) == len(POISON) and await healthz(r.url) == 200
    assert registry_view(pair[0].t.registry) == registry_view(pair[1].t.registry)
    assert [m.peer for m in pair[0].t.registry.members(C)] == ["n1", "n2", "n3"]
    await pair[0].stop()  # restarted: reads the whole log again, poison included
    pair[0] = await Replica(config(redis_server)).start()
    await serve_announces(pair[0], "n4", 4)
    assert await skipped(pair[0]) == len(POISON) and await healthz(pair[0].url) == 200
    assert registry_view(pair[0].t.registry) == registry_view(pair[1].t.registry)


def bad_snapshots() -> list[tuple[str, dict[str, bytes]]]:
    """Snapshots of the wrong structure, each under a good MAC, and two without one."""
    reg = Registry()
    good = msgpack.unpackb(snapshot.dump(reg))
    sets = Registry()  # the attack on the pickled form: sets where dicts belong
    vars(sets).update({k: set() for k, v in vars(sets).items() if isinstance(v, dict)})

    def signed_state(state: Any) -> dict[str, bytes]:
        raw: bytes = msgpack.packb(state)
        return {"id": b"1-0", "state": raw, "mac": replicas.mac(KEY, b"s", b"1-0", raw)}

    members_as_map = [*good[:2], [[C, {"peer": "x"}, [], [], 0, [], [], [], []]], *good[3:]]
    wrong_member = [*good[:2], [[C, [["x", "a:1", "r", "3", False, 0.0, "", 0]], ["x"],
                                 [["r", [], ["x"]]], 0, [], [], [], []]], *good[3:]]
    ghost_fetcher = [*good[:2], [[C, [["x", "a:1", "r", 3, False, 0.0, "", 0]], ["x"],
                                  [["r", [], ["x"]]], 0, ["ghost"], [["ghost", 0, 0.0]], [],
                                  []]],
                     [[C, "x", 0.0]], *good[4:]]
    return [
        ("pickled registry with sets for dicts", {"id": b"1-0", "state": pickle.dumps(sets)}),
        ("right structure, no MAC", {"id": b"1-0", "state": snapshot.dump(reg)}),
        ("a map for the members", signed_state(members_as_map)),
        ("a string count", signed_state(wrong_member)),
        ("a fetcher that is not a member", signed_state(ghost_fetcher)),
        ("a later format", signed_state([snapshot.FORMAT + 1, *good[1:]])),
        ("not a list", signed_state({"registry": 1})),
        ("a huge id", {**signed_state(good), "id": b"99999999999999999999-0"}),
    ]


@pytest.mark.parametrize("case", range(len(bad_snapshots())),
                         ids=[name for name, _ in bad_snapshots()])
async def test_a_bad_snapshot_is_refused_and_the_state_rebuilt_from_the_log(
        pair: list[Replica], redis_server: RedisServer, case: int) -> None:
    await serve_announces(pair[0], "n1", 1)
    await serve_announces(pair[1], "n2", 1)
    r = redis_server.client()
    await r.hset("bootseer:snapshot", mapping=bad_snapshots()[case][1])
    await r.aclose()
    late = await Replica(config(redis_server)).start()  # a replica (re)starting on it
    try:
        await serve_announces(late, "n3", 2)
        await serve_announces(pair[0], "n4", 2)
        assert await _metric(late.url, "bootseer_tracker_snapshots_refused_total") == 1
        views = [registry_view(x.t.registry) for x in [*pair, late]]
        assert views[0] == views[1] == views[2]
        assert [m.peer for m in late.t.registry.members(C)] == ["n1", "n2", "n3", "n4"]
        r = redis_server.client()
        assert await r.exists("bootseer:snapshot") == 0  # deleted: the next writer replaces it
        await r.aclose()
    finally:
        await late.stop()


async def test_healthz_fails_when_the_log_reader_is_not_running(pair: list[Replica]) -> None:
    assert await healthz(pair[0].url) == 200
    (reader,) = [t for t in asyncio.all_tasks() if t.get_name() == "tracker-log"
                 and t in pair[0].t.core._tasks]  # type: ignore[attr-defined]
    reader.cancel()
    await asyncio.gather(reader, return_exceptions=True)
    assert await healthz(pair[0].url) == 503
    assert await healthz(pair[1].url) == 200


async def test_a_manifest_in_redis_that_is_not_its_ids_is_refused_not_served(
        pair: list[Replica], redis_server: RedisServer) -> None:
    real, other = manifest(), manifest(b"other bytes " * 400)
    r = redis_server.client()
    await r.hset("bootseer:manifests", real.content_id, canonical(other))
    await r.aclose()
    async with TrackerClient(pair[0].url, SECRET) as c:
        with pytest.raises(TrackerError) as refused:
            await c.get_manifest(real.content_id)
        assert refused.value.status == 503 and "fails its check" in refused.value.message
    await serve_announces(pair[0], "n1", 1)  # the replica serves on


# -- Redis AUTH -----------------------------------------------------------------------


def test_replicas_without_a_redis_password_are_a_config_error() -> None:
    with pytest.raises(ConfigError, match="redis_url needs redis_password_file"):
        TrackerConfig(redis_url="redis://127.0.0.1:6379/0")
    with pytest.raises(ConfigError, match="rediss://"):
        TrackerConfig(redis_url="redis://127.0.0.1:6379/0", redis_password_file="pw",
                      redis_ca_file="ca.pem")


@pytest.mark.parametrize("given", ["none", "wrong", "missing file"])
async def test_a_tracker_without_the_redis_password_fails_in_one_line(
        tmp_path: Path, redis_server: RedisServer, given: str) -> None:
    pw = tmp_path / "pw"
    if given == "wrong":
        pw.write_text("not-the-password\n")
    args = ["--redis", redis_server.url]
    if given != "none":
        args += ["--redis-password-file", str(pw)]
    t = await start_tracker(tmp_path, *args)
    assert not t.url and t.proc.returncode == 2
    err = t.log.read_text().strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    expected = {"none": "redis_url needs redis_password_file",
                "wrong": "refused the tracker's credentials",
                "missing file": f"cannot read redis_password_file {pw}"}[given]
    assert expected in err, err


async def test_a_replica_with_the_password_file_serves(tmp_path: Path,
                                                       redis_server: RedisServer) -> None:
    t = await start_tracker(tmp_path, *redis_server.replica_args)
    try:
        assert t.url, t.log.read_text()
        assert await healthz(t.url) == 200
    finally:
        await t.stop()


async def test_replicas_reach_redis_over_tls_checked_against_the_ca_file(
        tmp_path: Path) -> None:
    server = await RedisServer(tmp_path / "redis-tls", persistent=False, tls=True).start()
    try:
        assert server.url.startswith("rediss://")
        pair = [await Replica(config(server, redis_ca_file=str(server.ca_file))).start()
                for _ in range(2)]
        try:
            await serve_announces(pair[0], "n1", 1)
            await serve_announces(pair[1], "n2", 1)
            assert registry_view(pair[0].t.registry) == registry_view(pair[1].t.registry)
        finally:
            for r in pair:
                await r.stop()
        other = await RedisServer(tmp_path / "other-ca", tls=True).start()  # another CA
        await other.stop()
        t = await start_tracker(tmp_path, *server.replica_args[:-1], str(other.ca_file))
        assert not t.url and t.proc.returncode == 2
        err = t.log.read_text().strip()
        assert "Traceback" not in err and len(err.splitlines()) == 1, err
        assert "certificate verify failed" in err and server.url in err, err
    finally:
        await server.stop()
