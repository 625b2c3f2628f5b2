"""`bootseer bench depsnap`: install vs restore vs lazy mount, side by side, in one run.

On a real, ML-shaped environment installed from a local wheelhouse (numpy,
pandas, pyarrow, scipy and their dependencies; `depsnap.testing.wheelhouse`), each
case on a fresh prefix and with an empty cache, on loopback agents
(`p2p.testing.localcluster`):

- `pip_seconds`: `pip install --no-index --find-links WHEELHOUSE ...` into a
  fresh venv (pip compiles byte-code: `pip_compiles_bytecode`);
- `uv_seconds`: `uv pip install` of the same, empty uv cache, no byte-code
  (uv's default); `uv_bytecode_seconds` the same with `--compile-bytecode`;
- `create_seconds`: `depsnap run` with the pip command on agent A (install,
  capture, publish); agent A then fetches the packs (it is the seed);
- `restore_seconds`: `depsnap restore` on a fresh agent B (empty store, no
  cache) from its peer A, the median of `--rounds`, each by a new agent. The
  restored tree includes pip's byte-code, so compare it with `pip_seconds`
  and `uv_bytecode_seconds`. `restore_fetch_seconds`: until every file's
  bytes are written; `restore_place_seconds`: links, modes, mtimes after
  that. `copy_seconds` is `cp -a` of the same tree on this disk, a floor for
  writing it, in rounds alternating with the restores;
- `mount_first_import_seconds`: from starting `depsnap mount` on a fresh
  agent D (empty store) to `import pandas` succeeding from the mount, and the
  pack bytes that took (`mount_fetched_bytes`). The node runs the mount
  server (`bootseer fs server`, started before the clock): the serving
  process is forked from it, without an interpreter start or imports of its
  own. The key's hot-frame record (`depsnap.hot`) was made by the mount
  before it, the key's first, on agent C (empty store too), timed the same
  way: `mount_unrecorded_import_seconds` (a cluster's first launch of a key;
  every later one is D's case). C is stopped before D starts, and D before E,
  so each has the seed as its only peer. E mounts as D did but without the
  mount server (`mount_direct_import_seconds`). `mount_prefetch_chunks`: the
  chunks D's mount handed its agent from the record before anything was read.
  D mounts as a node does by default: the kernel-protocol server with no-open
  (`fusefs.kernelfs`; `mount_server` says which served) and the tree packed at
  capture (`mount_tree`); F mounts the same with `--server pyfuse3`, every open
  and release a round trip (`mount_handler_*`, the baseline measured in the same
  run; `mount_over_handler` and `mount_cpu_over_handler`, the importer's and
  the serving process's CPU together, compare them); G with `--passthrough`
  (`mount_passthrough_*`: decoded, checked copies of the recorded big files
  written while the mount starts, `depsnap.backing`). Each then mounts the key
  again (`mount_again_*`, `mount_handler_again_*`,
  `mount_passthrough_again_*`): the chunks local now, and G's copies written.
  `mount_read_path` and `mount_account` say what served, by the serving
  process's own account (passthrough opens, handler opens and reads);
  `mount_import_cpu_seconds` and `mount_server_cpu_seconds` are the CPU
  seconds of the importing interpreter and of the serving process (from its
  fork until the import ended; for the mount server's host, which serves every
  mount of the run, from the end of the mount it served before), which load
  moves less than wall time;
- `snapshot_bytes` (all packs as stored: zstd frames, what peers move),
  `snapshot_raw_bytes` (the packs' raw bytes), and sharing: a second
  environment (numpy and six, at another prefix) is published next to the
  first, and `second_new_bytes` is what it added to the origin;
- the targets, side by side: `pip_over_restore` (>= 10 wanted) and
  `uv_bytecode_over_restore` (>= 2; uv with byte-code, since the snapshot
  holds pip's byte-code: `restore_compares_with`), and for the mount
  `transfer_seconds` (a fresh agent fetching every pack from A, nothing
  written out: the swarm's rate here) and `mount_target_seconds`, 1 s plus
  `mount_fetched_bytes` at that rate;
- CPU seconds (user + system) of pip, uv and restore (`*_cpu_seconds`: the
  restorer with its extractors, its agent, and the seed while it served) and
  their ratios (`*_over_restore_cpu`): on a shared two-core machine another
  job's load moves wall times by 2-3x from one minute to the next, CPU
  seconds much less.

Venv creation is not in any of the install times. Times are noisy on a
shared machine: compare the ratios.

Nothing is deleted until the run ends: each round's restored
tree and copy is renamed aside. On ext4, creating a file right after many
were deleted is slow: the inode allocator skips, one by one, inodes deleted
in the last minutes (`recently_deleted` in a kernel profile). Here a `cp -a`
of this tree (10,000+ files) took 5.7-9 s within minutes of deleting one, and
1.3 s after waiting; a bench that deleted a tree between rounds measured
that, not the restore.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from depsnap.testing.wheelhouse import ML_LOCK, ML_WHEELS, PYTHON, wheelhouse
from fusefs.request import SERVER_ENV
from p2p.bench import workdir
from p2p.process import cpu_seconds
from p2p.testing.localcluster import AgentHandle, LocalCluster, bootseer_command

IMPORT = "import pandas, numpy; print(pandas.__version__)"
_SERVED_CPU: dict[int, float] = {}  # a serving process's CPU when its last mount here ended


def add_parser(kinds: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = kinds.add_parser("depsnap", help="pip and uv against depsnap restore and mount")
    p.add_argument("--package", dest="packages", action="append", metavar="SPEC",
                   help=f"pinned packages (default: {' '.join(ML_WHEELS)})")
    p.add_argument("--python", default=PYTHON, help="the interpreter the environments are made for")
    p.add_argument("--rounds", type=int, default=3,
                   help="restores (each by a fresh agent) and copies; medians are reported")
    p.add_argument("--json", action="store_true", help="print only the JSON line")
    p.add_argument("--workdir", type=Path, help="keep logs, venvs and stores here")
    p.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    result = asyncio.run(_bench(args))
    print(json.dumps(result))
    return 0 if result["import_ok"] else 1


async def _bench(args: argparse.Namespace) -> dict[str, Any]:
    packages = args.packages or list(ML_WHEELS)
    wheels = await asyncio.to_thread(wheelhouse, ML_LOCK, args.packages or ())
    with workdir(args.workdir, "depsnap") as work:
        cluster = LocalCluster(work / "cluster")
        try:
            return await _cases(cluster, work, wheels, packages, args)
        finally:
            await cluster.stop()


class _Runner:
    def __init__(self, work: Path, wheels: Path, python: str, env: dict[str, str]) -> None:
        self.work, self.wheels, self.python = work, wheels, python
        self.env = {k: v for k, v in env.items() if not k.startswith(("PIP_", "UV_"))}

    def venv(self, name: str, pip: bool) -> Path:
        prefix = self.work / name
        _check([self.python, "-m", "venv", *([] if pip else ["--without-pip"]), str(prefix)],
               self.env)
        return prefix

    def timed(self, argv: list[str], env: dict[str, str] | None = None
              ) -> tuple[float, float]:
        """Wall and CPU seconds (user + system, the command and its children)."""
        started, cpu = time.monotonic(), _children_cpu()
        _check(argv, {**self.env, **(env or {})})
        return round(time.monotonic() - started, 3), round(_children_cpu() - cpu, 3)

    def pip_args(self, packages: list[str]) -> list[str]:
        return ["install", "-q", "--no-index", "--find-links", str(self.wheels), *packages]


def _children_cpu() -> float:
    """CPU seconds of this process's waited-for children so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _check(argv: list[str], env: dict[str, str]) -> str:
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:4])} ... failed ({done.returncode}): "
                           f"{done.stderr.strip()[-1500:]}")
    return done.stdout


async def _cases(cluster: LocalCluster, work: Path, wheels: Path, packages: list[str],
                 args: argparse.Namespace) -> dict[str, Any]:
    run = _Runner(work, wheels, args.python, dict(os.environ))
    uv = shutil.which("uv") or str(Path(sys.executable).parent / "uv")
    out: dict[str, Any] = {"bench": "depsnap", "packages": packages}

    pip_venv = await asyncio.to_thread(run.venv, "pip-venv", True)
    out["pip_seconds"], out["pip_cpu_seconds"] = await asyncio.to_thread(
        run.timed, [str(pip_venv / "bin" / "pip"), *run.pip_args(packages)])
    out["pip_compiles_bytecode"] = True
    for name, extra in (("uv", []), ("uv_bytecode", ["--compile-bytecode"])):
        venv = await asyncio.to_thread(run.venv, f"{name}-venv", False)
        out[f"{name}_seconds"], out[f"{name}_cpu_seconds"] = await asyncio.to_thread(
            run.timed, [uv, "pip", *run.pip_args(packages), "--python",
                        str(venv / "bin" / "python"), *extra],
            {"UV_CACHE_DIR": str(work / f"uv-cache-{name}")})
    out["installed_bytes"] = _tree_bytes(pip_venv)

    origin = work / "snapshots"
    origin.mkdir()
    await cluster.start_tracker()
    await cluster.start_origin(origin)
    a, c, d = [await cluster.start_agent(i, "r1", name=n) for i, n in enumerate("acd")]
    env = _node_env(cluster, work, origin)

    prefix = work / "venv"
    created = await _depsnap(env, a, "run", "--json", "--prefix", str(prefix), "--python",
                             args.python, "--", "pip", *run.pip_args(packages))
    out.update(create_seconds=created["seconds"], snapshot_bytes=created["pack_bytes"],
               snapshot_files=created["files"], snapshot_packs=created["packs"])
    tree = json.loads((origin / "trees" / created["tree"]).read_text())
    out["snapshot_raw_bytes"] = sum(pack["size"] for pack in tree["packs"])
    out["pack_compression"] = "zstd level 3, frames of 1 MiB raw"
    await _ensure_all(a, tree)  # A seeds: it holds every pack
    prefix.rename(work / "created-venv")

    out.update(await _restores(env, cluster, run, a, created["key"], tree, prefix,
                               args.rounds))
    out["restore_compares_with"] = "pip_seconds, uv_bytecode_seconds (byte-code compiled)"
    for name in ("pip", "uv_bytecode"):
        out[f"{name}_over_restore"] = round(out[f"{name}_seconds"] / out["restore_seconds"], 2)
        out[f"{name}_over_restore_cpu"] = round(
            out[f"{name}_cpu_seconds"] / out["restore_cpu_seconds"], 2)
    t = await cluster.start_agent(9, "r1", name="t")
    out["transfer_seconds"] = await _ensure_all(t, tree)
    await t.child.stop()

    # As a node runs it beside its agent, started before any clock runs.
    server = await cluster.spawn("mount-server", ["fs", "server", "--socket",
                                                  str(work / "mount.sock")], env=env)
    try:
        unrecorded = await _mount_import(env, c, created["key"], work / "mnt-first",
                                         work / "mount.sock")
        await c.child.stop()  # D's only peer is the seed, as C's was: like against like
        out.update(await _mount_import(env, d, created["key"], work / "mnt",
                                       work / "mount.sock"))
        again = await _mount_import(env, d, created["key"], work / "mnt-again",
                                    work / "mount.sock")
        await d.child.stop()
        f = await cluster.start_agent(7, "r1", name="f")
        handler = await _mount_import(env, f, created["key"], work / "mnt-handler",
                                      work / "mount.sock", "--server", "pyfuse3")
        handler_again = await _mount_import(env, f, created["key"],
                                            work / "mnt-handler-again", work / "mount.sock",
                                            "--server", "pyfuse3")
        await f.child.stop()
        g = await cluster.start_agent(6, "r1", name="g")
        copies = await _mount_import(env, g, created["key"], work / "mnt-copies",
                                     work / "mount.sock", "--passthrough")
        copies_again = await _mount_import(env, g, created["key"], work / "mnt-copies-again",
                                           work / "mount.sock", "--passthrough")
        await g.child.stop()
    finally:
        await server.stop()
    for name, case in (("mount_handler_", handler), ("mount_again_", again),
                       ("mount_handler_again_", handler_again),
                       ("mount_passthrough_", copies), ("mount_passthrough_again_", copies_again)):
        out[f"{name}import_seconds"] = case["mount_first_import_seconds"]
        for field in ("seconds", "import_cpu_seconds", "server_cpu_seconds", "read_path",
                      "account", "phases"):
            out[name + field] = case[f"mount_{field}"]
    e = await cluster.start_agent(8, "r1", name="e")
    direct = await _mount_import(env, e, created["key"], work / "mnt-direct", None)
    await e.child.stop()
    out["mount_unrecorded_seconds"] = unrecorded["mount_seconds"]
    out["mount_unrecorded_import_seconds"] = unrecorded["mount_first_import_seconds"]
    out["mount_direct_seconds"] = direct["mount_seconds"]
    out["mount_direct_import_seconds"] = direct["mount_first_import_seconds"]
    out["import_ok"] = all(r["import_ok"] for r in (out, unrecorded, direct, handler, again,
                                                   handler_again, copies, copies_again))
    out["mount_over_handler"] = round(out["mount_first_import_seconds"]
                                      / handler["mount_first_import_seconds"], 3)
    out["mount_cpu_over_handler"] = round(
        (out["mount_server_cpu_seconds"] + out["mount_import_cpu_seconds"])
        / (handler["mount_server_cpu_seconds"] + handler["mount_import_cpu_seconds"]), 3)
    rate = out["snapshot_bytes"] / out["transfer_seconds"]
    out["mount_target_seconds"] = round(1 + out["mount_fetched_bytes"] / rate, 3)

    second = await _depsnap(env, a, "run", "--json", "--prefix", str(work / "second"),
                            "--python", args.python, "--", "pip",
                            *run.pip_args(["numpy", "six"]))
    out.update(second_pack_bytes=second["pack_bytes"],
               second_new_bytes=second["new_pack_bytes"])
    out["load_average"] = round(os.getloadavg()[0], 2)
    return out


async def _restores(env: dict[str, str], cluster: LocalCluster, run: _Runner,
                    seed: AgentHandle, key: str, tree: dict[str, Any], prefix: Path,
                    rounds: int) -> dict[str, Any]:
    """`rounds` restores, each by a fresh agent, alternating with `cp -a` of the tree.
    A restore's CPU time is the restorer's (its extractors included), its agent's and
    the seed's while it served."""
    restores, cpus, copies, fetches, places = [], [], [], [], []
    peer = origin = 0
    for i in range(rounds):
        b = await cluster.start_agent(10 + i, "r1", name=f"b{i}")
        cpu = _children_cpu() + cpu_seconds(seed.child.pid) - cpu_seconds(b.child.pid)
        got = await _depsnap(env, b, "restore", "--json", key, "--prefix", str(prefix),
                             "--no-cache", "--store-dir", str(b.store_dir))
        cpus.append(round(_children_cpu() + cpu_seconds(seed.child.pid)
                          + cpu_seconds(b.child.pid) - cpu, 3))
        restores.append(got["seconds"])
        fetches.append(got["fetch_seconds"])
        places.append(got["place_seconds"])
        peer, origin = await _fetched(b, tree)
        await b.child.stop()
        prefix.rename(run.work / f"restored-venv-{i}")  # nothing is deleted mid-run
        copy = run.work / f"copied-venv-{i}"
        copies.append((await asyncio.to_thread(
            run.timed, ["cp", "-a", str(run.work / "created-venv"), str(copy)]))[0])
    return {"restore_seconds": statistics.median(restores), "restore_rounds": restores,
            "restore_cpu_seconds": statistics.median(cpus),
            "restore_fetch_seconds": statistics.median(fetches),
            "restore_place_seconds": statistics.median(places),
            "copy_seconds": statistics.median(copies), "copy_rounds": copies,
            "restore_peer_bytes": peer, "restore_origin_bytes": origin}


async def _ensure_all(agent: AgentHandle, tree: dict[str, Any]) -> float:
    """Have `agent` fetch every pack of `tree`, all at once; the seconds it took."""
    started = time.monotonic()
    async with agent.client(600) as client:
        await asyncio.gather(*(client.ensure(p["content"]) for p in tree["packs"]))
    return round(time.monotonic() - started, 3)


def _node_env(cluster: LocalCluster, work: Path, origin: Path) -> dict[str, str]:
    env = {k: v for k, v in cluster.env.items() if not k.startswith(("PIP_", "UV_"))}
    return {**env, "BOOTSEER_TRACKER": cluster.tracker_url,
            "BOOTSEER_DEPSNAP_ORIGIN_DIR": str(origin),
            "BOOTSEER_DEPSNAP_ORIGIN_URL": cluster.origin_url,
            "BOOTSEER_DEPSNAP_CACHE": str(work / "file-cache")}


async def _depsnap(env: dict[str, str], agent: AgentHandle, *args: str,
                  json_out: bool = True) -> dict[str, Any]:
    proc = await asyncio.create_subprocess_exec(
        *bootseer_command(), "depsnap", *args,
        env={**env, "BOOTSEER_API_SOCKET": agent.api_socket},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"depsnap {args[0]} failed: {err.decode()[-1500:]}")
    if not json_out:
        return {}
    result: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    return result


async def _fetched(agent: AgentHandle, tree: dict[str, Any]) -> tuple[int, int]:
    async with agent.client(60) as client:
        contents = (await client.status())["contents"]
    held = [contents[p["content"]] for p in tree["packs"] if p["content"] in contents]
    return sum(c["peer_bytes"] for c in held), sum(c["origin_bytes"] for c in held)


async def _mount_import(env: dict[str, str], agent: AgentHandle, key: str, mountpoint: Path,
                        server: Path | None, *flags: str) -> dict[str, Any]:
    """`depsnap mount` on an empty node (through the mount server if given), timed until
    `import pandas` works from the mount; then `depsnap umount`. Which path served the
    reads comes from the mount's own account in its log (`fusefs.bench.readpath`)."""
    from fusefs.bench.readpath import account, read_path

    mountpoint.mkdir()
    node = {**env, "BOOTSEER_API_SOCKET": agent.api_socket,
            "BOOTSEER_LOG_DIR": str(mountpoint.parent),
            **({SERVER_ENV: str(server)} if server else {})}
    started = time.monotonic()
    ready = await _depsnap(node, agent, "mount", key, str(mountpoint), "--store-dir",
                           str(agent.store_dir), *flags)
    mounted = time.monotonic() - started
    # Until the import ended, its start included; through a mount server, its host's since
    # the mount it served before this one ended (its mounts here come one at a time): the
    # host serves every mount of the run, and its CPU counts them all.
    serving = int(ready.get("server_pid", ready["pid"]))
    try:
        children = _children_cpu()
        proc = await asyncio.create_subprocess_exec(
            str(mountpoint / "bin" / "python"), "-c", IMPORT, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE)
        _, err = await proc.communicate()
        seconds = time.monotonic() - started
        import_cpu = _children_cpu() - children
        server_cpu = cpu_seconds(serving) - _SERVED_CPU.get(serving, 0.0)
        async with agent.client(60) as client:
            contents = (await client.status())["contents"]
    finally:
        await _depsnap(node, agent, "umount", str(mountpoint), json_out=False)
    log = Path(ready["log"])
    await _unmounted(log)
    _SERVED_CPU[serving] = cpu_seconds(serving)
    fetched = sum(contents[p]["peer_bytes"] + contents[p]["origin_bytes"]
                  for p in ready["packs"] if p in contents)
    return {"mount_seconds": round(mounted, 3), "mount_first_import_seconds": round(seconds, 3),
            "mount_fetched_bytes": fetched, "mount_hot_frames": ready["hot_frames"],
            "mount_prefetch_chunks": _prefetched(ready, log), "mount_tree": ready.get("tree_kind"),
            "mount_phases": ready.get("phases"),
            "mount_server": ready.get("server"), "mount_read_path": read_path(log),
            "mount_import_cpu_seconds": round(import_cpu, 3),
            "mount_server_cpu_seconds": round(server_cpu, 3),
            "mount_account": account(log), "import_ok": proc.returncode == 0,
            **({"import_error": err.decode()[-500:]} if proc.returncode else {})}


def _prefetched(ready: dict[str, Any], log: Path) -> int | None:
    """The chunks the mount handed its agent from the record: in its "mounted" line if the
    prefetch had asked by then (the mount does not wait for it), else in its last words."""
    if ready.get("prefetch_chunks") is not None:
        return int(ready["prefetch_chunks"])
    found = re.findall(r"'prefetch_chunks': (\d+)", log.read_text(errors="replace"))
    return int(found[-1]) if found else None


async def _unmounted(log: Path, timeout_s: float = 30.0) -> None:
    """Until the serving process has logged its unmount (`umount` returns once the mount is
    gone; the account of what it served is the process's last words)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if log.exists() and "unmounted " in log.read_text(errors="replace"):
            return
        await asyncio.sleep(0.05)


def _tree_bytes(root: Path) -> int:
    return sum(p.lstat().st_size for p in root.rglob("*") if p.is_file() and not p.is_symlink())
