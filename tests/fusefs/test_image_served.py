"""`bootseer image run` with its mount served by the node's mount server.

The image, registry, tracker and agents of `test_image`; a real `bootseer fs
server` (its host serves kernel-protocol mounts on this machine), named to
`image run` by BOOTSEER_MOUNT_SERVER as a node's agent environment does.
What is proved:

- through the server, `image run` runs the command, returns its exit status,
  saves the hot-block record before it returns (a second agent's launch
  prefetches it, from the first agent) and reports this run's bytes from
  peers and from the registry, which the serving side counted; and the
  `image run` process itself imported no aiohttp (`python -X importtime`);
- with the variable set and no server answering, `image run` says so and
  forks its mount's serving process itself;
- an `image run` killed with SIGKILL leaves no mount: its handle (or the
  serving process the server forked, for a pyfuse3 mount) watches it
  (`end_with_client`) and stops the mount; and its guard deletes its runc
  container and unmounts the runtime's tmpfs and overlay: no mount, no
  process, no scratch directory is left.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.procs import processes_naming
from helpers.registry import RunningRegistry
from test_image import TEST_BOUND_S, agent_flags, cluster_of, image, index, push
from test_mount_server import start_server

from fusefs.request import SERVER_ENV
from fusefs.testing.sample import BuiltImage
from p2p.testing.localcluster import LocalCluster

__all__ = ["image"]  # the module's fixture, shared with test_image


async def image_run(cluster: LocalCluster, server: Path, *args: str
                    ) -> tuple[int, dict[str, object], str]:
    """`python -X importtime -m fusefs.image run --json ...` through the server: (status,
    timeline, stderr)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-X", "importtime", "-m", "fusefs.image", "run", "--json", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**cluster.env, SERVER_ENV: str(server)})
    out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, json.loads(out.decode().splitlines()[-1]), err.decode()


def imported(err: str) -> set[str]:
    """The modules a `-X importtime` run imported, from its stderr."""
    return {line.rsplit("|", 1)[1].strip() for line in err.splitlines()
            if line.startswith("import time:") and line.count("|") == 2}


async def test_image_run_through_the_server_runs_records_and_counts_its_bytes(
        fuse_ready: None, registry: RunningRegistry, image: BuiltImage, tmp_path: Path) -> None:
    ref = await push(registry, "test/served", image)
    async with asyncio.timeout(TEST_BOUND_S), cluster_of(tmp_path, 2) as (cluster, agents):
        await index(cluster, ref, agents[0])
        server = await start_server(tmp_path / "mount.sock", env=cluster.env)
        try:
            status, lazy, err = await image_run(
                cluster, server.socket, *agent_flags(cluster, agents[0]), "--record", ref,
                "--", "sh", "-c", "cat /data/hot.bin > /dev/null; exit 5")
            assert status == 5 and lazy["exit_status"] == 5, err[-3000:]
            assert lazy["served_by"] == "mount server", lazy
            assert "starting the mount process here" not in err
            record = lazy["record"]
            assert isinstance(record, dict) and record["recorded_chunks"] > 0, lazy
            assert record["record_runs"] == 1 and record["record_chunks"] > 0
            assert lazy["origin_bytes"] and lazy["peer_bytes"] == 0, lazy
            assert lazy["startup_s"] is not None and lazy["seconds"] > 0
            modules = imported(err)
            assert "fusefs.image.run" in modules, "not an importtime listing"
            assert not {m for m in modules if m.split(".")[0] == "aiohttp"
                        or m in ("fusefs.image.catalog", "p2p.agentclient")}, \
                sorted(m for m in modules if m.startswith(("aiohttp", "fusefs.image")))

            status, warm, err = await image_run(
                cluster, server.socket, *agent_flags(cluster, agents[1]), ref, "--",
                "sh", "-c", "cat /data/hot.bin > /dev/null")
            assert status == 0, err[-3000:]
            assert warm["served_by"] == "mount server"
            assert isinstance(warm["prefetch_chunks"], int) and warm["prefetch_chunks"] > 0, \
                "the first run's record was not saved before it returned"
            assert warm["peer_bytes"] and warm["origin_bytes"] == 0, warm
        finally:
            await server.stop()


async def test_with_no_server_answering_image_run_says_so_and_forks_its_mount(
        fuse_ready: None, registry: RunningRegistry, image: BuiltImage, tmp_path: Path) -> None:
    ref = await push(registry, "test/served-none", image)
    async with asyncio.timeout(TEST_BOUND_S), cluster_of(tmp_path, 1) as (cluster, agents):
        await index(cluster, ref, agents[0])
        status, timeline, err = await image_run(
            cluster, tmp_path / "nobody.sock", *agent_flags(cluster, agents[0]), ref, "--",
            "sh", "-c", "cat /data/hot.bin > /dev/null; exit 3")
        assert status == 3, err[-3000:]
        assert "no mount server answers at" in err and "starting the mount process here" in err
        assert timeline["served_by"] == "forked" and timeline["origin_bytes"], timeline


def fuse_mounts_under(where: Path) -> list[str]:
    with open("/proc/self/mountinfo") as f:
        fields = [line.split(" - ") for line in f]
    return [left.split()[4] for left, right in fields
            if left.split()[4].startswith(f"{where}/") and right.startswith("fuse")]


def mounts_under(where: Path) -> list[str]:
    with open("/proc/self/mountinfo") as f:
        return [line.split()[4] for line in f if line.split()[4].startswith(f"{where}/")]


def runc_containers_in(where: Path) -> list[str]:
    listed = json.loads(subprocess.run(["runc", "list", "--format", "json"], check=True,
                                       capture_output=True, text=True).stdout or "null")
    return [c["id"] for c in listed or [] if c["bundle"].startswith(f"{where}/")]


@pytest.mark.parametrize(("flags", "runtime"), [((), "runc"), (("--no-passthrough",), "bwrap")],
                         ids=["hosted-runc", "forked-bwrap"])
async def test_an_image_run_killed_by_sigkill_leaves_no_mount_or_process_behind(
        fuse_ready: None, registry: RunningRegistry, image: BuiltImage, tmp_path: Path,
        flags: tuple[str, ...], runtime: str) -> None:
    """Hosted: the server's host serves the mount, its handle watches `image run`. Forked
    (pyfuse3, with --no-passthrough): the server forks a serving process, which does. The
    runtime's tmpfs and overlay, and runc's container (runc does not end with its parent),
    are removed by image run's guard."""
    ref = await push(registry, f"test/served-killed{'-'.join(flags)}", image)
    scratch = tmp_path / "tmp"  # image run's scratch directories, and its runtime's
    scratch.mkdir()
    async with asyncio.timeout(TEST_BOUND_S), cluster_of(tmp_path, 1) as (cluster, agents):
        await index(cluster, ref, agents[0])
        server = await start_server(tmp_path / "mount.sock", env=cluster.env)
        killed = None
        try:
            killed = subprocess.Popen(
                [sys.executable, "-m", "fusefs.image", "run", *agent_flags(cluster, agents[0]),
                 "--runtime", runtime, *flags, ref, "--", "sh", "-c", "echo up; sleep 120"],
                env={**cluster.env, SERVER_ENV: str(server.socket), "TMPDIR": str(scratch)},
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
            assert killed.stdout is not None
            line = await asyncio.to_thread(killed.stdout.readline)
            assert line == b"up\n", line
            assert len(fuse_mounts_under(scratch)) == 1, "the image was not mounted"
            assert len(mounts_under(scratch)) == 3, "not the image, a tmpfs and an overlay"
            killed.send_signal(signal.SIGKILL)
            await asyncio.to_thread(killed.wait)
            for _ in range(300):  # bounded: 30 s
                if not (mounts_under(scratch) or processes_naming(str(scratch))):
                    break
                await asyncio.sleep(0.1)
            assert not fuse_mounts_under(scratch), "the image mount outlived its image run"
            assert not mounts_under(scratch), "the runtime's tmpfs and overlay stayed"
            assert not processes_naming(str(scratch)), "runc or bwrap outlived image run"
            if runtime == "runc":
                assert not runc_containers_in(scratch), "the container outlived image run"
            assert list(scratch.iterdir()) == [], "its scratch directory stayed"
        finally:
            if killed is not None and killed.poll() is None:
                killed.kill()
                killed.wait()
            if runtime == "runc":  # what the guard should have removed, should it fail
                for container in runc_containers_in(scratch):
                    subprocess.run(["runc", "delete", "--force", container], check=False)
            if killed is not None and killed.stdout is not None:
                await asyncio.to_thread(killed.stdout.read)  # the orphaned command's end
                killed.stdout.close()
            for where in sorted(mounts_under(scratch), reverse=True):
                subprocess.run(["umount", "-l", where], check=False)
            await server.stop()
