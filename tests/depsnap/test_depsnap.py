"""Dependency snapshots end to end: real wheels, real pip, a tracker, an origin, agents.

A tracker, an HTTP origin serving the snapshot directory and agents run on
127.0.0.1 (`p2p.testing.localcluster`); `bootseer depsnap ...` runs as a child
process, as a job launcher would run it. Wheels are real (numpy, tabulate
with its console script, six), downloaded once into a local wheelhouse
(depsnap/testing/wheelhouse.py) and installed with `--no-index --find-links`. What is
proved:

- `depsnap run` on agent A installs and publishes; on agent B (empty store)
  the same command restores instead of installing, and the restored venv is
  the installed one, path for path (kinds, bytes, modes, mtimes, link
  targets), and works: `import numpy` computes, the `tabulate` console
  script runs;
- a failing or interrupted command publishes nothing and returns its status;
- two runs of one key at once end with one published snapshot;
- a full disk during restore leaves no partial tree and says why; a key
  nobody published is a one-line error; a restore killed mid-fetch leaves
  nothing at the prefix, and the next restore there removes what it left.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import signal
import stat
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from helpers.waiting import until

from depsnap.mount import MountOptions
from depsnap.testing.wheelhouse import PYTHON
from fusefs.mount import Mount
from p2p.testing.localcluster import AgentHandle, LocalCluster, bootseer_command

PINS = "numpy==2.2.6\ntabulate==0.9.0\n"


@dataclass
class Node:
    agent: AgentHandle
    env: dict[str, str]


@asynccontextmanager
async def swarm(tmp_path: Path, agents: int, origin: Path | None = None
                ) -> AsyncIterator[tuple[LocalCluster, list[Node]]]:
    """A tracker, an origin serving `origin` (default: a new tmp_path/snapshots) and
    `agents` agents, with the environment `bootseer depsnap` needs on each node."""
    cluster = LocalCluster(tmp_path / "cluster")
    try:
        if origin is None:
            origin = tmp_path / "snapshots"
            origin.mkdir()
        await cluster.start_tracker()
        await cluster.start_origin(origin)
        nodes = [await add_node(cluster, tmp_path, origin, i) for i in range(agents)]
        yield cluster, nodes
    finally:
        await cluster.stop()


async def add_node(cluster: LocalCluster, tmp_path: Path, origin: Path, index: int,
                   config: dict[str, Any] | None = None) -> Node:
    """Agent `index` (with `config`), and the environment `bootseer depsnap` needs there."""
    agent = await cluster.start_agent(index, "r1", config)
    env = {**cluster.env, "BOOTSEER_TRACKER": cluster.tracker_url,
           "BOOTSEER_API_SOCKET": agent.api_socket,
           "BOOTSEER_STORE_DIR": str(agent.store_dir),
           "BOOTSEER_LOG_DIR": str(tmp_path),  # where `depsnap mount` logs
           "BOOTSEER_DEPSNAP_ORIGIN_DIR": str(origin),
           "BOOTSEER_DEPSNAP_ORIGIN_URL": cluster.origin_url,
           "BOOTSEER_DEPSNAP_CACHE": str(tmp_path / f"cache{index}")}
    return Node(agent, {k: v for k, v in env.items() if not k.startswith("PIP_")})


async def depsnap(node: Node, *args: str, cwd: Path, private: Path | None = None,
                  env: dict[str, str] | None = None) -> tuple[int, dict[str, Any], str]:
    """Run `bootseer depsnap ARGS` for `node` (with `env` added to its environment); with
    `private`, in a mount namespace of its own with a fresh tmpfs at `private` (two
    "nodes" on one host, one path each)."""
    wrap = [] if private is None else [
        "unshare", "--mount", "--propagation", "private", "sh", "-c",
        'mount -t tmpfs tmpfs "$0" && exec "$@"', str(private)]
    proc = await asyncio.create_subprocess_exec(
        *wrap, *bootseer_command(), "depsnap", *args, cwd=cwd, env={**node.env, **(env or {})},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 600)
    lines = out.decode().strip().splitlines()
    summary = json.loads(lines[-1]) if lines and lines[-1].startswith("{") else {}
    assert proc.returncode is not None
    return proc.returncode, summary, err.decode()


def install_args(prefix: Path, wheels: Path, *packages: str) -> list[str]:
    return ["run", "--json", "--prefix", str(prefix), "--python", PYTHON, "--",
            "pip", "install", "-q", "--no-index", "--find-links", str(wheels), *packages]


def uv_install_args(prefix: Path, wheels: Path, *packages: str) -> list[str]:
    uv = str(Path(sys.executable).parent / "uv")  # uv: the other installer depsnap runs
    return ["run", "--json", "--prefix", str(prefix), "--python", PYTHON, "--", uv, "pip",
            "install", "-q", "--no-index", "--find-links", str(wheels), *packages]


def tree_of(root: Path, made_at: Path | None = None) -> dict[str, tuple[Any, ...]]:
    """Every path under root: kind, permission bits, mtime, and bytes or link target. A tree
    restored at another prefix than the one it was `made_at` names its own prefix in script
    #! lines and activate files (depsnap.relocate): read back, they name `made_at` again,
    so the two trees compare byte for byte everywhere else."""
    out: dict[str, tuple[Any, ...]] = {}
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        rel = str(path.relative_to(root))
        if stat.S_ISLNK(st.st_mode):
            out[rel] = ("link", os.readlink(path))
        elif stat.S_ISDIR(st.st_mode):
            out[rel] = ("dir", stat.S_IMODE(st.st_mode), st.st_mtime_ns)
        else:
            data = path.read_bytes()
            if made_at is not None:
                data = data.replace(str(root).encode(), str(made_at).encode())
            out[rel] = ("file", stat.S_IMODE(st.st_mode), st.st_mtime_ns, data)
    return out


async def test_run_creates_on_one_agent_and_restores_a_working_venv_on_another(
        tmp_path: Path, wheels: Path) -> None:
    work = tmp_path / "job"
    work.mkdir()
    (work / "requirements.txt").write_text(PINS)
    prefix = tmp_path / "venv"
    async with swarm(tmp_path, 3) as (_, (a, b, c)):
        args = install_args(prefix, wheels, "-r", "requirements.txt")
        status, created, err = await depsnap(a, *args, cwd=work)
        assert status == 0, err
        assert (created["action"], created["won"], created["exit_status"]) == (
            "created", True, 0), created
        assert any(line.startswith("numpy==2.2.6") for line in
                   json.loads((tmp_path / "snapshots" / "trees" / created["tree"]
                               ).read_text())["resolved"])
        installed = tmp_path / "installed"
        prefix.rename(installed)

        status, restored, err = await depsnap(b, *args, cwd=work,
                                              env={"BOOTSEER_PROGRESS_EVERY_S": "0"})
        assert status == 0, err
        assert (restored["action"], restored["key"]) == ("restored", created["key"]), restored
        shown = [line for line in err.splitlines()
                 if line.startswith(f"restore {created['key'][:12]}: ")]
        assert shown and " of " in shown[-1], err[-2000:]  # a log gets plain progress lines
        assert restored["fetched_packs"] == created["packs"] > 1
        assert tree_of(prefix) == tree_of(installed)

        check = subprocess.run([str(prefix / "bin" / "python"), "-c",
                                "import numpy; print(int(numpy.arange(10).sum()))"],
                               capture_output=True, text=True, check=False)
        assert (check.returncode, check.stdout.strip()) == (0, "45"), check.stderr
        script = subprocess.run([str(prefix / "bin" / "tabulate"), "--help"],
                                capture_output=True, text=True, check=False)
        assert script.returncode == 0 and "usage" in script.stdout.lower(), script.stderr

        async with b.agent.client(30) as client:
            contents = (await client.status())["contents"]
        assert sum(c["origin_bytes"] + c["peer_bytes"] for c in contents.values()) \
            >= restored["fetched_bytes"]

        await lazy_mount_imports_numpy(c, created["key"], tmp_path / "mnt")

        # The same snapshot again on B: every file links from B's local cache.
        again = tmp_path / "again"
        status, second, err = await depsnap(b, "restore", "--json", created["key"],
                                            "--prefix", str(again), cwd=work)
        assert status == 0, err
        assert (second["fetched_packs"], second["cached_files"]) == (0, second["files"])
        # At another prefix, the same tree but for the entry points, which name where they
        # are now; the files they replaced (hard links into the cache) are left alone.
        before, after = tree_of(installed), tree_of(again)
        assert after.keys() == before.keys()
        moved = {rel for rel in after if after[rel] != before[rel]}
        assert {"bin/activate", "bin/tabulate"} <= moved
        assert all(rel.startswith("bin/") for rel in moved), moved
        assert (again / "bin" / "tabulate").read_text().startswith(f"#!{again}/bin/python")
        assert (prefix / "bin" / "tabulate").read_text().startswith(  # B's first restore
            f"#!{prefix}/bin/python")
        assert f"VIRTUAL_ENV={again}" in (again / "bin" / "activate").read_text() \
            or f"VIRTUAL_ENV='{again}'" in (again / "bin" / "activate").read_text()
        table = subprocess.run([str(again / "bin" / "tabulate"), "--help"],
                               capture_output=True, text=True, timeout=60)
        assert table.returncode == 0 and "Usage" in table.stdout, table.stderr


async def pack_bytes_held(node: Node, packs: list[str]) -> int:
    async with node.agent.client(30) as client:
        contents = (await client.status())["contents"]
    return sum(contents[p]["origin_bytes"] + contents[p]["peer_bytes"]
               for p in packs if p in contents)


async def lazy_mount_imports_numpy(node: Node, key: str, mountpoint: Path) -> None:
    """Mount on a node with an empty store: listing fetches nothing, importing numpy
    fetches only part of the packs."""
    mountpoint.mkdir()
    opts = MountOptions(key, mountpoint, node.env["BOOTSEER_TRACKER"],
                        node.agent.api_socket, node.agent.store_dir)
    async with await Mount.spawn(opts.argv(), mountpoint, mountpoint.parent / "mount.log",
                                 env=node.env) as mount:
        packs = mount.ready["packs"]
        names = await asyncio.to_thread(lambda: [p.name for p in mountpoint.rglob("*")])
        assert "numpy" in names and "tabulate" in names
        assert not (mountpoint / "lib/python3.11/site-packages/numpy/nothing.py").exists()
        assert await pack_bytes_held(node, packs) == 0
        check = await asyncio.create_subprocess_exec(
            str(mountpoint / "bin" / "python"), "-c", "import numpy; print(numpy.ones(3).sum())",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await check.communicate()
        assert (check.returncode, out.strip()) == (0, b"3.0"), err
        held = await pack_bytes_held(node, packs)
        total = sum(p.stat().st_size for p in mountpoint.rglob("*")
                    if p.is_file() and not p.is_symlink())
        assert 0 < held < total, (held, total)


def key_of(cwd: Path, python: str, *command: str, prefix: str = "/opt/venv",
           env: dict[str, str] | None = None) -> dict[str, Any]:
    done = subprocess.run([*bootseer_command(), "depsnap", "key", "--json", "--prefix",
                           prefix, "--python", python, "--", *command], cwd=cwd,
                          capture_output=True, text=True, check=False, env=env)
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def test_a_key_does_not_depend_on_what_the_prefix_holds_now(tmp_path: Path) -> None:
    """`pip` runs from the venv `depsnap run` makes, whatever is at the prefix or on PATH
    now: a node that restored the prefix before (or has no pip on PATH) gets the same key
    as one that starts empty."""
    (tmp_path / "req.txt").write_text(PINS)
    no_pip = tmp_path / "empty-bin"
    no_pip.mkdir()
    env = {**os.environ, "PATH": str(no_pip)}
    prefix = tmp_path / "venv"
    empty = key_of(tmp_path, PYTHON, "pip", "install", "-r", "req.txt", prefix=str(prefix),
                   env=env)
    subprocess.run([PYTHON, "-m", "venv", "--without-pip", str(prefix)], check=True)
    held = key_of(tmp_path, PYTHON, "pip", "install", "-r", "req.txt", prefix=str(prefix),
                  env=env)
    assert held == empty
    assert empty["inputs"]["installer"].startswith("pip ")


def test_depsnap_key_hashes_contents_in_any_order_and_shows_its_inputs(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("numpy==2.2.6\ntabulate==0.9.0  # table\n")
    (tmp_path / "b.txt").write_text("Tabulate==0.9.0\n\nnumpy==2.2.6\n")
    one = key_of(tmp_path, PYTHON, "pip", "install", "-r", "a.txt", "six")
    two = key_of(tmp_path, PYTHON, "pip", "install", "six", "-r", "b.txt")
    assert one == two
    assert one["inputs"]["files"] == [{"option": "-r",
                                       "lines": ["numpy==2.2.6", "tabulate==0.9.0"]}]
    assert one["inputs"]["python"]["executable"] == PYTHON
    (tmp_path / "b.txt").write_text("numpy==2.2.5\ntabulate==0.9.0\n")
    assert key_of(tmp_path, PYTHON, "pip", "install", "six", "-r", "b.txt")["key"] != one["key"]
    other_python = key_of(tmp_path, sys.executable, "pip", "install", "-r", "a.txt", "six")
    assert other_python["key"] != one["key"]
    assert other_python["inputs"]["python"] != one["inputs"]["python"]


async def test_a_failed_or_interrupted_install_publishes_nothing(
        tmp_path: Path, wheels: Path) -> None:
    async with swarm(tmp_path, 1) as (_, (a,)):
        status, summary, _ = await depsnap(
            a, *install_args(tmp_path / "v1", wheels, "no-such-package==1"), cwd=tmp_path)
        assert status == 1 and summary["action"] == "failed", summary
        # Interrupted as by Ctrl-C: SIGINT at its default, even where the test itself was
        # started with SIGINT ignored (a background job of a non-interactive shell).
        ctrl_c = ("import os, signal; signal.signal(signal.SIGINT, signal.SIG_DFL); "
                  "os.kill(os.getpid(), signal.SIGINT)")
        interrupted = ["run", "--json", "--prefix", str(tmp_path / "v2"), "--python", PYTHON,
                       "--", PYTHON, "-c", ctrl_c]
        status, summary, _ = await depsnap(a, *interrupted, cwd=tmp_path)
        assert status == 130 and summary["published"] is False, summary
        assert not (tmp_path / "snapshots" / "trees").exists()


async def test_two_nodes_creating_one_key_at_once_publish_one_snapshot(
        tmp_path: Path, wheels: Path) -> None:
    private = tmp_path / "node"
    private.mkdir()
    uv_args = uv_install_args(private / "venv", wheels, "six")
    async with swarm(tmp_path, 2) as (_, (a, b)):
        results = await asyncio.gather(*(
            depsnap(node, *uv_args, cwd=tmp_path, private=private) for node in (a, b)))
        assert [status for status, _, _ in results] == [0, 0], results
        summaries = [s for _, s, _ in results]
        # Both may have installed (neither saw the other's name yet): one name won, and
        # the other node reports the winner's tree (or restored it, if it came later).
        assert len({s["tree"] for s in summaries}) == 1, summaries
        assert sum(s.get("won", False) for s in summaries) == 1, summaries


async def republish(cluster: LocalCluster, origin: Path, tree: dict[str, Any], key: str) -> None:
    """Publish `tree` (a tree manifest as JSON) under the name of `key`, as a hostile or
    buggy publisher could."""
    from depsnap.capture import publish_file
    from depsnap.key import key_name
    from depsnap.snapshot import KIND
    from p2p.tracker_client import TrackerClient

    manifest = publish_file(json.dumps(tree).encode(), origin, cluster.origin_url, KIND,
                            "trees")
    async with TrackerClient(cluster.tracker_url, cluster.secret) as tracker:
        await tracker.put_manifest(manifest)
        await tracker.put_name(key_name(key), manifest.content_id)


async def test_restore_refuses_bad_snapshots_and_leaves_nothing_behind(
        tmp_path: Path, wheels: Path) -> None:
    origin = tmp_path / "snapshots"
    async with swarm(tmp_path, 3) as (cluster, (a, b, c)):
        status, created, err = await depsnap(
            a, *install_args(tmp_path / "venv", wheels, "six"), cwd=tmp_path)
        assert status == 0, err
        tree = json.loads((origin / "trees" / created["tree"]).read_text())

        async def refused(node: Node, key: str, prefix: Path, why: str) -> None:
            status, _, err = await depsnap(node, "restore", key, "--prefix", str(prefix),
                                           cwd=tmp_path)
            assert status == 2 and why in err and "Traceback" not in err, err
            assert not prefix.exists()
            assert not [p for p in prefix.parent.iterdir() if ".depsnap-" in p.name]

        await refused(b, "0" * 64, tmp_path / "r0", "no snapshot is published for key")
        await refused(b, "ab", tmp_path / "r0", "not a snapshot key")

        other = "1" * 64  # a tree whose key is not the one it is published under
        await republish(cluster, origin, tree, other)
        await refused(b, other, tmp_path / "r1", f"is the snapshot of key {created['key']}")

        for n, (path, bad) in enumerate([("lib", "../escape"), ("lib64", "/etc")]):
            evil = json.loads(json.dumps(tree))
            row = next(r for r in evil["entries"] if r[0] == path)
            row[0 if path == "lib" else 4] = bad
            evil["key"] = f"{n + 2}" * 64
            await republish(cluster, origin, evil, evil["key"])
            await refused(b, evil["key"], tmp_path / f"r{n + 2}",
                          "'..'" if path == "lib" else "leaves the prefix")

        # A pack corrupted at the origin: C (nothing cached) refuses it, keeps nothing.
        pack = max((origin / "packs").iterdir(), key=lambda p: p.stat().st_size)
        data = bytearray(pack.read_bytes())
        data[len(data) // 2] ^= 0xFF
        pack.write_bytes(bytes(data))
        await refused(c, created["key"], tmp_path / "r9", "cannot fetch pack")
        data[len(data) // 2] ^= 0xFF
        pack.write_bytes(bytes(data))

        # Not this agent's store: the packs come through the agent's API instead.
        status, _, err = await depsnap(b, "restore", "--json", created["key"], "--prefix",
                                       str(tmp_path / "r10"), "--store-dir", str(tmp_path),
                                       cwd=tmp_path)
        assert status == 0 and "through the agent instead" in err, err
        assert tree_of(tmp_path / "r10", tmp_path / "venv") == tree_of(tmp_path / "venv")

        small = tmp_path / "small"  # a full disk: no partial tree, and it says so
        small.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(small)],
                       check=True)
        try:
            await refused(b, created["key"], small / "venv", "no space left")
            assert list(small.iterdir()) == []
        finally:
            subprocess.run(["umount", str(small)], check=True)


async def test_a_killed_restore_leaves_no_tree_at_the_prefix_and_the_next_one_clears_it(
        tmp_path: Path, wheels: Path) -> None:
    origin = tmp_path / "snapshots"
    async with swarm(tmp_path, 1) as (cluster, (a,)):
        status, created, err = await depsnap(
            a, *install_args(tmp_path / "venv", wheels, "numpy"), cwd=tmp_path)
        assert status == 0, err
        # B downloads at 10 MB/s: its restore of numpy (about 40 MB) is still fetching
        # when it is killed.
        b = await add_node(cluster, tmp_path, origin, 1, {"download_mbps": 10})
        prefix = tmp_path / "restored"
        proc = await asyncio.create_subprocess_exec(
            *bootseer_command(), "depsnap", "restore", created["key"], "--prefix",
            str(prefix), env=b.env, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL)

        def partial() -> list[Path]:
            return [p for p in tmp_path.iterdir() if p.name.startswith(".restored.depsnap-")]

        async def building() -> bool:
            return bool(partial())

        await until(building, "the restore starts building its tree")
        proc.kill()
        assert await proc.wait() == -9
        assert not prefix.exists() and partial()

        status, _, err = await depsnap(b, "restore", "--json", created["key"], "--prefix",
                                       str(prefix), cwd=tmp_path)
        assert status == 0, err
        assert "left by a restore that did not finish" in err, err
        assert not [p for p in tmp_path.iterdir() if ".depsnap-" in p.name]
        assert tree_of(prefix, tmp_path / "venv") == tree_of(tmp_path / "venv")


async def test_a_snapshot_pushed_to_a_registry_restores_from_its_blobs(
        tmp_path: Path, wheels: Path) -> None:
    from helpers.registry import running_registry

    from depsnap.registry import PACK_TYPE, PACKED_TREE_TYPE, SNAPSHOT_TYPE, TREE_TYPE, snapshot_tag
    from p2p.origin.oci import RegistryClient

    with running_registry(tmp_path / "registry") as registry:
        async with swarm(tmp_path, 2) as (_, (a, b)):
            repo = f"{registry.address}/depsnap"
            pusher = Node(a.agent, {**a.env, "BOOTSEER_DEPSNAP_REGISTRY": repo})
            status, created, err = await depsnap(
                pusher, *uv_install_args(tmp_path / "venv", wheels, "six"), cwd=tmp_path)
            assert status == 0 and created["won"], err
            assert not (tmp_path / "snapshots" / "packs").exists()  # all went to the registry
            async with RegistryClient() as client:
                pulled = await client.get_manifest(registry.ref("depsnap",
                                                                snapshot_tag(created["key"])))
            assert pulled.manifest.artifact_type == SNAPSHOT_TYPE
            assert [la.media_type for la in pulled.manifest.layers] == \
                [TREE_TYPE] + [PACK_TYPE] * created["packs"] + [PACKED_TREE_TYPE]

            status, _, err = await depsnap(b, "restore", "--json", created["key"],
                                           "--prefix", str(tmp_path / "r"), cwd=tmp_path)
            assert status == 0, err
            assert tree_of(tmp_path / "r", tmp_path / "venv") == tree_of(tmp_path / "venv")
            async with b.agent.client(30) as client:
                contents = (await client.status())["contents"]
            assert sum(c["origin_bytes"] for c in contents.values()) >= created["pack_bytes"]


async def test_a_snapshot_its_tracker_does_not_know_is_found_in_the_origins_key_record(
        tmp_path: Path, wheels: Path) -> None:
    origin = tmp_path / "snapshots"
    origin.mkdir()
    async with swarm(tmp_path / "one", 1, origin) as (_, (a,)):
        status, created, err = await depsnap(
            a, *uv_install_args(tmp_path / "venv", wheels, "six"), cwd=tmp_path)
        assert status == 0, err
        assert (origin / "keys" / f"{created['key']}.json").exists()
        async with swarm(tmp_path / "two", 1, origin) as (_, (b,)):  # a tracker of its own
            status, restored, err = await depsnap(b, "restore", "--json", created["key"],
                                                  "--prefix", str(tmp_path / "r"),
                                                  cwd=tmp_path)
            assert status == 0, err
            assert restored["tree"] == created["tree"]
            assert tree_of(tmp_path / "r", tmp_path / "venv") == tree_of(tmp_path / "venv")
            await mount_and_umount(b, created["key"], tmp_path / "m")


async def mount_and_umount(node: Node, key: str, mountpoint: Path) -> None:
    """`depsnap mount` leaves a serving process behind; `depsnap umount` ends it."""
    mountpoint.mkdir()
    status, ready, err = await depsnap(node, "mount", key, str(mountpoint), cwd=mountpoint.parent)
    assert status == 0 and ready["event"] == "mounted", err
    try:
        check = subprocess.run([str(mountpoint / "bin" / "python"), "-c", "import six"],
                               capture_output=True, text=True, check=False)
        assert check.returncode == 0, check.stderr
    finally:
        status, _, err = await depsnap(node, "umount", str(mountpoint), cwd=mountpoint.parent)

        async def gone() -> bool:
            return not Path(f"/proc/{ready['pid']}").exists()

        await until(gone, "the mount's serving process exits after umount")
    assert status == 0, err


async def test_a_mount_refuses_a_file_whose_bytes_do_not_match_the_trees_digest(
        tmp_path: Path, wheels: Path) -> None:
    """A tree that names other bytes for a file than its pack holds (a hostile publisher's)
    is refused by restore; a mount must refuse that file too (EIO), and serve the rest."""
    origin = tmp_path / "snapshots"
    async with swarm(tmp_path, 1) as (cluster, (a,)):
        status, created, err = await depsnap(
            a, *install_args(tmp_path / "venv", wheels, "six"), cwd=tmp_path)
        assert status == 0, err
        tree = json.loads((origin / "trees" / created["tree"]).read_text())
        row = next(r for r in tree["entries"] if r[0].endswith("site-packages/six.py"))
        real, forged = row[5], "f" * 64
        for r in tree["entries"]:
            if r[1] == "file" and r[5] == real:
                r[5] = forged
        for pack in tree["packs"]:
            for member in pack["members"]:
                if member[0] == real:
                    member[0] = forged
        tree["key"] = "3" * 64
        await republish(cluster, origin, tree, tree["key"])
        mountpoint = tmp_path / "m"
        mountpoint.mkdir()
        status, ready, err = await depsnap(a, "mount", tree["key"], str(mountpoint),
                                           cwd=tmp_path)
        assert status == 0 and ready["event"] == "mounted", err
        try:
            with pytest.raises(OSError) as refused:
                (mountpoint / row[0]).read_bytes()
            assert refused.value.errno == errno.EIO
            assert (mountpoint / "pyvenv.cfg").read_bytes() == \
                (tmp_path / "venv" / "pyvenv.cfg").read_bytes()
        finally:
            status, _, err = await depsnap(a, "umount", str(mountpoint), cwd=tmp_path)
        assert status == 0, err


async def test_an_import_through_a_snapshot_mount_survives_an_agent_restart(
        tmp_path: Path, wheels: Path) -> None:
    """Issue 35: the agent of the reading node is killed (SIGKILL) and started again while
    `import numpy` reads through the mount; the import pauses and succeeds."""
    work = tmp_path / "job"
    work.mkdir()
    (work / "requirements.txt").write_text(PINS)
    slow = {"download_mbps": 8.0}  # numpy's libraries take a few seconds to arrive
    async with swarm(tmp_path, 1) as (cluster, (a,)):
        args = install_args(tmp_path / "venv", wheels, "-r", "requirements.txt")
        status, created, err = await depsnap(a, *args, cwd=work)
        assert status == 0, err
        b = await add_node(cluster, tmp_path, tmp_path / "snapshots", 1, slow)
        where = tmp_path / "mnt"
        where.mkdir()
        opts = MountOptions(created["key"], where, b.env["BOOTSEER_TRACKER"],
                            b.agent.api_socket, b.agent.store_dir)
        async with await Mount.spawn(opts.argv(), where, tmp_path / "mount.log",
                                     env=b.env) as mount:
            assert mount.ready["packs"]
            importer = await asyncio.create_subprocess_exec(
                str(where / "bin" / "python"), "-c", "import numpy; print(numpy.ones(3).sum())",
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
            await asyncio.sleep(1.0)
            assert importer.returncode is None, "the import finished before the restart"
            cluster.children.remove(b.agent.child)
            await b.agent.child.stop(signal.SIGKILL)
            await asyncio.sleep(1.0)
            assert importer.returncode is None, "the import ended with no agent to serve it"
            await cluster.start_agent(1, "r1", slow)  # its store and socket again
            out, err = await asyncio.wait_for(importer.communicate(), 180)
            assert (importer.returncode, out.strip()) == (0, b"3.0"), err.decode()[-2000:]
        assert "waits for the agent" in (tmp_path / "mount.log").read_text()
