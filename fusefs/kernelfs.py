"""A read-only filesystem spoken straight to /dev/fuse, for reads by passthrough.

Used instead of the pyfuse3 shell (`fusefs.fs`) where a measured target needs
what pyfuse3 cannot give: a file whose content is whole and verified on this node
(or whose one range of a content is) is opened in passthrough mode, and the
kernel then reads its backing file (`fusefs.backing`) itself; no READ for it
reaches this process. Every other file, and every file while its content is
incomplete, is served by the same handler
path as `fusefs.fs`: `Tree.map_range`, then the `Source` (verified chunk files,
the agent for missing chunks, EIO after the source's bound). Which files have
a backing file, and how one is built and checked, is the `Backing`'s business.

Rules of the kernel this follows (Linux 6.9+): an inode is in passthrough mode or
in cached mode while any file of it is open, never both (an open asking for the
other mode fails with EIO), and all its passthrough opens share one backing file.
So the first open of an inode picks the mode, the ones while it is open follow
it, and its backing id is closed at its last RELEASE. A file with no backing
file yet is opened in cached mode, and its backing may start building one in
the background (a content that became whole, a snapshot file just verified);
the next first open uses it.

The codec is `fusefs.protocol`; this module reads requests (one `readv` each into
one reused buffer, on the event loop, non-blocking), answers metadata inline from
the tree, and runs OPEN and READ as tasks (they wait on disk threads or the
agent). Mounting is `fusefs.kernelmount`, a mount's life `fusefs.kernelserve`.
`PassthroughUnavailable` says why the mount cannot be served this way (no
privilege, a kernel that does not offer passthrough); `fusefs.mount.serve` then
serves with pyfuse3 instead.
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import logging
import os
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from fusefs import protocol as P
from fusefs.kept import OpenJournal
from fusefs.kernelmount import unmount
from fusefs.source import Source, SourceError
from fusefs.tree import Extent, Kind, Node, TreeError, TreeView

log = logging.getLogger(__name__)

TIMEOUT_S = 24 * 3600.0  # the tree never changes
BLOCK_SIZE = 1 << 20
NAME_MAX = 255
REQUEST_BUFFER = 1 << 17  # > max_write (4 KiB) + headers; xattr names fit with room


class Backing(Protocol):
    """Backing files for passthrough, each written only from verified bytes
    (`fusefs.backing.WholeBacking`: a range of a content kept in the store;
    `depsnap.backing.MemberFiles`: a decoded file of a snapshot pack)."""

    @property
    def built(self) -> int:
        """Backing files this process wrote."""

    @property
    def checked(self) -> int:
        """Backing files this mount hashed at an open (files the process's memory of
        checked stats did not vouch for: `fusefs.backing.CheckedFiles`)."""

    async def open(self, extent: Extent) -> int | None:
        """An fd of a checked backing file holding exactly `extent`'s bytes, for the caller
        to close; None if there is none yet (one may be built for a later open)."""

    async def close(self) -> None:
        """Stop building."""


class FuseReply(Exception):
    """Answer the request with this errno."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


@dataclass
class _Opened:
    """The mode an inode's open files share (see the module docstring)."""

    count: int
    backing_id: int | None  # None: cached mode, the handler serves its reads


class KernelFS:
    """Serves `tree` on the FUSE device `fd` (already mounted at `path`)."""

    def __init__(self, tree: TreeView, source: Source, backing: Backing | None, fd: int,
                 path: str, want_passthrough: bool = True,
                 journal: OpenJournal | None = None) -> None:
        self.tree = tree
        self.source = source
        self.backing = backing
        self.fd = fd
        self.path = path
        self.want_passthrough = want_passthrough and backing is not None
        self.passthrough = False  # negotiated at INIT
        self.no_open = False  # negotiated at INIT: without passthrough, OPEN is not needed
        self.requests: Counter[int] = Counter()  # by opcode
        self.request_s: defaultdict[int, float] = defaultdict(float)  # from reading to answer
        self.reads = self.read_bytes = self.failed_reads = 0
        self.passthrough_opens = self.handler_opens = 0
        self._buffer = bytearray(REQUEST_BUFFER)
        self._opened: dict[int, _Opened] = {}
        self._journal = journal  # kept by a mount server with the device (fusefs.kept)
        self._open_locks: dict[int, asyncio.Lock] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._done: asyncio.Future[None] | None = None
        self._initialised: Callable[[], None] = lambda: None
        self._ops: dict[int, Callable[[P.Header, memoryview], bytes]] = {
            P.Op.LOOKUP: self._lookup, P.Op.GETATTR: self._getattr,
            P.Op.READLINK: self._readlink, P.Op.OPENDIR: self._opendir,
            P.Op.READDIR: self._readdir, P.Op.READDIRPLUS: self._readdirplus,
            P.Op.RELEASEDIR: lambda h, b: b"",
            P.Op.STATFS: self._statfs, P.Op.ACCESS: self._access,
            P.Op.GETXATTR: self._getxattr, P.Op.LISTXATTR: self._listxattr,
            P.Op.RELEASE: self._release, P.Op.FLUSH: self._flush,
            P.Op.OPEN: self._no_open, P.Op.DESTROY: lambda h, b: b""}

    # ---- the device ---------------------------------------------------------------------

    async def serve(self, initialised: Callable[[], None], resumed: bool = False) -> None:
        """Answer requests until the mount goes away or `stop`. INIT comes first;
        `initialised` is called once its reply is written. `resumed` (after `adopt`): the
        device was served by a process that died; INIT came then, and the requests it had
        read but not answered are queued again (FUSE_NOTIFY_RESEND)."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        self._done = done
        self._initialised = initialised
        loop.add_reader(self.fd, self._drain, done)
        if resumed:
            self._write([P.notify_resend()])
            initialised()
        try:
            await done
        finally:
            loop.remove_reader(self.fd)
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            if self.backing is not None:
                await self.backing.close()
            self._close_backing()

    def stop(self) -> None:
        """Unmount (lazily if files are open) and stop serving: the mount's stop. Requests
        still in the kernel fail with ENOTCONN once the device is closed."""
        unmount(self.path)
        if self._done is not None and not self._done.done():
            self._done.set_result(None)

    def _drain(self, done: asyncio.Future[None]) -> None:
        view = memoryview(self._buffer)
        while not done.done():
            try:
                n = os.readv(self.fd, [self._buffer])
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno == errno.ENOENT:  # the request was interrupted: next one
                    continue
                if exc.errno != errno.ENODEV:
                    log.warning("reading /dev/fuse: %s", exc)
                done.set_result(None)  # ENODEV: unmounted
                return
            if n == 0:
                done.set_result(None)
                return
            header, body = P.parse(view[:n])
            self._handle(header, body)

    def _handle(self, header: P.Header, body: memoryview) -> None:
        op = header.opcode
        self.requests[op] += 1
        if op in P.NO_REPLY:
            return  # forgets: the tree is immutable, nothing to free; interrupts: reads end
        started = time.perf_counter()
        if op == P.Op.INIT:
            self._reply(header.unique, self._init(body))
            self._initialised()
            return
        if op in (P.Op.OPEN, P.Op.READ) and not (op == P.Op.OPEN and self.no_open):
            body = memoryview(bytes(body))  # the buffer is reused by the next request
            job = self._open(header, body) if op == P.Op.OPEN else self._read(header, body)
            task = asyncio.get_running_loop().create_task(job)
            self._tasks.add(task)
            task.add_done_callback(lambda t: self._finished(t, op, started))
            return
        handler = self._ops.get(op)
        try:
            if handler is None:
                raise FuseReply(errno.EROFS if op in P.WRITE_OPS else errno.ENOSYS)
            self._reply(header.unique, handler(header, body))
        except FuseReply as exc:
            self._error(header.unique, exc.code)
        except TreeError as exc:  # a packed tree's fault, found at its first use
            log.warning("%s: EIO", exc)
            self._error(header.unique, errno.EIO)
        self.request_s[op] += time.perf_counter() - started

    def _finished(self, task: asyncio.Task[None], op: int, started: float) -> None:
        self._tasks.discard(task)
        self.request_s[op] += time.perf_counter() - started

    def account(self) -> dict[str, list[float]]:
        """Requests by opcode name: [count, seconds from reading each to answering it]."""
        return {P.NAMES.get(op, str(op)): [n, round(self.request_s[op], 4)]
                for op, n in self.requests.most_common()}

    def _reply(self, unique: int, payload: bytes | memoryview) -> None:
        self._write([P.reply_header(unique, len(payload)), payload])

    def _error(self, unique: int, code: int) -> None:
        self._write([P.reply_header(unique, 0, code)])

    def _write(self, parts: list[Any]) -> None:
        try:
            os.writev(self.fd, parts)
        except OSError as exc:  # ENOENT: interrupted meanwhile; ENODEV: unmounted
            if exc.errno not in (errno.ENOENT, errno.ENODEV):
                log.warning("replying on /dev/fuse: %s", exc)

    # ---- metadata ----------------------------------------------------------------------

    def negotiated(self) -> dict[str, Any]:
        """What INIT settled, for a process that serves this device after us (`adopt`)."""
        return {"passthrough": self.passthrough, "no_open": self.no_open}

    def adopt(self, state: dict[str, Any]) -> None:
        """Serve a device another process served: what its INIT settled, and its open
        files (from the journal)."""
        self.passthrough, self.no_open = bool(state["passthrough"]), bool(state["no_open"])
        if self._journal is not None:
            self._opened = {inode: _Opened(count, backing_id) for inode, (count, backing_id)
                            in self._journal.replay().items()}

    def _init(self, body: memoryview) -> bytes:
        offer = P.init_in(body)
        answer = P.negotiate(offer, self.want_passthrough, want_no_open=self.backing is None)
        self.passthrough, self.no_open = answer.passthrough, answer.no_open
        log.info("FUSE %d.%d, passthrough %s, no-open %s", offer.major, answer.minor,
                 "on" if self.passthrough else "off", "on" if self.no_open else "off")
        return P.init_out(answer)

    def _flush(self, header: P.Header, body: memoryview) -> bytes:
        # Nothing is ever written: ENOSYS makes the kernel stop sending FLUSH at each close.
        raise FuseReply(errno.ENOSYS)

    def _no_open(self, header: P.Header, body: memoryview) -> bytes:
        """OPEN with no-open on: ENOSYS, and the kernel opens every file by itself from
        now on, with no OPEN or RELEASE round trip (a read-only mount: the VFS refuses
        writes before they get here). Only the first open of the mount comes here."""
        raise FuseReply(errno.ENOSYS)

    def _node(self, inode: int) -> Node:
        try:
            return self.tree.node(inode)
        except KeyError:
            raise FuseReply(errno.ENOENT) from None
        except TreeError as exc:
            log.warning("%s: EIO", exc)
            raise FuseReply(errno.EIO) from None

    def _lookup(self, header: P.Header, body: memoryview) -> bytes:
        node = self.tree.lookup(header.nodeid, os.fsdecode(P.name_arg(body)))
        return P.entry_out(None if node is None else _attr(node), TIMEOUT_S)

    def _getattr(self, header: P.Header, body: memoryview) -> bytes:
        return P.attr_out(_attr(self._node(header.nodeid)), TIMEOUT_S)

    def _readlink(self, header: P.Header, body: memoryview) -> bytes:
        node = self._node(header.nodeid)
        if node.kind is not Kind.SYMLINK:
            raise FuseReply(errno.EINVAL)
        return os.fsencode(node.target)

    def _opendir(self, header: P.Header, body: memoryview) -> bytes:
        if self.no_open:
            raise FuseReply(errno.ENOSYS)  # as `_no_open`, for directories
        if self._node(header.nodeid).kind is not Kind.DIR:
            raise FuseReply(errno.ENOTDIR)
        return P.open_out(header.nodeid, P.FOPEN_KEEP_CACHE | P.FOPEN_CACHE_DIR)

    def _readdir(self, header: P.Header, body: memoryview) -> bytes:
        args = P.read_in(body)
        entries = ((os.fsencode(name), node.inode, node.mode, next_off)
                   for name, node, next_off in self.tree.readdir(header.nodeid, args.offset))
        return P.dirents(entries, args.size)

    def _readdirplus(self, header: P.Header, body: memoryview) -> bytes:
        args = P.read_in(body)
        entries = ((os.fsencode(name), _attr(node), next_off)
                   for name, node, next_off in self.tree.readdir(header.nodeid, args.offset))
        return P.direntplus(entries, args.size, TIMEOUT_S)

    def _statfs(self, header: P.Header, body: memoryview) -> bytes:
        return P.statfs_out((self.tree.total_bytes + 4095) // 4096, len(self.tree), NAME_MAX)

    def _access(self, header: P.Header, body: memoryview) -> bytes:
        self._node(header.nodeid)
        if P.access_mask(body) & os.W_OK:
            raise FuseReply(errno.EROFS)
        return b""

    def _getxattr(self, header: P.Header, body: memoryview) -> bytes:
        size, name = P.xattr_in(body)
        wanted = os.fsdecode(name)
        for key, value in self._node(header.nodeid).xattrs:
            if key == wanted:
                return _sized(value, size)
        raise FuseReply(errno.ENODATA)

    def _listxattr(self, header: P.Header, body: memoryview) -> bytes:
        size, _ = P.xattr_in(body)
        names = b"".join(os.fsencode(k) + b"\0" for k, _ in self._node(header.nodeid).xattrs)
        return _sized(names, size)

    # ---- data --------------------------------------------------------------------------

    async def _open(self, header: P.Header, body: memoryview) -> None:
        try:
            node = self._node(header.nodeid)
            flags = P.open_in(body)
            if flags & os.O_ACCMODE != os.O_RDONLY or flags & os.O_TRUNC:
                raise FuseReply(errno.EROFS)
            if node.kind is not Kind.FILE:
                raise FuseReply(errno.EISDIR if node.kind is Kind.DIR else errno.EINVAL)
            lock = self._open_locks.setdefault(node.inode, asyncio.Lock())
            async with lock:
                opened = self._opened.get(node.inode)
                if opened is None:
                    opened = _Opened(0, await self._backing_for(node))
                    self._opened[node.inode] = opened
                opened.count += 1
                self._note(node.inode, opened)
        except FuseReply as exc:
            self._error(header.unique, exc.code)
            return
        if opened.backing_id is None:
            self.handler_opens += 1
            self._reply(header.unique, P.open_out(node.inode, P.FOPEN_KEEP_CACHE))
        else:
            self.passthrough_opens += 1
            self._reply(header.unique, P.open_out(node.inode, P.FOPEN_PASSTHROUGH,
                                                  opened.backing_id))

    async def _backing_for(self, node: Node) -> int | None:
        """A backing id for the file's verified bytes; None: the handler serves."""
        extent = _one_extent(node)
        backing = self.backing
        if not self.passthrough or backing is None or extent is None:
            return None
        fd = await backing.open(extent)
        if fd is None:
            return None
        try:
            backing_id = fcntl.ioctl(self.fd, P.DEV_IOC_BACKING_OPEN,
                                     bytearray(P.backing_map(fd)), True)
            return backing_id if backing_id > 0 else None
        except OSError as exc:
            log.warning("the kernel refused a backing file for inode %d (%s); serving it "
                        "by the handler", node.inode, exc)
            return None
        finally:
            os.close(fd)

    def _release(self, header: P.Header, body: memoryview) -> bytes:
        inode = P.release_fh(body)
        opened = self._opened.get(inode)
        if opened is not None:
            opened.count -= 1
            self._note(inode, opened)
            if opened.count <= 0:
                del self._opened[inode]
                self._close_id(opened.backing_id)
        return b""

    def _note(self, inode: int, opened: _Opened) -> None:
        if self._journal is not None:
            self._journal.note(inode, opened.backing_id, max(opened.count, 0))

    def _close_id(self, backing_id: int | None) -> None:
        if backing_id is None:
            return
        try:
            fcntl.ioctl(self.fd, P.DEV_IOC_BACKING_CLOSE,
                        bytearray(backing_id.to_bytes(4, "little")), True)
        except OSError as exc:
            log.warning("closing backing id %d: %s", backing_id, exc)

    def _close_backing(self) -> None:
        for opened in self._opened.values():
            self._close_id(opened.backing_id)
        self._opened.clear()

    async def _read(self, header: P.Header, body: memoryview) -> None:
        args = P.read_in(body)
        self.reads += 1
        self.read_bytes += args.size
        try:
            extents = self.tree.map_range(header.nodeid, args.offset, args.size)
            parts = [await self.source.read(e.content, e.offset, e.length) for e in extents]
        except KeyError:
            self._error(header.unique, errno.ENOENT)
            return
        except (SourceError, TreeError) as exc:
            self.failed_reads += 1
            log.warning("read of inode %d, %d bytes at %d: EIO: %s", header.nodeid, args.size,
                        args.offset, exc)
            self._error(header.unique, errno.EIO)
            return
        size = sum(len(p) for p in parts)
        self._write([P.reply_header(header.unique, size), *parts])


def _one_extent(node: Node) -> Extent | None:
    """The one content range a file's bytes are, if they are one (passthrough maps a file
    onto one backing file)."""
    if node.kind is not Kind.FILE or len(node.extents) != 1 or node.size == 0:
        return None
    extent = node.extents[0]
    return extent if extent.length == node.size else None


def _attr(node: Node) -> P.Attr:
    return P.Attr(node.inode, node.size, node.mode, node.nlink, node.uid, node.gid,
                  node.mtime_ns, BLOCK_SIZE)


def _sized(value: bytes, size: int) -> bytes:
    """An xattr answer: its size if the caller asked for it (0), else the value."""
    if size == 0:
        return P.xattr_size_out(len(value))
    if len(value) > size:
        raise FuseReply(errno.ERANGE)
    return value
