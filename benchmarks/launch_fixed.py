"""A launch with every byte local, forked against through the node's mount server: what its
fixed cost is, and where it goes.

    .venv/bin/python benchmarks/launch_fixed.py [--rounds 6] [--runtime runc]

One node on 127.0.0.1: a docker-registry holding the Debian python3 sample image
(`fusefs.testing.sample.python3_image`, built once and cached), a tracker, one
agent, and `bootseer fs server` beside it, started before any clock. The image is
indexed and launched twice untimed (the first records its hot blocks; both fetch
what they read). Then `bootseer launch --image REF -- python3 -c 'import json,
email.parser'` alternates, ABBA, forked (no BOOTSEER_MOUNT_SERVER: the launch forks
its image mount's serving child) and served (the server's host serves it). Every
byte is in the agent's store, so what a launch takes is its fixed cost.

One JSON line: per arm, the medians over rounds of the launch's wall seconds
(this script's clock, from exec to exit), the timeline's `startup_s` (before the
launch's clock: the interpreter, imports, arguments), `mounts_started_s`, the
image's `ready_s` and mount phases, `command_started_s`, `command_s` (the command
under the runtime) and `seconds`; CPU seconds of the launch and its children
(runc, the job, a forked mount) and of the server's host during the launch; the
served/forked ratio of the wall medians; the load average at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

COMMAND = ["python3", "-c", "import json, email.parser; print('ok')"]
FIGURES = ("wall_s", "startup_s", "mounts_started_s", "image_ready_s", "command_started_s",
           "command_s", "seconds", "cpu_launch_s", "cpu_children_s", "host_cpu_s")


async def main(args: argparse.Namespace) -> dict[str, Any]:
    from fusefs.bench.launch import call
    from fusefs.request import SERVER_ENV
    from fusefs.testing.registry import local_registry
    from fusefs.testing.sample import push_sample, python3_image
    from p2p.bench import workdir
    from p2p.origin.oci import RegistryClient
    from p2p.origin.oci_ref import ImageRef
    from p2p.process import cpu_seconds
    from p2p.testing.localcluster import LocalCluster, bootseer_command

    image = await python3_image()
    with workdir(None, "launch-fixed") as work, local_registry(work / "registry") as registry:
        async with RegistryClient() as client:
            await push_sample(client, ImageRef(registry.address, "bench/fixed", "1"), image)
        ref = f"{registry.address}/bench/fixed:1"
        cluster = LocalCluster(work / "cluster")
        try:
            await cluster.start_tracker()
            agent = await cluster.start_agent(0, "rack0")
            await call([*bootseer_command(), "image", "index", ref, "--tracker",
                        cluster.tracker_url], cluster.env)
            sock = work / "mount.sock"
            server = await cluster.spawn("mount-server", ["fs", "server", "--socket", str(sock)])
            host = int(server.ready["host_pid"])
            argv = [*bootseer_command(), "launch", "--json", "--image", ref, "--tracker",
                    cluster.tracker_url, "--api-socket", agent.api_socket, "--store-dir",
                    str(agent.store_dir), "--runtime", args.runtime, "--log-level", "WARNING",
                    "--", *COMMAND]
            envs = {"forked": cluster.env, "served": {**cluster.env, SERVER_ENV: str(sock)}}
            for arm in ("forked", "served"):  # untimed: the record, then every byte local
                await _launch(argv, envs[arm], host, cpu_seconds)
            arms: dict[str, list[dict[str, Any]]] = {"forked": [], "served": []}
            for r in range(args.rounds):
                for arm in ("forked", "served") if r % 2 == 0 else ("served", "forked"):
                    arms[arm].append(await _launch(argv, envs[arm], host, cpu_seconds))
        finally:
            await cluster.stop()
    out: dict[str, Any] = {"bench": "launch_fixed", "rounds": args.rounds,
                           "runtime": args.runtime, "command": COMMAND}
    for arm, rows in arms.items():
        out[arm] = {name: round(statistics.median(r[name] for r in rows), 3)
                    for name in FIGURES if all(name in r for r in rows)}
        out[arm]["image_mount_phases"] = {
            name: round(statistics.median(r["mount_phases"][name] for r in rows), 3)
            for name in rows[0]["mount_phases"]}
        out[arm]["served_by"] = sorted({r["served_by"] for r in rows})
        out[arm]["wall_s_runs"] = [r["wall_s"] for r in rows]
    out["served_over_forked_wall"] = round(out["served"]["wall_s"] / out["forked"]["wall_s"], 3)
    out["load_average"] = [round(x, 2) for x in os.getloadavg()]
    return out


async def _launch(argv: list[str], env: dict[str, str], host: int,
                  cpu_seconds: Any) -> dict[str, Any]:
    from fusefs.bench.launch import call

    before, started = cpu_seconds(host), time.monotonic()
    out = await call(argv, env)
    wall = round(time.monotonic() - started, 3)
    timeline = json.loads(out.splitlines()[-1])
    if timeline["exit_status"] != 0:
        raise SystemExit(f"the launch exited {timeline['exit_status']}: {timeline}")
    return {**timeline, "wall_s": wall, "host_cpu_s": round(cpu_seconds(host) - before, 3),
            "image_ready_s": timeline["image"]["ready_s"],
            "served_by": timeline["image"]["served_by"],
            "mount_phases": timeline["image"]["mount_phases"],
            "cpu_launch_s": timeline["cpu_s"]["launch"],
            "cpu_children_s": timeline["cpu_s"]["children"]}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--runtime", choices=("runc", "bwrap"), default="runc")
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from p2p.errors import UserError

    try:
        print(json.dumps(asyncio.run(main(parser.parse_args()))), flush=True)
    except UserError as exc:
        raise SystemExit(str(exc)) from None
