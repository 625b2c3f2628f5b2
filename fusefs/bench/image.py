"""`bootseer bench image`: launching a realistic image four ways, side by side, in one run.

The image is Debian bookworm minbase with python3 and a few packages of an ML
environment (`--packages`, default numpy, scipy and pandas; built once per
machine with debootstrap and cached: `sample.python3_image`) plus a small top
layer; the command imports a few modules, as a training script's first lines
do. A real `docker-registry` on 127.0.0.1 holds it, behind a
`CappedProxy` that caps what the registry sends (`--registry-cap`, MB/s);
agents cap their own traffic at `--node-cap`. Every case starts cold (a
fresh agent, an empty store, a new scratch directory):

- `full_pull_seconds`: today's way with the real tools: `skopeo copy` of the
  whole image, `umoci unpack`, then the command under runc in the unpacked
  rootfs;
- `lazy_seconds`: `bootseer image run --record` on agent A: the image is
  mounted lazily and only what the command reads is fetched, from the
  registry (no record exists yet); the launch is recorded;
- `prefetch_seconds`: `bootseer image run` on a fresh agent B while A is up:
  B prefetches the recorded hot set, from A;
- `prefetch_handler_seconds`: the same on a third fresh agent C with
  `--no-passthrough` (pyfuse3 serves every read: the path before gzip layers'
  hot files had decoded copies), the baseline of `prefetch_seconds` in the run;
- `fuse_read_gbps` / `handler_fuse_read_gbps` / `direct_read_gbps`: a second
  image with a large file (`--big-file-mb`, default 1 GiB of incompressible
  bytes in a plain tar layer of its own, as incompressible contents should be
  shipped) is fetched whole on a third agent and mounted once, so that the
  file's backing file is built (`backing_ready_seconds`: from the mount to
  the backing file, while the handler serves that first read); then three
  rounds, each on fresh mounts (so each is a first read through FUSE): the
  same layer's bytes straight from the store's chunk files (from the page
  cache: the chunks were just written), the file read once with `dd bs=4M`
  through a `--no-passthrough` mount (pyfuse3: every read through the handler,
  the baseline) and through a passthrough mount; medians, with the serving
  process's CPU seconds per GiB and which path served (`*read_path`, by the
  server's own account).

- the mount server: every `image run` above (and the local ones below) runs as
  on a node that runs `bootseer fs server` beside its agent, started before any
  clock: BOOTSEER_MOUNT_SERVER names it, and the server serves the mount
  (`fusefs.image.served`; the timelines' `served_by`). Then those agents stop,
  and `forked_lazy_seconds` / `forked_prefetch_seconds` are the same lazy
  (`--record --no-prefetch`, from the registry) and prefetched (from the lazy
  one's agent) launches on two more fresh agents without the variable: `image
  run` forks its serving process itself, as before the server, the baseline
  of the same run (`forked_prefetch_over_lazy`). `*_startup_s`: each launch's
  seconds before its own clock (the process's start, imports, arguments);
  `load_average` (1, 5, 15 min) at the end of these cases.

- `local_*` / `merged_local_*`: launches on that second agent, everything
  local now, alternating three times each way: with the image's tree as
  `image index` packed it (what every launch does) and with it merged at
  mount from the layers' members (the bindings pushed again without the tree,
  as for an image indexed before trees were packed): the launch's seconds,
  `mounted_s` (from `image run`'s start to the mount serving) and the mount's
  `open_image_s` and `tree_s`, medians; `prefetch_tree` and `prefetch_server`
  say which tree and which server (kernel: passthrough for plain layers'
  files and decoded copies of gzip layers' hot files; pyfuse3: the handler)
  the prefetched launch had, and `prefetch_backing` which path served its
  files (`copy_opens`: opens of gzip layers' files read by passthrough from a
  decoded copy; `copy_misses`: such files, big enough for a copy, opened
  before their spans were decoded, so served by the handler; `plain_opens`).

Each launch's `*_timeline` is `image run --json`'s own: its clock starts once the
process has started Python, imported its modules and read its arguments (`startup_s`,
from the process's start time in /proc) and ends before the process exits
(`exit_s`, added here: what is left of this bench's clock of the launch).

The JSON line also gives `image_bytes` (compressed layers), `hot_bytes` (the
record's chunks), `startup_fetched_bytes` (layer bytes B received during its
launch, from peers and from the registry), the registry's own egress per
case, and the ratios the targets are stated in.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shlex
import statistics
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from fusefs.request import SERVER_ENV
from p2p.bench import workdir
from p2p.units import MiB

FUSE_ROUNDS = 3  # fresh mounts, median reported
TREE_ROUNDS = 3  # local launches each way (packed tree, merged tree), medians reported
DEFAULT_COMMAND = "python3 -c 'import json, sqlite3, ssl, email, decimal, numpy'"
DEFAULT_PACKAGES = "python3-numpy,python3-scipy,python3-pandas"


def add_parser(kinds: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = kinds.add_parser("image", help="lazy and prefetched image launches vs a full pull")
    p.add_argument("--node-cap", type=float, default=100.0, help="MB/s per agent, each way")
    p.add_argument("--registry-cap", type=float, default=100.0, help="MB/s out of the registry")
    p.add_argument("--big-file-mb", type=int, default=1024,
                   help="size of the file read through the mount for fuse_read_gbps "
                        "(0: skip that case)")
    p.add_argument("--command", default=DEFAULT_COMMAND, help="what each launch runs")
    p.add_argument("--packages", default=DEFAULT_PACKAGES,
                   help="Debian packages in the image beside python3, comma-separated")
    p.add_argument("--runtime", choices=("runc", "bwrap"), default="runc")
    p.add_argument("--json", action="store_true", help="print only the JSON line")
    p.add_argument("--workdir", type=Path, help="keep logs and stores here")
    p.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    import uvloop

    from p2p.errors import UserError

    try:
        result = uvloop.run(_bench(args))
    except Exception as exc:  # a failed case must not print a partial result as complete
        from fusefs.image.tool import ToolError
        from fusefs.testing.registry import RegistryStartError

        if isinstance(exc, ToolError | RegistryStartError):
            raise UserError(str(exc)) from None
        raise
    print(json.dumps(result))
    return 0


async def _bench(args: argparse.Namespace) -> dict[str, Any]:
    with workdir(args.workdir, "image") as work:
        return await _bench_in(args, work)


async def _bench_in(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    from fusefs.testing.registry import CappedProxy, local_registry
    from fusefs.testing.sample import push_sample, python3_image
    from p2p.origin.oci import RegistryClient
    from p2p.origin.oci_ref import ImageRef
    from p2p.testing.localcluster import LocalCluster

    def log(message: str) -> None:
        if not args.json:
            print(message, flush=True)

    log("building the sample images (cached after the first run)")
    packages = ("python3", *args.packages.split(",")) if args.packages else ("python3",)
    image = await python3_image(packages=packages)
    big = await python3_image(packages=packages, big_file_bytes=args.big_file_mb * MiB,
                              big_file_plain=True) if args.big_file_mb else None
    with local_registry(work / "registry") as registry:
        async with RegistryClient() as client:
            for name, img in (("bench/python", image), ("bench/python-big", big)):
                if img is not None:
                    await push_sample(client, ImageRef(registry.address, name, "1"), img)
        async with CappedProxy(registry.address, args.registry_cap) as proxy:
            cluster = LocalCluster(work / "cluster")
            try:
                await cluster.start_tracker()
                ref, big_ref = f"{proxy.address}/bench/python:1", \
                    f"{proxy.address}/bench/python-big:1"
                for r in (ref, big_ref) if big is not None else (ref,):
                    await _cli(cluster, "image", "index", r, "--tracker", cluster.tracker_url)
                result = {"bench": "image", "node_cap_mbps": args.node_cap,
                          "registry_cap_mbps": args.registry_cap, "command": args.command,
                          "runtime": args.runtime,
                          "image_bytes": sum(la.size for la in image.layers)}
                result |= await _cases(args, cluster, proxy, ref, work, log)
                if big is not None:
                    result |= await _fuse_read(args, cluster, big_ref, big, work, log)
            finally:
                await cluster.stop()
    return _ratios(result)


async def _cases(args: argparse.Namespace, cluster: Any, proxy: Any, ref: str, work: Path,
                 log: Any) -> dict[str, Any]:
    from fusefs.bench.baseline import full_pull
    from fusefs.image.process import image_process
    from fusefs.image.runtime import run_in_rootfs

    argv = shlex.split(args.command)
    caps = {"download_mbps": args.node_cap, "upload_mbps": args.node_cap}
    out: dict[str, Any] = {}

    log("full pull: skopeo copy + umoci unpack + run")
    sent, started = proxy.sent_bytes, time.monotonic()
    pulled = await full_pull(ref, work / "full", plain_http=True)
    config = await _config_of(ref)
    process = await asyncio.to_thread(image_process, pulled.rootfs, config, argv)
    status = await run_in_rootfs(pulled.rootfs, process, runtime=args.runtime)
    out["full_pull_seconds"] = round(time.monotonic() - started, 3)
    out["full_pull_registry_bytes"] = proxy.sent_bytes - sent
    _check_status(status, "the full-pull launch")

    # As a node runs it beside its agent, started before any clock runs: every launch
    # below but the forked ones has its mount served by it.
    server = await cluster.spawn("mount-server", ["fs", "server", "--socket",
                                                  str(work / "mount.sock")])
    try:
        out |= await _served_cases(args, cluster, proxy, ref, argv, caps,
                                   {**cluster.env, SERVER_ENV: str(work / "mount.sock")}, log)
    finally:
        await server.stop()
    log("forked: a lazy and a prefetched launch on fresh agents, no mount server")
    d = await cluster.start_agent(4, "rack0", config=caps)
    out["forked_lazy_seconds"], forked_lazy = await _launch(
        cluster, d, ref, argv, args.runtime, "--record", "--no-prefetch")
    e = await cluster.start_agent(5, "rack0", config=caps)
    out["forked_prefetch_seconds"], forked_warm = await _launch(cluster, e, ref, argv,
                                                                args.runtime)
    for agent in (d, e):
        await agent.child.stop()
    out["forked_lazy_timeline"], out["forked_prefetch_timeline"] = forked_lazy, forked_warm
    for case in ("lazy", "prefetch", "forked_lazy", "forked_prefetch"):
        out[f"{case}_startup_s"] = out[f"{case}_timeline"].get("startup_s")
    out["load_average"] = [round(x, 2) for x in os.getloadavg()]
    return out


async def _served_cases(args: argparse.Namespace, cluster: Any, proxy: Any, ref: str,
                        argv: list[str], caps: dict[str, float], env: dict[str, str],
                        log: Any) -> dict[str, Any]:
    """The lazy, prefetched, handler and local launches, through the mount server (`env`
    names it); their agents are stopped at the end, so that the forked launches after
    them fetch from the registry and from each other, as these did."""
    out: dict[str, Any] = {}
    a = await cluster.start_agent(0, "rack0", config=caps)
    log("lazy: bootseer image run --record on a fresh agent")
    sent = proxy.sent_bytes
    out["lazy_seconds"], lazy = await _launch(cluster, a, ref, argv, args.runtime, "--record",
                                              env=env)
    out["lazy_registry_bytes"] = proxy.sent_bytes - sent
    b = await cluster.start_agent(1, "rack0", config=caps)
    log("prefetch: bootseer image run on a second fresh agent, the hot set from the first")
    sent = proxy.sent_bytes
    out["prefetch_seconds"], warm = await _launch(cluster, b, ref, argv, args.runtime, env=env)
    out["prefetch_registry_bytes"] = proxy.sent_bytes - sent
    layers = await _layer_contents(cluster, ref)
    held = await _held(b, layers)
    out["startup_fetched_bytes"] = held["peer_bytes"] + held["origin_bytes"]
    out["startup_peer_bytes"], out["startup_origin_bytes"] = held["peer_bytes"], \
        held["origin_bytes"]
    out["hot_bytes"] = (await _held(a, layers))["have_bytes"]
    out["prefetch_chunks"] = warm.get("prefetch_chunks")
    out["prefetch_mounted_s"], out["prefetch_tree"] = warm.get("mounted_s"), warm.get("tree")
    out["prefetch_server"] = warm.get("server")
    # Which path served the prefetched launch's files: opens answered by passthrough (gzip
    # layers' decoded copies, plain layers' ranges), and gzip files worth a copy that were
    # not decoded yet at their open (the handler served them).
    out["prefetch_backing"] = warm.get("backing")
    out["lazy_timeline"], out["prefetch_timeline"] = lazy, warm
    log("prefetch, handler: the same on a third fresh agent with --no-passthrough")
    c = await cluster.start_agent(3, "rack0", config=caps)
    out["prefetch_handler_seconds"], handler = await _launch(
        cluster, c, ref, argv, args.runtime, "--no-passthrough", env=env)
    out["prefetch_handler_server"] = handler.get("server")
    out["prefetch_handler_timeline"] = handler
    log("local: launches on the second agent, the tree packed at index vs merged at mount")
    out |= await _tree_cases(cluster, b, ref, argv, args.runtime, env)
    for agent in (a, b, c):
        await agent.child.stop()
    return out


async def _tree_cases(cluster: Any, agent: Any, ref: str, argv: list[str], runtime: str,
                      env: dict[str, str]) -> dict[str, Any]:
    """Launches with everything local, alternating: the image's tree as `image index` packed
    it, and merged at mount from the layers' members (its bindings pushed again without the
    tree, as an image indexed before trees were packed; put back after each)."""
    runs: dict[str, list[dict[str, Any]]] = {"packed": [], "merged": []}
    for _ in range(TREE_ROUNDS):
        for how, r in runs.items():
            async with _tree_hidden(ref, hidden=how == "merged"):
                seconds, timeline = await _launch(cluster, agent, ref, argv, runtime, env=env)
            if timeline.get("tree") != how:
                raise RuntimeError(f"a launch meant to use the {how} tree used "
                                   f"{timeline.get('tree')!r}")
            phases = timeline.get("mount_phases") or {}
            r.append({"seconds": seconds, "mounted_s": timeline["mounted_s"],
                      "open_image_s": phases.get("open_image_s"),
                      "tree_s": phases.get("tree_s")})
    out: dict[str, Any] = {}
    for how, r in runs.items():
        key = "local" if how == "packed" else "merged_local"
        for field in ("seconds", "mounted_s", "open_image_s", "tree_s"):
            out[f"{key}_{field}"] = round(statistics.median(x[field] for x in r), 3)
        out[f"{key}_mounted_runs_s"] = [x["mounted_s"] for x in r]
    return out


@contextlib.asynccontextmanager
async def _tree_hidden(ref: str, hidden: bool) -> AsyncIterator[None]:
    from fusefs.image.binding import Bindings, pull_bindings, push_bindings
    from p2p.origin.oci import RegistryClient
    from p2p.origin.oci_ref import parse_reference

    if not hidden:
        yield
        return
    async with RegistryClient() as client:
        pulled = await client.get_manifest(parse_reference(ref))
        found = await pull_bindings(client, pulled.ref, pulled.digest)
        if found is None or found.tree is None:
            raise RuntimeError(f"{ref} has no packed tree in its bindings")
        await push_bindings(client, pulled.ref, Bindings(found.image, found.layers))
        try:
            yield
        finally:
            await push_bindings(client, pulled.ref, found)


async def _launch(cluster: Any, agent: Any, ref: str, argv: list[str], runtime: str,
                  *extra: str, env: dict[str, str] | None = None
                  ) -> tuple[float, dict[str, Any]]:
    started = time.monotonic()
    _, out = await _cli(cluster, "image", "run", "--tracker", cluster.tracker_url,
                        "--api-socket", agent.api_socket, "--store-dir", str(agent.store_dir),
                        "--runtime", runtime, "--json", *extra, ref, "--", *argv, env=env)
    seconds = round(time.monotonic() - started, 3)
    timeline = json.loads(out.splitlines()[-1])
    _check_status(timeline["exit_status"], f"the launch on {agent.child.name}")
    if timeline.get("startup_s") is not None:  # the rest of this clock: the process's end
        timeline["exit_s"] = round(seconds - timeline["startup_s"] - timeline["seconds"], 3)
    return seconds, timeline


async def _fuse_read(args: argparse.Namespace, cluster: Any, ref: str, big: Any, work: Path,
                     log: Any) -> dict[str, Any]:
    from fusefs.bench.readpath import read_path
    from fusefs.image.options import MountOptions
    from fusefs.mount import Mount
    from fusefs.testing.sample import BIG_FILE_PATH

    agent = await cluster.start_agent(2, "rack0")
    layers = await _layer_contents(cluster, ref)
    big_layer = layers[-1]
    log("fuse read: fetch the big layer whole, then dd through the mount and from the store")
    async with agent.client(None) as client:
        await client.ensure(big_layer)
    mountpoint = work / "mnt-big"
    mountpoint.mkdir()
    target = mountpoint / BIG_FILE_PATH.lstrip("/")
    files = sorted((agent.store_dir / big_layer).glob("*.chunk"),
                   key=lambda p: int(p.name.split(".")[0]))
    file_bytes, size = args.big_file_mb * MiB, big.layers[-1].size

    def options(passthrough: bool) -> MountOptions:
        return MountOptions(ref, mountpoint, cluster.tracker_url, agent.api_socket,
                            agent.store_dir, prefetch=False, passthrough=passthrough)

    # The member's backing file (passthrough's layout) is built by the first passthrough
    # mount that opens it, from the verified chunks, while the handler serves that read.
    began = time.monotonic()
    async with await Mount.spawn(options(True).argv(), mountpoint, work / "mnt-big-build.log",
                                 env=cluster.env):
        await dd_seconds(target)
        while not list((agent.store_dir / big_layer).glob("extent-*.whole")):
            if time.monotonic() - began > 600:
                raise RuntimeError("the big file's backing file was not built in 600 s")
            await asyncio.sleep(0.05)
    backing_s = time.monotonic() - began
    runs: dict[bool, dict[str, list[Any]]] = {m: {"gbps": [], "cpu": [], "path": []}
                                              for m in (False, True)}
    direct = []
    await asyncio.to_thread(os.sync)  # the layer was just written: its writeback is not a read
    for _ in range(FUSE_ROUNDS):  # a fresh mount each: every round is a first read
        direct.append(size / await asyncio.to_thread(read_all_seconds, files) / 1e9)
        for passthrough, r in runs.items():
            mount_log = work / f"mnt-big-{passthrough}.log"
            async with await Mount.spawn(options(passthrough).argv(), mountpoint, mount_log,
                                         env=cluster.env) as mount:
                before = cpu_seconds(mount.proc.pid)
                r["gbps"].append(file_bytes / await dd_seconds(target) / 1e9)
                r["cpu"].append((cpu_seconds(mount.proc.pid) - before) * (1 << 30) / file_bytes)
            r["path"].append(read_path(mount_log))
    out: dict[str, Any] = {"big_file_bytes": file_bytes, "big_layer_bytes": size,
                           "backing_ready_seconds": round(backing_s, 3),
                           "direct_read_gbps": round(statistics.median(direct), 3)}
    for passthrough, r in runs.items():
        key = "" if passthrough else "handler_"
        out |= {f"{key}fuse_read_gbps": round(statistics.median(r["gbps"]), 3),
                f"{key}fuse_read_runs_gbps": [round(v, 3) for v in r["gbps"]],
                f"{key}fuse_server_cpu_s_per_gib": round(statistics.median(r["cpu"]), 3),
                f"{key}read_path": sorted(set(r["path"]))}
    return out


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a live process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def read_all_seconds(paths: list[Path]) -> float:
    """Seconds to read every file once into one reused 4 MiB buffer (as dd bs=4M does)."""
    buf = bytearray(4 * MiB)
    started = time.monotonic()
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass
    return time.monotonic() - started


async def dd_seconds(path: Path) -> float:
    """Seconds `dd bs=4M` takes to read `path` once."""
    started = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        "dd", f"if={path}", "of=/dev/null", "bs=4M", stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE)
    _, err = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"dd of {path} failed: {err.decode()[-500:]}")
    return time.monotonic() - started


async def _cli(cluster: Any, *args: str, env: dict[str, str] | None = None
               ) -> tuple[int, str]:
    from p2p.testing.localcluster import bootseer_command

    proc = await asyncio.create_subprocess_exec(
        *bootseer_command(), *args, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env=env or cluster.env)
    out, err = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"bootseer {' '.join(args[:3])} failed ({proc.returncode}): "
                           f"{err.decode()[-3000:]}")
    return proc.returncode or 0, out.decode()


async def _config_of(ref: str) -> dict[str, Any]:
    from fusefs.image.catalog import resolve
    from p2p.origin.oci import RegistryClient
    from p2p.origin.oci_ref import parse_reference

    async with RegistryClient() as client:
        _, config = await resolve(client, parse_reference(ref))
    return dict(config.get("config") or {})


async def _layer_contents(cluster: Any, ref: str) -> list[str]:
    from p2p.origin.oci import RegistryClient
    from p2p.origin.oci_origin import layer_name
    from p2p.origin.oci_ref import parse_reference
    from p2p.tracker_client import TrackerClient

    async with RegistryClient() as client, \
            TrackerClient(cluster.tracker_url, cluster.secret) as tracker:
        pulled = await client.get_manifest(parse_reference(ref))
        return [await tracker.get_name(layer_name(la.digest)) for la in pulled.manifest.layers]


async def _held(agent: Any, contents: list[str]) -> dict[str, int]:
    from p2p.progress import totals

    async with agent.client(30.0) as client:
        return totals(await client.status(), contents)


def _check_status(status: int, what: str) -> None:
    if status != 0:
        raise RuntimeError(f"{what} exited with status {status}; the benchmark stops")


def _ratios(r: dict[str, Any]) -> dict[str, Any]:
    def ratio(a: str, b: str) -> float | None:
        return round(r[a] / r[b], 3) if r.get(b) else None

    r["prefetch_over_full_pull"] = ratio("prefetch_seconds", "full_pull_seconds")
    r["prefetch_over_lazy"] = ratio("prefetch_seconds", "lazy_seconds")
    r["forked_prefetch_over_lazy"] = ratio("forked_prefetch_seconds", "forked_lazy_seconds")
    r["prefetch_handler_over_lazy"] = ratio("prefetch_handler_seconds", "lazy_seconds")
    r["prefetch_over_prefetch_handler"] = ratio("prefetch_seconds", "prefetch_handler_seconds")
    r["startup_fetched_over_hot"] = ratio("startup_fetched_bytes", "hot_bytes")
    r["fuse_over_direct"] = ratio("fuse_read_gbps", "direct_read_gbps")
    r["passthrough_over_handler"] = ratio("fuse_read_gbps", "handler_fuse_read_gbps")
    r["packed_over_merged_mounted"] = ratio("local_mounted_s", "merged_local_mounted_s")
    r["packed_over_merged_launch"] = ratio("local_seconds", "merged_local_seconds")
    return r
