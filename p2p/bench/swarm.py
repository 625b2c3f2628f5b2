"""`bootseer bench swarm`: the swarm against the origin-only baseline, in one run.

Both rounds use the same processes' code, caps and content: first every node
fetches the content through the swarm, then a fresh set of agents with
`use_peers = false` fetches it straight from the origin. One JSON line gives
the swarm's time, the baseline's, the lower bound

    T* = max(S / origin_cap, S / node_cap, N * S / (origin_cap + N * node_cap))

(every byte must leave the origin once, every node must download S, and the
whole swarm's upload capacity must carry N * S), the origin egress ratio and
the agents' peak RSS. Caps are in MB/s (10^6 bytes); `node_cap` applies to
each node's upload and download alike.

What a byte costs: `agent_cpu_s_per_gib` is the agents' CPU (user + system, all
threads) over the GiB delivered into their stores. With `--nodes 1` the round is
one pair: a seed that fetched the content from the origin beforehand, and one
receiver that fetches it from the seed; the seed's CPU counts too, so the figure
is what one stream costs at both ends (compare it with a bare sendfile ->
recv_into + hash + pwrite transfer over loopback, about 0.85 CPU-s per GiB here).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import sys
import tomllib
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Any

import uvloop

from p2p.bench import workdir
from p2p.content import CHUNK_SIZE, DEFAULT_DIGEST, DIGESTS, ContentId
from p2p.errors import UserError
from p2p.store import write_all
from p2p.testing.demo import ROUND_TIMEOUT_S, distribute
from p2p.testing.localcluster import AgentHandle, LocalCluster, wait_all_complete, write_random_file
from p2p.units import GiB, MiB, positive_int, size_arg

if TYPE_CHECKING:  # a testbed is optional: load its shell only when one is used
    from p2p.testing.testbed.netns import Testbed


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("bench", help="benchmarks that print one JSON line")
    kinds = p.add_subparsers(dest="bench", required=True, metavar="BENCH")
    s = kinds.add_parser("swarm", help="N agents fetch one content: swarm vs origin-only")
    s.add_argument("--nodes", type=positive_int, default=8,
                   help="agents that fetch the content; 1: one receiver from one seed")
    s.add_argument("--size", type=size_arg, default=256 * MiB,
                   help="content size, e.g. 256MiB, 1GiB (default: 256MiB)")
    s.add_argument("--racks", type=positive_int, default=2, help="racks the agents are spread over")
    s.add_argument("--node-cap", type=float, default=None,
                   help="MB/s (10^6 bytes a second) per node, each way; default: no cap")
    s.add_argument("--origin-cap", type=float, default=None, help="MB/s out of the origin")
    s.add_argument("--chunk-size-mb", type=positive_int, default=CHUNK_SIZE // MiB,
                   help="chunk size in MiB")
    s.add_argument("--digest", choices=sorted(DIGESTS), default=DEFAULT_DIGEST,
                   help="chunk digest algorithm of the generated content")
    s.add_argument("--no-baseline", action="store_true", help="skip the origin-only round")
    s.add_argument("--origin-fetchers", type=positive_int, default=None,
                   help="members per content the tracker appoints to fetch from the origin "
                        "(default: the tracker's)")
    s.add_argument("--agent-option", action="append", default=[], metavar="KEY=VALUE",
                   help="override an agent setting, e.g. upload_slots=2 or swarm.max_inflight=8")
    s.add_argument("--testbed", metavar="NAME",
                   help="run on `bootseer testbed` NAME: the tracker and origin in its origin "
                        "namespace, agent i in node i; the caps are the testbed's, so "
                        "--node-cap/--origin-cap and --racks are taken from it")
    s.add_argument("--json", action="store_true", help="print only the JSON line")
    s.add_argument("--workdir", type=Path, help="keep logs and stores here")
    s.set_defaults(run=_run)
    for ep in sorted(entry_points(group="bootseer.benches"), key=lambda e: e.name):
        ep.load()(kinds)  # other packages' benchmarks (p2p imports none of them)


def bound_seconds(nodes: int, size: int, node_cap: float | None,
                  origin_cap: float | None) -> float | None:
    if node_cap is None or origin_cap is None:
        return None
    node_bps, origin_bps = node_cap * 1e6, origin_cap * 1e6
    return max(size / origin_bps, size / node_bps, nodes * size / (origin_bps + nodes * node_bps))


def _run(args: argparse.Namespace) -> int:
    result = uvloop.run(_bench(args))
    print(json.dumps(result))
    return 0 if result["verified"] else 1


async def _bench(args: argparse.Namespace) -> dict[str, Any]:
    bed = _testbed(args) if args.testbed else None
    with workdir(args.workdir, "swarm") as work:
        cluster = LocalCluster(work, testbed=bed)
        try:
            return await _rounds(cluster, args)
        finally:
            await cluster.stop()


async def _rounds(cluster: LocalCluster, args: argparse.Namespace) -> dict[str, Any]:
    source = cluster.workdir / "origin" / "content.bin"
    await asyncio.to_thread(write_random_file, source, args.size)
    fetchers = [] if args.origin_fetchers is None else ["--origin-fetchers",
                                                         str(args.origin_fetchers)]
    await cluster.start_tracker(*fetchers)
    on_testbed = cluster.testbed is not None
    await cluster.start_origin(source.parent, None if on_testbed else args.origin_cap)
    manifest = await cluster.publish(source, args.chunk_size_mb * MiB, digest=args.digest)
    caps = {} if on_testbed else {"upload_mbps": args.node_cap, "download_mbps": args.node_cap}

    write_floor = await asyncio.to_thread(write_cost, cluster.workdir / "write-floor",
                                          min(max(args.size, 64 * MiB), GiB))
    options = _agent_options(args.agent_option, caps)
    seeds = await _seed(cluster, args, options, manifest.content_id) if args.nodes == 1 else []
    swarm_agents = await _agents(cluster, args, "swarm", options)
    seed_cpu = [a.child.cpu_split() for a in seeds]
    swarm = await distribute(cluster, swarm_agents, source, manifest.content_id, args.size,
                             progress=not args.json and sys.stderr.isatty())
    # The seed's CPU until now: the receiver's read-back checks that follow the round
    # ask nothing of it.
    for seed, (user, system) in zip(seeds, seed_cpu, strict=True):
        now_user, now_system = seed.child.cpu_split()
        swarm.agent_user_cpu_seconds += now_user - user
        swarm.agent_cpu_seconds += now_user - user + now_system - system
    rss = max(a.child.peak_rss_mb() for a in [*seeds, *swarm_agents])
    wasted, cancelled, relays, timeouts = await _counters(
        swarm_agents, "bootseer_wasted_bytes_total", "bootseer_requests_cancelled_total",
        "bootseer_relays_total", "bootseer_request_timeouts_total")
    await asyncio.gather(*(a.child.stop() for a in [*seeds, *swarm_agents]))

    baseline_seconds = None
    if not args.no_baseline:
        solo = {**caps, "swarm": {"use_peers": False, "chunk_picker": "in_order"}}
        base_agents = await _agents(cluster, args, "base", solo)
        baseline = await distribute(cluster, base_agents, source, manifest.content_id,
                                    args.size, progress=False, verify=False)
        baseline_seconds = round(baseline.seconds, 3)
        await asyncio.gather(*(a.child.stop() for a in base_agents))

    bound = bound_seconds(args.nodes, args.size, args.node_cap, args.origin_cap)
    delivered_gib = args.nodes * args.size / GiB
    return {
        "bench": "swarm", "nodes": args.nodes, "bytes": args.size, "testbed": args.testbed,
        "chunk_bytes": args.chunk_size_mb * MiB, "digest": args.digest,
        "node_cap_mbps": args.node_cap, "origin_cap_mbps": args.origin_cap,
        "seconds": round(swarm.seconds, 3),
        "baseline_seconds": baseline_seconds,
        "speedup": round(baseline_seconds / swarm.seconds, 2) if baseline_seconds else None,
        "bound_seconds": round(bound, 3) if bound else None,
        "seconds_over_bound": round(swarm.seconds / bound, 3) if bound else None,
        "origin_egress_ratio": round(swarm.origin_bytes / args.size, 4),
        "max_agent_rss_mb": round(rss, 1),
        # The agents' CPU over the round, and how many cores it kept busy: near the
        # host's count, the round measured the host's CPU rather than the swarm.
        "agent_cpu_seconds": round(swarm.agent_cpu_seconds, 2),
        "agent_cores": round(swarm.agent_cpu_seconds / swarm.seconds, 2),
        "agent_cpu_s_per_gib": round(swarm.agent_cpu_seconds / delivered_gib, 3),
        # ... of which user CPU: the interpreter and hashing (the rest is the kernel's:
        # socket copies, the page cache that chunk files are written into)
        "agent_user_cpu_s_per_gib": round(swarm.agent_user_cpu_seconds / delivered_gib, 3),
        "host_cpus": os.cpu_count(),
        # What writing one node's share as new chunk files costs this host, measured
        # just before the round: every delivered byte is written into the page cache
        # once. A low figure may still rise during the round (see `write_cost`).
        "write_floor_cpu_s_per_gib": round(write_floor, 3),
        # When each agent first asked for a chunk, from the round's start: hearing the
        # tracker, joining peers and settling take that long (the simulator's nodes start
        # at once; benchmarks/calibrate.py gives it this spread as start jitter).
        "start_offsets_s": sorted(round(x, 3) for x in swarm.start_offsets),
        "started_at": round(swarm.started_wall, 3),  # the round's start (Unix time)
        "wasted_bytes": int(wasted), "requests_cancelled": int(cancelled),
        "relays": int(relays), "request_timeouts": int(timeouts),
        "aggregate_mbps": round(args.nodes * args.size / swarm.seconds / 1e6, 1),
        "node_seconds": sorted(round(float(r.get("seconds", -1)), 2)
                               for r in swarm.per_node.values()),
        "verified": swarm.verified,
        "failures": swarm.failures,
    }


def write_cost(directory: Path, nbytes: int) -> float:
    """CPU seconds per GiB that writing `nbytes` of new chunk files costs this thread.

    On a VM whose free memory the host takes back (free page reporting), the first
    touch of a page is a fault on the host, charged to the guest: writing into fresh
    page cache measured 3.3-3.9 CPU-s per GiB here, and 0.16-0.19 once the pages
    were backed again (pages freed a moment ago, e.g. by the last round's stores,
    are handed out first, so the probe may see backed pages where the agents,
    writing more, do not). Every delivered byte is written once, so this is part of
    the agents' CPU that no change to them can remove.
    """
    directory.mkdir(parents=True, exist_ok=True)
    block = memoryview(os.urandom(CHUNK_SIZE))
    before = resource.getrusage(resource.RUSAGE_THREAD)
    for i in range(nbytes // CHUNK_SIZE):
        fd = os.open(directory / f"{i}.chunk", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            write_all(fd, block)
        finally:
            os.close(fd)
    after = resource.getrusage(resource.RUSAGE_THREAD)
    shutil.rmtree(directory)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return cpu / (nbytes // CHUNK_SIZE * CHUNK_SIZE / GiB)


async def _seed(cluster: LocalCluster, args: argparse.Namespace, options: dict[str, Any],
                content: ContentId) -> list[AgentHandle]:
    """The one-pair case's seed: an agent that holds the whole content, fetched from the
    origin before the round (`--nodes 1`)."""
    seed = await cluster.start_agent(1, "rack1", options, name="seed")
    result = (await wait_all_complete([seed], content, ROUND_TIMEOUT_S))[seed.index]
    if "error" in result:
        raise UserError(f"the seed could not fetch the content: {result['error']}")
    return [seed]


def _testbed(args: argparse.Namespace) -> Testbed:
    """The testbed named by --testbed, with the caps and racks in `args` set from it."""
    from p2p.testing.testbed.netns import TestbedError, find

    try:
        bed = find(args.testbed)
    except TestbedError as exc:
        raise UserError(str(exc)) from None
    if args.nodes > len(bed.nodes):
        raise UserError(f"--nodes {args.nodes}: testbed {args.testbed} has {len(bed.nodes)}")
    spec = bed.plan.spec
    args.node_cap, args.origin_cap, args.racks = spec.node_mbps, spec.origin_mbps, spec.racks
    return bed


async def _counters(agents: list[AgentHandle], *names: str) -> list[float]:
    """Each named counter, summed over `agents` and over its labels (from their /metrics
    text)."""
    from prometheus_client.parser import text_string_to_metric_families

    totals = dict.fromkeys(names, 0.0)
    for agent in agents:
        async with agent.client(10.0) as client:
            text = await client.metrics()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name in totals:
                    totals[sample.name] += sample.value
    return [totals[name] for name in names]


def _agent_options(pairs: list[str], base: dict[str, Any]) -> dict[str, Any]:
    """KEY=VALUE pairs as an agent config dict; `swarm.KEY` goes to the [swarm] table."""
    options: dict[str, Any] = {**base, "swarm": {}}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise UserError(f"--agent-option wants KEY=VALUE, got {pair!r}")
        table, dot, name = key.strip().rpartition(".")
        if dot and table != "swarm":
            raise UserError(f"--agent-option: only the [swarm] table nests, not {table!r}")
        (options["swarm"] if dot else options)[name] = _toml_value(value.strip())
    return options


def _toml_value(text: str) -> Any:
    """`text` as a TOML value (2, 1.5, true, "x"); a bare word stays a string, so
    `chunk_picker=rarest` needs no quotes."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


async def _agents(cluster: LocalCluster, args: argparse.Namespace, prefix: str,
                  config: dict[str, Any]) -> list[AgentHandle]:
    return list(await asyncio.gather(*(
        cluster.start_agent(i, f"rack{i % args.racks}", config, name=f"{prefix}{i}")
        for i in range(args.nodes))))
