"""HDFS checkpoints through the swarm, against a real HDFS (Hadoop's mini cluster).

A checkpoint of safetensors shards (numpy tensors) is written into the mini
cluster; agents load it through `bootseer ckpt prefetch`, the FUSE mount and
`hdfs_stripe.open`, and every tensor is compared with the original. HDFS
egress is what the agents' sessions report as origin bytes (the indexer's
agent counts the read that indexed). Faults: a changed file, an unreachable NameNode,
a permission denied, a DataNode stopped or killed (SIGKILL, a JVM of its own)
mid-read, a peer serving bad stripes, the reader's agent killed and restarted
mid-read.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import signal
import struct
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers.hostile import HostilePeer
from helpers.promtext import metric
from helpers.waiting import until

import hdfs_stripe
from fusefs.mount import Mount
from fusefs.mountinfo import is_mounted
from hdfs_stripe.index import resolve
from hdfs_stripe.mount import MountOptions
from hdfs_stripe.naming import parse_uri
from hdfs_stripe.origin import webhdfs_for
from hdfs_stripe.reader import StripeReader
from hdfs_stripe.testing.minicluster import MiniClusterError, MiniHdfs
from hdfs_stripe.webhdfs import WebHdfs
from p2p.agentclient import AgentError
from p2p.content import PeerId
from p2p.testing.localcluster import AgentHandle, LocalCluster, bootseer_command
from p2p.tracker_client import TrackerClient
from p2p.units import MiB

BLOCK = 4 * MiB  # small blocks: a shard of a few MiB spreads over every DataNode
SHARDS = {"model-00001.safetensors": 3, "model-00002.safetensors": 4,
          "optimizer.safetensors": 5}  # MiB of float32 tensors, roughly


@asynccontextmanager
async def hdfs(tmp_path: Path, **options: Any) -> AsyncIterator[MiniHdfs]:
    try:
        cluster = await MiniHdfs.start(tmp_path / "hdfs", **options)
    except MiniClusterError as exc:
        pytest.fail(f"the HDFS mini cluster is needed and did not start: {exc}")
    try:
        yield cluster
    finally:
        await cluster.stop()


@asynccontextmanager
async def swarm(tmp_path: Path, agents: int, config: dict[str, Any] | None = None
                ) -> AsyncIterator[tuple[LocalCluster, list[AgentHandle]]]:
    cluster = LocalCluster(tmp_path / "cluster")
    try:
        await cluster.start_tracker()
        yield cluster, [await cluster.start_agent(i, "rack0", config) for i in range(agents)]
    finally:
        await cluster.stop()


# ---- safetensors files ------------------------------------------------------------------


def tensors_of(seed: int, mib: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    count = mib * MiB // 4 // 3
    return {"embed.weight": rng.standard_normal((count // 256, 256), dtype=np.float32),
            "layer.bias": rng.standard_normal(count // 2, dtype=np.float32),
            "head.weight": rng.integers(-100, 100, count - count // 2, dtype=np.int32)}


def safetensors_bytes(tensors: dict[str, np.ndarray]) -> bytes:
    """The safetensors layout: u64 header length, JSON header, then the raw tensors."""
    header, blobs, at = {}, [], 0
    for name, array in tensors.items():
        raw = array.tobytes()
        dtype = {"float32": "F32", "int32": "I32"}[str(array.dtype)]
        header[name] = {"dtype": dtype, "shape": list(array.shape),
                        "data_offsets": [at, at + len(raw)]}
        blobs.append(raw)
        at += len(raw)
    head = json.dumps(header).encode()
    return struct.pack("<Q", len(head)) + head + b"".join(blobs)


def load_safetensors(read: Any) -> dict[str, np.ndarray]:
    """Tensors from a file object, as a loader would read them (header, then seeks)."""
    (n,) = struct.unpack("<Q", read.read(8))
    header = json.loads(read.read(n))
    out = {}
    for name, info in header.items():
        lo, hi = info["data_offsets"]
        read.seek(8 + n + lo)
        dtype = {"F32": np.float32, "I32": np.int32}[info["dtype"]]
        out[name] = np.frombuffer(read.read(hi - lo), dtype=dtype).reshape(info["shape"])
    return out


def assert_same(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert sorted(got) == sorted(want)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])


async def write_checkpoint(cluster: MiniHdfs, root: str) -> dict[str, dict[str, np.ndarray]]:
    shards = {name: tensors_of(i, mib) for i, (name, mib) in enumerate(SHARDS.items())}
    async with WebHdfs(cluster.http_url) as client:
        await client.mkdirs(root)
        for name, tensors in shards.items():
            await client.create(f"{root}/{name}", safetensors_bytes(tensors), replication=2,
                                block_size=BLOCK)
    return shards


async def bootseer(cluster: LocalCluster | None, *args: str,
                   env: dict[str, str] | None = None) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        *bootseer_command(), *args, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env=env or (cluster.env if cluster else None))
    out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def flags(cluster: LocalCluster, agent: AgentHandle) -> list[str]:
    return ["--tracker", cluster.tracker_url, "--api-socket", agent.api_socket,
            "--store-dir", str(agent.store_dir)]


async def origin_bytes(agent: AgentHandle) -> int:
    async with agent.client(30) as client:
        return sum(int(c["origin_bytes"]) for c in (await client.status())["contents"].values())


def open_api(cluster: LocalCluster, agent: AgentHandle, uri: str) -> Any:
    return hdfs_stripe.open(uri, tracker=cluster.tracker_url, api_socket=agent.api_socket,
                            store_dir=agent.store_dir, secret=cluster.secret)


# ---- tests ------------------------------------------------------------------------------


async def test_a_checkpoint_loads_through_prefetch_mount_and_api_hdfs_read_once(
        tmp_path: Path, fuse_ready: None) -> None:
    async with hdfs(tmp_path) as dfs, swarm(tmp_path, 3) as (cluster, (a, b, c)):
        shards = await write_checkpoint(dfs, "/ckpt/step-100")
        total = sum(len(safetensors_bytes(t)) for t in shards.values())
        code, out, err = await bootseer(cluster, "ckpt", "prefetch", dfs.uri("/ckpt/step-100"),
                                        "--json", *flags(cluster, a))
        assert code == 0, err
        lines = [json.loads(line) for line in out.splitlines()]
        assert sorted(line["path"] for line in lines) == sorted(SHARDS)
        assert all(line["indexed"] for line in lines)
        indexed = sum(line["index_hdfs_bytes"] for line in lines)
        assert indexed == total  # the first reader read every byte once, to index it

        where = tmp_path / "mnt"
        where.mkdir()
        opts = MountOptions(dfs.uri("/ckpt/step-100"), where, cluster.tracker_url,
                            b.api_socket, b.store_dir)
        mount = await Mount.spawn(opts.argv(), where, tmp_path / "mount.log", env=cluster.env)
        try:
            assert not any(f["indexed"] for f in mount.ready["files"])  # found by name
            for name, tensors in shards.items():
                with open(where / name, "rb") as f:
                    assert_same(await asyncio.to_thread(load_safetensors, f), tensors)
            assert sorted(p.name for p in where.iterdir()) == sorted(SHARDS)
        finally:
            await mount.stop()
        assert not is_mounted(where)

        def through_api() -> None:
            for name, tensors in shards.items():
                with open_api(cluster, c, dfs.uri(f"/ckpt/step-100/{name}")) as f:
                    assert not f.resolved.indexed
                    assert_same(load_safetensors(f), tensors)

        await asyncio.to_thread(through_api)
        assert await origin_bytes(b) == 0 and await origin_bytes(c) == 0  # all from peers


async def test_agents_loading_the_same_shard_split_the_hdfs_reads(tmp_path: Path) -> None:
    async with hdfs(tmp_path) as dfs, swarm(tmp_path, 3) as (cluster, agents):
        data = safetensors_bytes(tensors_of(7, 24))
        async with WebHdfs(dfs.http_url) as client:
            await client.create("/ckpt/big.safetensors", data, replication=2, block_size=BLOCK)
        uri = parse_uri(dfs.uri("/ckpt/big.safetensors"))
        reader = StripeReader(webhdfs_for(uri))
        async with TrackerClient(cluster.tracker_url, cluster.secret) as tracker:
            resolved = await resolve(reader, tracker, uri, store_dir=None)  # publish only
        await reader.close()

        async def load(agent: AgentHandle) -> dict[str, Any]:
            async with agent.client(300) as client:
                return await client.ensure(resolved.content_id)

        results = await asyncio.gather(*(load(agent) for agent in agents))
        assert all(r["complete"] for r in results), results
        from_hdfs = sum(int(r["origin_bytes"]) for r in results)
        assert len(data) <= from_hdfs <= 1.1 * len(data), results
        with await asyncio.to_thread(open_api, cluster, agents[2], str(uri)) as f:
            assert await asyncio.to_thread(f.read) == data


async def test_readers_starting_cold_at_once_read_hdfs_once_between_them(
        tmp_path: Path) -> None:
    async with hdfs(tmp_path) as dfs, swarm(tmp_path, 3) as (cluster, agents):
        data = safetensors_bytes(tensors_of(8, 16))
        async with WebHdfs(dfs.http_url) as client:
            await client.create("/ckpt/cold.safetensors", data, replication=2,
                                block_size=BLOCK)
        runs = await asyncio.gather(*(
            bootseer(cluster, "ckpt", "prefetch", dfs.uri("/ckpt/cold.safetensors"), "--json",
                     *flags(cluster, agent)) for agent in agents))
        assert all(code == 0 for code, _, _ in runs), [err for _, _, err in runs]
        lines = [json.loads(out) for _, out, _ in runs]
        assert sum(line["indexed"] for line in lines) == 1, lines  # one claimed the indexing
        assert len({line["content"] for line in lines}) == 1
        # The indexer's agent counts the read that indexed as origin bytes: the agents'
        # origin bytes alone are the HDFS egress (what the tracker's page shows).
        from_hdfs = sum(line["origin_bytes"] for line in lines)
        assert len(data) <= from_hdfs <= 1.1 * len(data), lines
        indexer = next(line for line in lines if line["indexed"])
        assert indexer["origin_bytes"] >= indexer["index_hdfs_bytes"] > 0, lines
        for agent in agents:
            with await asyncio.to_thread(open_api, cluster, agent,
                                         dfs.uri("/ckpt/cold.safetensors")) as f:
                assert await asyncio.to_thread(f.read) == data


async def test_a_changed_file_is_reported_and_never_mixed(tmp_path: Path) -> None:
    # An origin that keeps failing ends the content after this long, naming why.
    give_up = {"swarm": {"no_source_deadline_s": 5.0}}
    async with hdfs(tmp_path) as dfs, swarm(tmp_path, 1, give_up) as (cluster, (agent,)):
        old, new = bytes(range(256)) * 40_000, bytes(range(255, -1, -1)) * 40_000
        async with WebHdfs(dfs.http_url) as client:
            await client.create("/ckpt/shard", old, replication=2, block_size=BLOCK)
            uri = parse_uri(dfs.uri("/ckpt/shard"))
            reader = StripeReader(webhdfs_for(uri))
            async with TrackerClient(cluster.tracker_url, cluster.secret) as tracker:
                first = await resolve(reader, tracker, uri, store_dir=None)
            await reader.close()
            await client.create("/ckpt/shard", new, replication=2, block_size=BLOCK)

        async with agent.client(120) as api:
            with pytest.raises(AgentError, match="changed while it was being read"):
                await api.ensure(first.content_id)
        with await asyncio.to_thread(open_api, cluster, agent, str(uri)) as f:
            assert f.resolved.content_id != first.content_id
            assert await asyncio.to_thread(f.read) == new


async def test_hdfs_errors_are_one_line_naming_the_path_and_the_user(tmp_path: Path) -> None:
    async with hdfs(tmp_path) as dfs:
        async with WebHdfs(dfs.http_url) as client:
            await client.create("/private/shard", b"secret", permission="600")
        env = {**LocalCluster(tmp_path).env, "HADOOP_USER_NAME": "alice"}
        args = ["--tracker", "http://127.0.0.1:9", "--api-socket", str(tmp_path / "none.sock")]
        code, _, err = await bootseer(None, "ckpt", "prefetch", dfs.uri("/private/shard"),
                                      *args, env=env)
        assert code == 2 and "permission denied: user 'alice'" in err and "/private/shard" \
            in err and "Traceback" not in err, err
        code, _, err = await bootseer(None, "ckpt", "prefetch", dfs.uri("/no/such"), *args,
                                      env=env)
        assert code == 2 and "/no/such does not exist" in err, err
    code, _, err = await bootseer(None, "ckpt", "prefetch", "hdfs://127.0.0.1:9/x", *args,
                                  env=env)
    assert code == 2 and "the NameNode at http://127.0.0.1:9 did not serve /x after" in err \
        and "Traceback" not in err, err


@pytest.mark.parametrize("how", ["stopped", "killed"])
async def test_a_datanode_stopped_or_killed_mid_read_the_reader_finishes_on_a_replica(
        tmp_path: Path, how: str) -> None:
    """Stopped: the DataNode shuts down in the cluster's JVM. Killed: its own JVM gets
    SIGKILL, as a crashed host: connections cut, no goodbye to the NameNode."""
    async with hdfs(tmp_path, read_cap_bps=8 * MiB, own_jvms=how == "killed") as dfs:
        data = bytes(np.random.default_rng(3).integers(0, 255, 24 * MiB, dtype=np.uint8))
        async with WebHdfs(dfs.http_url) as client:
            await client.create("/ckpt/shard", data, replication=3, block_size=BLOCK)
        uri = parse_uri(dfs.uri("/ckpt/shard"))
        reader = StripeReader(webhdfs_for(uri), stripe_size=2 * MiB)
        try:
            version = await reader.current(uri)
            buf = bytearray(len(data))
            task = asyncio.create_task(reader.read(uri, version, 0, memoryview(buf)))

            async def streaming() -> bool:
                return reader.bytes_read >= 4 * MiB and bool(reader.in_flight())

            await until(streaming, "the read under way")
            (busy,) = reader.in_flight()
            port = int(busy.rsplit(":", 1)[1])
            await (dfs.kill_datanode(port) if how == "killed" else dfs.stop_datanode(port))
            await asyncio.wait_for(task, 300)
            assert buf == data
            assert busy in reader.down_nodes()
        finally:
            await reader.close()


async def test_a_peer_serving_bad_stripes_is_dropped_and_the_stripes_refetched(
        tmp_path: Path) -> None:
    async with hdfs(tmp_path) as dfs, swarm(tmp_path, 1) as (cluster, (agent,)):
        data = safetensors_bytes(tensors_of(9, 12))
        async with WebHdfs(dfs.http_url) as client:
            await client.create("/ckpt/shard", data, replication=2, block_size=BLOCK)
        uri = parse_uri(dfs.uri("/ckpt/shard"))
        reader = StripeReader(webhdfs_for(uri), stripe_size=MiB)
        async with TrackerClient(cluster.tracker_url, cluster.secret) as tracker:
            resolved = await resolve(reader, tracker, uri, store_dir=None)  # publish only
            manifest = await tracker.get_manifest(resolved.content_id)
        await reader.close()
        # A node with the cluster secret that claims every stripe and sends garbage.
        hostile = HostilePeer(manifest, cluster.secret, cluster.tracker_url, cluster.secret)
        await hostile.start()
        try:
            async with agent.client(300) as api:
                status = await api.ensure(resolved.content_id)
            assert status["complete"], status
            fooled = PeerId(agent.peer)
            assert hostile.log.garbage_sent[fooled] >= 1, hostile.log

            async def hung_up() -> bool:
                return fooled in hostile.log.closed_by_peer

            await until(hung_up, what=f"the agent drops the hostile peer: {hostile.log}")
            async with agent.client(30) as api:
                text = await api.metrics()
            assert metric(text, "bootseer_chunks_rejected_total", source="peer") >= 1
            assert metric(text, "bootseer_peers_dropped_total") >= 1
            assert int(status["origin_bytes"]) >= len(data)  # every stripe came from HDFS
            with await asyncio.to_thread(open_api, cluster, agent, str(uri)) as f:
                assert await asyncio.to_thread(f.read) == data
        finally:
            await hostile.stop()


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
async def test_a_sha256sum_through_the_mount_survives_an_agent_restart(
        tmp_path: Path, fuse_ready: None, sig: int) -> None:
    """Issue 35: the mount server waits for the agent to come back; the reader (a real
    `sha256sum` in its own process) sees a pause, never an error or a wrong byte."""
    data = bytes(np.random.default_rng(5).integers(0, 255, 16 * MiB, dtype=np.uint8))
    slow = {"download_mbps": 4.0}  # the reader's node: its read takes ~4 s
    async with hdfs(tmp_path) as dfs, swarm(tmp_path, 1) as (cluster, (a,)):
        async with WebHdfs(dfs.http_url) as client:
            await client.create("/ckpt/big", data, replication=2, block_size=BLOCK)
        code, _, err = await bootseer(cluster, "ckpt", "prefetch", dfs.uri("/ckpt/big"),
                                      "--json", *flags(cluster, a))
        assert code == 0, err  # indexed, and held by a
        b = await cluster.start_agent(1, "rack0", slow)
        where = tmp_path / "mnt"
        where.mkdir()
        opts = MountOptions(dfs.uri("/ckpt"), where, cluster.tracker_url, b.api_socket,
                            b.store_dir)
        mount = await Mount.spawn(opts.argv(), where, tmp_path / "mount.log", env=cluster.env)
        try:
            started = time.monotonic()
            reader = await asyncio.create_subprocess_exec(
                "sha256sum", str(where / "big"), stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE)
            await asyncio.sleep(1.0)  # a quarter of the file read, the rest on its way
            cluster.children.remove(b.child)
            await b.child.stop(sig)
            await asyncio.sleep(1.0)
            assert reader.returncode is None, "the read ended with no agent to serve it"
            await cluster.start_agent(1, "rack0", slow)  # its store and socket again
            out, err = await asyncio.wait_for(reader.communicate(), 120)
            stall = time.monotonic() - started
            assert reader.returncode == 0, err.decode()
            assert out.decode().split()[0] == hashlib.sha256(data).hexdigest()
            assert "waits for the agent" in (tmp_path / "mount.log").read_text()
        finally:
            await mount.stop()
        print(json.dumps({"restart_signal": sig.name, "sha256sum_seconds": round(stall, 2)}))


async def test_checkpoint_mounts_through_the_mount_server_are_served_by_one_process(
        tmp_path: Path, fuse_ready: None) -> None:
    """`ckpt mount` with BOOTSEER_MOUNT_SERVER set, twice: both mounts served by the
    server's host (the command line parsed and set up there, in the caller's environment:
    the secret, the tracker, the HDFS user), each read as a loader reads it; `ckpt umount`
    ends each mount's handle; the server's stop leaves nothing mounted."""
    async with hdfs(tmp_path) as dfs, swarm(tmp_path, 1) as (cluster, (a,)):
        shards = await write_checkpoint(dfs, "/ckpt/step-7")
        async with WebHdfs(dfs.http_url) as client:
            await client.create("/private/shard", b"secret", permission="600")
        uri = dfs.uri("/ckpt/step-7")
        code, _, err = await bootseer(cluster, "ckpt", "prefetch", uri, "--json",
                                      *flags(cluster, a))
        assert code == 0, err
        sock = tmp_path / "mount.sock"
        server = await asyncio.create_subprocess_exec(
            *bootseer_command(), "fs", "server", "--socket", str(sock),
            stdout=asyncio.subprocess.PIPE, env=cluster.env)
        assert server.stdout is not None
        host = json.loads(await asyncio.wait_for(server.stdout.readline(), 30))["host_pid"]
        # The failed mount below keeps its log (as a user's would): here, in tmp_path.
        env = {**cluster.env, "BOOTSEER_MOUNT_SERVER": str(sock),
               "BOOTSEER_LOG_DIR": str(tmp_path)}
        mounts = []
        try:
            for name in ("one", "two"):
                (tmp_path / name).mkdir()
                code, out, err = await bootseer(cluster, "ckpt", "mount", uri,
                                                str(tmp_path / name), *flags(cluster, a),
                                                env=env)
                assert code == 0, err
                mounts.append(json.loads(out))
            assert [m["server_pid"] for m in mounts] == [host, host]
            # The HDFS user is the mount command's, not the server's.
            (tmp_path / "private").mkdir()
            code, _, err = await bootseer(cluster, "ckpt", "mount", dfs.uri("/private/shard"),
                                          str(tmp_path / "private"), *flags(cluster, a),
                                          env={**env, "HADOOP_USER_NAME": "alice"})
            assert code == 2 and "permission denied: user 'alice'" in err, err
            for name in ("one", "two"):
                for shard, tensors in shards.items():
                    with open(tmp_path / name / shard, "rb") as f:
                        assert_same(await asyncio.to_thread(load_safetensors, f), tensors)
            code, _, err = await bootseer(cluster, "ckpt", "umount", str(tmp_path / "one"))
            assert code == 0, err

            async def handle_gone() -> bool:
                return not Path(f"/proc/{mounts[0]['pid']}").exists()

            await until(handle_gone, "the unmounted mount's handle exits")
            assert is_mounted(tmp_path / "two")
        finally:
            server.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(server.wait(), 30) == 0
        assert not is_mounted(tmp_path / "one") and not is_mounted(tmp_path / "two")
