"""One real swarm round, traced: when each chunk was asked for and stored, on every agent.

    python benchmarks/trace_round.py [--nodes 16] [--size 64MiB] [--node-cap 8]
        [--origin-cap 16] [--chunk-mb 4] [--racks 2] [--keep DIR]

Starts a tracker, a capped origin and N agents on loopback (as `bootseer bench
swarm` does), with the agents logging at debug level, has every agent fetch
the content, and reads the agents' logs back. It prints one JSON line: the
round's time, every node's completion time, when each agent first asked for a
chunk (of a peer or the origin: the simulator's nodes do at once), and, for
each chunk read from the origin, when its fetcher decided to read it, when the read began (after the
fetcher's download budget allowed it) and when it was stored; all in seconds
from the start of the round. With --keep, the logs stay in DIR, for a closer
look (`request`, `stored`, `origin fetch`, `origin read` and `tracker:` lines).

This is the tool that compares a real round with the simulator's (the
simulator's runs are deterministic and can be traced by hand): stop 31 found
with it that on 16 agents at 8 MB/s the fetchers' origin reads wait 0.4-2 s on
their download budget behind relay requests, so the origin delivers its chunks
staggered.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from p2p.content import MiB
from p2p.localcluster import LocalCluster, wait_all_complete, write_random_file
from simulations.scenario import parse_size

Event = tuple[float, str, int, str | None]  # seconds since the start, what, chunk, peer
EVENT = re.compile(r"^(\S+ \S+) DEBUG p2p\.agent: (origin fetch|origin read|request|stored) "
                   r"\S+/(\d+)(?: from (.+))?$")


def parse_log(path: Path, started: float) -> list[Event]:
    """The events of one agent's debug log, timed from `started`."""
    events: list[Event] = []
    for line in path.read_text(errors="replace").splitlines():
        if (m := EVENT.match(line)) is None:
            continue
        stamp = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
        events.append((round(stamp - started, 3), m.group(2), int(m.group(3)), m.group(4)))
    return events


def origin_chunks(logs: dict[str, list[Event]]) -> list[dict[str, Any]]:
    """Every chunk read from the origin: who, and when it was decided, begun and stored."""
    rows = []
    for agent, events in logs.items():
        marks: dict[tuple[str, int], float] = {}
        for t, what, chunk, peer in events:
            if what in ("origin fetch", "origin read"):
                marks.setdefault((what, chunk), t)
            elif what == "stored" and peer == "the origin":
                rows.append({"agent": agent, "chunk": chunk,
                             "fetch_s": marks.get(("origin fetch", chunk)),
                             "read_s": marks.get(("origin read", chunk)), "stored_s": t})
    return sorted(rows, key=lambda r: r["stored_s"])


async def round_(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    size = int(parse_size(args.size))
    cluster = LocalCluster(workdir)
    try:
        source = workdir / "origin" / "content.bin"
        source.parent.mkdir(parents=True)
        await asyncio.to_thread(write_random_file, source, size)
        await cluster.start_tracker()
        await cluster.start_origin(source.parent, args.origin_cap)
        manifest = await cluster.publish(source, args.chunk_mb * MiB)
        caps = {"upload_mbps": args.node_cap, "download_mbps": args.node_cap}
        agents = await asyncio.gather(*(
            cluster.start_agent(i, f"rack{i % args.racks}", caps) for i in range(args.nodes)))
        started = time.time()
        results = await wait_all_complete(agents, manifest.content_id, 600.0)
        seconds = time.time() - started
    finally:
        await cluster.stop()
    failures = [f"agent{i}: {r['error']}" for i, r in results.items() if "error" in r]
    logs = {p.stem: parse_log(p, started) for p in sorted(workdir.glob("agent*.log"))}
    return {"bench": "trace_round", "nodes": args.nodes, "bytes": size,
            "node_cap_mbps": args.node_cap, "origin_cap_mbps": args.origin_cap,
            "chunk_bytes": args.chunk_mb * MiB, "seconds": round(seconds, 3),
            "node_seconds": sorted(round(float(r.get("seconds", -1)), 2)
                                   for r in results.values()),
            "first_action_s": sorted(events[0][0] for events in logs.values() if events),
            "origin_chunks": origin_chunks(logs), "failures": failures}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=16)
    p.add_argument("--size", default="64MiB")
    p.add_argument("--node-cap", type=float, default=8.0, help="MB/s per agent, each way")
    p.add_argument("--origin-cap", type=float, default=16.0, help="MB/s out of the origin")
    p.add_argument("--chunk-mb", type=int, default=4)
    p.add_argument("--racks", type=int, default=2)
    p.add_argument("--keep", type=Path, help="copy the agents' logs into this directory")
    args = p.parse_args()
    os.environ["BOOTSEER_LOG_LEVEL"] = "DEBUG"  # the agents' children inherit it
    with tempfile.TemporaryDirectory(prefix="bootseer-trace-") as tmp:
        result = asyncio.run(round_(args, Path(tmp)))
        if args.keep:
            args.keep.mkdir(parents=True, exist_ok=True)
            for log in Path(tmp).glob("*.log"):
                shutil.copy(log, args.keep)
    print(json.dumps(result))
    return 1 if result["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
