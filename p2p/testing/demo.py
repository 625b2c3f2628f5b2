"""`bootseer demo`: one content to N agents on this machine, verified byte for byte.

With no configuration it starts a tracker, an HTTP origin and 8 agents as
separate processes on loopback, distributes a generated 256 MiB content,
checks every node's copy against the original through the agent's read API,
and prints a summary (or one JSON line with `--json`). `verified` is true only
if every node completed and every byte of every copy matched.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvloop

from p2p.content import CHUNK_SIZE, ContentId
from p2p.errors import UserError
from p2p.testing.localcluster import AgentHandle, LocalCluster, write_random_file
from p2p.units import MiB, positive_int, size_arg

VERIFY_BLOCK = 16 * MiB
ROUND_TIMEOUT_S = 900.0




def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("demo", help="distribute a generated content to N local agents")
    p.add_argument("--nodes", type=positive_int, default=8, help="agents in the swarm")
    p.add_argument("--size", type=size_arg, default=256 * MiB,
                   help="content size, e.g. 256MiB, 1GiB (default: 256MiB)")
    p.add_argument("--racks", type=positive_int, default=2, help="racks the agents are spread over")
    p.add_argument("--json", action="store_true", help="print one JSON line")
    p.add_argument("--workdir", type=Path, help="keep logs and stores here")
    p.set_defaults(run=_run)


@dataclass
class Round:
    """What one distribution round measured."""

    nodes: int
    bytes: int
    seconds: float
    origin_bytes: int
    peer_bytes: int
    per_node: dict[int, dict[str, Any]]
    verified: bool
    failures: list[str]
    agent_cpu_seconds: float  # the agents' user + system CPU until the last completed
    agent_user_cpu_seconds: float  # ... of which user CPU (the interpreter, hashing)
    started_wall: float  # when the round began (Unix time)
    # When each agent first asked for a chunk, from the round's start (agents that say)
    start_offsets: list[float]


async def distribute(cluster: LocalCluster, agents: list[AgentHandle], source: Path,
                     content: ContentId, size: int, progress: bool,
                     verify: bool = True) -> Round:
    """Have every agent fetch `content`; measure, then check every copy."""
    origin_before = await cluster.origin_bytes()
    cpu_before = [a.child.cpu_split() for a in agents]
    started, started_wall = time.monotonic(), time.time()
    watcher = asyncio.ensure_future(_watch(agents, content, size, started)) if progress else None
    from p2p.testing.localcluster import wait_all_complete

    results = await wait_all_complete(agents, content, ROUND_TIMEOUT_S)
    seconds = time.monotonic() - started
    cpu_after = [a.child.cpu_split() for a in agents]  # before the checks
    agent_user_cpu = sum(a[0] - b[0] for a, b in zip(cpu_after, cpu_before, strict=True))
    agent_cpu = agent_user_cpu + sum(a[1] - b[1] for a, b in zip(cpu_after, cpu_before,
                                                                 strict=True))
    if watcher:
        watcher.cancel()
        print(file=sys.stderr)
    origin_bytes = await cluster.origin_bytes() - origin_before
    failures = [f"node {i}: {r['error']}" for i, r in results.items() if "error" in r]
    if verify and not failures:
        failures += await _verify(agents, source, content, size)
    return Round(len(agents), size, seconds, origin_bytes,
                 sum(int(r.get("peer_bytes", 0)) for r in results.values()), results,
                 verified=verify and not failures, failures=failures,
                 agent_cpu_seconds=agent_cpu, agent_user_cpu_seconds=agent_user_cpu,
                 started_wall=started_wall,
                 start_offsets=[r["started_at"] + r["first_fetch_s"] - started_wall
                                for r in results.values()
                                if r.get("started_at") is not None
                                and r.get("first_fetch_s") is not None])


async def _watch(agents: list[AgentHandle], content: ContentId, size: int,
                 started: float) -> None:
    clients = [a.client(5.0) for a in agents]
    try:
        while True:
            await asyncio.sleep(0.5)
            have = 0
            for client in clients:
                try:
                    status = await client.status()
                except Exception:
                    continue
                info = status["contents"].get(content)
                have += info["have"] / max(1, info["chunks"]) if info else 0
            pct = 100 * have / len(agents)
            print(f"\r  {time.monotonic() - started:6.1f}s  {pct:5.1f}% of "
                  f"{len(agents)} x {size / MiB:.0f} MiB", end="", file=sys.stderr, flush=True)
    finally:
        for client in clients:
            await client.close()


async def _verify(agents: list[AgentHandle], source: Path, content: ContentId,
                  size: int) -> list[str]:
    """Compare every node's copy with the original, through each agent's read API."""
    failures = []
    with open(source, "rb") as original:
        for offset in range(0, size, VERIFY_BLOCK):
            expected = original.read(VERIFY_BLOCK)
            for agent in agents:
                async with agent.client(60.0) as client:
                    got = await client.read(content, offset, len(expected))
                if got != expected:
                    failures.append(f"node {agent.index}: bytes at {offset} differ")
    return failures


def _run(args: argparse.Namespace) -> int:
    return uvloop.run(_demo(args))


async def _demo(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="bootseer-demo-") as tmp:
        workdir = args.workdir or Path(tmp)
        cluster = LocalCluster(workdir)
        try:
            result = await _demo_round(cluster, args)
        finally:
            await cluster.stop()
    if args.json:
        print(json.dumps({"nodes": result.nodes, "bytes": result.bytes,
                          "seconds": round(result.seconds, 3),
                          "origin_bytes": result.origin_bytes, "peer_bytes": result.peer_bytes,
                          "verified": result.verified, "failures": result.failures}))
    else:
        _print_summary(result)
    return 0 if result.verified else 1


async def _demo_round(cluster: LocalCluster, args: argparse.Namespace) -> Round:
    source = cluster.workdir / "origin" / "content.bin"
    def say(text: str) -> None:
        if not args.json:
            print(text, file=sys.stderr)

    say(f"generating {args.size / MiB:.0f} MiB of content ...")
    await asyncio.to_thread(write_random_file, source, args.size)
    await cluster.start_tracker()
    await cluster.start_origin(source.parent)
    say(f"tracker {cluster.tracker_url}, origin {cluster.origin_url}; starting "
        f"{args.nodes} agents in {args.racks} racks ...")
    agents = await asyncio.gather(*(cluster.start_agent(i, f"rack{i % args.racks}")
                                    for i in range(args.nodes)))
    manifest = await cluster.publish(source, CHUNK_SIZE)
    say(f"content {manifest.content_id}: {manifest.chunks} chunks; distributing ...")
    if not agents:
        raise UserError("no agents")
    return await distribute(cluster, list(agents), source, manifest.content_id, args.size,
                            progress=not args.json and sys.stderr.isatty())


def _print_summary(r: Round) -> None:
    mib = r.bytes / MiB
    print(f"\n{r.nodes} nodes x {mib:.0f} MiB in {r.seconds:.2f} s "
          f"({r.nodes * r.bytes / r.seconds / 1e6:.0f} MB/s aggregate)")
    print(f"  from the origin: {r.origin_bytes / MiB:8.1f} MiB "
          f"({r.origin_bytes / r.bytes:.2f} x the content)")
    print(f"  from peers:      {r.peer_bytes / MiB:8.1f} MiB")
    for index, info in sorted(r.per_node.items()):
        if "error" in info:
            print(f"  node {index}: FAILED: {info['error']}")
        else:
            print(f"  node {index}: done in {info['seconds']:6.2f} s, "
                  f"{info['origin_bytes'] / MiB:6.1f} MiB origin, "
                  f"{info['peer_bytes'] / MiB:6.1f} MiB peers")
    verdict = "every copy matches the original" if r.verified else "NOT VERIFIED"
    print(f"  verified: {verdict}")
    for failure in r.failures:
        print(f"    {failure}")
