"""Issue 7, the tracker's rows: attacks on a real `bootseer tracker` process on loopback.

A node is the address it is seen at, so every node here that must be told
apart runs on its own loopback address (127.0.0.2, ...): its TrackerClient
binds there (`bind_host`), exactly as an agent binds to its configured host.
Every wait is bounded; nothing asserts on wall-clock durations.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
import urllib.parse
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yarl
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_tracker_service import (
    SECRET,
    Tracker,
    manifest,
    metric,
    signed,
    start_tracker,
)

from p2p.auth import AUTH_HEADER, TIME_HEADER, sign_request
from p2p.content import ContentId, ManifestError, PeerId
from p2p.process import free_port
from p2p.testing.localcluster import LocalCluster, wait_all_complete, write_random_file
from p2p.tracker_client import UNREACHABLE, TrackerClient, TrackerError
from p2p.units import MiB
from tracker.app import make_app
from tracker.config import TrackerConfig

C = ContentId("c1-" + "2" * 64)
D = ContentId("c1-" + "3" * 64)


@pytest.fixture
async def tracker(tmp_path: Path) -> AsyncIterator[Tracker]:
    t = await start_tracker(tmp_path, "--state-dir", str(tmp_path / "state"), "--seed", "1")
    assert t.url, f"tracker did not start: {t.log.read_text()}"
    yield t
    assert await t.stop() == 0, t.log.read_text()
    assert "Traceback" not in t.log.read_text()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as s:
        yield s


class Node:
    """A node at its own loopback address, talking to the tracker from there."""

    def __init__(self, tracker: Tracker, host: str, peer: str, port: int = 7000) -> None:
        self.host, self.peer, self.addr = host, PeerId(peer), f"{host}:{port}"
        self.client = TrackerClient(tracker.url, SECRET, bind_host=host)

    async def announce(self, content: ContentId = C, **kw: Any) -> list[str]:
        reply = await self.client.announce(content, self.peer, self.addr, "r0",
                                           have=kw.pop("have", 0),
                                           complete=kw.pop("complete", False), **kw)
        return sorted(p.peer for p in reply.peers)

    async def close(self) -> None:
        await self.client.close()


@pytest.fixture
async def nodes(tracker: Tracker) -> AsyncIterator[dict[str, Node]]:
    made = {name: Node(tracker, f"127.0.0.{i + 2}", name)
            for i, name in enumerate(["honest", "x", "y", "attacker", "z"])}
    yield made
    for n in made.values():
        await n.close()


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


# -- identity -------------------------------------------------------------------------


async def test_stopped_sent_in_another_nodes_name_fails(nodes: dict[str, Node]) -> None:
    honest, attacker, z = nodes["honest"], nodes["attacker"], nodes["z"]
    await honest.announce()
    stop = attacker.client.announce(C, honest.peer, honest.addr, "r0", 0, False,
                                    event="stopped")
    with pytest.raises(TrackerError, match=r"belongs to the node at 127\.0\.0\.2") as info:
        await stop
    assert info.value.status == 403
    assert await z.announce() == ["honest"]  # still in the swarm


async def test_an_announce_must_name_the_address_it_comes_from(
        nodes: dict[str, Node]) -> None:
    attacker, z = nodes["attacker"], nodes["z"]
    with pytest.raises(TrackerError, match=r"names host 127\.0\.0\.2, but the announce "
                       r"came from 127\.0\.0\.5") as info:
        await attacker.client.announce(C, PeerId("fake"), "127.0.0.2:7000", "r0", 0, False)
    assert info.value.status == 403
    # An unspecified host is taken to mean the address the announce came from.
    await attacker.client.announce(C, attacker.peer, "0.0.0.0:7001", "r0", 0, False)
    reply = await z.client.announce(C, z.peer, z.addr, "r0", 0, False)
    assert [(p.peer, p.addr) for p in reply.peers] == [("attacker", "127.0.0.5:7001")]


async def test_invented_reporter_ids_do_not_ban_an_honest_node(
        nodes: dict[str, Node], tracker: Tracker, http: aiohttp.ClientSession) -> None:
    honest, x, attacker, z = nodes["honest"], nodes["x"], nodes["attacker"], nodes["z"]
    for n in (honest, x, attacker):
        await n.announce()
    bad = attacker.client
    for ghost in ["ghost-1", "ghost-2"]:  # ids that are members nowhere
        with pytest.raises(TrackerError, match="only members may report") as info:
            await bad.report(PeerId(ghost), honest.peer, C, "bad chunk 1")
        assert info.value.status == 403
    with pytest.raises(TrackerError, match=r"belongs to the node at 127\.0\.0\.3"):
        await bad.report(x.peer, honest.peer, C, "bad chunk 1")  # a real member's id
    # Two members at the attacker's one address count as one reporter.
    await bad.announce(C, PeerId("attacker-2"), attacker.addr, "r0", 0, False)
    assert not await bad.report(attacker.peer, honest.peer, C, "bad chunk 1")
    assert not await bad.report(PeerId("attacker-2"), honest.peer, C, "bad chunk 2")
    assert "honest" in await z.announce()
    assert await metric(http, tracker, "bootseer_tracker_banned") == 0
    assert await metric(http, tracker, "bootseer_tracker_forbidden_total") == 3


async def test_two_addresses_holding_nothing_cannot_ban_an_honest_node(
        nodes: dict[str, Node], tracker: Tracker, http: aiohttp.ClientSession) -> None:
    """Issue 34, finding 3: reports count only from members holding chunks of the content."""
    honest, x, y, attacker, z = (nodes[n] for n in ["honest", "x", "y", "attacker", "z"])
    await honest.announce(have=3)
    for n in (attacker, z):  # two members, two addresses, nothing held
        await n.announce()
        assert not await n.client.report(n.peer, honest.peer, C, "bad chunk 1")
    assert "honest" in await x.announce()
    assert await metric(http, tracker, "bootseer_tracker_banned") == 0
    for n in (x, y):  # reporters that hold chunks of it: the ban still works
        await n.announce(have=2)
    assert not await x.client.report(x.peer, honest.peer, C, "bad chunk 2")
    assert await y.client.report(y.peer, honest.peer, C, "bad chunk 2")
    assert "honest" not in await z.announce()


async def test_a_banned_address_gets_nothing_under_a_new_peer_id(
        nodes: dict[str, Node], tracker: Tracker) -> None:
    x, y, attacker, z = nodes["x"], nodes["y"], nodes["attacker"], nodes["z"]
    await attacker.announce()  # first incomplete announcer: an origin fetcher
    for n in (x, y):
        await n.announce(complete=True)
    assert (await attacker.client.announce(C, attacker.peer, attacker.addr, "r0", 0,
                                           False)).origin_slot == 0
    # The reporters saw it at its address; the name it claimed does not matter.
    assert not await x.client.report(x.peer, PeerId("whatever"), C, "bad chunk 3",
                                     addr="127.0.0.5:7000")
    assert await y.client.report(y.peer, PeerId("whatever"), C, "bad chunk 4",
                                 addr="127.0.0.5")
    assert await z.announce() == ["x", "y"]
    fresh = await attacker.client.announce(C, PeerId("new-name"), "127.0.0.5:7002", "r0",
                                           0, False)
    assert fresh.origin_slot is None
    assert await z.announce() == ["x", "y"]
    assert await z.announce(D) == []
    await attacker.announce(D)
    assert await z.announce(D) == []  # banned in every content
    assert "now banned" in tracker.log.read_text()


async def test_a_report_of_unreachable_frees_the_fetchers_slot_without_a_ban(
        tracker: Tracker, nodes: dict[str, Node]) -> None:
    honest, x, attacker = nodes["honest"], nodes["x"], nodes["attacker"]
    for n in (honest, x):
        await n.announce()
    with pytest.raises(TrackerError, match="only members may report") as info:
        await attacker.client.report(attacker.peer, honest.peer, C, UNREACHABLE)
    assert info.value.status == 403
    assert not await x.client.report(x.peer, honest.peer, C, UNREACHABLE)
    reply = await x.client.announce(C, x.peer, x.addr, "r0", 0, False)
    assert (reply.origin_slot, reply.origin_filled) == (0, 1)  # x took the freed slot
    assert [p.peer for p in reply.peers] == ["honest"]  # not banned


# -- bounded resources ----------------------------------------------------------------


async def test_unauthenticated_manifest_puts_do_not_grow_the_tracker(
        tracker: Tracker, http: aiohttp.ClientSession) -> None:
    """40 x 4 MiB PUTs: 20 unsigned, 20 with well-formed but forged signatures."""
    body = b"{" + b" " * (4 * MiB - 2) + b"}"
    path = f"/v1/manifests/{manifest().content_id}"

    async def put(i: int) -> int:
        headers = {} if i % 2 else {AUTH_HEADER: "ab" * 32, TIME_HEADER: f"{time.time():.3f}"}
        try:
            async with http.put(tracker.url + path, data=body, headers=headers) as r:
                return r.status
        except aiohttp.ClientError:  # it hung up on us before we finished: fine too
            return 401

    before = rss_kib(tracker.proc.pid)
    statuses = await asyncio.gather(*(put(i) for i in range(40)))
    grown_mib = (rss_kib(tracker.proc.pid) - before) / 1024
    assert set(statuses) == {401}
    assert grown_mib < 40, f"tracker RSS grew by {grown_mib:.0f} MiB"
    async with TrackerClient(tracker.url, SECRET) as c:  # still serving
        assert await c.put_manifest(manifest()) is True


async def raw_connection(url: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return await asyncio.open_connection(host, int(port))


async def test_slow_clients_are_cut_and_a_real_request_still_succeeds(tmp_path: Path) -> None:
    """500 connections dribbling a request head, one byte at a time."""
    t = await start_tracker(tmp_path, "--header-timeout", "2")
    head = b"POST /v1/announce HTTP/1.1\r\nHost: tracker\r\nContent-Length: 10\r\n"
    try:
        conns = [await raw_connection(t.url) for _ in range(500)]

        async def dribble(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> int:
            for i in range(len(head)):
                try:
                    writer.write(head[i:i + 1])
                    await writer.drain()
                    if await asyncio.wait_for(reader.read(1), 0.5) == b"":
                        return i + 1  # the tracker hung up
                except TimeoutError:
                    continue
                except ConnectionError:
                    return i + 1
            return -1  # never cut: sent the whole head

        cuts = asyncio.gather(*(dribble(r, w) for r, w in conns))
        async with TrackerClient(t.url, SECRET) as c:  # meanwhile, a real request
            reply = await c.announce(C, PeerId("p"), "127.0.0.1:7000", "r0", 0, False)
            assert reply.origin_slot == 0
        sent = await asyncio.wait_for(cuts, 60)
        assert -1 not in sent
        assert max(sent) < len(head)
        for _, w in conns:
            w.close()
    finally:
        assert await t.stop() == 0


async def test_a_body_that_does_not_arrive_in_time_gets_408(tmp_path: Path) -> None:
    t = await start_tracker(tmp_path, "--body-timeout", "1")
    try:
        reader, writer = await raw_connection(t.url)
        writer.write(b"POST /v1/announce HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n"
                     + f"{AUTH_HEADER}: {'ab' * 32}\r\n{TIME_HEADER}: {time.time():.3f}\r\n"
                       .encode() + b"\r\n{")
        reply = await asyncio.wait_for(reader.read(), 30)
        assert reply.startswith(b"HTTP/1.1 408"), reply[:100]
        assert b"did not arrive within 1 s" in reply
        writer.close()
    finally:
        assert await t.stop() == 0
    assert "Traceback" not in t.log.read_text()


async def test_connections_beyond_the_cap_get_503_and_a_log_line(tmp_path: Path) -> None:
    t = await start_tracker(tmp_path, "--max-connections", "20")
    try:
        idle = [await raw_connection(t.url) for _ in range(20)]
        await asyncio.sleep(0.2)  # let the tracker accept them all
        reader, writer = await raw_connection(t.url)
        reply = await asyncio.wait_for(reader.read(), 10)
        assert reply.startswith(b"HTTP/1.1 503")
        writer.close()
        for _, w in idle:
            w.close()
        async with aiohttp.ClientSession() as http:
            async with asyncio.timeout(20):
                while True:  # the cap frees as the idle connections close
                    async with http.get(t.url + "/healthz") as r:
                        if r.status == 200:
                            break
                    await asyncio.sleep(0.1)
            assert await metric(http, t, "bootseer_tracker_refused_connections_total") >= 1
    finally:
        assert await t.stop() == 0
    assert "at the cap of 20 open connections" in t.log.read_text()


# -- replay ---------------------------------------------------------------------------


async def test_a_replayed_request_has_no_second_effect(
        tracker: Tracker, http: aiohttp.ClientSession) -> None:
    async with TrackerClient(tracker.url, SECRET) as c:
        await c.announce(C, PeerId("a"), "127.0.0.1:7000", "r0", 0, False)
        body = json.dumps({"content": C, "peer": "a", "addr": "127.0.0.1:7000", "rack": "r0",
                           "have": 0, "complete": False, "event": "stopped"}).encode()
        headers = sign_request(SECRET, "POST", "/v1/announce", body, time.time())
        async with http.post(tracker.url + "/v1/announce", data=body, headers=headers) as r:
            assert r.status == 200
        await c.announce(C, PeerId("a"), "127.0.0.1:7000", "r0", 0, False)  # rejoins
        async with http.post(tracker.url + "/v1/announce", data=body, headers=headers) as r:
            assert r.status == 409
            assert "replayed request" in (await r.json())["error"]
        reply = await c.announce(C, PeerId("b"), "127.0.0.1:7001", "r0", 0, False)
        assert [p.peer for p in reply.peers] == ["a"]  # the stop was not repeated
    assert await metric(http, tracker, "bootseer_tracker_replays_total") == 1


@pytest.mark.parametrize("stamp", ["nan", "NaN", "inf", "-inf", "1e10", "-5", "1.5e9",
                                   "1_700_000_000", "0x10", "\u0661\u0667" + "\u0660" * 8])
async def test_a_stamp_that_is_not_plain_decimal_seconds_is_refused(
        tracker: Tracker, http: aiohttp.ClientSession, stamp: str) -> None:
    body = json.dumps({"content": C, "peer": "a", "addr": "127.0.0.1:7000", "rack": "r0",
                       "have": 0, "complete": False}).encode()
    headers = sign_request(SECRET, "POST", "/v1/announce", body, time.time())
    headers[TIME_HEADER] = stamp
    async with http.post(tracker.url + "/v1/announce", data=body, headers=headers) as r:
        assert r.status == 401
        assert "authentication headers" in (await r.json())["error"]


# -- rate limits ----------------------------------------------------------------------


async def test_announces_and_reports_beyond_their_rate_get_429(tmp_path: Path) -> None:
    config = tmp_path / "tracker.toml"
    config.write_text("announce_rate_per_second = 0.2\nannounce_burst = 3\n"
                      "report_rate_per_second = 0.2\nreport_burst = 2\n")
    t = await start_tracker(tmp_path, "--config", str(config))
    try:
        async with TrackerClient(t.url, SECRET) as c:
            async def announce(content: ContentId = C) -> None:
                await c.announce(content, PeerId("p"), "127.0.0.1:7000", "r0", 0, False)

            for _ in range(3):
                await announce()
            for _ in range(20):
                with pytest.raises(TrackerError) as info:
                    await announce()
                assert (info.value.status, info.value.retry_after_s) == (429, 5)
            with pytest.raises(TrackerError):  # one budget per node: all its contents
                await announce(D)
            await c.announce(D, PeerId("q"), "127.0.0.1:7001", "r0", 0, False)  # another node
            for _ in range(2):
                await c.report(PeerId("p"), PeerId("q"), D, "bad chunk")
            with pytest.raises(TrackerError, match="too many reports") as info:
                await c.report(PeerId("p"), PeerId("q"), D, "bad chunk")
            assert info.value.status == 429
    finally:
        assert await t.stop() == 0
    refusals = [line for line in t.log.read_text().splitlines() if " 429 " in line]
    assert 1 <= len(refusals) <= 2, refusals  # rate-limited logging, too


# -- content ids and names ------------------------------------------------------------


async def test_a_content_id_with_an_encoded_slash_is_refused_both_ends(
        tracker: Tracker, http: aiohttp.ClientSession) -> None:
    seen: list[str] = []

    async def record(request: web.Request) -> web.Response:
        seen.append(request.raw_path)
        return web.json_response({})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", record)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    evil = ContentId("..%2F..%2F..%2Fetc%2Fpasswd")
    try:
        async with TrackerClient(f"http://127.0.0.1:{runner.addresses[0][1]}", SECRET) as c:
            with pytest.raises(ManifestError, match="is not a content id"):
                await c.get_manifest(evil)
            with pytest.raises(ManifestError):
                await c.announce(evil, PeerId("p"), "127.0.0.1:7000", "r0", 0, False)
            with pytest.raises(ManifestError):
                await c.put_name("etc/passwd", evil)
    finally:
        await runner.cleanup()
    assert seen == []  # nothing was sent, for any path
    for path in [f"/v1/manifests/{evil}", "/v1/manifests/c1-..%2F",
                 "/v1/manifests/c1-%2Fetc%2Fpasswd"]:
        status, reply = await signed(http, tracker, "GET", path)
        assert status == 400, (path, reply)
        assert "is not a content id" in reply["error"]


async def test_names_first_writer_wins_and_survive_a_restart(tmp_path: Path) -> None:
    state = str(tmp_path / "state")
    real, other = manifest(), manifest(b"other bytes " * 100)
    name = "registry.example/team/trainer:1.4@sha256-abc"
    t = await start_tracker(tmp_path, "--state-dir", state)
    try:
        async with TrackerClient(t.url, SECRET) as c:
            with pytest.raises(TrackerError, match="publish it before naming it") as info:
                await c.put_name(name, real.content_id)
            assert info.value.status == 404
            await c.put_manifest(real)
            await c.put_manifest(other)
            assert await c.put_name(name, real.content_id) is True
            assert await c.put_name(name, real.content_id) is False  # idempotent
            with pytest.raises(TrackerError, match=f"already names {real.content_id}") as info:
                await c.put_name(name, other.content_id)
            assert info.value.status == 409
            assert await c.get_name(name) == real.content_id
            with pytest.raises(TrackerError, match="no content is named") as info:
                await c.get_name("nobody/named/this")
            assert info.value.status == 404
            for bad in [".hidden", "a//b", "a/../b", "x" * 256, "sp ace", "a/"]:
                with pytest.raises(ValueError, match=r"must be 1\.\.255 characters"):
                    await c.get_name(bad)
        async with aiohttp.ClientSession() as http:
            for bad in ["a//b", "x" * 256, "a%20b", "-a"]:
                status, reply = await signed(http, t, "GET", f"/v1/names/{bad}")
                assert (status, "must be 1..255" in reply["error"]) == (400, True), bad
    finally:
        assert await t.stop() == 0
    again = await start_tracker(tmp_path, "--state-dir", state)
    try:
        async with TrackerClient(again.url, SECRET) as c:
            assert await c.get_name(name) == real.content_id
            with pytest.raises(TrackerError) as info:
                await c.put_name(name, other.content_id)
            assert info.value.status == 409
    finally:
        assert await again.stop() == 0


# -- origin-fetcher slots -------------------------------------------------------------


async def test_fake_members_holding_the_fetcher_slots_lose_them(tmp_path: Path) -> None:
    """4 never-progressing members, at unreachable addresses, take every slot first."""
    cluster = LocalCluster(tmp_path / "cluster")
    fakes: list[TrackerClient] = []
    slots: dict[str, int | None] = {}
    try:
        await cluster.start_tracker("--fetcher-stall", "1", "--announce-interval", "0.5")
        source = tmp_path / "origin" / "content.bin"
        await asyncio.to_thread(write_random_file, source, 16 * MiB, 3)
        await cluster.start_origin(source.parent)
        m = await cluster.publish(source, 1 * MiB)
        fakes = [TrackerClient(cluster.tracker_url, cluster.secret, bind_host=f"127.0.0.{i + 2}")
                 for i in range(4)]

        async def fake_announce(i: int) -> None:
            host = f"127.0.0.{i + 2}"
            reply = await fakes[i].announce(m.content_id, PeerId(f"fake{i}"),
                                            f"{host}:{free_port(host)}", "rack0", 0, False)
            slots[f"fake{i}"] = reply.origin_slot

        for i in range(4):
            await fake_announce(i)
        assert slots == {"fake0": 0, "fake1": 1, "fake2": 2, "fake3": 3}

        async def keep_announcing() -> None:
            while True:
                await asyncio.gather(*(fake_announce(i) for i in range(4)))
                await asyncio.sleep(0.3)

        announcer = asyncio.create_task(keep_announcing())
        try:
            agents = [await cluster.start_agent(i, "rack0") for i in range(2)]
            results = await wait_all_complete(agents, m.content_id, 120)
        finally:
            announcer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await announcer
        assert all(r.get("complete") for r in results.values()), results
        # The agents may finish before the fakes' next announce: ask once more.
        await asyncio.gather(*(fake_announce(i) for i in range(4)))
        assert set(slots.values()) == {None}, slots  # every fake lost its slot
        async with aiohttp.ClientSession() as http, \
                http.get(cluster.tracker_url + "/metrics") as r:
            text = await r.text()
        reassigned = next(float(line.split()[1]) for line in text.splitlines()
                          if line.startswith("bootseer_tracker_fetchers_reassigned "))
        assert reassigned >= 4
        assert await cluster.origin_bytes() <= 2 * m.size
    finally:
        for c in fakes:
            await c.close()
        await cluster.stop()


async def test_ten_squatting_addresses_cost_an_honest_fetch_a_few_seconds(
        tmp_path: Path) -> None:
    """Issue 34, finding 7, with real processes: 10 fake members at 10 addresses, each
    listening (dials to them succeed, then nothing is said), take the slots first and keep
    announcing holding nothing, under two peer ids each. Default intervals. The honest
    agent's time is printed for the report, beside the same fetch without squatters;
    what is asserted is that the fakes are out and the origin served the bytes ~once."""
    cluster = LocalCluster(tmp_path / "cluster")
    fakes: list[TrackerClient] = []
    servers: list[asyncio.Server] = []
    held: list[asyncio.StreamWriter] = []
    slots: dict[str, int | None] = {}

    async def hold(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)  # accepted, never answered

    try:
        await cluster.start_tracker()
        origin = tmp_path / "origin"
        for name, seed in (("squatted.bin", 3), ("alone.bin", 4)):
            await asyncio.to_thread(write_random_file, origin / name, 16 * MiB, seed)
        await cluster.start_origin(origin)
        squatted = await cluster.publish(origin / "squatted.bin", 1 * MiB)
        alone = await cluster.publish(origin / "alone.bin", 1 * MiB)
        hosts = [f"127.0.0.{i + 2}" for i in range(10)]
        servers = [await asyncio.start_server(hold, h, 0) for h in hosts]
        addrs = [f"{h}:{srv.sockets[0].getsockname()[1]}"
                 for h, srv in zip(hosts, servers, strict=True)]
        fakes = [TrackerClient(cluster.tracker_url, cluster.secret, bind_host=h) for h in hosts]

        async def fake_announce(i: int) -> None:
            for peer in (f"fake{i}", f"fake{i}-b"):
                reply = await fakes[i].announce(squatted.content_id, PeerId(peer), addrs[i],
                                                "rack0", 0, False)
                slots[peer] = reply.origin_slot

        for _ in range(2):  # the second pass hears the slots as they settled
            for i in range(10):
                await fake_announce(i)
        assert sorted(s for s in slots.values() if s is not None) == list(range(8))

        async def keep_announcing() -> None:
            while True:
                await asyncio.gather(*(fake_announce(i) for i in range(10)))
                await asyncio.sleep(0.3)

        announcer = asyncio.create_task(keep_announcing())
        try:
            (agent,) = [await cluster.start_agent(0, "rack0")]
            began = time.monotonic()
            results = await wait_all_complete([agent], squatted.content_id, 120)
            with_squatters = time.monotonic() - began
            began = time.monotonic()
            baseline = await wait_all_complete([agent], alone.content_id, 120)
            without = time.monotonic() - began
        finally:
            announcer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await announcer
        assert all(r.get("complete") for r in [*results.values(), *baseline.values()]), results
        await asyncio.gather(*(fake_announce(i) for i in range(10)))
        assert set(slots.values()) == {None}, slots  # every fake, under either id, is out
        assert await cluster.origin_bytes() <= 2 * (squatted.size + alone.size)
        print(json.dumps({"test": "squatted_fetch_16MiB", "fakes": 10,
                          "seconds": round(with_squatters, 2),
                          "baseline_seconds": round(without, 2),
                          "ratio": round(with_squatters / without, 1)}))
    finally:
        for w in held:
            w.close()
        for srv in servers:
            srv.close()
        for c in fakes:
            await c.close()
        await cluster.stop()


# -- fuzzing the request parsing ------------------------------------------------------


class InProcessTracker:
    """The tracker app on a real loopback port, run by a loop in a thread of its own.

    Hypothesis calls a synchronous test body once per example; each example
    sends its requests to the loop with `send` and waits for the status.
    """

    def __init__(self, state_dir: Path) -> None:
        self.config = TrackerConfig(port=0, state_dir=str(state_dir), seed=1,
                                    announce_rate_per_second=1e6, announce_burst=10**6,
                                    report_rate_per_second=1e6, report_burst=10**6,
                                    host_rate_per_second=1e6, host_burst=10**6)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.url = self._call(self._start())

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(60)

    async def _start(self) -> str:
        self.app = make_app(self.config, SECRET)
        self.runner = web.AppRunner(self.app)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()
        self.http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30))
        return f"http://127.0.0.1:{self.runner.addresses[0][1]}"

    async def _send(self, method: str, path: str, body: bytes) -> int:
        url = yarl.URL(self.url + path, encoded=True)  # signed over the decoded path
        headers = sign_request(SECRET, method, url.path, body, time.time())
        async with self.http.request(method, url, data=body, headers=headers) as r:
            await r.read()
            return r.status

    def send(self, method: str, path: str, body: bytes) -> int:
        return int(self._call(self._send(method, path, body)))

    def close(self) -> None:
        async def stop() -> None:
            await self.http.close()
            await self.runner.cleanup()

        self._call(stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture(scope="module")
def in_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessTracker]:
    served = InProcessTracker(tmp_path_factory.mktemp("fuzz"))
    yield served
    served.close()


LEAF = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
NESTED = st.lists(LEAF, max_size=4) | st.dictionaries(st.text(max_size=8), LEAF, max_size=4)
JSON = LEAF | NESTED | st.lists(NESTED, max_size=3) | st.dictionaries(
    st.text(max_size=8), NESTED, max_size=3)
REAL = manifest()


def near(good: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    """Dicts shaped like `good`: each field kept, dropped or replaced by any JSON."""
    return st.fixed_dictionaries({}, optional={k: st.just(v) | JSON for k, v in good.items()})


BODIES = st.one_of(st.binary(max_size=64).map(lambda b: ("raw", b)),
                   JSON.map(lambda v: ("json", v)))
ANNOUNCE = near({"content": C, "peer": "p", "addr": "127.0.0.1:7000", "rack": "r",
                 "have": 1, "complete": False, "event": "started", "want": 3})
REPORT = near({"peer": "p", "bad_peer": "q", "content": C, "reason": "bad chunk",
               "addr": "127.0.0.2"})
MANIFEST = near(REAL.to_dict())
NAME = near({"content_id": REAL.content_id})
EXPECTED = {200, 201, 400, 403, 404, 409}


def encode(value: Any) -> bytes:
    if isinstance(value, tuple):
        kind, inner = value
        return inner if kind == "raw" else json.dumps(inner).encode()
    return json.dumps(value).encode()


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(announce=ANNOUNCE | BODIES, report=REPORT | BODIES, manifest_body=MANIFEST | BODIES,
       name=NAME | BODIES, name_path=st.text(max_size=12) | st.just("team/image:1"))
def test_no_request_body_makes_the_tracker_fail(
        in_process: InProcessTracker, announce: Any, report: Any, manifest_body: Any,
        name: Any, name_path: str) -> None:
    quoted = urllib.parse.quote(name_path, safe="") or "x"
    for method, path, body in [
            ("POST", "/v1/announce", announce), ("POST", "/v1/report", report),
            ("PUT", f"/v1/manifests/{REAL.content_id}", manifest_body),
            ("PUT", f"/v1/names/{quoted}", name)]:
        status = in_process.send(method, path, encode(body))
        assert status in EXPECTED, (method, path, body, status)
    assert in_process.send("GET", "/healthz", b"") == 200
