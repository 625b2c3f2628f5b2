"""`bootseer bench ckpt`: checkpoint reads on the HDFS mini cluster, side by side, one run.

One file (`--size`, random bytes) is written with `--replication` copies in
`--block-size` blocks spread over 3 DataNodes (`minicluster.write_spread`) whose
reads are capped at `--dn-cap` MB/s each (disk-bound DataNodes, paced as a disk
serves: `minicluster` says how). The default cap is 20 MB/s, not a real disk's 80:
the caps must stay the bottleneck, and on the 2-core development machine the whole
WebHDFS path (DataNode JVMs and the Python reader) tops out at 150-180 MB/s
uncapped, below 3 x 80. One stream gets the cap (1 GiB at 20 MB/s: 19.9 MB/s;
Hadoop's own throttler gave it 20.6-22.0 MB/s, bursts after every idle moment).
After a warm-up pass (a just-started JVM serves 2-3x slower), in order:

- `single_stream_seconds`: one sequential WebHDFS stream of the whole file,
  as fuse-dfs reads it (one block at a time, one DataNode at a time);
- `striped_seconds`: the first reader's striped read (`index.index`: stripes
  from every DataNode at once), which also yields the manifest, published;
- `single_node_seconds`: one agent (node cap `--node-cap` MB/s each way) loads
  the file alone (every stripe from HDFS through its origin adapter);
- `swarm_max_seconds`: `--nodes` fresh agents load it at once; the slowest
  one's time; `hdfs_bytes_ratio` is what HDFS served them / the file size;
- `fuse_read_gbps`: the file read with `dd bs=4M` through `bootseer ckpt serve`
  on an agent that holds every stripe, by FUSE passthrough (the kernel reads a
  whole-file copy written from the verified stripes; `whole_build_*`: building
  it), and `handler_fuse_read_gbps` through the handler (`--no-passthrough`,
  pyfuse3: the baseline), side by side on fresh mounts (each a first read
  through FUSE), medians of three (`*_runs_gbps`: all; `*_server_cpu_s_per_gib`:
  the serving process's CPU; `*read_path`: what served, by the server's own
  account; `direct_read_gbps`: the stripe files read directly, what the disk
  and page cache give without FUSE). `server_first_*` and `server_second_*`: the
  same read through a mount server's host (`bootseer fs server`, one process
  for many mounts; a fresh server each round): its first mount of the file, then
  a second mount of it while the first is still mounted, which trusts the
  backing file the first one checked (`*_backing_checked`: files the mount
  hashed, by its own account); CPU is the host's.

Every load is checked against the file's SHA-256. Ratios, not absolute times,
are what carry from this 2-core machine to a cluster.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from p2p.bench import workdir
from p2p.chunkfile import CHUNK_SUFFIX
from p2p.errors import UserError
from p2p.units import GiB, MiB, positive_int, size_arg

READ_BYTES = 4 * MiB
FUSE_ROUNDS = 3  # fresh mounts, median reported
# The read cases, by the prefix of their keys in the JSON line.
CASES = {"handler": "handler_", "passthrough": "", "server_first": "server_first_",
         "server_second": "server_second_"}


def add_parser(kinds: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    b = kinds.add_parser("ckpt", help="HDFS checkpoint reads: one stream, striped, swarm, FUSE")
    b.add_argument("--size", type=size_arg, default=1 * GiB,
                   help="checkpoint file size, e.g. 1GiB (default: 1GiB)")
    b.add_argument("--nodes", type=positive_int, default=8, help="agents loading the file at once")
    b.add_argument("--dn-cap", type=float, default=20.0, help="MB/s of reads per DataNode")
    b.add_argument("--node-cap", type=float, default=100.0, help="MB/s per agent, each way")
    b.add_argument("--replication", type=positive_int, default=2,
                   help="HDFS replicas of each block")
    b.add_argument("--block-size", type=size_arg, default=64 * MiB,
                   help="HDFS block size (default: 64MiB)")
    b.add_argument("--stripe-size", type=size_arg, default=None,
                   help="default: hdfs_stripe.stripe.STRIPE_SIZE")
    b.add_argument("--parallel", type=positive_int, default=8,
                   help="stripes the striped reader has in flight")
    b.add_argument("--origin-inflight", type=positive_int, default=8,
                   help="stripes each agent reads from HDFS at once (swarm.max_origin_inflight;"
                        " the agent's default of 2 keeps one node on 1-2 DataNodes)")
    b.add_argument("--json", action="store_true", help="print only the JSON line")
    b.add_argument("--workdir", type=Path, help="keep logs, HDFS and stores here")
    b.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    from hdfs_stripe.cli import expected
    from hdfs_stripe.testing.minicluster import MiniClusterError

    try:
        result = expected(_bench(args))
    except MiniClusterError as exc:
        raise UserError(str(exc)) from None
    print(json.dumps(result))
    return 0 if result["verified"] else 1


async def _bench(args: argparse.Namespace) -> dict[str, Any]:
    from hdfs_stripe.testing.minicluster import MiniHdfs

    with workdir(args.workdir, "ckpt") as work:
        say = _progress(not args.json and sys.stderr.isatty())
        say("starting the HDFS mini cluster")
        async with await MiniHdfs.start(work / "hdfs", 3, int(args.dn_cap * 1e6),
                                        args.block_size) as dfs:
            return await _rounds(dfs, work, args, say)


def _progress(show: bool) -> Any:
    def say(text: str) -> None:
        if show:
            print(f"bench ckpt: {text}", file=sys.stderr, flush=True)
    return say


async def _rounds(dfs: Any, work: Path, args: argparse.Namespace, say: Any) -> dict[str, Any]:
    from hdfs_stripe.index import index
    from hdfs_stripe.naming import content_name, parse_uri
    from hdfs_stripe.reader import StripeReader
    from hdfs_stripe.stripe import STRIPE_SIZE
    from hdfs_stripe.testing.minicluster import write_spread
    from hdfs_stripe.webhdfs import WebHdfs
    from p2p.testing.localcluster import LocalCluster
    from p2p.tracker_client import TrackerClient

    data = os.urandom(args.size)
    digest = hashlib.sha256(data).hexdigest()
    say(f"writing {args.size} bytes")
    async with WebHdfs(dfs.http_url) as client:
        await client.mkdirs("/bench")
        for name in ("warmup", "ckpt"):
            body = data if name == "ckpt" else data[:min(len(data), 256 * MiB)]
            await write_spread(client, f"/bench/{name}", body, args.replication,
                               args.block_size)
        say("warm-up pass")
        await _single_stream(client, "/bench/warmup", min(len(data), 256 * MiB))
        say("one sequential stream")
        single_s, single_ok = await _single_stream(client, "/bench/ckpt", len(data), digest)
    uri = parse_uri(dfs.uri("/bench/ckpt"))
    reader = StripeReader(WebHdfs(uri.endpoint), args.stripe_size or STRIPE_SIZE)
    try:
        await index(reader, parse_uri(dfs.uri("/bench/warmup")),
                    await reader.current(parse_uri(dfs.uri("/bench/warmup"))), None,
                    args.parallel)
        say("striped read")
        version = await reader.current(uri)
        started = time.monotonic()
        manifest = await index(reader, uri, version, None, args.parallel)
        striped_s = time.monotonic() - started
    finally:
        await reader.close()
    cluster = LocalCluster(work / "cluster")
    try:
        await cluster.start_tracker()
        async with TrackerClient(cluster.tracker_url, cluster.secret) as tracker:
            await tracker.put_manifest(manifest)
            await tracker.put_name(content_name(uri, version), manifest.content_id)
        caps = {"upload_mbps": args.node_cap, "download_mbps": args.node_cap,
                "origin_concurrency": args.origin_inflight,
                "swarm": {"max_origin_inflight": args.origin_inflight}}
        say("one agent alone")
        (solo,), _ = await _load(cluster, "solo", 1, caps, manifest.content_id)
        say(f"{args.nodes} agents at once")
        swarm, holder = await _load(cluster, "swarm", args.nodes, caps, manifest.content_id,
                                    keep_first=True)
        say("reading through the mount")
        fuse = await _fuse_read(cluster, holder, uri, work, manifest, digest)
    finally:
        await cluster.stop()
    swarm_max = max(r["seconds"] for r in swarm)
    from_hdfs = sum(r["origin_bytes"] for r in swarm)
    return {
        "bench": "ckpt", "bytes": args.size, "replication": args.replication,
        "block_bytes": args.block_size, "stripe_bytes": manifest.chunk_size,
        "datanodes": len(dfs.datanodes), "dn_read_cap_mbps": args.dn_cap,
        "node_cap_mbps": args.node_cap, "origin_inflight": args.origin_inflight,
        "single_stream_seconds": round(single_s, 3),
        "striped_seconds": round(striped_s, 3),
        "striped_speedup": round(single_s / striped_s, 2),
        "swarm_nodes": args.nodes,
        "swarm_max_seconds": round(swarm_max, 3),
        "single_node_seconds": round(solo["seconds"], 3),
        "swarm_over_single_node": round(swarm_max / solo["seconds"], 3),
        "hdfs_bytes_ratio": round(from_hdfs / args.size, 4),
        **{k: v for k, v in fuse.items() if k != "fuse_ok"},
        "verified": single_ok and fuse["fuse_ok"] and solo["verified"]
        and all(r["verified"] for r in swarm),
    }


async def _single_stream(client: Any, path: str, size: int,
                         digest: str | None = None) -> tuple[float, bool]:
    buf = bytearray(size)
    started = time.monotonic()
    await client.read_into(path, 0, memoryview(buf))
    seconds = time.monotonic() - started
    return seconds, digest is None or hashlib.sha256(buf).hexdigest() == digest


async def _load(cluster: Any, prefix: str, nodes: int, config: dict[str, Any], content: str,
                keep_first: bool = False) -> tuple[list[dict[str, Any]], Any]:
    """`nodes` fresh agents load `content` at once; per agent: seconds, origin bytes,
    whether its store holds every stripe. All are stopped but the first, if kept: it is
    returned too."""
    agents = await asyncio.gather(*(cluster.start_agent(i, "rack0", config,
                                                        name=f"{prefix}{i}")
                                    for i in range(nodes)))

    async def one(agent: Any) -> dict[str, Any]:
        async with agent.client(1800) as client:
            status: dict[str, Any] = await client.ensure(content)
        held = len(list((agent.store_dir / content).glob("*.chunk")))
        return {"seconds": float(status["seconds"]), "origin_bytes": status["origin_bytes"],
                "verified": bool(status["complete"]) and held == status["chunks"]}

    try:
        return list(await asyncio.gather(*(one(a) for a in agents))), agents[0]
    finally:
        await asyncio.gather(*(a.child.stop() for a in agents[1 if keep_first else 0:]))


async def _fuse_read(cluster: Any, agent: Any, uri: Any, work: Path, manifest: Any,
                     digest: str) -> dict[str, Any]:
    """Reads of the file through `bootseer ckpt serve` by both paths, side by side: the
    whole file the passthrough path needs is built first (timed: the one-time cost of
    that layout over chunk files), then, after a sync (the stripes were just written:
    their writeback is not a read), FUSE_ROUNDS rounds of: the stripe files read directly
    (what the disk and page cache give), `dd bs=4M` through a fresh `--no-passthrough`
    mount (pyfuse3, every read through the handler) and through a fresh passthrough
    mount (each a first read; a new serving process hashes the whole file once at its
    first open). GB/s, serving-process CPU s/GiB and the path that served, medians;
    then one untimed read through passthrough that checks every byte."""
    from fusefs.backing import WholeFiles
    from fusefs.bench.image import cpu_seconds, dd_seconds, read_all_seconds
    from fusefs.bench.readpath import read_path
    from fusefs.mount import Mount
    from hdfs_stripe.mount import MountOptions

    size = manifest.size
    where = work / "mnt"
    where.mkdir(exist_ok=True)
    began, cpu_began = time.monotonic(), time.process_time()
    built = await asyncio.to_thread(WholeFiles(agent.store_dir).build, manifest)
    build_s, build_cpu = time.monotonic() - began, time.process_time() - cpu_began
    await asyncio.to_thread(os.sync)
    stripes = sorted(agent.store_dir.glob(f"*/*{CHUNK_SUFFIX}"),
                     key=lambda p: int(p.name.split(".")[0]))
    runs: dict[str, dict[str, list[Any]]] = {
        m: {"gbps": [], "cpu": [], "path": [], "checked": []} for m in CASES}
    direct, same = [], False
    for round_, last in enumerate([False] * (FUSE_ROUNDS - 1) + [True]):
        direct.append(size / await asyncio.to_thread(read_all_seconds, stripes) / 1e9)
        for mode in ("handler", "passthrough"):
            opts = MountOptions(str(uri), where, cluster.tracker_url, agent.api_socket,
                                agent.store_dir, passthrough=mode == "passthrough")
            log = work / f"mount-{mode}.log"
            argv = [*opts.argv(), "--log-level", "INFO"]  # INFO: the server's account
            async with await Mount.spawn(argv, where, log, env=cluster.env) as mount:
                before = cpu_seconds(mount.proc.pid)
                runs[mode]["gbps"].append(size / await dd_seconds(where / "ckpt") / 1e9)
                runs[mode]["cpu"].append((cpu_seconds(mount.proc.pid) - before) * GiB / size)
                if last and mode == "passthrough":
                    same = await asyncio.to_thread(_sha256_of, where / "ckpt") == digest
            runs[mode]["path"].append(read_path(log))
        await _server_round(cluster, agent, uri, work, size, round_, runs)
    out: dict[str, Any] = {"fuse_ok": same and built,
                           "whole_build_seconds": round(build_s, 3),
                           "whole_build_cpu_s_per_gib": round(build_cpu * GiB / size, 3),
                           "direct_read_gbps": round(statistics.median(direct), 3)}
    for mode, r in runs.items():
        key = CASES[mode]
        out |= {f"{key}fuse_read_gbps": round(statistics.median(r["gbps"]), 3),
                f"{key}fuse_read_runs_gbps": [round(v, 3) for v in r["gbps"]],
                f"{key}fuse_server_cpu_s_per_gib": round(statistics.median(r["cpu"]), 3),
                f"{key}read_path": sorted(set(r["path"]))}
        if r["checked"]:
            out[f"{key}backing_checked"] = r["checked"]
    out["passthrough_over_handler"] = round(out["fuse_read_gbps"] /
                                            out["handler_fuse_read_gbps"], 2)
    out["server_second_over_first"] = round(out["server_second_fuse_read_gbps"] /
                                            out["server_first_fuse_read_gbps"], 2)
    return out


async def _server_round(cluster: Any, agent: Any, uri: Any, work: Path, size: int,
                        round_: int, runs: dict[str, dict[str, list[Any]]]) -> None:
    """One round through a fresh mount server: `dd` through its first mount of the file,
    then through a second mount of it (the first still mounted); the host's CPU."""
    from fusefs.bench.image import cpu_seconds, dd_seconds
    from fusefs.bench.mountserver import MountServer
    from fusefs.bench.readpath import account, read_path
    from fusefs.mount import LOG_DIR_ENV
    from hdfs_stripe.mount import MountOptions

    env = {**cluster.env, LOG_DIR_ENV: str(work)}  # the mounts' logs stay: their accounts
    server = await MountServer.start(work / f"server-{round_}.sock",
                                     work / f"server-{round_}.log", env)
    mounted = []
    try:
        for mode in ("server_first", "server_second"):
            where = work / f"mnt-{mode}"
            where.mkdir(exist_ok=True)
            opts = MountOptions(str(uri), where, cluster.tracker_url, agent.api_socket,
                                agent.store_dir)
            log = work / f"mount-{mode}-{round_}.log"
            ready = await server.mount([*opts.argv(), "--log-level", "INFO"], log, env)
            mounted.append((ready, log, mode))
            host = int(ready["server_pid"])
            before = cpu_seconds(host)
            runs[mode]["gbps"].append(size / await dd_seconds(where / "ckpt") / 1e9)
            runs[mode]["cpu"].append((cpu_seconds(host) - before) * GiB / size)
    finally:
        for ready, _, _ in reversed(mounted):
            await server.unmount(ready)
        await server.stop()
    for _, log, mode in mounted:
        runs[mode]["path"].append(read_path(log))
        runs[mode]["checked"].append((account(log) or {}).get("backing_checked"))


def _sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    buf = bytearray(READ_BYTES)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            h.update(memoryview(buf)[:n])
    return h.hexdigest()
