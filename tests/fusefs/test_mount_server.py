"""The mount server (`bootseer fs server`): serving processes forked from a started one.

A real server process on a unix socket, real `fusefs mount` serving processes
over a real agent, and a real FUSE mount read from this process. What is
proved:

- with BOOTSEER_MOUNT_SERVER set, `start_detached` (every `mount` command)
  gets its serving process from the server (its parent is the server), with
  the caller's stdout and stderr: the mount serves the tree's bytes, and a
  serving command that fails reports its own error through the log it was
  given;
- mounts outlive the server; the server removes its socket when it stops;
  a socket nobody answers on makes `start_detached` say so and start the
  process itself;
- the server runs serving commands only, refuses malformed requests and goes
  on serving, listens at mode 0600, and will not start over a live server.

A node without /dev/fuse or fusermount3 FAILS these tests, naming the Debian
package to install; it does not skip them.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import stat
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from fusefs.mount import MountError, start_detached
from fusefs.mountinfo import is_mounted
from fusefs.server import SERVER_ENV, ServerRefused, fork_serving
from fusefs.tree import Entry, Extent, Kind, Layer, build_tree
from p2p.testing.localcluster import LocalCluster, write_random_file
from p2p.units import MiB

pytestmark = pytest.mark.usefixtures("fuse_ready")
SIZE = 3 * MiB + 5
BOUND_S = 30.0


class Server:
    def __init__(self, proc: asyncio.subprocess.Process, socket_path: Path) -> None:
        self.proc, self.socket = proc, socket_path

    async def stop(self) -> int:
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
        return await asyncio.wait_for(self.proc.wait(), BOUND_S)


async def start_server(socket_path: Path, env: dict[str, str] | None = None) -> Server:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "fusefs", "server", "--socket", str(socket_path),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env)
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), BOUND_S)
    assert json.loads(line)["event"] == "serving", line
    return Server(proc, socket_path)


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[Server]:
    s = await start_server(tmp_path / "mount.sock")
    try:
        yield s
    finally:
        await s.stop()


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


async def stop_mount(pid: int, mountpoint: Path) -> None:
    os.kill(pid, signal.SIGTERM)
    for _ in range(int(BOUND_S / 0.05)):
        if not is_mounted(mountpoint):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{mountpoint} still mounted {BOUND_S} s after SIGTERM")


async def test_mounts_come_from_the_server_and_outlive_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
        ) -> None:
    cluster = LocalCluster(tmp_path / "cluster")
    mounts: list[tuple[int, Path]] = []
    try:
        origin = tmp_path / "origin"
        await asyncio.to_thread(write_random_file, origin / "layer.bin", SIZE, 7)
        await cluster.start_tracker()
        await cluster.start_origin(origin)
        agent = await cluster.start_agent(0, "rack0")
        layer = await cluster.publish(origin / "layer.bin", MiB)
        tree = build_tree([Layer("layer", [Entry("data/f.bin", Kind.FILE, size=SIZE, extents=(
            Extent(layer.content_id, 0, SIZE),))])])
        (tmp_path / "tree.json").write_bytes(tree.to_json())
        for key, value in cluster.env.items():
            monkeypatch.setenv(key, value)
        server = await start_server(tmp_path / "mount.sock")
        monkeypatch.setenv(SERVER_ENV, str(server.socket))

        def mount(name: str, tree_file: Path) -> dict[str, Any]:
            where = tmp_path / name
            where.mkdir()
            argv = [sys.executable, "-m", "fusefs", "mount", str(tree_file), str(where),
                    "--api-socket", agent.api_socket, "--store-dir", str(agent.store_dir)]
            ready = start_detached(argv, tmp_path / f"{name}.log", BOUND_S)
            mounts.append((ready["pid"], where))
            return ready

        ready = await asyncio.to_thread(mount, "mnt", tmp_path / "tree.json")
        assert parent_of(ready["pid"]) == server.proc.pid
        want = (origin / "layer.bin").read_bytes()
        assert await asyncio.to_thread((tmp_path / "mnt/data/f.bin").read_bytes) == want

        # A serving command that fails: its own message, through the log it was given.
        with pytest.raises(MountError, match="cannot read the tree file"):
            await asyncio.to_thread(mount, "bad", tmp_path / "no-such-tree.json")

        assert await server.stop() == 0
        assert not server.socket.exists()
        assert await asyncio.to_thread((tmp_path / "mnt/data/f.bin").read_bytes) == want

        # The socket is gone: the next mount says so and starts its process here.
        capfd.readouterr()
        ready = await asyncio.to_thread(mount, "mnt2", tmp_path / "tree.json")
        assert "starting the mount process here" in capfd.readouterr().err
        assert parent_of(ready["pid"]) == os.getpid()
        assert await asyncio.to_thread((tmp_path / "mnt2/data/f.bin").read_bytes) == want
    finally:
        for pid, where in mounts:
            if is_mounted(where):
                await stop_mount(pid, where)
        await cluster.stop()


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
