"""`bootseer bench launch --rounds R`: launches forked against launches through a mount server.

Each round runs two arms on the testbed's nodes, in ABBA order over the rounds
(forked then served, served then forked, ...), so both see the same machine load
and neither always goes first. An arm starts a fresh agent per node (an empty
store: its bytes come from the registry, HDFS, the snapshot origin and the other
nodes, as in the main Bootseer arm), and in the `served` arm a `bootseer fs
server` per node, in that node's network namespace, started before the clock and
named to the node's launch by BOOTSEER_MOUNT_SERVER; then every node launches the
job at once. What each arm reports is what the launches' own timelines say: the
nodes' seconds, the parts' ready times, `startup_s` (each launch process's
seconds before its own clock), `mounts_started_s` and the image mount's phases,
who served the mounts; and the arm's CPU seconds: the launches' own and their
children's, and the mount servers' hosts' during the arm (a forked mount's CPU is
its launch's child's; a served one's is its host's). The agents and servers are
stopped and their stores removed after each arm.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from fusefs.request import SERVER_ENV
from p2p.process import cpu_seconds_of

ARMS = ("forked", "served")
PHASES = ("mounts_started_s", "image_ready_s", "env_ready_s", "ckpt_ready_s",
          "command_started_s", "command_s", "startup_s", "seconds", "cpu_ready_s",
          "cpu_launch_s", "cpu_children_s")


# The job launched on an agent's node with an environment (None: the cluster's): (its
# output lines, its timeline). `fusefs.bench.launch.bootseer`, bound to the bench's run.
Launch = Callable[[Any, dict[str, str] | None],
                  Awaitable[tuple[list[str], dict[str, Any]]]]


async def server_rounds(args: argparse.Namespace, cluster: Any, launch: Launch, work: Path,
                        log: Any) -> dict[str, Any]:
    """The rounds (module docstring): one dict for the bench's JSON line."""
    rounds: list[dict[str, Any]] = []
    outputs: set[tuple[str, ...]] = set()
    for r in range(args.rounds):
        row: dict[str, Any] = {}
        for arm in ARMS if r % 2 == 0 else tuple(reversed(ARMS)):
            log(f"round {r + 1}: {arm}")
            launched, host_cpu = await _arm(args, cluster, launch, work, f"r{r}{arm}",
                                            served=arm == "served")
            outputs |= {tuple(lines) for lines, _ in launched}
            row[arm] = _figures([t for _, t in launched]) | {"cpu_seconds": _cpu(
                [t for _, t in launched], host_cpu)}
        row["served_over_forked_p50"] = round(row["served"]["p50_seconds"]
                                              / row["forked"]["p50_seconds"], 3)
        row["load_average"] = [round(x, 2) for x in os.getloadavg()]
        rounds.append(row)
    ratios = [row["served_over_forked_p50"] for row in rounds]
    return {"rounds": rounds, "served_over_forked_p50_median": round(statistics.median(ratios), 3),
            **{f"{arm}_p50_seconds_median": round(statistics.median(
                row[arm]["p50_seconds"] for row in rounds), 3) for arm in ARMS},
            "same_output": outputs}


async def _arm(args: argparse.Namespace, cluster: Any, launch: Launch, work: Path,
               tag: str, served: bool
               ) -> tuple[list[tuple[list[str], dict[str, Any]]], float]:
    """Every node's launch of the job on a fresh agent (and, `served`, its own mount
    server); (their outputs and timelines, the CPU seconds the servers' hosts spent)."""
    agents = [await cluster.start_agent(i, "", name=f"{tag}-agent{i}")
              for i in range(args.nodes)]
    servers = []
    try:
        envs: list[dict[str, str] | None] = [None] * args.nodes
        if served:
            for i, node in enumerate(cluster.testbed.nodes[:args.nodes]):
                sock = work / f"{tag}-mount{i}.sock"
                servers.append(await cluster.spawn(f"{tag}-mount{i}", [
                    "fs", "server", "--socket", str(sock), "--log-level", "WARNING"],
                    netns=node.netns))
                envs[i] = {**cluster.env, SERVER_ENV: str(sock)}
        hosts = [s.ready["host_pid"] for s in servers if s.ready.get("host_pid")]
        before = cpu_seconds_of(hosts)
        launched = await asyncio.gather(*(launch(a, envs[a.index]) for a in agents))
        return list(launched), round(cpu_seconds_of(hosts) - before, 2)
    finally:
        for child in (*servers, *(a.child for a in agents)):
            await child.stop()
        for agent in agents:
            shutil.rmtree(agent.store_dir, ignore_errors=True)


def _figures(timelines: list[dict[str, Any]]) -> dict[str, Any]:
    seconds = [t["seconds"] for t in timelines]
    served_by = sorted({f"{part}:{who}" for t in timelines for part in ("image", "env", "ckpt")
                        if part in t
                        for who in _as_list(t[part].get("served_by", "none"))})
    return {"p50_seconds": round(statistics.median(seconds), 3), "max_seconds": max(seconds),
            "phases": medians([flat(t) for t in timelines], PHASES),
            "image_mount_phases": _phase_medians([t["image"].get("mount_phases") or {}
                                                  for t in timelines]),
            "served_by": served_by}


def _cpu(timelines: list[dict[str, Any]], host_cpu: float) -> dict[str, float]:
    """The arm's CPU seconds: the launches' own and their children's (runc, the job, forked
    mounts), and the mount servers' hosts' (what serving the mounts cost there)."""
    launches = sum(t["cpu_s"]["launch"] + t["cpu_s"]["children"] for t in timelines)
    return {"launches": round(launches, 2), "mount_server_hosts": host_cpu,
            "total": round(launches + host_cpu, 2)}


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _phase_medians(rows: list[dict[str, Any]]) -> dict[str, float]:
    names = sorted({n for r in rows for n, v in r.items() if isinstance(v, int | float)})
    return {n: round(statistics.median(r[n] for r in rows if n in r), 3) for n in names}


def flat(timeline: dict[str, Any]) -> dict[str, Any]:
    return {**timeline, **{f"{part}_ready_s": timeline[part]["ready_s"]
                           for part in ("image", "env", "ckpt") if part in timeline},
            **{f"cpu_{name}_s": value for name, value in timeline.get("cpu_s", {}).items()}}


def medians(rows: list[dict[str, Any]], names: tuple[str, ...]) -> dict[str, float]:
    return {n: round(statistics.median(r[n] for r in rows), 3) for n in names
            if all(n in r for r in rows)}
