"""Attacks on an agent's peer port, against real processes on loopback (issue 7).

Each test starts a tracker, an HTTP origin and one or two agents
(p2p.testing.localcluster) on 127.0.0.1, and attacks from other loopback addresses
(127.0.0.2, 127.0.0.3): a node's identity is its address, so an attacker
needs one of its own. The attacks: a flood that exhausts the agent's file
descriptors, thousands of idle unauthenticated connections, requests for
chunks that do not exist, a node that claims another node's peer id, an
attacker that comes back under a new peer id, and a member that cannot be
dialled. Every wait is bounded and waits for an event (a log line, a metric,
a status), never for a duration; nothing asserts on elapsed time.

The first tests drive the connection guard core directly (no I/O).
"""

from __future__ import annotations

import asyncio
import os
import resource
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import msgpack
import pytest
from helpers.hostile import HostilePeer, RawClient, fetch_chunk
from helpers.promtext import metric
from helpers.waiting import WAIT_S, until

from p2p import wire
from p2p.content import ContentId, Manifest, PeerId
from p2p.guard import ConnectionGuard, ConnectionLimits
from p2p.ratelimit import LogLimiter
from p2p.testing.localcluster import AgentHandle, LocalCluster, write_random_file
from p2p.tracker_client import TrackerClient
from p2p.units import MiB
from p2p.wire import Piece, Reject, Request

SIZE = 8 * MiB
CHUNK = 1 * MiB
CHUNKS = SIZE // CHUNK
ATTACKER = "127.0.0.2"
BYSTANDER = "127.0.0.3"


# ---- the guard core -----------------------------------------------------------------


def test_guard_caps_handshakes_per_address_in_all_and_connections() -> None:
    guard = ConnectionGuard(ConnectionLimits(max_connections=6, max_handshakes=4,
                                             max_handshakes_per_ip=2), frozenset({"10.0.0.1"}))
    assert [guard.admit("10.0.0.9", 0.0) for _ in range(3)] == [None, None, "handshakes_per_ip"]
    assert guard.admit("10.0.0.8", 0.0) is None
    # Our own address has no per-address cap, but the overall handshake cap holds.
    assert guard.admit("10.0.0.1", 0.0) is None
    assert guard.admit("10.0.0.1", 0.0) == "handshakes"
    guard.handshake_ended("10.0.0.9")
    guard.link_opened()
    guard.link_opened()
    assert guard.connections == 5
    assert guard.admit("10.0.0.7", 0.0) is None
    assert guard.admit("10.0.0.6", 0.0) == "connections"
    guard.link_closed()
    guard.handshake_ended("10.0.0.7")
    assert guard.connections == 4
    assert guard.admit("10.0.0.9", 0.0) is None


def test_guard_bans_an_address_for_a_while_but_never_our_own() -> None:
    guard = ConnectionGuard(ConnectionLimits(ban_s=10.0), frozenset({"10.0.0.1"}))
    assert guard.ban("10.0.0.9", 5.0)
    assert not guard.ban("10.0.0.9", 6.0)  # already banned: nothing new to say
    assert guard.admit("10.0.0.9", 14.9) == "banned"
    assert guard.admit("10.0.0.9", 15.0) is None
    assert not guard.ban("10.0.0.1", 5.0)
    assert guard.admit("10.0.0.1", 5.0) is None


def test_log_limiter_says_how_many_it_held_back() -> None:
    quiet = LogLimiter(every_s=10.0)
    assert quiet.allow("a", 0.0) == 0
    assert [quiet.allow("a", t) for t in (1.0, 2.0, 9.9)] == [None, None, None]
    assert quiet.allow("b", 3.0) == 0
    assert quiet.allow("a", 10.0) == 3


# ---- helpers ----------------------------------------------------------------------


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[LocalCluster]:
    c = LocalCluster(tmp_path / "cluster")
    try:
        yield c
    finally:
        await c.stop()


async def publish(cluster: LocalCluster, tmp_path: Path, name: str, seed: int,
                  chunk: int = CHUNK) -> tuple[Path, Manifest]:
    source = tmp_path / "origin" / name
    await asyncio.to_thread(write_random_file, source, SIZE, seed)
    return source, await cluster.publish(source, chunk)


async def seeded(cluster: LocalCluster, tmp_path: Path, chunk: int = CHUNK,
                 rack: str = "rack1") -> tuple[Path, Manifest, AgentHandle]:
    """Tracker, origin, one content, and an agent that holds all of it."""
    await cluster.start_tracker()
    (tmp_path / "origin").mkdir(parents=True, exist_ok=True)
    await cluster.start_origin(tmp_path / "origin")
    source, manifest = await publish(cluster, tmp_path, "content.bin", 11, chunk)
    seeder = await cluster.start_agent(0, rack)
    async with seeder.client(WAIT_S) as client:
        await client.ensure(manifest.content_id)
    return source, manifest, seeder


def addr_of(agent: AgentHandle) -> str:
    return str(agent.child.ready["addr"])




async def agent_metric(agent: AgentHandle, name: str, **labels: str) -> float:
    async with agent.client(10.0) as client:
        return metric(await client.metrics(), name, **labels)


async def tracker_metric(cluster: LocalCluster, name: str) -> float:
    async with aiohttp.ClientSession() as http, \
            http.get(f"{cluster.tracker_url}/metrics",
                     timeout=aiohttp.ClientTimeout(total=10)) as resp:
        return metric(await resp.text(), name)


async def content_info(agent: AgentHandle, content: ContentId) -> dict[str, Any]:
    async with agent.client(10.0) as client:
        return dict((await client.status())["contents"].get(content, {}))


def log_of(agent: AgentHandle) -> str:
    return agent.child.stderr_path.read_text(errors="replace")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


async def serves_every_chunk(agent: AgentHandle, cluster: LocalCluster, source: Path,
                             manifest: Manifest, bind_host: str | None = None) -> None:
    original = source.read_bytes()
    for chunk in range(manifest.chunks):
        got = await fetch_chunk(addr_of(agent), cluster.secret, manifest.content_id, chunk,
                                manifest.chunk_length(chunk), bind_host=bind_host)
        assert got == original[chunk * CHUNK:(chunk + 1) * CHUNK], chunk


async def read_all(agent: AgentHandle, content: ContentId) -> bytes:
    async with agent.client(WAIT_S) as client:
        return await client.read(content, 0, SIZE)


async def open_many(addr: str, n: int, bind_host: str, batch: int = 200) -> list[RawClient]:
    clients: list[RawClient] = []
    for start in range(0, n, batch):
        clients += await asyncio.gather(*(RawClient.open(addr, bind_host)
                                          for _ in range(min(batch, n - start))))
    return clients


def close_all(clients: list[RawClient]) -> None:
    for client in clients:
        client.close()


@pytest.fixture(autouse=True)
def enough_descriptors() -> None:
    """Floods open thousands of sockets here: use the whole hard nofile limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


# ---- out of descriptors -------------------------------------------------------------


async def authenticate_or_hang(addr: str, secret: bytes, i: int) -> tuple[RawClient, bool]:
    """A connection, and whether the agent got through its handshake (in a bounded wait)."""
    client = await RawClient.open(addr)
    nonce = os.urandom(wire.NONCE_SIZE)
    peer = f"fd{i}"
    await client.send(wire.Hello(wire.PROTOCOL_VERSION, peer, "", "rack0", nonce).encode())
    try:
        async with asyncio.timeout(3.0):
            challenge = await client.recv_message()
    except (TimeoutError, ConnectionError, wire.RemoteProtocolError):
        return client, False
    assert isinstance(challenge, wire.Challenge)
    from p2p.auth import handshake_mac

    await client.send(wire.Auth(handshake_mac(secret, "client", nonce, challenge.nonce, peer,
                                              challenge.peer)).encode())
    return client, True


async def test_agent_with_a_low_nofile_limit_gets_300_connections_and_still_serves(
        cluster: LocalCluster, tmp_path: Path) -> None:
    source, manifest, seeder = await seeded(cluster, tmp_path)
    pid, addr = seeder.child.pid, addr_of(seeder)
    limit = len(os.listdir(f"/proc/{pid}/fd")) + 24
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (limit, limit))

    clients: list[RawClient] = []
    try:
        # Authenticated links, 16 at a time, until the agent runs out of descriptors
        # and a handshake goes unanswered; the rest of the 300 wait in the backlog.
        while len(clients) < 300:
            batch = await asyncio.gather(*(authenticate_or_hang(addr, cluster.secret,
                                                                len(clients) + i)
                                           for i in range(16)))
            clients += [client for client, _ in batch]
            if not all(ok for _, ok in batch):
                break
        clients += await open_many(addr, 300 - len(clients), "127.0.0.1")

        async def out_of_descriptors() -> bool:
            return "cannot accept peer connections" in log_of(seeder)

        await until(out_of_descriptors, "the agent logs that it cannot accept")
    finally:
        close_all(clients)
    assert await agent_metric(seeder, "bootseer_accept_errors_total") >= 1

    async def serves_again() -> bool:
        try:
            await serves_every_chunk(seeder, cluster, source, manifest)
        except (OSError, ConnectionError, wire.RemoteProtocolError) as exc:
            print("not yet:", exc)
            return False
        return True

    await until(serves_again, "the agent completes a handshake and serves every chunk")
    assert "accepting peer connections again" in log_of(seeder)
    assert log_of(seeder).count("cannot accept peer connections") <= 2  # one per episode
    assert seeder.child.proc.returncode is None


# ---- idle unauthenticated floods ----------------------------------------------------


async def test_500_then_4000_idle_unauthenticated_connections_cost_little_memory(
        cluster: LocalCluster, tmp_path: Path) -> None:
    source, manifest, seeder = await seeded(cluster, tmp_path)
    pid, addr = seeder.child.pid, addr_of(seeder)
    before = rss_mb(pid)
    peak = before
    refused = 0.0
    for n in (500, 4000):
        clients = await open_many(addr, n, ATTACKER)
        try:
            async def all_seen(n: int = n, base: float = refused) -> bool:
                # All but the few let into a handshake are closed at once.
                got = await agent_metric(seeder, "bootseer_connections_refused_total")
                return got >= base + n - 8

            await until(all_seen, f"the agent dealt with all {n} connections")
            peak = max(peak, rss_mb(pid))
            # Honest peers still get through while the flood is on.
            await serves_every_chunk(seeder, cluster, source, manifest)
        finally:
            close_all(clients)
        refused = await agent_metric(seeder, "bootseer_connections_refused_total")
    assert await agent_metric(seeder, "bootseer_connections_refused_total",
                              reason="handshakes_per_ip") >= 4500 - 16
    after = rss_mb(pid)
    print(f"agent RSS: {before:.0f} MB before, {peak:.0f} MB at the peak, {after:.0f} MB after")
    assert peak - before < 60, (before, peak)
    assert after - before < 60, (before, after)
    await serves_every_chunk(seeder, cluster, source, manifest)


# ---- chunk indices outside the content -----------------------------------------------


def raw_request(content: str, chunk: int, req: int) -> bytes:
    body = msgpack.packb({"t": "req", "content": content, "chunk": chunk, "req": req})
    return len(body).to_bytes(4, "big") + body


async def test_requests_for_chunks_outside_the_content_are_rejected_and_later_ones_served(
        cluster: LocalCluster, tmp_path: Path) -> None:
    source, manifest, seeder = await seeded(cluster, tmp_path)
    content, addr = manifest.content_id, addr_of(seeder)
    client = await RawClient.authenticated(addr, cluster.secret, "bounds")
    try:
        for req, chunk in enumerate((CHUNKS, 2**32 - 1, CHUNKS + 1), start=1):
            await client.send(Request(content, chunk, req).encode())
        await client.send(Request(content, 3, 9).encode())
        async with asyncio.timeout(WAIT_S):
            for req, chunk in enumerate((CHUNKS, 2**32 - 1, CHUNKS + 1), start=1):
                answer = await client.recv_message()
                assert isinstance(answer, Reject), answer
                assert (answer.req, answer.chunk) == (req, chunk)
                assert f"{CHUNKS} chunks" in answer.reason, answer.reason
            piece = await client.recv_message()
            assert isinstance(piece, Piece) and (piece.req, piece.chunk) == (9, 3), piece
            data = await client.recv_exactly(piece.len)
        assert data == source.read_bytes()[3 * CHUNK:4 * CHUNK]
    finally:
        client.close()

    # Index -1 cannot be said in the protocol: the link is dropped, and the address banned.
    bad = await RawClient.authenticated(addr, cluster.secret, "negative", BYSTANDER)
    try:
        await bad.send(raw_request(content, -1, 1))
        async with asyncio.timeout(WAIT_S):
            assert await bad.closed_by_peer() in ("eof", "reset")
    finally:
        bad.close()
    again = await RawClient.open(addr, BYSTANDER)
    try:
        await again.send(wire.Hello(wire.PROTOCOL_VERSION, "negative2", "", "rack0",
                                    os.urandom(16)).encode())
        async with asyncio.timeout(WAIT_S):
            assert await again.first_bytes() == b""
    finally:
        again.close()
    await serves_every_chunk(seeder, cluster, source, manifest)
    assert seeder.child.proc.returncode is None


# ---- identities that cannot be borrowed ---------------------------------------------


async def test_a_node_claiming_another_nodes_peer_id_is_refused_and_the_real_node_kept(
        cluster: LocalCluster, tmp_path: Path) -> None:
    source, manifest, seeder = await seeded(cluster, tmp_path, chunk=CHUNK // 4)
    content = manifest.content_id
    source.rename(tmp_path / "original.bin")  # from now on the seeder is the only source
    source = tmp_path / "original.bin"
    impostor = HostilePeer(manifest, cluster.secret, cluster.tracker_url, cluster.secret,
                           "impostor", rack="rack0")
    try:
        victim = await cluster.start_agent(1, "rack0", {"download_mbps": 2.0})
        ensure = asyncio.ensure_future(read_all(victim, content))

        async def linked_to_seeder() -> bool:
            return (await content_info(victim, content)).get("peers", 0) >= 1

        await until(linked_to_seeder, "the victim joins the seeder, named by the tracker")
        # Towards the victim, the impostor claims to be the seeder; it says so when it
        # dials, either with its own address or with the seeder's; and when dialled.
        impostor.claim = seeder.peer
        await impostor.start()
        await impostor.dial(addr_of(victim), seeder.peer)
        await impostor.dial(addr_of(victim), seeder.peer, claim_addr=addr_of(seeder))
        async with asyncio.timeout(WAIT_S):
            data = await ensure
        assert data == source.read_bytes()
    finally:
        await impostor.stop()

    assert not impostor.log.garbage_sent, impostor.log
    assert len(impostor.log.closed_by_peer) + len(impostor.log.dial_failures) >= 2
    assert f"banning address {ATTACKER}" in log_of(victim)
    info = await content_info(victim, content)
    assert info["complete"] and info["peer_bytes"] == SIZE and info["origin_bytes"] == 0
    assert await agent_metric(victim, "bootseer_chunks_rejected_total") == 0
    assert f"dropping peer {seeder.peer}" not in log_of(victim)
    # The tracker still hands out the real node.
    async with TrackerClient(cluster.tracker_url, cluster.secret) as tracker:
        probe = f"127.0.0.1:{closed_port('127.0.0.1')}"
        reply = await tracker.announce(content, PeerId("probe"), probe, "rack0", 0, False)
        await tracker.announce(content, PeerId("probe"), probe, "rack0", 0, False, "stopped")
    assert seeder.peer in {p.peer for p in reply.peers}
    # And the impostor's address stays refused, whatever id it says next.
    late = await RawClient.open(addr_of(victim), ATTACKER)
    try:
        async with asyncio.timeout(WAIT_S):
            assert await late.first_bytes() == b""
    finally:
        late.close()


async def test_an_attacker_back_under_a_new_peer_id_is_refused(
        cluster: LocalCluster, tmp_path: Path) -> None:
    source, manifest, _ = await seeded(cluster, tmp_path, chunk=CHUNK // 2)
    content = manifest.content_id
    first = tmp_path / "first.bin"
    source.rename(first)  # the first content now comes from peers only
    attacker = HostilePeer(manifest, cluster.secret, cluster.tracker_url, cluster.secret,
                           "evil1", rack="rack0")
    try:
        await attacker.start()
        victim = await cluster.start_agent(1, "rack0")
        async with asyncio.timeout(WAIT_S):
            assert await read_all(victim, content) == first.read_bytes()

        async def dropped() -> bool:
            return PeerId(victim.peer) in attacker.log.closed_by_peer

        assert attacker.log.garbage_sent, f"the victim never asked the attacker: {attacker.log}"
        await until(dropped, "the victim drops the attacker")
        rejected = await agent_metric(victim, "bootseer_chunks_rejected_total")
        accepted = attacker.log.accepted

        # Back as "evil2", seeding a second content; then dialling in as "evil3".
        second_source, second = await publish(cluster, tmp_path, "second.bin", 12, CHUNK // 2)
        await attacker.rename("evil2", second)
        async with asyncio.timeout(WAIT_S):
            assert await read_all(victim, second.content_id) == second_source.read_bytes()
        await attacker.dial(addr_of(victim), "evil3")
    finally:
        await attacker.stop()

    assert attacker.log.accepted == accepted, "the victim dialled the banned address again"
    assert attacker.log.dial_failures or PeerId(victim.peer) in attacker.log.closed_by_peer
    assert not attacker.log.joined - {PeerId(victim.peer)}
    assert await agent_metric(victim, "bootseer_chunks_rejected_total") == rejected
    assert await agent_metric(victim, "bootseer_connections_refused_total", reason="banned") >= 1
    assert (await content_info(victim, second.content_id))["complete"]


# ---- members that cannot be dialled ------------------------------------------------


def closed_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


async def test_a_member_that_cannot_be_dialled_is_reported_unreachable_once(
        cluster: LocalCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BOOTSEER_LOG_LEVEL", "DEBUG")  # to count the dials
    await cluster.start_tracker()
    (tmp_path / "origin").mkdir()
    await cluster.start_origin(tmp_path / "origin")
    _, manifest = await publish(cluster, tmp_path, "content.bin", 13, CHUNK // 4)
    content = manifest.content_id
    ghost = f"{BYSTANDER}:{closed_port(BYSTANDER)}"
    connector = aiohttp.TCPConnector(local_addr=(BYSTANDER, 0))
    async with aiohttp.ClientSession(connector=connector) as http:
        tracker = TrackerClient(cluster.tracker_url, cluster.secret, http)
        await tracker.announce(content, PeerId("ghost"), ghost, "rack0", manifest.chunks, True)
    agent = await cluster.start_agent(1, "rack0", {"download_mbps": 2.0})
    async with agent.client(WAIT_S) as client:
        await client.ensure(content)

    dials = log_of(agent).count("cannot connect to ghost")
    assert dials >= 2, f"the agent dialled the ghost {dials} time(s): too few to test"

    async def reported() -> bool:
        return await tracker_metric(cluster, "bootseer_tracker_reports_total") >= 1

    await until(reported, "the agent reports the ghost")
    assert await tracker_metric(cluster, "bootseer_tracker_reports_total") == 1
