"""`bootseer bench tracker`: one tracker process under the announces of N nodes.

Starts `bootseer tracker` (the real command), announces every node's
contents once so the swarm has its full size, then replays signed announces
from all N nodes with `wrk` (tracker.bench.loadgen) over `--connections` keep-alive
connections for `--seconds`, and prints one JSON line:

    nodes, contents, replicas, protocol, announces_per_second (node announces),
    content_announces_per_second, p50_ms, p99_ms, tracker_rss_mb (peak),
    errors, tracker_cpu and generator_cpu (cores busy),
    content_announces_per_cpu_second, limited_by, swarm_peers

`content_announces_per_cpu_second` divides by the tracker's CPU: what one
core does, comparable across runs on a machine shared with other work.
`--compare-nodes 300` first measures a 300-node swarm (same contents) on a
tracker of its own, side by side in the same run, and adds `compare` (its
figures), `rate_ratio` and `cpu_rate_ratio` (large swarm over small): the
cost per announce should not grow with the swarm.
With `--replicas R` (R > 1) it starts a `redis-server` of its own and R
tracker processes sharing it (tracker.replicas), splits the pool and the
connections between them (one wrk each), and adds `redis_cpu`; the rate is
the sum, `p50_ms`/`p99_ms` the worst replica's, `tracker_cpu` the replicas'
sum, and `limited_by` is "machine" when trackers, Redis and wrk together kept
every core busy (on a 2-core machine, the usual case).

`limited_by` says what bounded the rate: "tracker" when the tracker process
kept a core busy; "generator" when wrk did instead (its figure is then the
generator's, not the tracker's); "neither" when neither was saturated (the
machine's two cores were busy with something else). Anything but "tracker"
is printed as a warning on stderr and exits with status 1.

The tracker runs with its per-address and per-peer rate limits lifted and a
long peer TTL: every simulated node shares 127.0.0.1 and announces as fast as
the tracker answers, far more often than every two seconds, and the swarm
must keep its size whatever the rate. Everything else is the default
configuration. `--protocol single` sends one request per content (the
pre-batching wire format); `batched` one per node with all its contents.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import uvloop

from p2p.bench import workdir as bench_workdir
from p2p.errors import UserError
from p2p.process import cpu_seconds
from p2p.testing.localcluster import Child, LocalCluster, to_toml
from p2p.units import positive_int
from tracker.bench import loadgen
from tracker.testing.redisproc import RedisMissing, RedisServer

SATURATED_CORE = 0.85  # a process this busy (of one core per thread) is the bound
POOL_SEED = 11
# Rate limits out of the way, but with buckets that stay (burst / rate = 1,000 s
# idle), as a node's bucket does between announces in a real cluster: a bucket
# forgotten and made again at every announce would cost the big swarm only.
BENCH_CONFIG = {
    "host_rate_per_second": 1e6, "host_burst": 1_000_000_000,
    "announce_rate_per_second": 1e6, "announce_burst": 1_000_000_000,
    "peer_ttl_seconds": 3600.0, "seed": 1, "log_level": "WARNING",
}


def add_parser(kinds: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = kinds.add_parser("tracker", help="one tracker under N nodes' signed announces (wrk)")
    p.add_argument("--nodes", type=positive_int, default=10_000, help="nodes announcing")
    p.add_argument("--contents", type=positive_int, default=3, help="contents per node")
    p.add_argument("--replicas", type=positive_int, default=1,
                   help="tracker processes sharing one Redis (started by the bench)")
    p.add_argument("--protocol", choices=["batched", "single"], default="batched",
                   help="one announce per node (all contents) or one per content")
    p.add_argument("--seconds", type=float, default=5.0, help="measured time")
    p.add_argument("--connections", type=positive_int, default=64,
                   help="wrk's open connections")
    p.add_argument("--threads", type=positive_int, default=1, help="wrk threads")
    p.add_argument("--max-rate", type=positive_int, default=40_000,
                   help="requests per second the prepared pool lasts for")
    p.add_argument("--want-share", type=float, default=0.1,
                   help="share of announced contents that ask for peers")
    p.add_argument("--compare-nodes", type=positive_int, metavar="N",
                   help="first measure a swarm of N nodes (same contents) on a fresh "
                   "tracker; add its figures and the ratios of the two rates")
    p.add_argument("--json", action="store_true", help="print only the JSON line")
    p.add_argument("--workdir", type=Path, help="keep the tracker's log and the pool here")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if not any(Path(d, "wrk").exists() for d in os.get_exec_path()):
        raise UserError("wrk is not installed (Debian package wrk; `make setup` installs it)")
    result = uvloop.run(_bench(args))
    print(json.dumps(result), flush=True)
    if result["limited_by"] not in ("tracker", "machine"):
        print(f"bootseer bench tracker: the tracker was not the bound (limited_by "
              f"{result['limited_by']}: tracker_cpu {result['tracker_cpu']}, generator_cpu "
              f"{result['generator_cpu']}); the rate above is not the tracker's capacity",
              file=sys.stderr)
        return 1
    return 0


async def _bench(args: argparse.Namespace) -> dict[str, Any]:
    with bench_workdir(args.workdir, "tracker") as workdir:
        small = None
        if args.compare_nodes:  # the small swarm first, on a tracker of its own
            small = await _run_once(workdir / "compare", args, args.compare_nodes)
        result = await _run_once(workdir, args, args.nodes)
    if small is not None:
        per_cpu = "content_announces_per_cpu_second"
        result["compare"] = {k: small[k] for k in (
            "nodes", "content_announces_per_second", per_cpu, "p99_ms", "tracker_cpu",
            "limited_by")}
        result["rate_ratio"] = round(result["content_announces_per_second"]
                                     / max(small["content_announces_per_second"], 1), 3)
        result["cpu_rate_ratio"] = round(result[per_cpu] / max(small[per_cpu], 1), 3)
    return result


async def _run_once(workdir: Path, args: argparse.Namespace, nodes: int) -> dict[str, Any]:
    cluster = LocalCluster(workdir)
    redis_server = None
    try:
        if args.replicas > 1:
            try:
                redis_server = await RedisServer(workdir / "redis").start()
            except RedisMissing as exc:
                raise UserError(str(exc)) from None
        return await _measure(cluster, workdir, args, nodes, redis_server)
    finally:
        await cluster.stop()
        if redis_server is not None:
            await redis_server.stop()


def _say(args: argparse.Namespace, message: str) -> None:
    if not args.json:
        print(message, file=sys.stderr, flush=True)


async def _measure(cluster: LocalCluster, workdir: Path, args: argparse.Namespace,
                   nodes: int, redis_server: RedisServer | None) -> dict[str, Any]:
    swarm = loadgen.Swarm(nodes, args.contents, want_share=args.want_share,
                          batched=args.protocol == "batched")
    config = workdir / "tracker.toml"
    workdir.mkdir(parents=True, exist_ok=True)
    config.write_text(to_toml(BENCH_CONFIG))
    if redis_server is None:
        trackers = [await cluster.start_tracker("--config", str(config))]
    else:
        trackers = await cluster.start_replicas(
            redis_server.url, args.replicas, "--config", str(config),
            "--redis-password-file", str(redis_server.password_file))
    urls = [t.ready["url"] for t in trackers]
    host_port = urls[0].removeprefix("http://")
    host, _, port = host_port.rpartition(":")

    _say(args, f"warm-up: {swarm.requests_per_round()} announces")
    warm = loadgen.build_pool(swarm, cluster.secret, host_port, swarm.requests_per_round(),
                              POOL_SEED, want_share=0.0)
    failures = await loadgen.send_pool(host, int(port), warm, min(args.connections, 16))
    if failures:
        raise UserError(f"{failures} warm-up announces failed; see {trackers[0].stderr_path}")
    peers_before = await _healthz_peers(urls[-1])

    count = int(args.max_rate * args.seconds)
    _say(args, f"signing {count} announces")
    pool = await asyncio.to_thread(loadgen.build_pool, swarm, cluster.secret, host_port,
                                   count, POOL_SEED + 1)
    runs = [workdir / f"wrk{i}" for i in range(len(urls))]
    for i, run_dir in enumerate(runs):  # each replica its share of the pool
        run_dir.mkdir(exist_ok=True)
        await asyncio.to_thread(loadgen.write_pool, pool[i::len(urls)], run_dir / "pool",
                                args.threads)
    del pool
    _say(args, f"wrk: {args.connections} connections for {args.seconds:g} s")
    pids = [t.pid for t in trackers] + ([redis_server.pid] if redis_server else [])
    cpu_before, wall_before = [cpu_seconds(p) for p in pids], time.monotonic()
    results = await asyncio.gather(*(
        asyncio.to_thread(loadgen.run_wrk, url, run_dir / "pool", args.threads,
                          max(1, args.connections // len(urls)), args.seconds, run_dir)
        for url, run_dir in zip(urls, runs, strict=True)))
    wall = time.monotonic() - wall_before
    cpu = [(cpu_seconds(p) - before) / wall for p, before in zip(pids, cpu_before, strict=True)]
    wrk = loadgen.WrkResult(sum(r.requests for r in results), max(r.seconds for r in results),
                            max(r.p50_ms for r in results), max(r.p99_ms for r in results),
                            sum(r.errors for r in results), sum(r.dry for r in results),
                            sum(r.cpu_seconds for r in results))
    if wrk.dry:
        raise UserError(f"the prepared pool ran out ({wrk.dry} requests past it): the "
                        f"tracker answered more than --max-rate {args.max_rate}/s; raise it")
    result = _result(args, swarm, wrk, trackers, sum(cpu[:len(trackers)]), peers_before,
                     await _healthz_peers(urls[-1]))
    if redis_server is not None:
        result["redis_cpu"] = round(cpu[-1], 2)
        busy = result["tracker_cpu"] + result["redis_cpu"] + result["generator_cpu"]
        if busy >= SATURATED_CORE * (os.cpu_count() or 1):
            result["limited_by"] = "machine"
    return result


def _result(args: argparse.Namespace, swarm: loadgen.Swarm, wrk: loadgen.WrkResult,
            trackers: list[Child], tracker_cpu: float, peers_before: int,
            peers_after: int) -> dict[str, Any]:
    rate = wrk.requests / wrk.seconds
    node_rate = rate if swarm.batched else rate / swarm.contents
    generator_cpu = wrk.cpu_seconds / wrk.seconds
    if tracker_cpu >= SATURATED_CORE * len(trackers):
        limited_by = "tracker"
    elif generator_cpu >= SATURATED_CORE * args.threads * len(trackers):
        limited_by = "generator"
    else:
        limited_by = "neither"
    return {
        "bench": "tracker", "nodes": swarm.nodes, "contents": swarm.contents,
        "replicas": args.replicas, "protocol": args.protocol,
        "announces_per_second": round(node_rate),
        "content_announces_per_second": round(node_rate * swarm.contents),
        "p50_ms": round(wrk.p50_ms, 2), "p99_ms": round(wrk.p99_ms, 2),
        "tracker_rss_mb": round(max(t.peak_rss_mb() for t in trackers), 1),
        "errors": wrk.errors, "requests": wrk.requests, "seconds": round(wrk.seconds, 2),
        "connections": args.connections, "want_share": args.want_share,
        "tracker_cpu": round(tracker_cpu, 2), "generator_cpu": round(generator_cpu, 2),
        "content_announces_per_cpu_second": round(node_rate * swarm.contents
                                                  / max(tracker_cpu, 1e-9)),
        "limited_by": limited_by, "swarm_peers": [peers_before, peers_after],
    }


async def _healthz_peers(url: str) -> int:
    timeout = aiohttp.ClientTimeout(total=10)
    async with aiohttp.ClientSession(timeout=timeout) as http, \
            http.get(f"{url}/healthz") as resp:
        return int((await resp.json())["peers"])


def main() -> int:
    """`python -m tracker.bench.announces ...`: the bench without the installed entry point."""
    parser = argparse.ArgumentParser(prog="bootseer bench")
    add_parser(parser.add_subparsers(dest="bench", required=True))
    args = parser.parse_args()
    try:
        return int(args.run(args))
    except UserError as exc:
        print(f"bootseer bench: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
