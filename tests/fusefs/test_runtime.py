"""Running commands in a read-only rootfs (runc and bwrap), image configs, samples, full pull.

The rootfs is the busybox sample layer unpacked into a plain directory (the
FUSE mount is tested elsewhere; here the overlay's lower just has to stay
untouched). Every run gets its scratch directory under the test's own
`scratch` dir, so a test can check that nothing stays mounted there; a
finalizer unmounts anything left (and fails the test) so a bug never leaks a
mount into the next test. Needs root, runc, bubblewrap, skopeo, umoci and
docker-registry (make setup).
"""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import io
import os
import signal
import tarfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from helpers.registry import running_registry

from fusefs.bench.baseline import full_pull
from fusefs.image import mounts
from fusefs.image.process import (
    ContainerError,
    Process,
    image_process,
    process_from_config,
    resolve_in_root,
)
from fusefs.image.runtime import RUNTIMES, find_command, run_in_rootfs
from fusefs.image.tool import ToolError
from fusefs.testing import debian
from fusefs.testing.sample import (
    BIG_FILE_PATH,
    WHITED_OUT,
    big_file_layer,
    busybox_image,
    push_sample,
    top_tar,
)
from p2p.origin.oci import RegistryClient

PASSWD = "root:x:0:0:root:/root:/bin/sh\napp:x:1234:2345:App:/home/app:/bin/sh\n"
GROUP = "root:x:0:\napp:x:2345:\nstaff:x:50:app\n"


def tar_names(layer: bytes) -> set[str]:
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(layer))) as tar:
        return {m.name.rstrip("/") for m in tar.getmembers()}


@pytest.fixture
def rootfs(tmp_path: Path) -> Path:
    """The busybox sample unpacked, with an /etc/passwd and /etc/group naming `app`."""
    root = tmp_path / "rootfs"
    layer = busybox_image().layers[0].read()
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(layer))) as tar:
        # Extraction filters came with Python 3.11.4; Debian bookworm has 3.11.2.
        safe = {"filter": "tar"} if hasattr(tarfile, "tar_filter") else {}
        tar.extractall(root, **safe)  # type: ignore[arg-type]
    (root / "etc" / "passwd").write_text(PASSWD)
    (root / "etc" / "group").write_text(GROUP)
    return root


def mounts_under(directory: Path) -> list[str]:
    with open("/proc/mounts") as f:
        return [line.split()[1] for line in f if line.split()[1].startswith(str(directory))]


@pytest.fixture
def scratch(tmp_path: Path) -> Iterator[Path]:
    """The parent of every run's scratch dir; left unmounted and empty, or the test fails."""
    directory = tmp_path / "scratch"
    directory.mkdir()
    yield directory
    leftovers = mounts_under(directory)
    for target in reversed(leftovers):
        mounts.unmount(Path(target))
    assert leftovers == [] and list(directory.iterdir()) == []


def sh(script: str, **fields: object) -> Process:
    return process_from_config({"Env": ["PATH=/bin"], **fields}, ["sh", "-c", script])


# -- running ---------------------------------------------------------------------------------

@pytest.mark.parametrize("runtime", RUNTIMES)
async def test_runs_in_overlay_and_cleans_up(runtime: str, rootfs: Path, scratch: Path,
                                              capfd: pytest.CaptureFixture[str]) -> None:
    before = sorted(p.name for p in rootfs.iterdir())
    status = await run_in_rootfs(rootfs, sh("echo hello; touch /newfile; exit 3"),
                                 runtime=runtime, scratch_dir=scratch)
    assert status == 3
    assert capfd.readouterr().out == "hello\n"
    assert sorted(p.name for p in rootfs.iterdir()) == before  # the write went to the tmpfs
    assert mounts_under(scratch) == [] and list(scratch.iterdir()) == []


@pytest.mark.parametrize("runtime", RUNTIMES)
async def test_config_env_cwd_user_applied(runtime: str, rootfs: Path, scratch: Path,
                                           capfd: pytest.CaptureFixture[str]) -> None:
    config = {"Env": ["PATH=/bin", "GREETING=hi there"], "User": "app",
              "WorkingDir": "/srv/app", "Cmd": ["sh", "-c", "id -u; id -g; pwd; env"]}
    process = image_process(rootfs, config, None)
    assert await run_in_rootfs(rootfs, process, runtime=runtime, scratch_dir=scratch) == 0
    lines = capfd.readouterr().out.splitlines()
    assert lines[:3] == ["1234", "2345", "/srv/app"]
    assert {"GREETING=hi there", "PATH=/bin", "HOME=/home/app"} <= set(lines[3:])
    assert not (rootfs / "srv").exists()


@pytest.mark.parametrize("runtime", RUNTIMES)
async def test_missing_command_is_a_clear_error(runtime: str, rootfs: Path,
                                                scratch: Path) -> None:
    process = process_from_config({"Env": ["PATH=/bin"]}, ["python3", "-V"])
    with pytest.raises(ContainerError, match=r"'python3' not found in the image \(PATH=/bin\)"):
        await run_in_rootfs(rootfs, process, runtime=runtime, scratch_dir=scratch)


def test_find_command(rootfs: Path) -> None:
    assert find_command(rootfs, "sh", "/nowhere:/bin") == rootfs / "bin" / "busybox"
    assert find_command(rootfs, "./sh", "", cwd="/bin") == rootfs / "bin" / "busybox"
    assert find_command(rootfs, "/etc/passwd", "/bin") is None  # not executable
    assert find_command(rootfs, "sh", "/etc") is None


async def test_rootfs_not_a_directory(tmp_path: Path, scratch: Path) -> None:
    (tmp_path / "file").write_text("")
    for missing in (tmp_path / "file", tmp_path / "absent"):
        with pytest.raises(ContainerError, match="is not a directory"):
            await run_in_rootfs(missing, sh("true"), scratch_dir=scratch)


@pytest.mark.parametrize("runtime, package", [("runc", "runc"), ("bwrap", "bubblewrap")])
async def test_missing_runtime_names_the_package(runtime: str, package: str, rootfs: Path,
                                                 scratch: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(scratch))
    with pytest.raises(ContainerError, match=f"apt-get install {package}"):
        await run_in_rootfs(rootfs, sh("true"), runtime=runtime, scratch_dir=scratch)


TRAP = "trap 'exit 42' TERM; touch /ready; sleep 1000 & wait"


async def started(scratch: Path) -> None:
    """Until the container has written /ready (it lands in the run's upper dir)."""
    while not list(scratch.glob("*/upper/ready")):
        await asyncio.sleep(0.02)


@pytest.mark.parametrize("runtime", RUNTIMES)
async def test_sigterm_to_caller_reaches_container(runtime: str, rootfs: Path,
                                                   scratch: Path) -> None:
    run = asyncio.create_task(run_in_rootfs(rootfs, sh(TRAP), runtime=runtime,
                                            scratch_dir=scratch))
    try:
        await started(scratch)
        os.kill(os.getpid(), signal.SIGTERM)  # our handler forwards it; pytest never sees it
        assert await run == 42
    finally:
        run.cancel()
        await asyncio.gather(run, return_exceptions=True)
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


@pytest.mark.parametrize("runtime", RUNTIMES)
async def test_cancel_stops_container_and_cleans_up(runtime: str, rootfs: Path,
                                                    scratch: Path) -> None:
    run = asyncio.create_task(run_in_rootfs(rootfs, sh(TRAP), runtime=runtime,
                                            scratch_dir=scratch))
    await started(scratch)
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    assert mounts_under(scratch) == [] and list(scratch.iterdir()) == []


# -- image configs ---------------------------------------------------------------------------

def test_process_defaults() -> None:
    process = process_from_config({"Cmd": ["/bin/sh"]}, None)
    assert process == Process(("/bin/sh",), ("PATH=" + debian_path(), "HOME=/root"), "/", 0, 0)


def debian_path() -> str:
    return "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def test_override_replaces_cmd_and_keeps_entrypoint() -> None:
    config = {"Entrypoint": ["python3", "-m"], "Cmd": ["http.server"], "WorkingDir": "srv",
              "Env": ["PATH=/opt/bin", "HOME=/data"]}
    assert process_from_config(config, None).argv == ("python3", "-m", "http.server")
    process = process_from_config(config, ["pip", "list"])
    assert process.argv == ("python3", "-m", "pip", "list")
    assert process.env == ("PATH=/opt/bin", "HOME=/data") and process.cwd == "/srv"


@pytest.mark.parametrize("user, ids", [
    ("", (0, 0, "/root")), ("1000", (1000, 0, "/")), ("1000:50", (1000, 50, "/")),
    ("1234", (1234, 2345, "/home/app")), ("app", (1234, 2345, "/home/app")),
    ("app:staff", (1234, 50, "/home/app")), ("app:7", (1234, 7, "/home/app")),
])
def test_user_forms(user: str, ids: tuple[int, int, str]) -> None:
    process = process_from_config({"Cmd": ["x"], "User": user}, None, passwd=PASSWD, group=GROUP)
    assert (process.uid, process.gid, dict(e.split("=", 1) for e in process.env)["HOME"]) == ids


@pytest.mark.parametrize("config, message", [
    ({"Cmd": ["x"], "User": "nobody"}, "user 'nobody' .* not in the image's /etc/passwd"),
    ({"Cmd": ["x"], "User": "app:wheel"}, "group 'wheel' .* not in the image's /etc/group"),
    ({"Cmd": ["x"], "User": ":50"}, "names a group but no user"),
    ({}, "nothing to run"),
    ({"Cmd": "sh -c true"}, "Cmd is not a list of strings"),
])
def test_config_errors(config: dict[str, object], message: str) -> None:
    with pytest.raises(ContainerError, match=message):
        process_from_config(config, None, passwd=PASSWD, group=GROUP)


def test_user_name_resolved_from_the_rootfs(rootfs: Path) -> None:
    process = image_process(rootfs, {"Cmd": ["sh"], "User": "app:staff"}, None)
    assert (process.uid, process.gid) == (1234, 50)


@pytest.mark.parametrize("target", ["../../outside/passwd", "/../../outside/passwd", "ABS"])
def test_hostile_passwd_symlink_stays_in_the_rootfs(target: str, rootfs: Path,
                                                     tmp_path: Path) -> None:
    outside = tmp_path / "outside" / "passwd"
    outside.parent.mkdir()
    outside.write_text("app:x:4242:4242::/:/bin/sh\n")  # what the image must not reach
    passwd = rootfs / "etc" / "passwd"
    passwd.unlink()
    passwd.symlink_to(str(outside) if target == "ABS" else target)
    with pytest.raises(ContainerError, match="not in the image's /etc/passwd"):
        image_process(rootfs, {"Cmd": ["sh"], "User": "app"}, None)


def test_symlinks_resolve_as_under_chroot(rootfs: Path) -> None:
    (rootfs / "etc" / "passwd.real").write_text(PASSWD)
    (rootfs / "etc" / "passwd").unlink()
    (rootfs / "etc" / "passwd").symlink_to("/etc/passwd.real")
    assert image_process(rootfs, {"Cmd": ["sh"], "User": "app"}, None).uid == 1234
    (rootfs / "loop").symlink_to("loop")
    with pytest.raises(ContainerError, match="too many symlinks"):
        resolve_in_root(rootfs, "/loop/x")


# -- samples and the cache -------------------------------------------------------------------

DEB822 = """Types: deb-src
URIs: http://src.example/debian
Suites: bookworm

Types: deb
# a comment
URIs: http://mirror.example/debian
Suites: bookworm bookworm-updates
Components: main
"""


def test_mirror_from_apt_sources() -> None:
    one_line = "# deb http://old.example/debian bookworm main\n" \
               "deb [arch=amd64 signed-by=/k.gpg] http://list.example/debian bookworm main\n"
    assert debian.mirror_from_sources([("x.sources", DEB822)], "bookworm") == \
        "http://mirror.example/debian"
    assert debian.mirror_from_sources([("sources.list", one_line), ("x.sources", DEB822)],
                                      "bookworm") == "http://list.example/debian"
    assert debian.mirror_from_sources([("x.sources", DEB822)], "trixie") is None


def test_machine_mirror_reads_sources_dir(tmp_path: Path) -> None:
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list.d" / "debian.sources.disabled").write_text(DEB822)
    with pytest.raises(ToolError, match="no apt source for Debian bookworm"):
        debian.machine_mirror("bookworm", tmp_path)
    (tmp_path / "sources.list.d" / "debian.sources").write_text(DEB822)
    assert debian.machine_mirror("bookworm", tmp_path) == "http://mirror.example/debian"


def test_cache_key_covers_every_input() -> None:
    base = debian.BaseInputs("bookworm", "minbase", ("python3",), "http://m/debian", "amd64")
    assert base.key() == replace(base).key() and len(base.key()) == 16
    variants = [replace(base, suite="trixie"), replace(base, variant="buildd"),
                replace(base, include=("python3", "git")), replace(base, mirror="http://n/d"),
                replace(base, arch="arm64"), replace(base, recipe=base.recipe + 1)]
    assert len({base.key(), *(v.key() for v in variants)}) == 7


def test_big_file_layer_is_cached_repeatable_and_incompressible(tmp_path: Path) -> None:
    layer = big_file_layer(300_000, tmp_path / "cache", seed=7)
    assert isinstance(layer.blob, Path)
    data = layer.read()
    assert layer.digest == "sha256:" + hashlib.sha256(data).hexdigest()
    assert layer.diff_id == "sha256:" + hashlib.sha256(gzip.decompress(data)).hexdigest()
    assert layer.size == len(data) > 300_000  # random bytes do not compress
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(data))) as tar:
        assert tar.getmember(BIG_FILE_PATH).size == 300_000
    mtime = layer.blob.stat().st_mtime_ns
    assert big_file_layer(300_000, tmp_path / "cache", seed=7) == layer
    assert layer.blob.stat().st_mtime_ns == mtime  # not rebuilt
    assert big_file_layer(300_000, tmp_path / "other", seed=8).digest != layer.digest


def test_top_layer_whites_out_a_base_file() -> None:
    parent, _, name = WHITED_OUT.rpartition("/")
    assert f"{parent}/.wh.{name}" in tar_names(gzip.compress(top_tar()))


# -- the full-pull baseline ------------------------------------------------------------------

async def test_full_pull_unpacks_what_was_pushed(tmp_path: Path, scratch: Path,
                                                 capfd: pytest.CaptureFixture[str]) -> None:
    image = busybox_image()
    with running_registry(tmp_path / "registry") as registry:
        ref = registry.ref("baseline/busybox", "v1")
        async with RegistryClient(plain_http=[registry.address]) as client:
            await push_sample(client, ref, image)
        pulled = await full_pull(f"{registry.address}/baseline/busybox:v1",
                                 tmp_path / "pull", plain_http=True)
    files = {str(p.relative_to(pulled.rootfs)) for p in pulled.rootfs.rglob("*")}
    assert files == tar_names(image.layers[0].read())
    assert pulled.bytes == image.layers[0].size + len(image.config) + len(image.manifest)
    assert pulled.seconds_copy > 0 and pulled.seconds_unpack > 0
    status = await run_in_rootfs(pulled.rootfs, sh("cat /etc/bootseer-platform"),
                                 scratch_dir=scratch)
    assert (status, capfd.readouterr().out) == (0, "linux/amd64\n")


async def test_full_pull_errors_name_the_tool(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ToolError, match=r"skopeo copy of 127.0.0.1:1/x:y failed .*\n.*"):
        await full_pull("127.0.0.1:1/x:y", tmp_path / "a", plain_http=True)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ToolError, match="apt-get install skopeo"):
        await full_pull("127.0.0.1:1/x:y", tmp_path / "b", plain_http=True)
