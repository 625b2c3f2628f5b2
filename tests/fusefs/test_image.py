"""Images end to end: a real registry, real agents, a real FUSE mount, a real runtime.

A module-scoped `docker-registry` (tests/helpers/registry.py) holds a three-layer
image built here from real files: Debian's busybox-static with applet
symlinks; a layer with a directory tree, a hard link, xattrs, a whiteout of a
base file and an opaque directory; and a plain (uncompressed) tar layer, as
incompressible contents should be, with a small "hot" and a larger "cold" file
of random bytes spanning several 1 MiB chunks. Each test starts a tracker and agents on
127.0.0.1 (`p2p.testing.localcluster`), indexes the image with `bootseer image index`
and mounts or runs it with `bootseer image ...` in child processes (a process
must not read a pyfuse3 mount it serves). What is proved:

- the mounted rootfs, on two agents, is file for file what `skopeo copy` +
  `umoci unpack` (the real tools) make of the same image: types, modes,
  owners, sizes, bytes, link targets, hard-link groups, xattrs, whiteouts;
  and listing it fetched nothing;
- `bootseer image run` runs a command in the image under runc and under
  bubblewrap, passes its output through, returns its exit status, and its
  writes do not reach the image;
- a launch recorded on one agent makes a second agent prefetch exactly that
  hot set, from the first agent: the registry's own access log shows no new
  blob reads, the agents' counters show peer bytes, and the cold file stays
  unfetched;
- bad layers (paths escaping the root, duplicates, dangling hard links, a
  corrupt gzip or truncated tar stream, an unknown layer media type) are
  refused by `image index` with one line naming the image and the layer; an
  image that was never indexed cannot be mounted, and the message says what
  to run;
- a read whose chunks the registry can no longer give fails with EIO once the
  mount's read bound passes, is logged, and the mount keeps serving.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import io
import json
import os
import random
import re
import stat
import tarfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path

import pytest
from helpers.registry import RunningRegistry

from fusefs.image.options import MountOptions
from fusefs.mount import Mount
from fusefs.mountinfo import is_mounted
from fusefs.testing.sample import BUSYBOX, BuiltImage, assemble, push_sample
from fusefs.testing.sample import Layer as SampleLayer
from p2p.origin.oci import RegistryClient, sha256_digest
from p2p.origin.oci_manifest import Platform
from p2p.testing.localcluster import AgentHandle, LocalCluster, bootseer_command
from p2p.units import MiB

TEST_BOUND_S = 240.0
MTIME = 1_700_000_000
HOT_BYTES, COLD_BYTES = 1 * MiB + 12345, 5 * MiB


# ---- the image ------------------------------------------------------------------------


def _info(name: str, kind: bytes = tarfile.REGTYPE, mode: int = 0o644, size: int = 0,
          **extra: object) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.size, info.mtime = kind, mode, size, MTIME
    info.uid = info.gid = 0
    for key, value in extra.items():
        setattr(info, key, value)
    return info


def _tar(members: list[tuple[tarfile.TarInfo, bytes | None]]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return out.getvalue()


def _file(name: str, data: bytes, mode: int = 0o644, **extra: object
          ) -> tuple[tarfile.TarInfo, bytes]:
    return _info(name, tarfile.REGTYPE, mode, len(data), **extra), data


def _dir(name: str, mode: int = 0o755, **extra: object) -> tuple[tarfile.TarInfo, None]:
    return _info(name, tarfile.DIRTYPE, mode, **extra), None


def _link(name: str, target: str, kind: bytes = tarfile.SYMTYPE
          ) -> tuple[tarfile.TarInfo, None]:
    return _info(name, kind, 0o777, linkname=target), None


def base_layer() -> bytes:
    busybox = BUSYBOX.read_bytes()
    return _tar([_dir("bin"), _dir("etc"), _dir("tmp", 0o1777), _dir("opt"),
                 _file("bin/busybox", busybox, 0o755),
                 *(_link(f"bin/{a}", "busybox") for a in ("sh", "cat", "echo", "ls", "id",
                                                          "touch", "pwd", "env", "dd")),
                 _file("etc/passwd", b"root:x:0:0:root:/root:/bin/sh\n"),
                 _file("etc/gone", b"removed by the next layer\n"),
                 _file("opt/old", b"hidden by an opaque directory\n")])


def tree_layer() -> bytes:
    rng = random.Random(7)
    return _tar([_dir("srv", 0o750, uid=12, gid=34),
                 _file("srv/a.txt", b"alpha\n" * 1000, 0o640, uid=1000, gid=1000,
                       pax_headers={"SCHILY.xattr.user.note": "hello"}),
                 _link("srv/a-hard", "srv/a.txt", tarfile.LNKTYPE),
                 _link("srv/abs-link", "/srv/a.txt"),
                 _file("srv/noise.bin", rng.randbytes(300_000)),
                 _file("etc/.wh.gone", b""),
                 _dir("opt", 0o700), _file("opt/.wh..wh..opq", b""),
                 _file("opt/new", b"new\n")])


def data_layer() -> bytes:
    rng = random.Random(11)
    return _tar([_dir("data"), _file("data/hot.bin", rng.randbytes(HOT_BYTES)),
                 _file("data/cold.bin", rng.randbytes(COLD_BYTES))])


def make_image(tars: list[bytes], plain: tuple[bytes, ...] = ()) -> BuiltImage:
    """gzip layers of `tars`, then plain (uncompressed) layers of `plain`."""
    run = {"Cmd": ["/bin/sh", "-c", "echo default"], "Env": ["PATH=/bin"], "WorkingDir": "/"}
    layers = [SampleLayer.of_tar(t) for t in tars] + [SampleLayer.of_plain_tar(t) for t in plain]
    return assemble(Platform("linux", "amd64"), layers, run)


async def push(registry: RunningRegistry, repository: str, image: BuiltImage) -> str:
    ref = registry.ref(repository)
    async with RegistryClient() as client:
        await push_sample(client, ref, image)
    return str(ref)


@pytest.fixture(scope="module")
def image() -> BuiltImage:
    if not BUSYBOX.is_file():
        pytest.fail("busybox is not installed: apt-get install busybox-static")
    return make_image([base_layer(), tree_layer()], plain=(data_layer(),))


# ---- the cluster ----------------------------------------------------------------------


@asynccontextmanager
async def cluster_of(tmp_path: Path, agents: int) -> AsyncIterator[
        tuple[LocalCluster, list[AgentHandle]]]:
    cluster = LocalCluster(tmp_path / "cluster")
    try:
        await cluster.start_tracker()
        handles = [await cluster.start_agent(i, "rack0") for i in range(agents)]
        yield cluster, handles
    finally:
        await cluster.stop()


async def bootseer(cluster: LocalCluster, *args: str, check: bool = True
                   ) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        *bootseer_command(), *args, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env=cluster.env)
    out, err = await proc.communicate()
    assert proc.returncode is not None
    if check and proc.returncode != 0:
        raise AssertionError(f"bootseer {' '.join(args)} exited {proc.returncode}:\n"
                             f"{err.decode()[-3000:]}")
    return proc.returncode, out.decode(), err.decode()


def agent_flags(cluster: LocalCluster, agent: AgentHandle) -> list[str]:
    return ["--tracker", cluster.tracker_url, "--api-socket", agent.api_socket,
            "--store-dir", str(agent.store_dir)]


async def index(cluster: LocalCluster, ref: str, agent: AgentHandle) -> list[dict[str, object]]:
    _, out, _ = await bootseer(cluster, "image", "index", ref, "--json",
                               "--tracker", cluster.tracker_url)
    return [json.loads(line) for line in out.splitlines()]


@asynccontextmanager
async def mounted(cluster: LocalCluster, agent: AgentHandle, ref: str, where: Path,
                  **options: object) -> AsyncIterator[Mount]:
    where.mkdir(parents=True, exist_ok=True)
    opts = MountOptions(ref, where, cluster.tracker_url, agent.api_socket, agent.store_dir,
                        **options)  # type: ignore[arg-type]
    mount = await Mount.spawn(opts.argv(), where, where.parent / f"{where.name}.log",
                              env=cluster.env)
    try:
        yield mount
    finally:
        await mount.stop()
        assert not is_mounted(where), "the mount outlived its test"


async def contents_of(agent: AgentHandle) -> dict[str, dict[str, object]]:
    async with agent.client(30.0) as client:
        return (await client.status())["contents"]  # type: ignore[no-any-return]


# ---- comparing trees ------------------------------------------------------------------


def describe(root: Path) -> dict[str, tuple[object, ...]]:
    """path -> (type, mode, uid, gid, size, sha256 or link target, xattrs, link group)."""
    out: dict[str, tuple[object, ...]] = {}
    inodes: dict[int, list[str]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in sorted(dirnames + filenames):
            path = Path(dirpath) / name
            rel = str(path.relative_to(root))
            st = path.lstat()
            if stat.S_ISLNK(st.st_mode):
                what: object = os.readlink(path)
            elif stat.S_ISREG(st.st_mode):
                what = hashlib.sha256(path.read_bytes()).hexdigest()
                inodes.setdefault(st.st_ino, []).append(rel)
            else:
                what = None
            xattrs = () if stat.S_ISLNK(st.st_mode) else tuple(sorted(
                (k, os.getxattr(path, k)) for k in os.listxattr(path) if k.startswith("user.")))
            out[rel] = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), st.st_uid,
                        st.st_gid, st.st_size if not stat.S_ISDIR(st.st_mode) else 0, what,
                        xattrs)
    for group in inodes.values():
        for rel in group:
            out[rel] = (*out[rel], tuple(sorted(group)))
    return out


# ---- tests ----------------------------------------------------------------------------


async def test_a_mounted_image_on_two_agents_is_what_the_real_tools_unpack(
        fuse_ready: None, registry: RunningRegistry, image: BuiltImage, tmp_path: Path) -> None:
    from fusefs.bench.baseline import full_pull

    ref = await push(registry, "test/tree", image)
    async with asyncio.timeout(TEST_BOUND_S), cluster_of(tmp_path, 2) as (cluster, agents):
        first = await index(cluster, ref, agents[0])
        assert [s["new"] for s in first] == [True, True, True]
        again = await index(cluster, ref, agents[0])
        assert [s["new"] for s in again] == [False, False, False]
        assert [s["content"] for s in again] == [s["content"] for s in first]

        pulled = await full_pull(ref, tmp_path / "baseline", plain_http=True, creds=None)
        expected = await asyncio.to_thread(describe, pulled.rootfs)
        assert "etc/gone" not in expected and "opt/old" not in expected  # the tools agree
        for i, agent in enumerate(agents):
            if i == 1:  # as indexed by a Bootseer before trees were packed: merged at mount
                await bindings_without_tree(registry, ref)
            async with mounted(cluster, agent, ref, tmp_path / f"mnt{i}") as mount:
                assert mount.ready["tree"] == ("packed", "merged")[i]
                names = await asyncio.to_thread(lambda: sorted(
                    (p.lstat().st_mode, str(p)) for p in mount.mountpoint.rglob("*")))
                assert len(names) == len(expected)
                held = await contents_of(agent)
                assert all(held.get(s["content"], {}).get("have", 0) == 0 for s in first), \
                    "listing the image fetched layer bytes"
                got = await asyncio.to_thread(describe, mount.mountpoint)
                assert got == expected


async def bindings_without_tree(registry: RunningRegistry, ref: str) -> None:
    from fusefs.image.binding import Bindings, pull_bindings, push_bindings
    from p2p.origin.oci_ref import parse_reference

    image_ref = parse_reference(ref)
    async with RegistryClient() as client:
        pulled = await client.get_manifest(image_ref)
        found = await pull_bindings(client, pulled.ref, pulled.digest)
        assert found is not None and found.tree is not None
        await push_bindings(client, pulled.ref, Bindings(found.image, found.layers))


async def test_run_passes_output_and_exit_status_and_keeps_writes_out_of_the_image(
        fuse_ready: None, registry: RunningRegistry, image: BuiltImage, tmp_path: Path) -> None:
    ref = await push(registry, "test/run", image)
    async with asyncio.timeout(TEST_BOUND_S), cluster_of(tmp_path, 1) as (cluster, agents):
        await index(cluster, ref, agents[0])
        for run, runtime in enumerate(("runc", "bwrap")):
            status, out, err = await bootseer(
                cluster, "image", "run", *agent_flags(cluster, agents[0]),
                "--runtime", runtime, "--json", ref, "--", "sh", "-c",
                "cat /srv/a-hard | head -c 6; touch /newfile && ls /newfile; exit 7",
                check=False)
            lines = out.splitlines()
            assert status == 7, err[-2000:]
            assert lines[0] == "alpha" and lines[1] == "/newfile"
            timeline = json.loads(lines[-1])
            assert timeline["exit_status"] == 7 and timeline["mounted_s"] > 0
            assert timeline["peer_bytes"] == 0  # one node
            # This run's bytes, not the node's: the second run reads what the first fetched.
            assert (timeline["origin_bytes"] > 0) == (run == 0), timeline
        async with mounted(cluster, agents[0], ref, tmp_path / "mnt") as mount:
            assert not (mount.mountpoint / "newfile").exists()


def blob_gets(registry: RunningRegistry, digest: str) -> int:
    """GETs of a blob in the registry's own access log."""
    text = registry.log_path.read_text(errors="replace")
    return sum(1 for line in text.splitlines()
               if "GET /v2/" in line and f"/blobs/{digest}" in line)


async def test_a_recorded_launch_is_prefetched_on_another_agent_from_peers(
        fuse_ready: None, registry: RunningRegistry, image: BuiltImage, tmp_path: Path) -> None:
    ref = await push(registry, "test/record", image)
    data_digest = image.layers[2].digest
    async with asyncio.timeout(TEST_BOUND_S), cluster_of(tmp_path, 2) as (cluster, agents):
        summaries = await index(cluster, ref, agents[0])
        data_content = summaries[2]["content"]
        _, _, said = await bootseer(cluster, "image", "run", *agent_flags(cluster, agents[0]),
                                    "--record", ref, "--", "sh", "-c",
                                    "cat /data/hot.bin > /dev/null")
        first = (await contents_of(agents[0]))[data_content]
        hot_chunks = first["have"]
        assert 0 < hot_chunks < first["chunks"], "the first launch fetched the cold file too"
        saved = re.search(r"saved the hot-block record \((\d+) chunks read in this launch's "
                          r"first 60 s; it now holds (\d+) chunks from 1 launches\)", said)
        assert saved and int(saved[1]) == int(saved[2]) >= hot_chunks, said

        before = blob_gets(registry, data_digest)
        async with mounted(cluster, agents[1], ref, tmp_path / "mnt") as mount:
            assert mount.ready["prefetch_chunks"] >= hot_chunks
            for _ in range(300):  # bounded: 30 s
                info = (await contents_of(agents[1])).get(data_content, {})
                if info.get("have") == hot_chunks:
                    break
                await asyncio.sleep(0.1)
            assert info.get("have") == hot_chunks, info
            assert info["origin_bytes"] == 0 and info["peer_bytes"] > 0
            assert blob_gets(registry, data_digest) == before, "the hot set came from the registry"
            for _ in range(300):  # bounded: 30 s; the mount decodes the hot spans ahead
                warmed = re.search(r"decoded (\d+) spans", mount.log_path.read_text())
                if warmed:
                    break
                await asyncio.sleep(0.1)
            assert warmed and int(warmed[1]) > 0, mount.log_path.read_text()[-2000:]
            hot = await asyncio.to_thread((mount.mountpoint / "data/hot.bin").read_bytes)
            assert hot == random.Random(11).randbytes(HOT_BYTES)
            after = (await contents_of(agents[1]))[data_content]
            assert after["have"] == hot_chunks and after["origin_bytes"] == 0


BAD_MEMBERS = {
    "dotdot": [_file("../escape", b"x")],
    "absolute": [_file("/etc/evil", b"x")],
    "duplicate": [_file("etc/twice", b"1"), _file("etc/twice", b"2")],
    "hardlink-to-nothing": [_link("etc/hard", "etc/nothing", tarfile.LNKTYPE)],
}


@pytest.mark.parametrize("case", [*BAD_MEMBERS, "corrupt-gzip", "truncated-tar", "zstd-type"])
async def test_bad_layers_are_refused_naming_the_image_and_the_layer(
        registry: RunningRegistry, tmp_path: Path, case: str) -> None:
    good = base_layer()
    platform = Platform("linux", "amd64")
    if case in BAD_MEMBERS:
        bad = make_image([good, _tar(BAD_MEMBERS[case])])
    elif case == "corrupt-gzip":
        layer = SampleLayer.of_tar(_tar([_file("x", random.Random(3).randbytes(200_000))]))
        blob = bytearray(layer.read())
        blob[len(blob) // 2] ^= 0xFF
        broken = SampleLayer(bytes(blob), sha256_digest(bytes(blob)), layer.diff_id, len(blob))
        bad = assemble(platform, [SampleLayer.of_tar(good), broken], {})
    elif case == "truncated-tar":
        bad = make_image([good, _tar([_file("x", random.Random(4).randbytes(50_000))])[:30_000]])
    else:
        zstd = replace(SampleLayer.of_tar(good),
                       media_type="application/vnd.oci.image.layer.v1.tar+zstd")
        bad = assemble(platform, [zstd], {})
    ref = await push(registry, f"test/bad-{case}", bad)
    async with asyncio.timeout(TEST_BOUND_S), cluster_of(tmp_path, 0) as (cluster, _):
        status, _, err = await bootseer(cluster, "image", "index", ref,
                                        "--tracker", cluster.tracker_url, check=False)
        assert status == 2, err
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
        assert f"test/bad-{case}" in err and "layer sha256:" in err, err


async def test_an_image_never_indexed_cannot_be_mounted_and_says_what_to_run(
        fuse_ready: None, registry: RunningRegistry, image: BuiltImage, tmp_path: Path) -> None:
    ref = await push(registry, "test/unindexed", image)
    async with asyncio.timeout(TEST_BOUND_S), cluster_of(tmp_path, 1) as (cluster, agents):
        status, _, err = await bootseer(cluster, "image", "run",
                                        *agent_flags(cluster, agents[0]), ref, "--", "true",
                                        check=False)
        assert status == 2 and "Traceback" not in err
        assert "bootseer image index" in err, err


def test_the_image_commands_are_registered() -> None:
    from p2p.cli import build_parser

    parser = build_parser()
    args = parser.parse_args(["image", "run", "--tracker", "http://t:1", "r/x:1", "--",
                              "sh", "-c", "exit 3"])
    assert args.cmd[-3:] == ["sh", "-c", "exit 3"] and args.tracker == "http://t:1"
    assert args.command == "image" and args.image_command == "run"


async def test_pull_then_mount_and_umount_from_the_command_line(
        fuse_ready: None, registry: RunningRegistry, image: BuiltImage, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    ref = await push(registry, "test/cli", image)
    async with asyncio.timeout(TEST_BOUND_S), cluster_of(tmp_path, 2) as (cluster, agents):
        await index(cluster, ref, agents[0])
        pulls = []
        for agent in agents:
            _, out, _ = await bootseer(cluster, "image", "pull", *agent_flags(cluster, agent),
                                       "--json", ref)
            pulls.append(json.loads(out.splitlines()[-1]))
        size = sum(layer.size for layer in image.layers)
        assert [p["bytes"] for p in pulls] == [p["have_bytes"] for p in pulls] == [size, size]
        assert pulls[0]["origin_bytes"] == size and pulls[0]["peer_bytes"] == 0
        assert pulls[1]["peer_bytes"] > 0, "the second node pulled nothing from the first"

        where = tmp_path / "mnt"
        where.mkdir()
        monkeypatch.delenv("BOOTSEER_LOG_DIR", raising=False)
        (tmp_path / "tmp").mkdir()
        monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))  # the mount's log goes under it
        _, out, _ = await bootseer(cluster, "image", "mount", *agent_flags(cluster, agents[1]),
                                   ref, str(where))
        ready = json.loads(out)
        try:
            text = await asyncio.to_thread((where / "srv/a.txt").read_bytes)
            assert text == b"alpha\n" * 1000 and ready["image"] == image.digest
        finally:
            status, _, err = await bootseer(cluster, "image", "umount", str(where), check=False)
        assert status == 0, err
        assert not is_mounted(where)
        for _ in range(100):  # bounded: 10 s for the serving process to finish
            if not Path(f"/proc/{ready['pid']}").exists():
                break
            await asyncio.sleep(0.1)
        assert not Path(f"/proc/{ready['pid']}").exists(), "the serving process outlived umount"
        assert Path(ready["log"]).parent.parent == tmp_path / "tmp"
        assert not list((tmp_path / "tmp").iterdir()), "the mount's private log was left"
        status, _, err = await bootseer(cluster, "image", "umount", str(where), check=False)
        assert status == 2 and "no FUSE mount" in err


async def test_a_read_whose_chunks_cannot_be_had_fails_with_eio_in_bounded_time(
        fuse_ready: None, registry: RunningRegistry, image: BuiltImage, tmp_path: Path) -> None:
    ref = await push(registry, "test/eio", image)
    async with asyncio.timeout(TEST_BOUND_S), cluster_of(tmp_path, 1) as (cluster, agents):
        await index(cluster, ref, agents[0])
        registry.blob_path(image.layers[2].digest).unlink()  # the origin loses the data layer
        async with mounted(cluster, agents[0], ref, tmp_path / "mnt",
                           read_timeout_s=2.0) as mount:
            with pytest.raises(OSError) as failed:
                await asyncio.to_thread((mount.mountpoint / "data/hot.bin").read_bytes)
            assert failed.value.errno == errno.EIO
            text = await asyncio.to_thread((mount.mountpoint / "srv/a.txt").read_bytes)
            assert text == b"alpha\n" * 1000, "the mount stopped serving after a failed read"
        assert "EIO" in (tmp_path / "mnt.log").read_text(), "the failed read was not logged"


async def test_an_insiders_first_come_layer_names_do_not_change_what_a_pinned_image_runs(
        fuse_ready: None, registry: RunningRegistry, tmp_path: Path) -> None:
    """Names are first-come; bindings are not. An insider (the cluster secret, no push
    rights) registers `layer/v1/<digest>` and `layer-index/v1/<digest>` of a layer first,
    with another layer's bytes and an index whose `layer` field is rewritten. The
    legitimate `image index` still indexes the layer from its bytes and pins it in the
    registry, and `image run REPO@sha256:...` prints the image's own /etc/motd."""
    from fusefs.image.gzindex import build_index
    from p2p.testing.localcluster import manifest_of_file
    from p2p.tracker_client import TrackerClient

    legit = make_image([base_layer(), _tar([_dir("etc"), _file("etc/motd", b"legit\n")])])
    tag_ref = await push(registry, "test/pinned", legit)
    pinned = f"{tag_ref.rsplit(':', 1)[0]}@{legit.digest}"
    target = legit.layers[1].digest
    evil = SampleLayer.of_tar(_tar([_dir("etc"), _file("etc/motd", b"insider\n")]))
    insider = tmp_path / "insider"
    insider.mkdir()
    (insider / "layer").write_bytes(evil.read())
    with open(insider / "layer", "rb") as blob:
        forged = replace(build_index(blob, evil.digest), layer_digest=target)
    (insider / "index").write_bytes(forged.to_bytes())
    async with asyncio.timeout(TEST_BOUND_S), cluster_of(tmp_path, 1) as (cluster, agents):
        layer_m = manifest_of_file(insider / "layer", MiB, f"file://{insider}/layer")
        index_m = manifest_of_file(insider / "index", MiB, f"file://{insider}/index")
        async with TrackerClient(cluster.tracker_url, cluster.secret) as tracker:
            for m in (layer_m, index_m):
                await tracker.put_manifest(m)
            await tracker.put_name(f"layer/v1/{target}", layer_m.content_id)
            await tracker.put_name(f"layer-index/v1/{target}", index_m.content_id)

        summaries = await index(cluster, tag_ref, agents[0])
        status, out, err = await bootseer(
            cluster, "image", "run", *agent_flags(cluster, agents[0]), "--runtime", "bwrap",
            pinned, "--", "cat", "/etc/motd", check=False)
        assert status == 0, err[-2000:]
        assert out.splitlines()[0] == "legit", out
        squatted = next(s for s in summaries if s["layer"] == target)
        assert squatted["squatted"] is True and squatted["content"] != layer_m.content_id


async def test_an_image_of_too_many_layers_is_refused_as_such(
        fuse_ready: None, registry: RunningRegistry, tmp_path: Path) -> None:
    """The issue's 3,000-layer image failed to mount with "tracker unreachable"; past the
    cap an image is refused, at index and at mount, with what is wrong."""
    from fusefs.image.catalog import MAX_LAYERS

    many = MAX_LAYERS + 1
    ref = await push(registry, "test/many",
                     make_image([_tar([_file(f"f{i}", b"x")]) for i in range(many)]))
    async with asyncio.timeout(TEST_BOUND_S), cluster_of(tmp_path, 1) as (cluster, agents):
        for args in (["index", ref, "--tracker", cluster.tracker_url],
                     ["run", *agent_flags(cluster, agents[0]), "--runtime", "bwrap", ref,
                      "--", "true"]):
            status, _, err = await bootseer(cluster, "image", *args, check=False)
            assert status != 0
            assert f"has {many} layers, more than the {MAX_LAYERS}" in err, err[-2000:]
            assert "Traceback" not in err and "unreachable" not in err


async def test_an_image_indexed_for_a_tracker_that_forgot_it_is_indexed_again(
        fuse_ready: None, registry: RunningRegistry, image: BuiltImage, tmp_path: Path) -> None:
    """The registry keeps the image's bindings; a tracker without a state dir does not keep
    the manifests they name. Indexing again for a new tracker publishes them again (it
    once said "already indexed" and left every launch with a 404)."""
    ref = await push(registry, "test/forgotten", image)
    async with asyncio.timeout(TEST_BOUND_S), cluster_of(tmp_path / "first", 1) as (c, a):
        assert all(line["new"] for line in await index(c, ref, a[0]))
    async with asyncio.timeout(TEST_BOUND_S), \
            cluster_of(tmp_path / "second", 1) as (cluster, agents):
        assert all(line["new"] for line in await index(cluster, ref, agents[0]))
        status, _, err = await bootseer(cluster, "image", "run",
                                        *agent_flags(cluster, agents[0]), ref, "--", "sh",
                                        "-c", "exit 0", check=False)
        assert status == 0, err
