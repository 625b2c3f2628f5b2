"""One real swarm round, traced: when each chunk was asked for and stored, on every agent.

    python benchmarks/trace_round.py [--nodes 16] [--size 64MiB] [--node-cap 8]
        [--origin-cap 16] [--chunk-mb 4] [--racks 2] [--keep DIR]

Runs `bootseer bench swarm --no-baseline` as benchmarks/calibrate.py does (a
tracker, a capped origin and N agents on loopback), with the agents logging at
debug level into a work directory it keeps until it has read their logs back.
It prints one JSON line: the bench's round time, every node's completion time
and each agent's first request (`start_offsets_s`), and, for each chunk read
from the origin, when its fetcher decided to read it, when the read began
(after the fetcher's download budget allowed it) and when it was stored; all in
seconds from the start of the round. With --keep, the logs stay in DIR, for a closer look
(`request`, `stored`, `origin fetch`, `origin read` and `tracker:` lines).

This is the tool that compares a real round with the simulator's (the
simulator's runs are deterministic and can be traced by hand): stop 31 found
with it that on 16 agents at 8 MB/s the fetchers' origin reads wait 0.4-2 s on
their download budget behind relay requests, so the origin delivers its chunks
staggered.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
from datetime import datetime
from pathlib import Path
from typing import Any

import calibrate  # benchmarks/calibrate.py: this script's directory is on the path

Event = tuple[float, str, int, str | None]  # seconds since the start, what, chunk, peer
EVENT = re.compile(r"^(\S+ \S+) DEBUG p2p\.(?:agent|intake): "
                   r"(origin fetch|origin read|request|stored) \S+/(\d+)(?: from (.+))?$")


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
    setup = argparse.Namespace(**vars(args), no_baseline=True, swarm=[], upload_slots=None,
                               timeout=1800.0)
    with tempfile.TemporaryDirectory(prefix="bootseer-trace-") as tmp:
        workdir = Path(tmp)
        _, bench = calibrate.bench(args.nodes, setup, ["--workdir", tmp],
                                   env={**os.environ, "BOOTSEER_LOG_LEVEL": "DEBUG"})
        agents = sorted(workdir.glob("swarm*.log"))  # the bench's agents are swarm0, swarm1...
        logs = {log.stem: parse_log(log, bench["started_at"]) for log in agents}
        if args.keep:
            args.keep.mkdir(parents=True, exist_ok=True)
            for log in workdir.glob("*.log"):
                shutil.copy(log, args.keep)
    keys = ("nodes", "bytes", "node_cap_mbps", "origin_cap_mbps", "chunk_bytes", "seconds",
            "node_seconds", "start_offsets_s", "failures")
    print(json.dumps({"bench": "trace_round", **{k: bench[k] for k in keys},
                      "origin_chunks": origin_chunks(logs)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
