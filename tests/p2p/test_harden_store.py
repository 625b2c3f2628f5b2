"""A lying disk, a broken store, a dead origin, a hostile local user: the agent says why
and never hands out a bad byte (issue 7, store and local-API rows).

Every test runs a real tracker, origin and agent processes on loopback
(p2p.testing.localcluster). Waits are bounded; nothing asserts on elapsed time except
the one bound that is the property itself (an agent exits after SIGTERM), with a
generous margin.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import os
import shutil
import signal
import stat
from pathlib import Path
from typing import Any

import pytest
from helpers.hostile import fetch_chunk
from helpers.promtext import metric
from helpers.waiting import WAIT_S, until

from p2p.agentclient import AgentError
from p2p.content import ContentId, Manifest
from p2p.store import ChunkStore
from p2p.testing.localcluster import (
    AgentHandle,
    LocalCluster,
    bootseer_command,
    to_toml,
    write_random_file,
)
from p2p.units import MiB

SIZE = 16 * MiB
CHUNK = 1 * MiB
CHUNKS = SIZE // CHUNK
FAST_RETRY = {"swarm": {"backoff_base_s": 0.1, "backoff_max_s": 0.5}}


async def start(cluster: LocalCluster, tmp_path: Path, size: int = SIZE,
                name: str = "content.bin", seed: int = 5) -> tuple[Path, Manifest]:
    source = tmp_path / "origin" / name
    await asyncio.to_thread(write_random_file, source, size, seed)
    if not cluster.tracker_url:
        await cluster.start_tracker()
        await cluster.start_origin(source.parent)
    return source, await cluster.publish(source, CHUNK)


async def status(agent: AgentHandle, content: ContentId) -> dict[str, Any]:
    async with agent.client(10.0) as client:
        return dict((await client.status())["contents"].get(content, {}))


async def metrics(agent: AgentHandle) -> str:
    async with agent.client(10.0) as client:
        return await client.metrics()


async def ensure(agent: AgentHandle, content: ContentId) -> dict[str, Any]:
    async with asyncio.timeout(WAIT_S), agent.client() as client:
        return await client.ensure(content)


async def read_all(agent: AgentHandle, content: ContentId, size: int) -> bytes:
    async with asyncio.timeout(WAIT_S), agent.client() as client:
        return await client.read(content, 0, size)


def chunk_path(agent: AgentHandle, content: ContentId, index: int) -> Path:
    return agent.store_dir / content / f"{index}.chunk"


def flip_byte(path: Path, at: int = 100) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0x5A]))


async def stop_origin(cluster: LocalCluster) -> None:
    origin = next(c for c in cluster.children if c.name.startswith("origin"))
    assert await origin.stop() == 0
    cluster.children.remove(origin)


async def restart_origin(cluster: LocalCluster, root: Path) -> None:
    port = cluster.origin_url.rsplit(":", 1)[1]
    again = await cluster.spawn("origin-again", ["origin", str(root), "--port", port])
    assert again.ready["url"] == cluster.origin_url




# ---- a lying disk -------------------------------------------------------------------


@pytest.mark.parametrize("damage", ["flip", "truncate"])
async def test_damaged_chunk_file_is_never_served_and_is_fetched_again(
        tmp_path: Path, damage: str) -> None:
    cluster = LocalCluster(tmp_path / "cluster")
    try:
        source, manifest = await start(cluster, tmp_path)
        content, original = manifest.content_id, source.read_bytes()
        agent = await cluster.start_agent(0, "rack0", FAST_RETRY)
        assert (await ensure(agent, content))["complete"]

        # With the origin down, the damage cannot be repaired at once: we can watch it.
        await stop_origin(cluster)
        victim = 3
        path = chunk_path(agent, content, victim)
        if damage == "flip":
            flip_byte(path)
        else:
            os.truncate(path, CHUNK // 2)

        # A peer asking for it is turned away, never handed the bad bytes.
        with pytest.raises(AssertionError, match="rejected"):
            await fetch_chunk(agent.child.ready["addr"], cluster.secret, content, victim, CHUNK)
        assert not path.exists()
        now = await status(agent, content)
        assert (now["complete"], now["have"]) == (False, CHUNKS - 1), now
        assert metric(await metrics(agent), "bootseer_chunks_damaged_total") == 1

        # A local read waits for the chunk to come back, then returns good bytes.
        reading = asyncio.ensure_future(read_all(agent, content, SIZE))
        await asyncio.sleep(0.3)
        assert not reading.done()
        await restart_origin(cluster, source.parent)
        assert await reading == original
        assert (await status(agent, content))["complete"]
        got = await fetch_chunk(agent.child.ready["addr"], cluster.secret, content, victim,
                                CHUNK)
        assert got == original[victim * CHUNK:(victim + 1) * CHUNK]

        # Damage found by a local read (not a peer) is repaired the same way.
        flip_byte(chunk_path(agent, content, 7), at=CHUNK - 1)
        assert await read_all(agent, content, SIZE) == original
        assert metric(await metrics(agent), "bootseer_chunks_damaged_total") == 2
        assert (await status(agent, content))["complete"]
        log = agent.child.stderr_path.read_text()
        assert "damaged" in log and f"{victim}.chunk" in log
    finally:
        await cluster.stop()


# ---- a broken store -----------------------------------------------------------------


SLOW = {"download_mbps": 8.0, **FAST_RETRY}  # a 16 MiB copy takes ~2 s: room to break it


async def break_mid_transfer(cluster: LocalCluster, agent: AgentHandle, content: ContentId,
                             breakage: Any) -> str | None:
    """Start a get, break the store once a few chunks are in; the get's error, if any."""
    getting = asyncio.ensure_future(ensure(agent, content))

    async def some_chunks() -> bool:
        return int((await status(agent, content)).get("have", 0)) >= 3

    await until(some_chunks, "the agent holds 3 chunks")
    breakage()
    try:
        await getting
    except AgentError as exc:
        return str(exc)
    return None


def delete_tree(path: Path) -> None:
    """rmtree under a live writer: the agent may put a chunk file into a directory
    between rmtree's listing and its rmdir (ENOTEMPTY), so go again, a bounded number
    of times."""
    for _ in range(20):
        try:
            shutil.rmtree(path)
            return
        except OSError as exc:
            if exc.errno != errno.ENOTEMPTY:
                raise
    raise AssertionError(f"{path} kept being written to while it was deleted")


async def test_store_directory_deleted_under_a_running_agent(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path / "cluster")
    try:
        source, manifest = await start(cluster, tmp_path)
        content = manifest.content_id
        agent = await cluster.start_agent(0, "rack0", SLOW)
        error = await break_mid_transfer(cluster, agent, content,
                                         lambda: delete_tree(agent.store_dir))
        if error is not None:  # a clear failure, then a clean retry
            assert str(agent.store_dir) in error and "No such file" in error, error
            assert str(agent.store_dir) in agent.child.stderr_path.read_text()
            assert (await ensure(agent, content))["complete"]
        assert await read_all(agent, content, SIZE) == source.read_bytes()
        assert len(list((agent.store_dir / content).glob("*.chunk"))) == CHUNKS
        assert await cluster.origin_bytes() <= 2 * SIZE
    finally:
        await cluster.stop()


async def test_store_write_error_other_than_disk_full_fails_then_recovers(
        tmp_path: Path) -> None:
    """The content's directory is replaced by a file: every write fails with ENOTDIR."""
    cluster = LocalCluster(tmp_path / "cluster")
    try:
        source, manifest = await start(cluster, tmp_path)
        content = manifest.content_id
        agent = await cluster.start_agent(0, "rack0", SLOW)
        directory = agent.store_dir / content

        def file_instead_of_directory() -> None:
            delete_tree(directory)
            directory.write_bytes(b"not a directory")

        error = await break_mid_transfer(cluster, agent, content, file_instead_of_directory)
        assert error is not None and str(directory) in error, error
        assert "Not a directory" in error or "File exists" in error, error
        info = await status(agent, content)
        assert info["failed"] and info["failure"], info
        with pytest.raises(AgentError, match="File exists"):  # retried, and says why again
            await ensure(agent, content)
        origin_after_failures = await cluster.origin_bytes()
        assert origin_after_failures < SIZE

        directory.unlink()  # the cause is gone: the next request succeeds, no restart
        assert (await ensure(agent, content))["complete"]
        assert await read_all(agent, content, SIZE) == source.read_bytes()
        assert await cluster.origin_bytes() <= 2 * SIZE
    finally:
        await cluster.stop()


async def test_content_larger_than_the_store_fails_clearly_and_is_not_sticky(
        tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path / "cluster")
    try:
        _, big = await start(cluster, tmp_path, 64 * MiB, "big.bin", seed=1)
        small_source, small = await start(cluster, tmp_path, 8 * MiB, "small.bin", seed=2)
        agent = await cluster.start_agent(0, "rack0", {"store_budget_gb": 20 / 1024})
        for _ in range(2):  # retried on the next request, failing the same clear way
            with pytest.raises(AgentError, match="store full") as full:
                await ensure(agent, big.content_id)
            assert "raise the store budget" in str(full.value)
        assert (await status(agent, big.content_id))["failed"]
        assert await cluster.origin_bytes() <= 2 * 21 * MiB  # nothing loops

        # The failed content no longer holds its room: another content fits, no restart.
        assert (await ensure(agent, small.content_id))["complete"]
        assert await read_all(agent, small.content_id, 8 * MiB) == small_source.read_bytes()
    finally:
        await cluster.stop()


# ---- no source ----------------------------------------------------------------------


async def test_content_with_a_dead_origin_and_no_peer_fails_after_the_deadline(
        tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path / "cluster")
    try:
        _, manifest = await start(cluster, tmp_path)
        await stop_origin(cluster)
        config = {"swarm": {"no_source_deadline_s": 2.0, "backoff_base_s": 0.1,
                            "backoff_max_s": 0.5}}
        agent = await cluster.start_agent(0, "rack0", config)
        proc = await asyncio.create_subprocess_exec(
            *bootseer_command(), "get", manifest.content_id, "--api-socket", agent.api_socket,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        async with asyncio.timeout(WAIT_S):
            out, err = await proc.communicate()
        message = err.decode()
        assert proc.returncode != 0 and out == b"", (proc.returncode, out, message)
        assert "no chunk arrived for 2 s" in message, message
        assert "the origin failed" in message and "last:" in message, message
        assert "Traceback" not in message
    finally:
        await cluster.stop()


async def test_sigterm_ends_the_agent_while_a_get_hangs(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path / "cluster")
    try:
        _, manifest = await start(cluster, tmp_path)
        await stop_origin(cluster)  # the get can never finish (default deadline: minutes)
        agent = await cluster.start_agent(0, "rack0")
        getting = asyncio.ensure_future(ensure(agent, manifest.content_id))

        async def session_open() -> bool:
            return bool(await status(agent, manifest.content_id))

        await until(session_open, "the agent works on the content")
        code = await agent.child.stop(signal.SIGTERM, timeout=10.0)  # kills if it hangs
        assert code == 0, f"agent did not exit on SIGTERM within 10 s (code {code})"
        with pytest.raises(AgentError, match="stopping"):
            await getting
        assert not Path(agent.api_socket).exists()
    finally:
        await cluster.stop()


# ---- the local API ------------------------------------------------------------------


async def refused(cluster: LocalCluster, name: str, api_socket: Path) -> str:
    """Start an agent that must refuse to start; its one-line error."""
    cfg = cluster.workdir / f"{name}.toml"
    cfg.write_text(to_toml({"tracker": cluster.tracker_url, "port": 0, "peer_id": name,
                            "store_dir": str(cluster.workdir / name / "store"),
                            "api_socket": str(api_socket)}))
    proc = await asyncio.create_subprocess_exec(
        *bootseer_command(), "agent", "--config", str(cfg), env=cluster.env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    async with asyncio.timeout(WAIT_S):
        out, err = await proc.communicate()
    assert proc.returncode == 2 and out == b"", (proc.returncode, out, err)
    assert b"Traceback" not in err, err
    return err.decode()


async def test_api_socket_is_private_whatever_the_umask_and_never_stolen(
        tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path / "cluster")
    old = os.umask(0)
    try:
        await cluster.start_tracker()
        agent = await cluster.start_agent(0, "rack0")
    finally:
        os.umask(old)
    try:
        sock = Path(agent.api_socket)
        assert stat.S_ISSOCK(sock.lstat().st_mode)
        assert stat.S_IMODE(sock.lstat().st_mode) == 0o660
        assert stat.S_IMODE(sock.parent.stat().st_mode) == 0o750

        # A second agent on the same path is refused and leaves the socket alone.
        inode = sock.lstat().st_ino
        assert "another agent is serving" in await refused(cluster, "agent1", sock)
        assert sock.lstat().st_ino == inode
        async with agent.client(10.0) as client:
            assert (await client.status())["peer"] == "agent0"

        # A regular file where the socket should go is refused, and kept.
        precious = tmp_path / "cluster" / "precious"
        precious.mkdir()
        (precious / "api.sock").write_text("keep me")
        assert "regular file" in await refused(cluster, "agent2", precious / "api.sock")
        assert (precious / "api.sock").read_text() == "keep me"

        # Our own stale socket (the agent was killed) is replaced on restart.
        await agent.child.stop(signal.SIGKILL)
        assert stat.S_ISSOCK(sock.lstat().st_mode)
        again = await cluster.start_agent(0, "rack0")
        async with again.client(10.0) as client:
            assert (await client.status())["peer"] == "agent0"
    finally:
        await cluster.stop()


async def test_content_ids_and_prefetch_lists_from_the_api_are_checked(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path / "cluster")
    try:
        _, manifest = await start(cluster, tmp_path)
        agent = await cluster.start_agent(0, "rack0")
        async with agent.client(30.0) as client:
            for bad in ["..%2F..%2Fetc%2Fpasswd", "../x", "c1-" + "g" * 64, "x" * 300]:
                with pytest.raises(AgentError, match="not a content id"):
                    await client.ensure(bad)
            assert (await client.status())["contents"] == {}
            content = manifest.content_id
            for chunks in ([CHUNKS], [-1], [True], ["0"], [2**70]):
                with pytest.raises(AgentError):
                    await client.prefetch(content, chunks)  # type: ignore[arg-type]
            await client.prefetch(content, [CHUNKS - 1, 0])
            with pytest.raises(AgentError):
                await client.read(content, -1, 10)
            assert (await client.ensure(content))["complete"]
    finally:
        await cluster.stop()


async def test_eight_concurrent_64_mib_reads_stream(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path / "cluster")
    try:
        size = 64 * MiB
        source, manifest = await start(cluster, tmp_path, size, "big.bin", seed=9)
        content = manifest.content_id
        agent = await cluster.start_agent(0, "rack0")
        assert (await ensure(agent, content))["complete"]
        assert await read_all(agent, content, MiB) == source.read_bytes()[:MiB]  # warm up
        before = agent.child.peak_rss_mb()
        want = hashlib.sha256(source.read_bytes()).hexdigest()

        async def one() -> str:
            digest = hashlib.sha256()
            async with asyncio.timeout(WAIT_S), agent.client() as client:
                await client.read_to(content, 0, size, digest.update)
            return digest.hexdigest()

        assert await asyncio.gather(*(one() for _ in range(8))) == [want] * 8
        grown = agent.child.peak_rss_mb() - before
        assert grown < 150, f"peak RSS grew {grown:.0f} MB for 8 streamed 64 MiB reads"
    finally:
        await cluster.stop()


# ---- the store alone ----------------------------------------------------------------


def test_has_is_false_outside_the_content(tmp_path: Path) -> None:
    from p2p.content import ManifestBuilder

    data = os.urandom(3 * 1000)
    builder = ManifestBuilder(1000)
    builder.feed(data)
    manifest = builder.finish("test", "file:///nowhere")
    store = ChunkStore(tmp_path, 1 << 20)
    store.attach(manifest)
    for i in range(3):
        store.put(manifest.content_id, i, data[i * 1000:(i + 1) * 1000])
    assert store.has(manifest.content_id, 2)
    for index in (-1, 3, 2**32 - 1, -(2**63)):
        assert not store.has(manifest.content_id, index)


def test_api_socket_group_is_applied_to_socket_and_directory(tmp_path: Path) -> None:
    import grp

    from p2p.localapi import bind_api_socket, release_api_socket

    path = tmp_path / "run" / "agent.sock"
    sock, bound = bind_api_socket(path, "daemon")
    try:
        gid = grp.getgrnam("daemon").gr_gid
        assert (path.stat().st_gid, path.parent.stat().st_gid) == (gid, gid)
        assert stat.S_IMODE(path.stat().st_mode) == 0o660
    finally:
        sock.close()
        release_api_socket(path, bound)
    assert not path.exists()
