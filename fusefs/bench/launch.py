"""`bootseer bench launch`: one job launched on every node of a testbed, today's way and Bootseer's.

    bootseer bench launch --nodes 8 --racks 2 [--node-cap 100] [--origin-cap 40] --json

Built for the run and removed after it (as root): a `bootseer testbed` of N
nodes; on its host side, a real `docker-registry` and a package mirror (a
directory of wheels behind `python -m http.server`), each behind a relay
capped at --origin-cap (what a shared registry or mirror gives a job); in its
origin namespace, the tracker and the snapshot origin, behind the origin
link's own cap (the same --origin-cap). Then, untimed, what exists before a
job is launched in a cluster that runs Bootseer: the image pushed and
indexed, the environment snapshot published (`depsnap run` once), and one
launch recorded (its hot blocks); that preparing agent is then gone.

Timed, two arms, every node at once, each node in its own namespace:

- baseline: `python -m fusefs.bench.launch_baseline` (skopeo + umoci, pip from the
  mirror, then the command under runc), nothing shared between nodes;
- bootseer: `bootseer launch --env-key KEY` through a fresh agent per node.

With `--rounds R`, then R rounds of two more Bootseer arms, in ABBA order, each
on fresh agents (empty stores): `forked` (as above: every launch forks its
mounts' serving children) and `served` (each node runs `bootseer fs server` in
its namespace, started before the clock, named to its launches by
BOOTSEER_MOUNT_SERVER: the server serves the launch's mounts). Reported under
`mount_server`: per round and arm the nodes' p50 and max seconds, the served
over forked ratio of the p50s, who served each launch's mounts (the timelines'
`served_by`), the phases' medians (with `startup_s`: each launch's seconds
before its own clock, and the image mount's own phases), the load average.

The command reads the image's Python library, the venv's site-packages and
imports numpy, and prints their digests: every node of every arm must print
the same lines. One JSON line: per-arm p50 and max of the nodes' times, the
reduction (1 - bootseer_max / baseline_max), the registry's and the mirror's
egress during the Bootseer arm over one image's and one environment's bytes,
and each arm's per-part breakdown (medians over nodes).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fusefs.bench.launch_rounds import flat, medians, server_rounds
from p2p import process as cpu
from p2p.bench import workdir
from p2p.errors import UserError
from p2p.units import MiB

REPOSITORY = "bench/launch:1"
CKPT_FILE = "/ckpt/step-1/model.bin"
JOB = r'''
import hashlib, os
def digest(root, skip):
    h, n = hashlib.sha256(), 0
    for d, dirs, files in os.walk(root):
        dirs.sort()
        for f in sorted(files):
            path = os.path.join(d, f)
            rel = os.path.relpath(path, root)
            if not skip(rel) and not os.path.islink(path):
                h.update(rel.encode() + b"\0" + open(path, "rb").read())
                n += 1
    return n, h.hexdigest()
cache = lambda rel: "__pycache__" in rel
print("image", *digest("/usr/lib/python3.11", cache))
venv = os.environ["VIRTUAL_ENV"]
print("env", *digest(os.path.join(venv, "lib/python3.11/site-packages"), lambda rel: cache(rel)
      or rel.split("/")[0].startswith(("pip", "_distutils")) or rel.endswith("RECORD")))
import numpy
print("numpy", numpy.__version__, int(numpy.arange(1000).sum()))
print("ckpt", *digest(os.environ["BOOTSEER_CKPT"], lambda rel: False))
'''


def add_parser(kinds: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from depsnap.testing.wheelhouse import TEST_WHEELS

    p = kinds.add_parser("launch", help="a job launched on a testbed: today's way and "
                         "bootseer launch", description=__doc__,
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=8, help="testbed nodes launching the job")
    p.add_argument("--racks", type=int, default=2, help="racks of the testbed")
    p.add_argument("--node-cap", type=float, default=100.0, metavar="MB/s",
                   help="each node's link, each way, in MB/s (10^6 bytes a second)")
    p.add_argument("--origin-cap", type=float, default=40.0, metavar="MB/s",
                   help="egress of the registry, of the package mirror, and of the origin "
                        "namespace (tracker, snapshot origin), each")
    p.add_argument("--oversubscription", type=float, default=2.0,
                   help="a rack's node caps over its uplink's")
    p.add_argument("--datanode-cap", type=float, default=25.0, metavar="MB/s",
                   help="each of the 3 DataNodes' disk reads (HDFS's own cap)")
    p.add_argument("--ckpt-mib", type=int, default=128, help="the checkpoint file's size")
    p.add_argument("--package", dest="packages", action="append", metavar="SPEC",
                   help=f"pinned packages of the environment (default: {' '.join(TEST_WHEELS)})")
    p.add_argument("--runtime", choices=("runc", "bwrap"), default="runc")
    p.add_argument("--rounds", type=int, default=0,
                   help="rounds of forked against mount-server launches (default 0: none)")
    p.add_argument("--name", default="bl", help="the testbed's name (built and removed)")
    p.add_argument("--subnet", default="10.215.0.0/16",
                   help="the testbed's /16 (default: not `bootseer testbed`'s own)")
    p.add_argument("--json", action="store_true", help="print only the JSON line")
    p.add_argument("--workdir", type=Path, help="keep logs and stores here")
    p.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    result = asyncio.run(_bench(args))
    print(json.dumps(result))
    return 0 if result["same_output"] else 1


async def _bench(args: argparse.Namespace) -> dict[str, Any]:
    from depsnap.testing.wheelhouse import PYTHON, TEST_LOCK, TEST_WHEELS, wheelhouse
    from fusefs.testing.sample import python3_image
    from p2p.testing.testbed.netns import TestbedError, testbed
    from p2p.testing.testbed.plan import Spec, SpecError

    def log(message: str) -> None:
        if not args.json:
            print(f"# {message}", file=sys.stderr, flush=True)

    packages = args.packages or list(TEST_WHEELS)
    log("building the image and the wheelhouse (cached after the first run)")
    image = await python3_image()
    wheels = await asyncio.to_thread(wheelhouse, TEST_LOCK, args.packages or ())
    spec = Spec(args.nodes, args.racks, args.node_cap, args.origin_cap, args.oversubscription,
                name=args.name, subnet=args.subnet)
    with workdir(args.workdir, "launch") as work:
        try:
            with testbed(spec) as bed:
                async with _origins(args, bed, work, wheels) as origins:
                    return await _arms(args, bed, origins, work, image, packages, PYTHON, log)
        except (TestbedError, SpecError) as exc:
            raise UserError(str(exc)) from None


@dataclass(frozen=True, slots=True)
class Origins:
    """The registry and the mirror on the testbed's host side, each behind a capped relay,
    and HDFS."""

    registry: Any
    registry_proxy: Any
    mirror_proxy: Any
    hdfs: Any

    @property
    def ckpt_uri(self) -> str:
        return str(self.hdfs.uri(CKPT_FILE))

    @property
    def ref(self) -> str:
        return f"{self.registry_proxy.address}/{REPOSITORY}"

    @property
    def mirror(self) -> str:
        return f"http://{self.mirror_proxy.address}/"


@contextlib.asynccontextmanager
async def _origins(args: argparse.Namespace, bed: Any, work: Path, wheels: Path
                   ) -> AsyncIterator[Origins]:
    """The registry, the mirror (both capped at --origin-cap) and HDFS (its DataNodes' reads
    capped at --datanode-cap), reachable from the testbed's nodes at its host address."""
    from fusefs.testing.registry import CappedProxy, local_registry
    from hdfs_stripe.testing.minicluster import MiniClusterError, MiniHdfs
    from p2p.process import free_port

    cap, host = args.origin_cap, bed.plan.host_ip
    with local_registry(work / "registry") as registry, _mirror(wheels, free_port()) as mirror:
        try:
            hdfs = await MiniHdfs.start(work / "hdfs", 3, int(args.datanode_cap * 1e6),
                                        32 * MiB, host=host)
        except MiniClusterError as exc:
            raise UserError(str(exc)) from None
        try:
            await _write_checkpoint(hdfs, args.ckpt_mib * MiB)
            async with CappedProxy(registry.address, cap, host) as reg_proxy, \
                    CappedProxy(mirror, cap, host) as mirror_proxy:
                yield Origins(registry, reg_proxy, mirror_proxy, hdfs)
        finally:
            await hdfs.stop()


async def _write_checkpoint(hdfs: Any, size: int) -> None:
    """Random bytes, replication 2, blocks spread over the DataNodes."""
    from hdfs_stripe.testing.minicluster import write_spread
    from hdfs_stripe.webhdfs import WebHdfs

    async with WebHdfs(hdfs.http_url) as client:
        await client.mkdirs(CKPT_FILE.rsplit("/", 1)[0])
        await write_spread(client, CKPT_FILE, os.urandom(size), 2, 32 * MiB)


@contextlib.contextmanager
def _mirror(directory: Path, port: int) -> Iterator[str]:
    """`python -m http.server` over `directory` on 127.0.0.1:port (a listing pip reads)."""
    proc = subprocess.Popen([sys.executable, "-m", "http.server", "--bind", "127.0.0.1",
                             str(port), "--directory", str(directory)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_http(f"http://127.0.0.1:{port}/", proc)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


def _wait_http(url: str, proc: subprocess.Popen[bytes]) -> None:
    import urllib.request

    for _ in range(200):  # bounded: 10 s
        if proc.poll() is not None:
            raise UserError(f"the package mirror exited at start ({proc.returncode})")
        with contextlib.suppress(OSError):
            urllib.request.urlopen(url, timeout=1).close()
            return
        time.sleep(0.05)
    raise UserError(f"the package mirror at {url} did not answer within 10 s")


# ---- the run --------------------------------------------------------------------------------


async def _arms(args: argparse.Namespace, bed: Any, origins: Origins, work: Path, image: Any,
                packages: list[str], python: str, log: Any) -> dict[str, Any]:
    from p2p.testing.localcluster import LocalCluster

    cluster = LocalCluster(work / "cluster", testbed=bed)
    try:
        await cluster.start_tracker()
        snapshots = work / "snapshots"
        snapshots.mkdir()
        await cluster.start_origin(snapshots)
        log("untimed: push and index the image, publish the environment, record a launch")
        key = await _prepare(args, cluster, origins, work, image, packages, python)
        out: dict[str, Any] = {"bench": "launch", "nodes": args.nodes, "racks": args.racks,
                               "node_cap_mbps": args.node_cap, "origin_cap_mbps": args.origin_cap,
                               "oversubscription": args.oversubscription,
                               "packages": packages,
                               "image_bytes": sum(la.size for la in image.layers),
                               "ckpt_bytes": args.ckpt_mib * MiB,
                               "datanode_cap_mbps": args.datanode_cap}
        log(f"baseline: {args.nodes} nodes pull, unpack, pip install and run")
        sent = origins.registry_proxy.sent_bytes, origins.mirror_proxy.sent_bytes
        spent = _children_cpu()
        baseline = await asyncio.gather(*(_baseline(args, cluster, origins, work, i, packages,
                                                    python) for i in range(args.nodes)))
        out["baseline_registry_bytes"] = origins.registry_proxy.sent_bytes - sent[0]
        out["baseline_mirror_bytes"] = origins.mirror_proxy.sent_bytes - sent[1]
        out["baseline_cpu_seconds"] = round(_children_cpu() - spent, 1)
        log(f"bootseer: {args.nodes} fresh agents, bootseer launch on each")
        agents = [await cluster.start_agent(i, "") for i in range(args.nodes)]
        sent = origins.registry_proxy.sent_bytes, origins.mirror_proxy.sent_bytes
        origin_before = await cluster.origin_bytes()
        spent, agents_cpu = _children_cpu(), cpu.cpu_seconds_of(a.child.pid for a in agents)
        launched = await asyncio.gather(*(_bootseer(args, cluster, origins, a, key, work)
                                          for a in agents))
        out["bootseer_cpu_seconds"] = {
            "launch": round(_children_cpu() - spent, 1),
            "agents": round(cpu.cpu_seconds_of(a.child.pid for a in agents) - agents_cpu, 1)}
        out["bootseer_registry_bytes"] = origins.registry_proxy.sent_bytes - sent[0]
        out["bootseer_mirror_bytes"] = origins.mirror_proxy.sent_bytes - sent[1]
        out["bootseer_snapshot_origin_bytes"] = await cluster.origin_bytes() - origin_before
        for agent in agents:
            await agent.child.stop()
        out = _summary(out, baseline, launched)
        if args.rounds > 0:
            log(f"{args.rounds} rounds: forked and through a mount server, fresh agents")
            out["mount_server"] = await server_rounds(
                args, cluster, lambda agent, env: _bootseer(args, cluster, origins, agent, key,
                                                            work, env), work, log)
            out["same_output"] = out["same_output"] and out["mount_server"].pop("same_output") \
                == {tuple(lines) for lines, _ in launched}
        return out
    finally:
        await cluster.stop()


async def _prepare(args: argparse.Namespace, cluster: Any, origins: Origins, work: Path,
                   image: Any, packages: list[str], python: str) -> str:
    from fusefs.testing.sample import push_sample
    from p2p.origin.oci import RegistryClient
    from p2p.origin.oci_ref import parse_reference

    async with RegistryClient(plain_http=(origins.registry.address,)) as client:
        await push_sample(client, parse_reference(f"{origins.registry.address}/{REPOSITORY}"),
                          image)
    await _bootseer_cli(cluster, None, ["image", "index", origins.ref, "--plain-http",
                                        "--tracker", cluster.tracker_url])
    prep = await cluster.start_agent(0, "", name="prep")
    prefix = work / "prep-venv"
    node = _node_flags(cluster, prep, work)
    summary = await _bootseer_cli(cluster, cluster.testbed.nodes[0], [
        "depsnap", "run", "--json", "--prefix", str(prefix), "--python", python,
        "--origin-dir", str(work / "snapshots"), *node, "--", "pip", "install", "-q",
        "--no-index", "--find-links", origins.mirror, "--trusted-host",
        origins.mirror_proxy.address.split(":")[0], *packages])
    key = str(json.loads(summary.splitlines()[-1])["key"])
    await _bootseer_cli(cluster, cluster.testbed.nodes[0], [
        "launch", "--image", origins.ref, "--plain-http", "--env-key", key,
        "--ckpt", origins.ckpt_uri, "--runtime", args.runtime, "--log-level", "WARNING",
        *node, "--", "python3", "-c", JOB])
    await prep.child.stop()
    shutil.rmtree(prep.store_dir, ignore_errors=True)
    shutil.rmtree(prefix, ignore_errors=True)
    return key


def _node_flags(cluster: Any, agent: Any, work: Path) -> list[str]:
    return ["--tracker", cluster.tracker_url, "--api-socket", agent.api_socket,
            "--store-dir", str(agent.store_dir), "--origin-url", cluster.origin_url,
            "--cache-dir", str(work / f"cache-{agent.child.name}")]


async def _bootseer_cli(cluster: Any, host: Any, argv: list[str],
                        env: dict[str, str] | None = None) -> str:
    """`bootseer ARGV` (in `host`'s namespace if given); its stdout."""
    from p2p.testing.localcluster import bootseer_command

    argv = [*bootseer_command(), *argv]
    return await call(cluster.testbed.command(host, argv) if host else argv,
                       env or cluster.env)


async def call(argv: list[str], env: dict[str, str]) -> str:
    """Run `argv`; its stdout, or UserError with its stderr."""
    proc = await asyncio.create_subprocess_exec(*argv, env=env,
                                                stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE)
    out, err = await proc.communicate()
    if proc.returncode != 0:
        raise UserError(f"{' '.join(argv[:6])} ... exited {proc.returncode}:\n"
                        f"{err.decode(errors='replace')[-2000:]}")
    return out.decode()


async def _baseline(args: argparse.Namespace, cluster: Any, origins: Origins, work: Path,
                    i: int, packages: list[str], python: str
                    ) -> tuple[list[str], dict[str, Any]]:
    argv = [sys.executable, "-m", "fusefs.bench.launch_baseline", "--image", origins.ref,
            "--mirror", origins.mirror, "--python", python, "--runtime", args.runtime,
            "--work", str(work / f"baseline-{i}"), "--ckpt", origins.ckpt_uri,
            *(f"--package={p}" for p in packages), "--", "python3", "-c", JOB]
    out = await call(cluster.testbed.command(cluster.testbed.nodes[i], argv), cluster.env)
    shutil.rmtree(work / f"baseline-{i}", ignore_errors=True)
    return _split(out)


async def _bootseer(args: argparse.Namespace, cluster: Any, origins: Origins, agent: Any,
                    key: str, work: Path, env: dict[str, str] | None = None
                    ) -> tuple[list[str], dict[str, Any]]:
    """`bootseer launch` of the job on `agent`'s node (with `env`: the cluster's by default);
    (its output lines, its timeline)."""
    out = await _bootseer_cli(cluster, cluster.testbed.nodes[agent.index], [
        "launch", "--json", "--image", origins.ref, "--plain-http", "--env-key", key,
        "--ckpt", origins.ckpt_uri, "--runtime", args.runtime, "--log-level", "WARNING",
        *_node_flags(cluster, agent, work), "--", "python3", "-c", JOB], env)
    return _split(out)


def _children_cpu() -> float:
    """CPU seconds of this process's finished children (and theirs)."""
    return cpu.own_and_children()[1]


def _split(out: str) -> tuple[list[str], dict[str, Any]]:
    lines = out.strip().splitlines()
    return lines[:-1], json.loads(lines[-1])


def _summary(out: dict[str, Any], baseline: list[tuple[list[str], dict[str, Any]]],
             launched: list[tuple[list[str], dict[str, Any]]]) -> dict[str, Any]:
    outputs = {tuple(lines) for lines, _ in (*baseline, *launched)}
    base = [t["seconds"] for _, t in baseline]
    boot = [t["seconds"] for _, t in launched]
    nodes = out["nodes"]
    one_image = out["baseline_registry_bytes"] / nodes  # what one full pull moved
    one_env = out["baseline_mirror_bytes"] / nodes  # what one pip install downloaded
    out |= {"baseline_p50_seconds": round(statistics.median(base), 3),
            "baseline_max_seconds": max(base),
            "bootseer_p50_seconds": round(statistics.median(boot), 3),
            "bootseer_max_seconds": max(boot),
            "reduction": round(1 - max(boot) / max(base), 3),
            "registry_bytes_ratio": round(out["bootseer_registry_bytes"] / one_image, 3),
            "index_bytes_ratio": round(out["bootseer_mirror_bytes"] / one_env, 3),
            "snapshot_origin_over_env": round(out["bootseer_snapshot_origin_bytes"] / one_env,
                                              3),
            "hdfs_bytes_ratio": round(sum(t["ckpt"]["origin_bytes"] for _, t in launched)
                                      / out["ckpt_bytes"], 3),
            "same_output": len(outputs) == 1,
            "load_average": round(os.getloadavg()[0], 2),
            "baseline_phases": medians([t for _, t in baseline],
                                        ("image_s", "env_s", "ckpt_s", "command_started_s",
                                         "command_s", "cpu_ready_s")),
            "bootseer_phases": medians([flat(t) for _, t in launched],
                                        ("image_ready_s", "env_ready_s", "ckpt_ready_s",
                                         "command_started_s",
                                         "command_s", "cpu_ready_s", "cpu_launch_s",
                                         "cpu_children_s"))}
    return out
