"""`bootseer launch` end to end: a real registry, real HDFS, real pip, real FUSE, real runc.

The image is Debian bookworm with python3 (`fusefs.testing.sample.python3_image`,
built once with debootstrap and cached), pushed to a `docker-registry` and
indexed; the environment is a requirements file of real wheels (installed with
pip from the local wheelhouse); the checkpoint is two files in Hadoop's mini
cluster. A tracker, a snapshot origin and two agents run on 127.0.0.1. What is
proved, with one launch.toml:

- on the first node the launch installs the environment and publishes it, runs
  the job in the image with the venv's Python (imports from the venv work) and
  the checkpoint readable at /ckpt byte for byte, and, the image having no
  hot-block record, records one;
- on the second node the same launch restores the environment instead, has
  the recorded blocks prefetched, gets image and checkpoint bytes from the
  first node, sees the same files, and returns the job's exit status;
- through the node's mount server (BOOTSEER_MOUNT_SERVER, a real `bootseer fs
  server`), the same launches serve the image, the checkpoint and the lazily
  mounted environment from the server's host (the timeline's `served_by`; the
  first launch, with no server, forked its own), and a checkpoint that does not
  exist fails the same way;
- a launch whose checkpoint does not exist fails with one line naming it,
  never runs the command, and leaves no mount behind;
- a launch through the mount server killed with SIGKILL mid-job leaves nothing:
  no mount under its scratch (the FUSE mounts end with it, its guard unmounts
  the runtime's tmpfs and overlay), no runc container, no process of its job
  or of runc, no scratch directory; the next launch on the node finishes
  without fetching from the origin anything its store held;
- with the registry stopped after the first node ran the job, the second node
  launches the image pinned by digest from its card, every block from the
  first node; by tag it cannot, and says so;
- `bootseer bench launch` at its smallest runs both arms on a testbed it builds
  and removes, and a round of launches forked and through a mount server per
  node, and every node of every arm sees the same files.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import random
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from helpers.procs import processes_naming
from helpers.registry import RunningRegistry, running_registry
from test_mount_server import Server, start_server

from depsnap.testing.wheelhouse import PYTHON
from fusefs.request import SERVER_ENV
from fusefs.testing.sample import push_sample, python3_image
from hdfs_stripe.testing.minicluster import MiniClusterError, MiniHdfs
from hdfs_stripe.webhdfs import WebHdfs
from p2p.origin.oci import RegistryClient
from p2p.testing.localcluster import AgentHandle, LocalCluster, bootseer_command
from p2p.units import MiB

TEST_BOUND_S = 600.0
CKPT = {"model.bin": 5 * MiB + 4321, "optim.bin": 2 * MiB}
JOB = """
import hashlib, os, sys
import tabulate, six
assert sys.prefix == os.environ["VIRTUAL_ENV"], (sys.prefix, os.environ["VIRTUAL_ENV"])
print("venv", sys.prefix, tabulate.__file__.startswith(sys.prefix), six.__version__)
ckpt = os.environ["BOOTSEER_CKPT"]
for name in sorted(os.listdir(ckpt)):
    print("ckpt", name, hashlib.sha256(open(os.path.join(ckpt, name), "rb").read()).hexdigest())
print(open("/app/hello.py").read().strip())
sys.exit(int(sys.argv[1]))
"""


@asynccontextmanager
async def hdfs_with_checkpoint(tmp_path: Path) -> AsyncIterator[tuple[MiniHdfs, dict[str, str]]]:
    """The mini cluster holding /ckpt/step-1/{CKPT}; the files' sha256 by name."""
    try:
        cluster = await MiniHdfs.start(tmp_path / "hdfs")
    except MiniClusterError as exc:
        pytest.fail(f"the HDFS mini cluster is needed and did not start: {exc}")
    rng, digests = random.Random(5), {}
    try:
        async with WebHdfs(cluster.http_url) as client:
            await client.mkdirs("/ckpt/step-1")
            for name, size in CKPT.items():
                data = rng.randbytes(size)
                await client.create(f"/ckpt/step-1/{name}", data, replication=2,
                                    block_size=2 * MiB)
                digests[name] = hashlib.sha256(data).hexdigest()
        yield cluster, digests
    finally:
        await cluster.stop()


async def launch(cluster: LocalCluster, agent: AgentHandle, work: Path, *args: str,
                 server: Path | None = None) -> tuple[int, list[str], dict[str, Any], str]:
    """`bootseer launch` on `agent`'s node from `work` (its mounts served by the mount server
    at `server`, if given): (status, job output lines, timeline, stderr)."""
    flags = ["--tracker", cluster.tracker_url, "--api-socket", agent.api_socket,
             "--store-dir", str(agent.store_dir), "--origin-dir", str(work.parent / "snapshots"),
             "--origin-url", cluster.origin_url, "--cache-dir", str(work / f"cache-{agent.index}")]
    proc = await asyncio.create_subprocess_exec(
        *bootseer_command(), "launch", "--json", *flags, *args, cwd=work,
        env=launch_env(cluster, server), stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    out, err = await proc.communicate()
    assert proc.returncode is not None
    lines = out.decode().splitlines()
    timeline = json.loads(lines[-1]) if lines and lines[-1].startswith("{") else {}
    return proc.returncode, lines[:-1] if timeline else lines, timeline, err.decode()


def launch_env(cluster: LocalCluster, server: Path | None) -> dict[str, str]:
    env = {k: v for k, v in cluster.env.items() if not k.startswith("PIP_")}
    return env | ({SERVER_ENV: str(server)} if server is not None else {})


def launch_toml(ref: str, venv: Path, ckpt_uri: str) -> str:
    return (f'image = "{ref}"\n'
            f'command = ["python3", "-c", {json.dumps(JOB)}, "0"]\n'
            f'[env]\nrequirements = "requirements.txt"\npath = "{venv}"\npython = "{PYTHON}"\n'
            f'[ckpt]\nuris = ["{ckpt_uri}"]\npath = "/ckpt"\n')


async def pushed_python3(registry: RunningRegistry, repository: str) -> tuple[Any, Any]:
    """The Debian python3 sample image, pushed as `repository`: (image, its reference)."""
    image = await python3_image()
    ref = registry.ref(repository)
    async with RegistryClient() as client:
        await push_sample(client, ref, image)
    return image, ref


def launch_mounts() -> list[str]:
    with open("/proc/self/mountinfo") as f:
        return [line.split()[4] for line in f if "bootseer-launch-" in line.split()[4]]


async def test_launch_brings_up_image_env_and_ckpt_and_the_second_node_gets_them_from_peers(
        fuse_ready: None, registry: RunningRegistry, wheels: Path, tmp_path: Path) -> None:
    _, ref = await pushed_python3(registry, "test/launch")
    work = tmp_path / "job"
    work.mkdir()
    (tmp_path / "snapshots").mkdir()
    venv = tmp_path / "venv"
    (work / "requirements.txt").write_text(
        f"--no-index\n--find-links {wheels}\ntabulate==0.9.0\nsix==1.17.0\n")
    cluster = LocalCluster(tmp_path / "cluster")
    server: Server | None = None
    async with asyncio.timeout(TEST_BOUND_S), hdfs_with_checkpoint(tmp_path) as (hdfs, digests):
        try:
            await cluster.start_tracker()
            await cluster.start_origin(tmp_path / "snapshots")
            agents = [await cluster.start_agent(i, "rack0") for i in range(2)]
            index = await asyncio.create_subprocess_exec(
                *bootseer_command(), "image", "index", str(ref),
                "--tracker", cluster.tracker_url, env=cluster.env,
                stdout=asyncio.subprocess.DEVNULL)
            assert await index.wait() == 0
            (work / "launch.toml").write_text(launch_toml(str(ref), venv,
                                                          hdfs.uri("/ckpt/step-1")))

            status, out, first, err = await launch(cluster, agents[0], work, "-f", "launch.toml")
            assert status == 0, err[-3000:]
            assert first["env"]["action"] == "created" and first["env"]["path"] == str(venv)
            assert not venv.exists(), "the install wrote the host's path and left it there"
            assert first["image"]["prefetch_chunks"] == 0  # no record yet: this launch makes one
            expected = [f"venv {venv} True 1.17.0",
                        *(f"ckpt {name} {digests[name]}" for name in sorted(CKPT)),
                        'print("hello from the bootseer sample")']
            assert out == expected, err[-3000:]
            assert first["ckpt"]["files"] == first["ckpt"]["indexed_here"] == len(CKPT)
            assert 0 < first["image"]["ready_s"] <= first["command_started_s"]
            assert first["image"]["served_by"] == "forked", first["image"]
            assert first["ckpt"]["served_by"] == ["forked"], first["ckpt"]

            # The second node runs the mount server: every later launch's mounts are its.
            server = await start_server(tmp_path / "mount.sock", env=cluster.env)
            # The second node: same file, its own exit status; everything from the first node.
            status, out, second, err = await launch(
                cluster, agents[1], work, "-f", "launch.toml", "--", "python3", "-c", JOB, "3",
                server=server.socket)
            assert status == 3, err[-3000:]
            assert out == expected, err[-3000:]
            assert second["exit_status"] == 3
            assert second["image"]["served_by"] == "mount server", second["image"]
            assert second["ckpt"]["served_by"] == ["mount server"], second["ckpt"]
            assert "starting the mount process here" not in err
            assert second["env"]["action"] == "restored"
            assert second["image"]["prefetch_chunks"] > 0, "the first launch recorded nothing"
            for part in ("image", "ckpt"):
                assert second[part]["peer_bytes"] > 0, (part, second[part])
            assert second["ckpt"]["indexed_here"] == 0 and second["ckpt"]["origin_bytes"] == 0
            # The first node published the snapshot to the origin without holding its packs
            # in its agent, so the second node reads them there (a third would find peers).
            assert second["env"]["origin_bytes"] + second["env"]["peer_bytes"] > 0

            # The environment mounted lazily by key instead: the same files, read-only.
            status, out, third, err = await launch(
                cluster, agents[1], work, "-f", "launch.toml", "--env-key",
                second["env"]["key"], "--env-mode", "mount", server=server.socket)
            assert status == 2 and "exactly one of key" in err  # the file names requirements
            (work / "by-key.toml").write_text(
                launch_toml(str(ref), venv, hdfs.uri("/ckpt/step-1")).replace(
                    'requirements = "requirements.txt"\npath = "' + str(venv) + '"\n',
                    f'key = "{second["env"]["key"]}"\nmode = "mount"\n'))
            status, out, third, err = await launch(cluster, agents[1], work, "-f",
                                                   "by-key.toml", server=server.socket)
            assert status == 0 and out == expected, err[-3000:]
            assert third["env"]["action"] == "mounted" and third["env"]["path"] == str(venv)
            assert third["env"]["served_by"] == "mount server", third["env"]

            # A checkpoint that is not there: one line, no command, nothing left mounted.
            status, out, _, err = await launch(
                cluster, agents[1], work, "-f", "launch.toml", "--ckpt",
                hdfs.uri("/ckpt/missing"), "--", "python3", "-c", "print('ran')",
                server=server.socket)
            assert status == 2 and "ran" not in out
            assert "/ckpt/missing" in err and "Traceback" not in err, err[-3000:]
            assert launch_mounts() == []
        finally:
            if server is not None:
                await server.stop()
            await cluster.stop()


def containers_in(scratch: Path) -> list[str]:
    """runc containers whose bundle is under `scratch`."""
    listed = json.loads(subprocess.run(["runc", "list", "--format", "json"], check=True,
                                       capture_output=True, text=True).stdout or "null")
    return [c["id"] for c in listed or [] if c["bundle"].startswith(f"{scratch}/")]


def launch_scratches() -> list[Path]:
    return sorted(Path(os.environ.get("TMPDIR", "/tmp")).glob("bootseer-launch-*"))


def mounts_under(where: Path) -> list[str]:
    with open("/proc/self/mountinfo") as f:
        return [line.split()[4] for line in f if line.split()[4].startswith(f"{where}/")]


async def test_a_launch_killed_mid_job_leaves_nothing_and_the_relaunch_finishes_from_its_store(
        fuse_ready: None, registry: RunningRegistry, wheels: Path, tmp_path: Path) -> None:
    _, ref = await pushed_python3(registry, "test/killed")
    work, venv = tmp_path / "job", tmp_path / "venv"
    work.mkdir()
    (tmp_path / "snapshots").mkdir()
    (work / "requirements.txt").write_text(f"--no-index\n--find-links {wheels}\nsix==1.17.0\n")
    venv.mkdir()
    (venv / "the-host-s.txt").write_text("a host directory the launch must not touch")
    marker = f"killed-job-{os.urandom(6).hex()}"  # in the job's command line
    job = (f"import six, time; print('running', six.__version__, flush=True); "
           f"time.sleep(120); print('{marker}')")
    toml = (f'image = "{ref}"\ncommand = ["python3", "-c", {json.dumps(job)}]\n'
            f'[env]\nrequirements = "requirements.txt"\npath = "{venv}"\npython = "{PYTHON}"\n')
    (work / "launch.toml").write_text(toml)
    cluster = LocalCluster(tmp_path / "cluster")
    server: Server | None = None
    killed: subprocess.Popen[bytes] | None = None
    scratch = None
    async with asyncio.timeout(TEST_BOUND_S):
        try:
            await cluster.start_tracker()
            await cluster.start_origin(tmp_path / "snapshots")
            agent = await cluster.start_agent(0, "rack0")
            server = await start_server(tmp_path / "mount.sock", env=cluster.env)
            index = await asyncio.create_subprocess_exec(
                *bootseer_command(), "image", "index", str(ref), "--tracker",
                cluster.tracker_url, env=cluster.env, stdout=asyncio.subprocess.DEVNULL)
            assert await index.wait() == 0
            before = set(launch_scratches())

            flags = ["--tracker", cluster.tracker_url, "--api-socket", agent.api_socket,
                     "--store-dir", str(agent.store_dir), "--origin-dir",
                     str(tmp_path / "snapshots"), "--origin-url", cluster.origin_url,
                     "--no-cache"]
            # Popen, not asyncio: its wait() would also wait for the pipe, which the orphaned
            # job would hold open
            killed = subprocess.Popen([*bootseer_command(), "launch", "-f", "launch.toml",
                                       *flags], cwd=work, env=launch_env(cluster, server.socket),
                                      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
            assert killed.stdout is not None
            line = await asyncio.to_thread(killed.stdout.readline)
            assert line.startswith(b"running"), line
            left = set(launch_scratches()) - before
            assert len(left) == 1, "the launch was not up"
            scratch = left.pop()
            up = mounts_under(scratch)
            assert f"{scratch}/image" in up and len(up) >= 4, up  # image, env, tmpfs, overlay
            assert containers_in(scratch) and processes_naming(marker)
            killed.kill()
            await asyncio.to_thread(killed.wait)
            await asyncio.to_thread(killed.stdout.read)  # EOF: nothing of the job holds it
            killed.stdout.close()

            async def swept() -> bool:
                return not (mounts_under(scratch) or containers_in(scratch)
                            or processes_naming(marker, str(scratch)) or scratch.exists())
            for _ in range(300):  # bounded: 30 s
                if await swept():
                    break
                await asyncio.sleep(0.1)
            assert mounts_under(scratch) == [], "the killed launch left mounts"
            assert containers_in(scratch) == [], "the killed launch left its runc container"
            assert processes_naming(marker, str(scratch)) == [], "its job or runc still runs"
            assert not scratch.exists(), "the killed launch's scratch stayed"

            async with agent.client() as api:
                held = {c: i["origin_bytes"] for c, i in (await api.status())["contents"].items()}
            status, out, timeline, err = await launch(
                cluster, agent, work, "-f", "launch.toml", "--no-cache", "--", "python3", "-c",
                "import six; print('running', six.__version__)", server=server.socket)
            assert status == 0 and out == ["running 1.17.0"], err[-3000:]
            assert timeline["image"]["served_by"] == "mount server", timeline["image"]
            assert [p.name for p in venv.iterdir()] == ["the-host-s.txt"]  # hidden, not written
            assert launch_mounts() == []
            async with agent.client() as api:
                after = (await api.status())["contents"]
            assert held and all(after[c]["origin_bytes"] == b for c, b in held.items()), \
                "the relaunch fetched from the origin what its store held"
            assert 0 < timeline["image"]["origin_bytes"] <= sum(held.values())
        finally:
            if killed is not None and killed.poll() is None:
                killed.kill()
                killed.wait()
            if scratch is not None:  # what the guard should have removed, should it fail
                for container in containers_in(scratch):
                    subprocess.run(["runc", "delete", "--force", container], check=False)
                for where in sorted(mounts_under(scratch), reverse=True):
                    subprocess.run(["umount", "-l", where], check=False)
            if server is not None:
                await server.stop()
            await cluster.stop()


def test_bench_launch_runs_both_arms_on_a_testbed_and_every_node_sees_the_same_files(
        fuse_ready: None, wheels: Path) -> None:
    """`bootseer bench launch` end to end at its smallest (2 nodes, a 16 MiB checkpoint, one
    round of forked and mount-server launches): what it reports, not how fast (no timing
    here: this machine is shared)."""
    done = subprocess.run(
        [*bootseer_command(), "bench", "launch", "--nodes", "2", "--racks", "1",
         "--name", "blt", "--subnet", "10.216.0.0/16", "--ckpt-mib", "16", "--rounds", "1",
         "--json"],
        capture_output=True, text=True, timeout=TEST_BOUND_S, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["same_output"] and result["nodes"] == 2
    assert result["baseline_registry_bytes"] >= 2 * result["image_bytes"]
    assert 0 < result["registry_bytes_ratio"] <= 1.1
    assert 0 < result["hdfs_bytes_ratio"] <= 1.1
    assert result["index_bytes_ratio"] == 0 and result["bootseer_mirror_bytes"] == 0
    assert {"image_ready_s", "env_ready_s", "ckpt_ready_s"} <= set(result["bootseer_phases"])
    (row,) = result["mount_server"]["rounds"]
    assert row["forked"]["served_by"] == ["ckpt:forked", "env:none", "image:forked"], row
    assert row["served"]["served_by"] == ["ckpt:mount server", "env:none",
                                          "image:mount server"], row
    assert row["served_over_forked_p50"] > 0 and "startup_s" in row["served"]["phases"]
    assert subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                          check=True).stdout.count("blt-") == 0, "the testbed was left up"


async def test_with_the_registry_gone_after_the_first_node_the_others_launch_from_peers(
        fuse_ready: None, tmp_path: Path) -> None:
    """The registry stops once the first node has run the job: a launch pinned by digest
    opens the image from its card and reads every block the job touches from the first
    node. A launch by tag cannot, and says why."""
    with running_registry(tmp_path / "registry") as reg:
        image, ref = await pushed_python3(reg, "test/gone")
        pinned = f"{reg.address}/test/gone@{image.digest}"
        cluster = LocalCluster(tmp_path / "cluster")
        async with asyncio.timeout(TEST_BOUND_S):
            try:
                await cluster.start_tracker()
                agents = [await cluster.start_agent(i, "rack0") for i in range(2)]
                index = await asyncio.create_subprocess_exec(
                    *bootseer_command(), "image", "index", str(ref), "--tracker",
                    cluster.tracker_url, env=cluster.env, stdout=asyncio.subprocess.DEVNULL)
                assert await index.wait() == 0
                job = ["--", "python3", "-c", "import json, email.parser; print('ok')"]
                status, out, _, err = await launch(cluster, agents[0], tmp_path,
                                                   "--image", pinned, *job)
                assert status == 0 and out == ["ok"], err[-3000:]
                reg.process.terminate()
                reg.process.wait(10)

                status, out, second, err = await launch(cluster, agents[1], tmp_path,
                                                        "--image", pinned, *job)
                assert status == 0 and out == ["ok"], err[-3000:]
                assert second["image"]["prefetch_chunks"] == 0  # the record is in the registry
                assert second["image"]["origin_bytes"] == 0
                assert second["image"]["peer_bytes"] > 0
                status, _, _, err = await launch(cluster, agents[1], tmp_path, "--image",
                                                 str(ref), *job)
                assert status == 2 and "names a tag" in err and "Traceback" not in err, err
            finally:
                await cluster.stop()
