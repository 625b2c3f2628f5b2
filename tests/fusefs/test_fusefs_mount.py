"""A real FUSE mount of a merged tree, served by a child process, read from this one.

Each test starts a LocalCluster (tracker, HTTP origin, one agent), publishes
random contents, builds a two-layer tree over them (files small, large and
spanning chunks, empty, split over two contents; symlinks, a hard link, a
whiteout, an opaque directory, xattrs) and mounts it with
`python -m fusefs mount` in a child process: a process that reads a pyfuse3
mount it serves deadlocks, so this process only reads. What is proved:

- every path, mode, owner, size, link count, link target and xattr of the
  mount is the tree's, and whiteouts and the opaque directory hide what they
  should; `ls`/`stat`/`readlink`/xattrs fetch nothing (the agent has not even
  opened the contents); then every file reads back byte for byte;
- writes fail with EROFS;
- a read of a chunk whose origin is dead fails with EIO once the mount's read
  bound passes (instead of hanging), is logged, and the mount keeps serving;
- a chunk file corrupted on disk is never returned: the read returns the
  right bytes after the agent fetched the chunk again, or EIO when it cannot.

A node without /dev/fuse or fusermount3 FAILS these tests, naming the Debian
package to install; it does not skip them.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import signal
import stat
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from helpers.promtext import metric

from fusefs.mount import Mount
from fusefs.mountinfo import is_mounted
from fusefs.tree import Entry, Extent, Kind, Layer, Tree, build_tree
from p2p.content import Manifest
from p2p.process import free_port
from p2p.testing.localcluster import AgentHandle, LocalCluster, write_random_file
from p2p.units import MiB

CHUNK = 1 * MiB
SHORT_READ_BOUND_S = 2.0
READ_BOUND_S = 30.0
TEST_BOUND_S = 90.0  # a hang fails the test instead of stalling the suite


@dataclass
class World:
    cluster: LocalCluster
    agent: AgentHandle
    mount: Mount
    tree: Tree
    data: dict[str, bytes]  # content id -> its bytes
    layer0: Manifest
    layer1: Manifest
    dead: Manifest

    @property
    def root(self) -> Path:
        return self.mount.mountpoint

    def expected(self, path: str) -> bytes:
        node = self.tree.resolve(path)
        assert node is not None and node.kind is Kind.FILE
        return b"".join(self.data[e.content][e.offset:e.offset + e.length]
                        for e in node.extents)

    async def agent_view(self) -> tuple[dict[str, object], str]:
        async with self.agent.client(30.0) as client:
            return (await client.status())["contents"], await client.metrics()


def f(path: str, content: Manifest, offset: int, length: int, **kw: object) -> Entry:
    return Entry(path, Kind.FILE, size=length,
                 extents=(Extent(content.content_id, offset, length),), **kw)  # type: ignore[arg-type]


def layers(a: Manifest, b: Manifest, dead: Manifest) -> list[Layer]:
    big = (500_000, 4 * MiB + 777)  # spans chunks 0..4 of layer0, unaligned
    split = (Extent(a.content_id, 6 * MiB, 1000), Extent(b.content_id, MiB - 10, 2 * MiB))
    lower = [
        Entry("etc", Kind.DIR, mode=0o750, uid=3, gid=4, mtime_ns=1_700_000_000_000_000_000),
        f("etc/small", a, 10, 100, mode=0o640, uid=1000, gid=1000,
          xattrs={"user.note": b"hi", "user.bin": b"\0\xff"}),
        f("etc/motd", a, 200, 50),
        f("usr/bin/big", a, *big, mode=0o755),
        Entry("usr/bin/big-link", Kind.HARDLINK, target="usr/bin/big"),
        Entry("empty", Kind.FILE, mode=0o600),
        f("gone", a, 0, 10),
        Entry("opt", Kind.DIR), f("opt/old", a, 0, 10), Entry("opt/olddir", Kind.DIR),
        Entry("bin", Kind.SYMLINK, target="usr/bin"),
        Entry("abs", Kind.SYMLINK, target="/etc/small"),
        Entry("escape", Kind.SYMLINK, target="../../../../etc/passwd"),
        Entry("dev/null", Kind.DEVICE),
    ]
    upper = [
        Entry(".wh.gone", Kind.FILE),
        Entry("opt", Kind.DIR, mode=0o700), Entry("opt/.wh..wh..opq", Kind.FILE),
        f("opt/new", b, 0, 1000),
        f("etc/motd", b, 5, 70, mode=0o444),
        Entry("split", Kind.FILE, size=1000 + 2 * MiB, extents=split),
        *(f(f"alias{i}", a, *big) for i in range(3)),
        f("dead.bin", dead, 0, dead.size),
    ]
    return [Layer("layer0", lower), Layer("layer1", upper)]


@contextlib.asynccontextmanager
async def world(tmp_path: Path, read_bound_s: float) -> AsyncIterator[World]:
    cluster = LocalCluster(tmp_path / "cluster")
    mount: Mount | None = None
    mountpoint = tmp_path / "mnt"
    try:
        origin = tmp_path / "origin"
        sizes = {"layer0.bin": 7 * MiB + 1000, "layer1.bin": 3 * MiB, "dead.bin": 2 * MiB}
        for i, (name, size) in enumerate(sizes.items()):
            await asyncio.to_thread(write_random_file, origin / name, size, i + 1)
        await cluster.start_tracker()
        await cluster.start_origin(origin)
        agent = await cluster.start_agent(0, "rack0")
        a = await cluster.publish(origin / "layer0.bin", CHUNK)
        b = await cluster.publish(origin / "layer1.bin", CHUNK)
        dead = await cluster.publish(origin / "dead.bin", CHUNK,
                                     origin=f"http://127.0.0.1:{free_port()}/dead.bin")
        data = {m.content_id: (origin / n).read_bytes() for m, n in
                ((a, "layer0.bin"), (b, "layer1.bin"), (dead, "dead.bin"))}
        tree = build_tree(layers(a, b, dead))
        tree_file = tmp_path / "tree.json"
        tree_file.write_bytes(tree.to_json())
        mountpoint.mkdir()
        mount = await Mount.start(tree_file, mountpoint, agent.api_socket, agent.store_dir,
                                  tmp_path / "mount.log", "--read-timeout", str(read_bound_s),
                                  env=cluster.env)
        yield World(cluster, agent, mount, tree, data, a, b, dead)
    finally:
        try:
            if mount is not None:
                await mount.stop()
        finally:
            await cluster.stop()
        assert not is_mounted(mountpoint), "the mount outlived its test"


def corrupt(store: Path, content: str, index: int) -> None:
    """Flip bytes in the middle of a stored chunk file, in place (same size)."""
    path = store / content / f"{index}.chunk"
    with open(path, "r+b") as fh:
        fh.seek(1234)
        good = fh.read(16)
        fh.seek(1234)
        fh.write(bytes(x ^ 0xFF for x in good))


def read_file(path: Path) -> bytes:
    with open(path, "rb") as fh:
        return fh.read()


def pread(path: Path, offset: int, length: int) -> bytes:
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.pread(fd, length, offset)
    finally:
        os.close(fd)


# ---- the tests ----------------------------------------------------------------------------


async def test_metadata_fetches_nothing_then_every_file_reads_back(
        fuse_ready: None, tmp_path: Path) -> None:
    async with asyncio.timeout(TEST_BOUND_S), world(tmp_path, READ_BOUND_S) as w:
        seen = await asyncio.to_thread(check_metadata, w.root, w.tree)
        assert "gone" not in seen and "opt/old" not in seen and "opt/olddir" not in seen
        assert "opt/new" in seen and "dev" in seen and "dev/null" not in seen
        contents, text = await w.agent_view()
        assert contents == {}, "metadata alone made the agent open a content"
        assert metric(text, "bootseer_origin_bytes_total") == 0
        assert metric(text, "bootseer_peer_bytes_total") == 0

        for path, node in w.tree.walk():
            if node.kind is Kind.FILE and path != "dead.bin":
                got = await asyncio.to_thread(read_file, w.root / path)
                assert got == w.expected(path), f"{path}: the bytes differ"
        contents, text = await w.agent_view()
        assert set(contents) == {w.layer0.content_id, w.layer1.content_id}
        assert metric(text, "bootseer_origin_bytes_total") > 0

        await asyncio.to_thread(check_read_only, w.root)


def check_metadata(root: Path, tree: Tree) -> set[str]:
    """Compare every path's metadata with the tree's; return the paths seen."""
    seen = set()
    for top, dirs, files in os.walk(root):
        for name in dirs + files:
            seen.add(os.path.relpath(os.path.join(top, name), root))
    assert seen == {path for path, _ in tree.walk()}
    inodes = {}
    for path, node in tree.walk():
        st = os.lstat(root / path)
        where = f"{path}: {st}"
        assert (st.st_mode, st.st_uid, st.st_gid, st.st_size, st.st_nlink) == (
            node.mode, node.uid, node.gid, node.size, node.nlink), where
        assert st.st_mtime_ns == node.mtime_ns, where
        inodes.setdefault(node.inode, set()).add(st.st_ino)
        if node.kind is Kind.SYMLINK:
            assert os.readlink(root / path) == node.target
        xattrs = {name: os.getxattr(root / path, name, follow_symlinks=False)
                  for name in os.listxattr(root / path, follow_symlinks=False)}
        assert xattrs == dict(node.xattrs), where
    assert all(len(st_inos) == 1 for st_inos in inodes.values())  # hard links: one inode
    big, link = os.stat(root / "usr/bin/big"), os.stat(root / "usr/bin/big-link")
    assert big.st_ino == link.st_ino and big.st_nlink == 2
    assert stat.S_IMODE(os.stat(root / "opt").st_mode) == 0o700
    assert os.path.realpath(root / "bin") == str(root / "usr/bin")  # resolved by the kernel
    with pytest.raises(OSError) as caught:
        os.getxattr(root / "etc/small", "user.absent")
    assert caught.value.errno == errno.ENODATA
    vfs = os.statvfs(root)
    assert vfs.f_files == len(tree) and vfs.f_bfree == 0
    return seen


def open_and_close(path: Path, mode: str) -> None:
    with open(path, mode):
        pass


def check_read_only(root: Path) -> None:
    attempts = [
        lambda: open_and_close(root / "etc/small", "r+b"),
        lambda: open_and_close(root / "new-file", "wb"),
        lambda: os.mkdir(root / "newdir"),
        lambda: os.unlink(root / "etc/small"),
        lambda: os.rename(root / "etc/small", root / "etc/other"),
        lambda: os.symlink("x", root / "link2"),
        lambda: os.chmod(root / "etc/small", 0o777),
        lambda: os.setxattr(root / "etc/small", "user.x", b"1"),
        lambda: os.truncate(root / "etc/small", 0),
    ]
    for attempt in attempts:
        with pytest.raises(OSError) as caught:
            attempt()
        assert caught.value.errno == errno.EROFS, caught.value


async def test_read_of_an_unreachable_chunk_is_eio_after_the_bound(
        fuse_ready: None, tmp_path: Path) -> None:
    async with asyncio.timeout(TEST_BOUND_S), world(tmp_path, SHORT_READ_BOUND_S) as w:
        with pytest.raises(OSError) as caught:
            await asyncio.to_thread(pread, w.root / "dead.bin", MiB, 4096)
        assert caught.value.errno == errno.EIO
        log = w.mount.log_path.read_text()
        assert "EIO" in log and w.dead.content_id in log, log[-2000:]
        assert "did not arrive within 2 s" in log, log[-2000:]
        got = await asyncio.to_thread(read_file, w.root / "etc/small")  # still serving
        assert got == w.expected("etc/small")


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
async def test_a_read_across_an_agent_restart_pauses_and_returns_the_right_bytes(
        fuse_ready: None, tmp_path: Path, sig: int) -> None:
    async with asyncio.timeout(TEST_BOUND_S), world(tmp_path, READ_BOUND_S) as w:
        small = await asyncio.to_thread(read_file, w.root / "etc/small")  # chunk 0 is local
        assert small == w.expected("etc/small")
        agent = w.agent.child
        w.cluster.children.remove(agent)
        await agent.stop(sig)
        started = time.monotonic()
        reader = asyncio.ensure_future(asyncio.to_thread(read_file, w.root / "usr/bin/big"))
        await asyncio.sleep(1.0)  # the reader is now waiting for chunks 1..4
        assert not reader.done(), "the read ended with no agent to serve its chunks"
        await w.cluster.start_agent(0, "rack0", name="agent0")  # its store and socket again
        got = await reader
        stall = time.monotonic() - started
        assert got == w.expected("usr/bin/big")
        assert "waits for the agent" in w.mount.log_path.read_text()
        if sig == signal.SIGTERM:  # a content first touched while the agent is away
            agent = w.cluster.children.pop()
            await agent.stop(sig)
            reader = asyncio.ensure_future(asyncio.to_thread(read_file, w.root / "opt/new"))
            await asyncio.sleep(1.0)
            assert not reader.done(), "the read ended with no agent to attach its content"
            await w.cluster.start_agent(0, "rack0", name="agent0")
            assert await reader == w.expected("opt/new")
        print(json.dumps({"restart_signal": sig.name, "reader_stall_s": round(stall, 2)}))


async def test_a_corrupted_chunk_file_is_never_returned(fuse_ready: None,
                                                        tmp_path: Path) -> None:
    async with asyncio.timeout(TEST_BOUND_S), world(tmp_path, SHORT_READ_BOUND_S * 2) as w:
        layer0 = w.layer0.content_id
        async with w.agent.client(60.0) as client:
            await client.ensure(layer0)  # every chunk local before the mount reads any
        store = w.agent.store_dir
        corrupt(store, layer0, 1)  # before this process ever read it
        got = await asyncio.to_thread(read_file, w.root / "usr/bin/big")
        assert got == w.expected("usr/bin/big")

        corrupt(store, layer0, 2)  # after it passed a check here: the file's stat changed
        got = await asyncio.to_thread(read_file, w.root / "alias0")  # another inode: uncached
        assert got == w.expected("alias0")
        _, text = await w.agent_view()
        assert metric(text, "bootseer_chunks_damaged_total") >= 2

        await next(c for c in w.cluster.children if c.name == "origin").stop()
        corrupt(store, layer0, 3)  # and now nobody can supply it again
        offset = 3 * CHUNK - 500_000  # alias1's byte at the start of chunk 3
        with pytest.raises(OSError) as caught:
            await asyncio.to_thread(pread, w.root / "alias1", offset, 4096)
        assert caught.value.errno == errno.EIO
        ok = await asyncio.to_thread(pread, w.root / "alias1", 0, 4096)
        assert ok == w.expected("alias1")[:4096]


async def test_a_bad_tree_file_is_one_line_not_a_traceback(tmp_path: Path) -> None:
    (tmp_path / "mnt").mkdir()
    bad = tmp_path / "tree.json"
    bad.write_text('{"version": 1, "nodes": [{"inode": 1, "kind": "dir", "mode": 16877, '
                   '"uid": 0, "gid": 0, "mtime_ns": 0, "children": [["x", 1]]}]}')
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m", "fusefs", "mount", str(bad), str(tmp_path / "mnt"), "--api-socket", "s",
        "--store-dir", str(tmp_path), stderr=asyncio.subprocess.PIPE)
    _, err = await proc.communicate()
    assert proc.returncode == 2
    assert err.decode().count("\n") == 1 and "two parents" in err.decode(), err
    assert "Traceback" not in err.decode()


async def _terminate_as_the_fd_wakes(wait: Any, notify: Any, woken_first: bool) -> list[str]:
    """A worker waits for a pipe to be readable; it becomes readable, and `notify` (what
    pyfuse3.terminate calls) runs either after the reader callback completed the wait but
    before the worker resumed (`woken_first`), or as a callback (SIGTERM's) that the loop
    runs just before the reader callback it queued in the same poll. The errors raised,
    out of `notify` or logged by the loop."""
    loop = asyncio.get_running_loop()
    errors: list[str] = []
    handler = loop.get_exception_handler()
    loop.set_exception_handler(lambda _, context: errors.append(repr(context.get("exception"))))
    r, w = os.pipe()
    try:
        worker = asyncio.create_task(wait(r))
        await asyncio.sleep(0)  # it is waiting
        os.write(w, b"x")
        if woken_first:  # the loop runs us, the reader callback, us, then the worker
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            try:
                notify(r)
            except asyncio.InvalidStateError as exc:
                errors.append(repr(exc))
        else:  # the next poll queues the reader callback after this one
            loop.call_soon(notify, r)
        with contextlib.suppress(Exception):
            await worker
        await asyncio.sleep(0)
    finally:
        worker.cancel()
        loop.set_exception_handler(handler)
        os.close(r)
        os.close(w)
    return errors


@pytest.mark.parametrize("woken_first", [True, False])
async def test_terminating_as_the_fuse_device_wakes_raises_nothing(woken_first: bool) -> None:
    import pyfuse3.asyncio

    from fusefs.mount import notify_closing, wait_readable

    theirs = await _terminate_as_the_fd_wakes(pyfuse3.asyncio.wait_readable,
                                              pyfuse3.asyncio.notify_closing, woken_first)
    ours = await _terminate_as_the_fd_wakes(wait_readable, notify_closing, woken_first)
    assert theirs and "InvalidStateError" in theirs[0]  # the race, in pyfuse3's shim
    assert ours == []
