"""The real tracker, started as `bootseer tracker --port 0`, over HTTP on loopback.

Talks to it with p2p.tracker_client.TrackerClient (the agent's client) and
with raw aiohttp requests for the cases the client would never send. Every
wait is bounded; nothing asserts on wall-clock durations.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from p2p.auth import BODY_MAC_HEADER, AuthError, sign_request
from p2p.content import ContentId, Manifest, ManifestBuilder, PeerId
from p2p.process import free_port
from p2p.tracker_client import TrackerClient, TrackerError, TrackerUnavailable

BOOTSEER = Path(sys.executable).parent / "bootseer"
SECRET = b"tracker-test-secret-0123456789"
START_TIMEOUT_SECONDS = 30.0
C = ContentId("c1-" + "1" * 64)
UNKNOWN = ContentId("c1-" + "0" * 64)  # well formed, never published


@dataclass
class Tracker:
    proc: asyncio.subprocess.Process
    url: str
    log: Path

    async def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.proc.returncode is None:
            self.proc.send_signal(sig)
        return await asyncio.wait_for(self.proc.wait(), START_TIMEOUT_SECONDS)


async def start_tracker(tmp_path: Path, *args: str, secret: bytes | None = SECRET,
                        port: str = "0") -> Tracker:
    """Run `bootseer tracker` and wait for its listening line (or its exit)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BOOTSEER_")}
    if secret is not None:
        env["BOOTSEER_SECRET"] = secret.decode()
    log = tmp_path / f"tracker-{time.monotonic_ns()}.log"
    with open(log, "wb") as stderr:
        proc = await asyncio.create_subprocess_exec(
            str(BOOTSEER), "tracker", "--port", port, *args, env=env,
            stdout=asyncio.subprocess.PIPE, stderr=stderr)
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), START_TIMEOUT_SECONDS)
    if not line:
        await asyncio.wait_for(proc.wait(), START_TIMEOUT_SECONDS)
        return Tracker(proc, "", log)
    event = json.loads(line)
    assert event["event"] == "listening"
    return Tracker(proc, event["url"], log)


@pytest.fixture
async def tracker(tmp_path: Path) -> AsyncIterator[Tracker]:
    t = await start_tracker(tmp_path, "--state-dir", str(tmp_path / "state"),
                            "--announce-interval", "0.2", "--peer-ttl", "0.6", "--seed", "1")
    assert t.url, f"tracker did not start: {t.log.read_text()}"
    yield t
    assert await t.stop() == 0, t.log.read_text()
    assert "Traceback" not in t.log.read_text()


@pytest.fixture
async def client(tracker: Tracker) -> AsyncIterator[TrackerClient]:
    async with TrackerClient(tracker.url, SECRET) as c:
        yield c


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s:
        yield s


async def signed(http: aiohttp.ClientSession, tracker: Tracker, method: str, path: str,
                 body: bytes = b"", secret: bytes = SECRET,
                 now: float | None = None) -> tuple[int, dict[str, Any]]:
    headers = sign_request(secret, method, path, body, time.time() if now is None else now)
    async with http.request(method, tracker.url + path, data=body, headers=headers) as r:
        return r.status, json.loads(await r.read())


def manifest(data: bytes = b"hello tracker " * 1000) -> Manifest:
    builder = ManifestBuilder(chunk_size=4096)
    builder.feed(data)
    return builder.finish("blob", "file:///tmp/origin")


async def announce(client: TrackerClient, peer: str, rack: str = "r0", host: str = "127.0.0.1",
                   **kw: Any) -> list[str]:
    reply = await client.announce(C, PeerId(peer), f"{host}:{6000 + len(peer)}", rack,
                                  have=kw.pop("have", 0), complete=kw.pop("complete", False),
                                  **kw)
    return sorted(p.peer for p in reply.peers)


async def metric(http: aiohttp.ClientSession, tracker: Tracker, name: str) -> float:
    async with http.get(tracker.url + "/metrics") as r:
        assert r.status == 200
        for line in (await r.text()).splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise AssertionError(f"metric {name} not exposed")


# -- announce, report -----------------------------------------------------------------


async def test_announce_hands_out_the_other_members(client: TrackerClient) -> None:
    assert await announce(client, "a") == []
    assert await announce(client, "b") == ["a"]
    reply = await client.announce(C, PeerId("c"), "127.0.0.1:7001", "r1", have=4, complete=True)
    assert sorted(p.peer for p in reply.peers) == ["a", "b"]
    assert reply.interval == pytest.approx(0.2)
    a = next(p for p in reply.peers if p.peer == "a")
    assert (a.addr, a.rack, a.have, a.complete) == ("127.0.0.1:6001", "r0", 0, False)
    assert await announce(client, "a", want=0) == []
    assert await announce(client, "a", want=1) in (["b"], ["c"])


async def test_announce_appoints_origin_fetchers(client: TrackerClient) -> None:
    async def slot(peer: str, complete: bool = False) -> tuple[int | None, int, int | None]:
        reply = await client.announce(C, PeerId(peer), "127.0.0.1:7000", "r0", have=0,
                                      complete=complete)
        return reply.origin_slot, reply.origin_slots, reply.origin_filled

    k = (await slot("seed", complete=True))[1]  # the configured fetcher count, fixed
    assert await slot("seed", complete=True) == (None, k, 0)
    assert await slot("a") == (0, k, 1)
    assert await slot("b") == (1, k, 2)
    assert await slot("a") == (0, k, 2)
    await client.announce(C, PeerId("a"), "127.0.0.1:7000", "r0", 0, False, event="stopped")
    assert await slot("b") == (0, k, 1)


async def test_stopped_peer_leaves_the_swarm(client: TrackerClient) -> None:
    await announce(client, "a")
    await announce(client, "b")
    assert await announce(client, "b", event="stopped") == []
    assert await announce(client, "a") == []


async def test_peer_reported_by_two_peers_is_not_handed_out(tracker: Tracker) -> None:
    """Nodes are addresses: each peer here runs on its own loopback address."""
    hosts = {"bad": "127.0.0.2", "x": "127.0.0.3", "y": "127.0.0.4", "z": "127.0.0.5"}
    clients = {p: TrackerClient(tracker.url, SECRET, bind_host=h) for p, h in hosts.items()}
    try:
        for p, c in clients.items():  # the reporters hold chunks: their reports count
            await announce(c, p, host=hosts[p], have=1)
        assert not await clients["x"].report(PeerId("x"), PeerId("bad"), C, "chunk 3 mismatch")
        assert "bad" in await announce(clients["z"], "z", host=hosts["z"])
        assert await clients["y"].report(PeerId("y"), PeerId("bad"), C, "chunk 5 mismatch")
        assert await announce(clients["z"], "z", host=hosts["z"]) == ["x", "y"]
    finally:
        for c in clients.values():
            await c.close()


async def test_silent_peers_expire(client: TrackerClient, tracker: Tracker,
                                   http: aiohttp.ClientSession) -> None:
    await announce(client, "a")
    await announce(client, "b")

    async def gone() -> None:
        while True:
            async with http.get(tracker.url + "/healthz") as r:
                if (await r.json())["peers"] == 0:
                    return
            await asyncio.sleep(0.1)

    await asyncio.wait_for(gone(), 20)
    assert await metric(http, tracker, "bootseer_tracker_expired_peers_total") == 2
    assert await announce(client, "c") == []


# -- manifests ------------------------------------------------------------------------


async def test_manifest_round_trip(client: TrackerClient) -> None:
    m = manifest()
    assert await client.put_manifest(m) is True
    assert await client.put_manifest(m) is False  # identical: fine, not new
    assert await client.get_manifest(m.content_id) == m
    with pytest.raises(TrackerError, match=f"no manifest is published as {UNKNOWN}") as info:
        await client.get_manifest(UNKNOWN)
    assert info.value.status == 404


async def test_an_id_cannot_be_bound_to_other_bytes(
        tracker: Tracker, http: aiohttp.ClientSession) -> None:
    """Ids certify their manifest: registering one first with another file's digests fails."""
    real, other = manifest(), manifest(b"an attacker's file " * 500)
    forged = {**other.to_dict(), "content_id": real.content_id}
    status, reply = await signed(http, tracker, "PUT", f"/v1/manifests/{real.content_id}",
                                 json.dumps(forged).encode())
    assert status == 400
    assert "does not match its manifest" in reply["error"]
    async with TrackerClient(tracker.url, SECRET) as c:
        assert await c.put_manifest(real) is True


async def test_manifest_survives_a_restart(tmp_path: Path) -> None:
    state = str(tmp_path / "state")
    m = manifest()
    first = await start_tracker(tmp_path, "--state-dir", state)
    async with TrackerClient(first.url, SECRET) as c:
        assert await c.put_manifest(m)
    assert await first.stop() == 0
    second = await start_tracker(tmp_path, "--state-dir", state)
    try:
        async with TrackerClient(second.url, SECRET) as c:
            assert await c.get_manifest(m.content_id) == m
    finally:
        assert await second.stop() == 0


async def test_client_rejects_an_unsigned_manifest(tmp_path: Path) -> None:
    """The client's trust boundary: a manifest without the tracker's body MAC is refused."""
    body = json.dumps(manifest().to_dict()).encode()

    async def unsigned(request: web.Request) -> web.Response:
        return web.Response(body=body, content_type="application/json",
                            headers={BODY_MAC_HEADER: "00" * 32})

    app = web.Application()
    app.router.add_get("/v1/manifests/{id}", unsigned)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        async with TrackerClient(f"http://127.0.0.1:{runner.addresses[0][1]}", SECRET) as c:
            with pytest.raises(AuthError):
                await c.get_manifest(UNKNOWN)
    finally:
        await runner.cleanup()


# -- authentication and bad input -----------------------------------------------------


async def test_unsigned_and_wrongly_signed_requests_get_401(
        tracker: Tracker, http: aiohttp.ClientSession) -> None:
    body = json.dumps({"content": C, "peer": "p", "addr": "h:1", "rack": "r", "have": 0,
                       "complete": False}).encode()
    async with http.post(tracker.url + "/v1/announce", data=body) as r:
        assert r.status == 401
        assert "missing" in (await r.json())["error"]
    status, reply = await signed(http, tracker, "POST", "/v1/announce", body,
                                 secret=b"another-secret-0123456789")
    assert (status, "wrong cluster secret" in reply["error"]) == (401, True)
    status, reply = await signed(http, tracker, "POST", "/v1/announce", body,
                                 now=time.time() - 3600)
    assert (status, "off the tracker's clock" in reply["error"]) == (401, True)
    status, _ = await signed(http, tracker, "GET", f"/v1/manifests/{UNKNOWN}", secret=b"x" * 20)
    assert status == 401
    async with TrackerClient(tracker.url, b"another-secret-0123456789") as c:
        with pytest.raises(TrackerError) as info:
            await c.get_manifest(UNKNOWN)
    assert info.value.status == 401
    assert await metric(http, tracker, "bootseer_tracker_auth_failures_total") == 5


GOOD = {"content": C, "peer": "p", "addr": "10.0.0.1:7000", "rack": "r", "have": 3,
        "complete": False}


def _with(**changes: Any) -> bytes:
    body = {**GOOD, **changes}
    return json.dumps({k: v for k, v in body.items() if v is not ...}).encode()


@pytest.mark.parametrize("body, message", [
    (b"{not json", "not valid JSON"),
    (b"[1, 2]", "must be a JSON object"),
    (b"[" * 30_000 + b"]" * 30_000, "not valid JSON"),  # too deep: RecursionError
    (_with(content=...), 'missing field "contents"'),
    (_with(peer=7), 'field "peer" must be str'),
    (_with(peer=""), 'field "peer" must not be empty'),
    (_with(have="3"), 'field "have" must be int'),
    (_with(have=True), 'field "have" must be int'),
    (_with(have=-1), 'field "have" must be in'),
    (_with(complete=1), 'field "complete" must be bool'),
    (_with(addr="10.0.0.1"), 'field "addr" must be "host:port"'),
    (_with(addr="h:99999"), 'field "addr"'),
    (_with(rack="a\nb"), 'field "rack" must be printable'),
    (_with(event="paused"), 'field "event"'),
    (_with(want=-2), 'field "want"'),
    (_with(rack="x" * 70_000), "exceeds the 65536-byte limit"),
])
async def test_malformed_announce_gets_400_naming_the_problem(
        tracker: Tracker, http: aiohttp.ClientSession, body: bytes, message: str) -> None:
    status, reply = await signed(http, tracker, "POST", "/v1/announce", body)
    assert status == 400
    assert message in reply["error"]


@pytest.mark.parametrize("path, body, message", [
    ("/v1/report", json.dumps({"peer": "a", "content": C, "reason": "r"}),
     'missing field "bad_peer"'),
    (f"/v1/manifests/{UNKNOWN}", "{}", "bad manifest"),
    (f"/v1/manifests/{UNKNOWN}", json.dumps({**manifest().to_dict(), "size": 1}), "bad manifest"),
    (f"/v1/manifests/{UNKNOWN}", json.dumps(manifest().to_dict()), "does not match the URL"),
    ("/v1/manifests/.hidden", json.dumps(manifest().to_dict()), "'.hidden' is not a content id"),
])
async def test_malformed_report_and_manifest_get_400(
        tracker: Tracker, http: aiohttp.ClientSession, path: str, body: str,
        message: str) -> None:
    method = "POST" if path == "/v1/report" else "PUT"
    status, reply = await signed(http, tracker, method, path, body.encode())
    assert status == 400
    assert message in reply["error"]
    assert await metric(http, tracker, "bootseer_tracker_bad_requests_total") == 1


async def test_unknown_route_is_a_json_404(tracker: Tracker,
                                           http: aiohttp.ClientSession) -> None:
    async with http.get(tracker.url + "/v2/nothing") as r:
        assert r.status == 404
        assert "error" in await r.json()


# -- health, metrics, unreachable -----------------------------------------------------


async def test_healthz_and_metrics(client: TrackerClient, tracker: Tracker,
                                   http: aiohttp.ClientSession) -> None:
    await announce(client, "a")
    await announce(client, "b")
    await client.put_manifest(manifest())
    await client.report(PeerId("a"), PeerId("b"), C, "bad chunk")
    async with http.get(tracker.url + "/healthz") as r:
        assert (r.status, await r.json()) == (200, {"ok": True, "peers": 2, "contents": 1})
    assert await metric(http, tracker, "bootseer_tracker_announces_total") == 2
    assert await metric(http, tracker, "bootseer_tracker_peers") == 2
    assert await metric(http, tracker, "bootseer_tracker_contents") == 1
    assert await metric(http, tracker, "bootseer_tracker_manifests") == 1
    assert await metric(http, tracker, "bootseer_tracker_reports_total") == 1
    for name in ["expired_peers_total", "auth_failures_total", "bad_requests_total"]:
        assert await metric(http, tracker, f"bootseer_tracker_{name}") == 0


async def test_unreachable_tracker_raises_tracker_unavailable() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    async with TrackerClient(url, SECRET) as c:
        with pytest.raises(TrackerUnavailable, match=f"the tracker at {url} is unreachable"):
            await announce(c, "a")


# -- the command ----------------------------------------------------------------------


async def test_port_in_use_is_a_one_line_error(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        t = await start_tracker(tmp_path, port=str(port))
    assert (t.url, t.proc.returncode) == ("", 2)
    log = t.log.read_text()
    assert f"port {port} on 127.0.0.1 is in use" in log
    assert "Traceback" not in log


async def test_missing_secret_is_a_one_line_error(tmp_path: Path) -> None:
    t = await start_tracker(tmp_path, secret=None)
    assert (t.url, t.proc.returncode) == ("", 2)
    assert "cluster secret" in t.log.read_text()
    assert "Traceback" not in t.log.read_text()


async def test_sigint_shuts_down_cleanly(tmp_path: Path) -> None:
    t = await start_tracker(tmp_path)
    assert t.url
    assert await t.stop(signal.SIGINT) == 0
    assert "Traceback" not in t.log.read_text()
