"""The mount server (`bootseer fs server`): mounts served by one process, or forked.

A real server process on a unix socket, real serving commands over a real
agent, real FUSE mounts read by other processes (`sha256sum`). What is proved:

- with BOOTSEER_MOUNT_SERVER set, `start_detached` (every `mount` command)
  gets a kernel-protocol mount served by the server's host: two mounts, one
  serving process; each has a handle process of its own, and SIGTERM to one
  handle stops that mount only; the host hashes a backing file once for both
  mounts of it (its own account in each mount's log); SIGTERM to the server
  unmounts every hosted mount and ends their handles;
- a host killed (SIGKILL) is replaced, on the same mounts: readers through
  them (a handler-served one, a passthrough one, a `sha256sum` running at the
  kill) get the right bytes after a pause, and a new open of a file the kernel
  holds in passthrough mode works (the open-files journal, `fusefs.kept`);
- an unmount (`bootseer ... umount`) of a hosted mount ends its handle; a
  server killed (SIGKILL) has its host unmount every mount and end;
- a pyfuse3 mount (--no-passthrough) is forked by the server, with the
  caller's stdout and stderr, and outlives it; a serving command that fails
  reports its own error through the log it was given; the server removes its
  socket when it stops; a socket nobody answers on makes `start_detached` say
  so and start the process itself;
- the server runs serving commands only, refuses malformed requests and goes
  on serving, listens at mode 0600, and will not start over a live server.

A node without /dev/fuse or fusermount3 FAILS these tests, naming the Debian
package to install; it does not skip them.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import signal
import socket
import stat
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from fusefs.backing import WholeFiles
from fusefs.bench.readpath import account
from fusefs.mount import LOG_DIR_ENV, MountError, force_unmount, start_detached
from fusefs.mountinfo import is_mounted
from fusefs.request import SERVER_ENV, ServerRefused, fork_serving
from fusefs.tree import Entry, Extent, Kind, Layer, build_tree
from p2p.testing.localcluster import LocalCluster, write_random_file
from p2p.units import MiB
from tests.helpers.waiting import until

pytestmark = pytest.mark.usefixtures("fuse_ready")
SIZE = 3 * MiB + 5
BOUND_S = 30.0


class Server:
    def __init__(self, proc: asyncio.subprocess.Process, socket_path: Path,
                 host_pid: int | None) -> None:
        self.proc, self.socket, self.host_pid = proc, socket_path, host_pid

    async def stop(self) -> int:
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
        return await asyncio.wait_for(self.proc.wait(), BOUND_S)


async def start_server(socket_path: Path, env: dict[str, str] | None = None) -> Server:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "fusefs", "server", "--socket", str(socket_path),
        stdout=asyncio.subprocess.PIPE, env=env)
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), BOUND_S)
    serving = json.loads(line)
    assert serving["event"] == "serving", line
    return Server(proc, socket_path, serving["host_pid"])


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[Server]:
    s = await start_server(tmp_path / "mount.sock")
    try:
        yield s
    finally:
        await s.stop()


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


async def gone(pid: int, what: str) -> None:
    async def ended() -> bool:
        return not alive(pid)
    await until(ended, what, BOUND_S)


async def unmounted(where: Path, what: str) -> None:
    async def done() -> bool:
        return not is_mounted(where)
    await until(done, what, BOUND_S)


async def stop_mount(pid: int, mountpoint: Path) -> None:
    os.kill(pid, signal.SIGTERM)
    await unmounted(mountpoint, f"{mountpoint} unmounted after SIGTERM")


async def sha256_by_another_process(path: Path) -> str:
    proc = await asyncio.create_subprocess_exec("sha256sum", str(path),
                                                stdout=asyncio.subprocess.PIPE)
    out, _ = await asyncio.wait_for(proc.communicate(), BOUND_S)
    assert proc.returncode == 0
    return out.split()[0].decode()


LAZY = 2 * MiB + 3


class Node:
    """An agent holding one published file whole (its chunks and its backing file), and
    another one it has not fetched (its origin can be paused); a tree file of both
    (data/f.bin, data/lazy.bin), and the mounts made through `mount` (stopped at the
    end)."""

    def __init__(self, tmp_path: Path, cluster: LocalCluster, size: int) -> None:
        self.tmp_path, self.cluster, self.size = tmp_path, cluster, size
        self.mounts: list[tuple[int, Path]] = []

    async def start(self) -> None:
        origin = self.tmp_path / "origin"
        await asyncio.to_thread(write_random_file, origin / "layer.bin", self.size, 7)
        await asyncio.to_thread(write_random_file, origin / "lazy.bin", LAZY, 8)
        self.data = (origin / "layer.bin").read_bytes()
        self.lazy = (origin / "lazy.bin").read_bytes()
        await self.cluster.start_tracker()
        self.origin = await self.cluster.start_origin(origin)
        self.agent = await self.cluster.start_agent(0, "rack0")
        manifest = await self.cluster.publish(origin / "layer.bin", MiB)
        lazy = await self.cluster.publish(origin / "lazy.bin", MiB)
        self.lazy_content = lazy.content_id
        async with self.agent.client(BOUND_S) as client:
            await client.ensure(manifest.content_id)
        assert await asyncio.to_thread(WholeFiles(self.agent.store_dir).build, manifest)
        tree = build_tree([Layer("layer", [
            Entry("data/f.bin", Kind.FILE, size=self.size,
                  extents=(Extent(manifest.content_id, 0, self.size),)),
            Entry("data/lazy.bin", Kind.FILE, size=LAZY,
                  extents=(Extent(lazy.content_id, 0, LAZY),))])])
        (self.tmp_path / "tree.json").write_bytes(tree.to_json())

    def mount(self, name: str, *flags: str, tree_file: Path | None = None) -> dict[str, Any]:
        where = self.tmp_path / name
        where.mkdir()
        argv = [sys.executable, "-m", "fusefs", "mount",
                str(tree_file or self.tmp_path / "tree.json"), str(where),
                "--api-socket", self.agent.api_socket, "--store-dir",
                str(self.agent.store_dir), *flags]
        ready = start_detached(argv, self.tmp_path / f"{name}.log", BOUND_S)
        self.mounts.append((ready["pid"], where))
        return ready

    async def asked_for_lazy(self) -> bool:
        """Whether the agent was asked for the lazy file's content (a read of it reached
        the agent through a mount's server)."""
        async with self.agent.client(BOUND_S) as client:
            return self.lazy_content in (await client.status())["contents"]

    async def stop(self) -> None:
        """Every mount stopped, then the cluster, even when a mount's stop fails (a dead
        mount whose stop raises must not leak the tracker, origin and agent)."""
        try:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.origin.pid, signal.SIGCONT)
            for pid, where in self.mounts:
                if is_mounted(where):
                    await stop_mount(pid, where)
        finally:
            await self.cluster.stop()


@pytest.fixture
async def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
               request: pytest.FixtureRequest) -> AsyncIterator[Node]:
    size = getattr(request, "param", SIZE)
    n = Node(tmp_path, LocalCluster(tmp_path / "cluster"), size)
    try:
        await n.start()
        for key, value in n.cluster.env.items():
            monkeypatch.setenv(key, value)
        monkeypatch.setenv(LOG_DIR_ENV, str(tmp_path))  # the logs stay: their accounts
        yield n
    finally:
        await n.stop()


async def test_two_mounts_one_process_one_check_and_a_stop_each(
        tmp_path: Path, node: Node, monkeypatch: pytest.MonkeyPatch) -> None:
    server = await start_server(tmp_path / "mount.sock")
    try:
        assert server.host_pid is not None and parent_of(server.host_pid) == server.proc.pid
        monkeypatch.setenv(SERVER_ENV, str(server.socket))
        want = hashlib.sha256(node.data).hexdigest()
        first = await asyncio.to_thread(node.mount, "a")
        assert await sha256_by_another_process(tmp_path / "a/data/f.bin") == want
        second = await asyncio.to_thread(node.mount, "b")
        assert await sha256_by_another_process(tmp_path / "b/data/f.bin") == want

        # One serving process, the server's host; a handle each, from the server.
        assert first["server_pid"] == second["server_pid"] == server.host_pid
        assert first["pid"] != second["pid"]
        assert {parent_of(first["pid"]), parent_of(second["pid"])} == {server.proc.pid}
        assert first["passthrough"] and second["passthrough"]

        # SIGTERM to a handle stops its mount only; the handle ends, status 0.
        os.kill(first["pid"], signal.SIGTERM)
        await unmounted(tmp_path / "a", "the first mount unmounted by its handle's SIGTERM")
        await gone(first["pid"], "the first mount's handle exits")
        assert is_mounted(tmp_path / "b") and alive(server.host_pid)
        assert await sha256_by_another_process(tmp_path / "b/data/f.bin") == want

        # The server's stop unmounts every hosted mount and ends the handles and the host.
        assert await server.stop() == 0
        assert not is_mounted(tmp_path / "b") and not server.socket.exists()
        await gone(second["pid"], "the second mount's handle exits with the server")
        await gone(server.host_pid, "the host exits with the server")
    finally:
        await server.stop()
    # By each mount's own account: both read by passthrough; the file hashed once.
    a, b = account(tmp_path / "a.log"), account(tmp_path / "b.log")
    assert a is not None and b is not None, (tmp_path / "b.log").read_text()
    assert a["passthrough_opens"] >= 1 and b["passthrough_opens"] >= 1
    assert a["handler_reads"] == b["handler_reads"] == 0
    assert (a["backing_checked"], b["backing_checked"]) == (1, 0)


# Reads 1 MiB, says so, waits for a line on stdin, reads the rest; prints the SHA-256.
READER = """
import hashlib, sys
digest = hashlib.sha256()
with open(sys.argv[1], "rb", buffering=0) as f:
    digest.update(f.read(1 << 20))
    print("started", flush=True)
    sys.stdin.readline()
    while chunk := f.read(1 << 20):
        digest.update(chunk)
print(digest.hexdigest(), flush=True)
"""


async def start_reader(path: Path) -> asyncio.subprocess.Process:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", READER, str(path), stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE)
    assert proc.stdout is not None
    assert await asyncio.wait_for(proc.stdout.readline(), BOUND_S) == b"started\n"
    return proc


async def finish_reader(proc: asyncio.subprocess.Process) -> str:
    out, _ = await asyncio.wait_for(proc.communicate(b"go\n"), BOUND_S)
    assert proc.returncode == 0
    return out.decode().strip()


@pytest.mark.parametrize("node", [48 * MiB], indirect=True)
async def test_a_killed_host_is_replaced_and_its_readers_see_a_pause_not_an_error(
        tmp_path: Path, node: Node, server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    """A reader through a mount whose every read goes through the host (no-open), one
    holding a passthrough file open, and a `sha256sum` whose read the host took and had
    not answered (its chunk is on its way from a paused origin) when the host is killed:
    all get the right bytes from the host that replaces it, on the same mounts (the read
    in flight because the new host has the kernel send it again); a new open of the
    passthrough file (the kernel holds it in passthrough mode with the dead host's backing
    file) works; the handles stand, and still stop their mounts."""
    monkeypatch.setenv(SERVER_ENV, str(server.socket))
    want = hashlib.sha256(node.data).hexdigest()
    handler = await asyncio.to_thread(node.mount, "h", "--no-open")
    passthrough = await asyncio.to_thread(node.mount, "p")
    assert not handler["passthrough"] and passthrough["passthrough"]
    readers = [await start_reader(tmp_path / name / "data/f.bin") for name in ("h", "p")]
    os.kill(node.origin.pid, signal.SIGSTOP)
    in_flight = asyncio.create_task(sha256_by_another_process(tmp_path / "h/data/lazy.bin"))
    await until(node.asked_for_lazy, "the host took the read and asked the agent", BOUND_S)
    assert server.host_pid is not None
    os.kill(server.host_pid, signal.SIGKILL)
    await gone(server.host_pid, "the host is killed")
    os.kill(node.origin.pid, signal.SIGCONT)

    assert await sha256_by_another_process(tmp_path / "p/data/f.bin") == want
    assert [await finish_reader(r) for r in readers] == [want, want]
    assert await in_flight == hashlib.sha256(node.lazy).hexdigest()
    for ready, name in ((handler, "h"), (passthrough, "p")):
        assert is_mounted(tmp_path / name) and alive(ready["pid"])
        assert "again, on the device" in (tmp_path / f"{name}.log").read_text()

    os.kill(passthrough["pid"], signal.SIGTERM)
    await unmounted(tmp_path / "p", "the passthrough mount stopped by its handle")
    await gone(passthrough["pid"], "its handle exits")
    another = await asyncio.to_thread(node.mount, "c")
    assert another["server_pid"] not in (server.host_pid, None)
    assert await server.stop() == 0
    for name in ("h", "c"):
        assert not is_mounted(tmp_path / name)
    await gone(handler["pid"], "the handler mount's handle exits with the server")


async def test_an_unmount_ends_its_handle_and_a_killed_server_unmounts_the_rest(
        tmp_path: Path, node: Node, monkeypatch: pytest.MonkeyPatch) -> None:
    server = await start_server(tmp_path / "mount.sock")
    try:
        monkeypatch.setenv(SERVER_ENV, str(server.socket))
        first, second = [await asyncio.to_thread(node.mount, name) for name in ("a", "b")]
        await asyncio.to_thread(force_unmount, tmp_path / "a")  # `bootseer ... umount`
        await gone(first["pid"], "the unmounted mount's handle exits")
        assert is_mounted(tmp_path / "b")
        server.proc.kill()
        await unmounted(tmp_path / "b", "the host unmounts its mounts once the server is gone")
        await gone(second["pid"], "the remaining mount's handle exits")
        await gone(second["server_pid"], "the host exits")
    finally:
        await server.stop()
        with contextlib.suppress(FileNotFoundError):
            server.socket.unlink()  # a killed server leaves its socket


async def test_a_server_and_host_killed_together_leave_no_mount(
        tmp_path: Path, node: Node, server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    """Whoever sees it first (the host: the server's end; the handle: both ends), the
    mount is unmounted and its handle ends."""
    monkeypatch.setenv(SERVER_ENV, str(server.socket))
    ready = await asyncio.to_thread(node.mount, "a")
    server.proc.kill()
    os.kill(ready["server_pid"], signal.SIGKILL)
    await unmounted(tmp_path / "a", "the mount unmounted with its server and host killed")
    await gone(ready["pid"], "its handle exits")
    server.socket.unlink()  # a killed server leaves its socket


async def test_pyfuse3_mounts_are_forked_and_outlive_the_server(
        tmp_path: Path, node: Node, monkeypatch: pytest.MonkeyPatch,
        capfd: pytest.CaptureFixture[str]) -> None:
    server = await start_server(tmp_path / "mount.sock")
    monkeypatch.setenv(SERVER_ENV, str(server.socket))
    mount: Callable[..., dict[str, Any]] = node.mount
    try:
        ready = await asyncio.to_thread(mount, "mnt", "--no-passthrough")
        assert parent_of(ready["pid"]) == server.proc.pid and "server_pid" not in ready
        assert await asyncio.to_thread((tmp_path / "mnt/data/f.bin").read_bytes) == node.data

        # A serving command that fails: its own message, through the log it was given.
        with pytest.raises(MountError, match="cannot read the tree file"):
            await asyncio.to_thread(mount, "bad", tree_file=tmp_path / "no-such-tree.json")
    finally:
        assert await server.stop() == 0
    assert not server.socket.exists()
    assert await asyncio.to_thread((tmp_path / "mnt/data/f.bin").read_bytes) == node.data

    # The socket is gone: the next mount says so and starts its process here.
    capfd.readouterr()
    ready = await asyncio.to_thread(mount, "mnt2")
    assert "starting the mount process here" in capfd.readouterr().err
    assert parent_of(ready["pid"]) == os.getpid()
    assert await asyncio.to_thread((tmp_path / "mnt2/data/f.bin").read_bytes) == node.data


async def test_the_server_runs_serving_commands_only(server: Server) -> None:
    assert stat.S_IMODE(server.socket.stat().st_mode) == 0o600
    read_fd, write_fd = os.pipe()
    try:
        with pytest.raises(ServerRefused, match="not a serving command"):
            fork_serving(str(server.socket), [sys.executable, "-m", "http.server"],
                         write_fd, write_fd)
        # Garbage, and a request without its descriptors: refused, and the server goes on.
        for payload, fds in ((b"\xff not json", [write_fd, write_fd]),
                             (json.dumps({"argv": [sys.executable, "-m", "fusefs"],
                                          "cwd": "/", "env": {}}).encode(), [])):
            with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as sock:
                sock.connect(str(server.socket))
                socket.send_fds(sock, [payload], fds)
                assert "error" in json.loads(sock.recv(65536))
        with pytest.raises(ServerRefused, match="not a serving command"):
            fork_serving(str(server.socket), [sys.executable, "-c", "print(1)"],
                         write_fd, write_fd)
    finally:
        os.close(read_fd)
        os.close(write_fd)
    assert server.proc.returncode is None


async def test_a_second_server_on_a_live_socket_refuses_to_start(server: Server) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "fusefs", "server", "--socket", str(server.socket),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), BOUND_S)
    assert proc.returncode == 2 and out == b""
    assert b"already answers" in err and b"Traceback" not in err
    assert server.proc.returncode is None and server.socket.is_socket()


@pytest.mark.parametrize("where", ["missing-dir/mount.sock", "a-file"])
async def test_a_socket_path_the_server_cannot_use_is_a_one_line_error(
        tmp_path: Path, where: str) -> None:
    (tmp_path / "a-file").write_text("not a socket")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "fusefs", "server", "--socket", str(tmp_path / where),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), BOUND_S)
    assert proc.returncode == 2 and out == b"", err
    assert (b"does not exist" if "/" in where else b"is not a socket") in err
    assert b"Traceback" not in err
    assert (tmp_path / "a-file").read_text() == "not a socket"  # left as it was
