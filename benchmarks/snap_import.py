"""A snapshot's first import through a fresh mount, two revisions in turn, one run.

The one figure `bootseer bench depsnap` reports for issue 32's snapshot
target, `mount_first_import_seconds` (a fresh agent, `depsnap mount` through
the node's mount server, until `import pandas, numpy` works from the mount),
without the pip, uv and restore cases around it, so two revisions can be
measured side by side on a shared machine in a few minutes:

- once: a tracker, an origin and a seed agent; the ML environment installed
  and published (`depsnap run`); a first mount on an agent of its own records
  the key's hot frames (`depsnap.hot`), as the bench's agent C does; a fresh
  agent fetching every pack gives the swarm's rate here (`transfer_seconds`)
  and so the target, 1 s + the bytes a mount fetched at that rate;
- one mount server per revision (`bootseer fs server`, PYTHONPATH pointing
  at that revision's exported tree, as `benchmarks/ab.py` does): its host
  serves the revision's mounts;
- rounds in ABBA order (before, after, after, before, ...), each mount by a
  fresh agent (empty store, the seed its only peer): wall seconds, the
  importer's CPU seconds, the host's CPU seconds from the mount's start to the
  import's end, the FUSE requests by opcode from the mount's log, the load.

    python benchmarks/snap_import.py --before REV [--after REV] [--rounds 2]
        [--profile DIR] [--logs DIR]

`--profile DIR` also runs `py-spy record --native` on the after side's host
through each of its imports (flame graphs in DIR, in py-spy's raw format:
`collapsed` stacks), which costs the host CPU: profile in a run of its own.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ab import REPO, commit_of, export

from depsnap.bench.snapshots import (
    IMPORT,
    _children_cpu,
    _depsnap,
    _ensure_all,
    _mount_import,
    _node_env,
    _Runner,
    _unmounted,
)
from depsnap.testing.wheelhouse import ML_LOCK, ML_WHEELS, PYTHON, wheelhouse
from fusefs.request import SERVER_ENV
from p2p.process import cpu_seconds
from p2p.testing.localcluster import AgentHandle, LocalCluster

REQUESTS = re.compile(r"unmounted .*requests (\{.*\})")
DECODED = re.compile(r"'decoded_frames': (\d+), 'distinct_frames': (\d+)")
WORKTREE = "WORKTREE"  # a revision name: this checkout as it is, uncommitted changes too


async def main(args: argparse.Namespace) -> dict[str, Any]:
    sides = {"before": args.before, "after": args.after}
    out: dict[str, Any] = {"bench": "snap_import", "commits": {
        s: r if r == WORKTREE else commit_of(r) for s, r in sides.items()}}
    wheels = await asyncio.to_thread(wheelhouse, ML_LOCK, ())
    with tempfile.TemporaryDirectory(prefix="snapimport-") as tmp:
        work = Path(tmp)
        trees = {s: REPO if r == WORKTREE else await asyncio.to_thread(
            export, r, work / f"tree-{s}") for s, r in sides.items()}
        cluster = LocalCluster(work / "cluster")
        try:
            out.update(await _run(cluster, work, wheels, trees, args))
        finally:
            await cluster.stop()
    return out


async def _run(cluster: LocalCluster, work: Path, wheels: Path, trees: dict[str, Path],
               args: argparse.Namespace) -> dict[str, Any]:
    run = _Runner(work, wheels, PYTHON, dict(os.environ))
    origin = work / "snapshots"
    origin.mkdir()
    await cluster.start_tracker()
    await cluster.start_origin(origin)
    seed = await cluster.start_agent(0, "r1", name="seed")
    env = _node_env(cluster, work, origin)
    created = await _depsnap(env, seed, "run", "--json", "--prefix", str(work / "venv"),
                             "--python", PYTHON, "--", "pip", *run.pip_args(list(ML_WHEELS)))
    tree = json.loads((origin / "trees" / created["tree"]).read_text())
    await _ensure_all(seed, tree)
    key = created["key"]
    agents = iter(range(1, 1000))

    async def fresh(name: str) -> AgentHandle:
        return await cluster.start_agent(next(agents), "r1", name=name)

    t = await fresh("transfer")
    transfer = await _ensure_all(t, tree)
    await t.child.stop()
    rate = created["pack_bytes"] / transfer
    servers, hosts = {}, {}
    for side, src in trees.items():
        servers[side] = work / f"{side}.sock"
        child = await cluster.spawn(f"server-{side}", ["fs", "server", "--socket",
                                                       str(servers[side])],
                                    env={**env, "PYTHONPATH": str(src)})
        hosts[side] = child.proc.pid
    recorder = await fresh("recorder")  # the key's first mount records its hot frames
    recorded = await _mount_import({**env, "PYTHONPATH": str(trees["after"])}, recorder, key,
                                   work / "mnt-record", servers["after"])
    await recorder.child.stop()
    results: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
    order = ["before", "after", "after", "before"] * args.rounds
    for i, side in enumerate(order[:2 * args.rounds]):
        agent = await fresh(f"{side}-{i}")
        profile = args.profile / f"{side}-{i}.txt" if args.profile and side == "after" else None
        case = await _measured({**env, "PYTHONPATH": str(trees[side])}, agent, key,
                               work / f"mnt-{i}", servers[side], hosts[side], profile, args.logs)
        await agent.child.stop()
        case["target_seconds"] = round(1 + case["fetched_bytes"] / rate, 3)
        results[side].append(case)
        print(json.dumps({"side": side, **case}), file=sys.stderr)
    out: dict[str, Any] = {"transfer_seconds": transfer, "recorded_import_seconds":
                           recorded["mount_first_import_seconds"], "rounds": results}
    for side, cases in results.items():
        for field in ("import_seconds", "import_cpu_seconds", "server_cpu_seconds",
                      "target_seconds"):
            out[f"{side}_{field}"] = statistics.median(c[field] for c in cases)
    out["after_over_before"] = round(out["after_import_seconds"]
                                     / out["before_import_seconds"], 3)
    out["cpu_after_over_before"] = round(
        (out["after_import_cpu_seconds"] + out["after_server_cpu_seconds"])
        / (out["before_import_cpu_seconds"] + out["before_server_cpu_seconds"]), 3)
    return out


async def _measured(env: dict[str, str], agent: AgentHandle, key: str, mountpoint: Path,
                    server: Path, server_pid: int, profile: Path | None,
                    logs: Path | None) -> dict[str, Any]:
    """One fresh mount through `server`, timed until the import works; the host's CPU
    from the mount's start to the import's end (the host serves nothing else then)."""
    mountpoint.mkdir()
    node = {**env, "BOOTSEER_API_SOCKET": agent.api_socket,
            "BOOTSEER_LOG_DIR": str(mountpoint.parent), SERVER_ENV: str(server)}
    host = _host_pid(server_pid)
    host_cpu = cpu_seconds(host)
    load = os.getloadavg()
    started = time.monotonic()
    ready = await _depsnap(node, agent, "mount", key, str(mountpoint), "--store-dir",
                           str(agent.store_dir))
    mounted = time.monotonic() - started
    spy = None if profile is None else subprocess.Popen(
        [str(Path(sys.executable).parent / "py-spy"), "record", "--native", "-r", "200",
         "-f", "raw", "-o", str(profile), "-p", str(ready["server_pid"])],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        children = _children_cpu()
        proc = await asyncio.create_subprocess_exec(
            str(mountpoint / "bin" / "python"), "-c", IMPORT,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        _, err = await proc.communicate()
        seconds = time.monotonic() - started
        import_cpu = _children_cpu() - children
        server_cpu = cpu_seconds(ready["server_pid"]) - host_cpu
        async with agent.client(60) as client:
            contents = (await client.status())["contents"]
    finally:
        if spy is not None:
            spy.send_signal(2)
            with contextlib.suppress(subprocess.TimeoutExpired):
                spy.wait(20)
        await _depsnap(node, agent, "umount", str(mountpoint), json_out=False)
    log = Path(ready["log"])
    await _unmounted(log)
    text = log.read_text(errors="replace")
    if logs is not None:
        shutil.copy(log, logs / f"{mountpoint.name}.log")
    requests = REQUESTS.findall(text)
    decoded = DECODED.findall(text)
    if proc.returncode != 0:
        raise RuntimeError(f"the import failed: {err.decode()[-800:]}")
    return {"import_seconds": round(seconds, 3), "mount_seconds": round(mounted, 3),
            "import_cpu_seconds": round(import_cpu, 3), "server_cpu_seconds":
            round(server_cpu, 3), "host": host == ready["server_pid"],
            "fetched_bytes": sum(contents[p]["peer_bytes"] + contents[p]["origin_bytes"]
                                 for p in ready["packs"] if p in contents),
            "requests": json.loads(requests[-1]) if requests else None,
            "frames_decoded": [int(n) for n in decoded[-1]] if decoded else None,
            "load": [round(x, 2) for x in load]}


def _host_pid(server_pid: int) -> int:
    """The pid of the mount server's host: the server's first child (the handles it
    forks per mount come after it)."""
    children = Path(f"/proc/{server_pid}/task/{server_pid}/children").read_text().split()
    if not children:
        raise RuntimeError(f"the mount server {server_pid} has no host")
    return int(children[0])


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--before", required=True, help="the baseline revision")
    p.add_argument("--after", default="HEAD", help="the revision measured (default HEAD; "
                   f"{WORKTREE}: this checkout, uncommitted changes included)")
    p.add_argument("--rounds", type=int, default=2, help="mounts per side (ABBA order)")
    p.add_argument("--profile", type=Path, help="py-spy the after side's host into DIR")
    p.add_argument("--logs", type=Path, help="keep each mount's log in DIR")
    args = p.parse_args()
    for keep in (args.profile, args.logs):
        if keep:
            keep.mkdir(parents=True, exist_ok=True)
    return args


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(_args()))))
