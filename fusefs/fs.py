"""The pyfuse3 shell: a read-only filesystem over a `Tree` and a `Source`.

One short `async def` per FUSE operation. Metadata (lookup, getattr, readdir,
readlink, xattrs, statfs) comes from the tree in memory and never touches the
source, so `ls`, `stat` or `find` fetch nothing. `read` maps the byte range to
content extents (`Tree.map_range`) and asks the source for each; a single
extent's buffer goes back to the kernel as it is (pyfuse3 takes any buffer),
so the only copy is the source's `pread`.

Tuning. The tree never changes: entry and attribute time-outs are a day (a
name that is not there is answered with a negative entry the kernel caches
as long: Python's import system probes thousands of absent names), and
`open` sets `keep_cache` so page-cache contents survive reopening (re-reads
at page-cache speed). The kernel's read size is raised separately, on the
mount's BDI (see fusefs.mount).

Errors are `FUSEError(errno)`: ENOENT for an inode the tree does not have,
EROFS for every write, EIO for a read whose bytes cannot be had in time
(the source says why; logged here with the file) and for any part of a packed
tree that fails its check at first use (`fusefs.packedtree`). The application owns lookup
counts: `lookup` and every entry `readdir` returns count one more, `forget`
counts them down; since the tree is immutable no inode is ever freed, the
counts only keep the bookkeeping honest.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pyfuse3
from pyfuse3 import FUSEError

from fusefs.source import Source, SourceError
from fusefs.tree import Kind, Node, TreeError, TreeView

log = logging.getLogger(__name__)

TIMEOUT_S = 24 * 3600.0  # entries and attributes never change
BLOCK_SIZE = 1 << 20  # st_blksize: tools that size their reads by it read 1 MiB
NAME_MAX = 255


class ContentFS(pyfuse3.Operations):
    """Serves `tree`, reading file bytes from `source`."""

    enable_writeback_cache = False

    def __init__(self, tree: TreeView, source: Source,
                 on_init: Callable[[], object] | None = None) -> None:
        """`on_init` is called when the kernel's INIT request is being answered."""
        super().__init__()
        self.tree = tree
        self.source = source
        self._on_init = on_init
        self.lookups: dict[int, int] = {}
        self.reads = 0
        self.read_bytes = 0
        self.failed_reads = 0
        self._attrs: dict[int, pyfuse3.EntryAttributes] = {}

    def init(self) -> None:
        if self._on_init is not None:
            self._on_init()

    # ---- metadata -------------------------------------------------------------------

    async def lookup(self, parent_inode: int, name: bytes, ctx: Any = None
                     ) -> pyfuse3.EntryAttributes:
        with _eio_on_tree_error():
            node = self.tree.lookup(parent_inode, os.fsdecode(name))
        if node is None:
            return _NEGATIVE  # the kernel caches the miss: imports probe many absent names
        self.lookups[node.inode] = self.lookups.get(node.inode, 0) + 1
        return self._attr(node)

    async def forget(self, inode_list: Sequence[tuple[int, int]]) -> None:
        for inode, count in inode_list:
            left = self.lookups.get(inode, 0) - count
            if left > 0:
                self.lookups[inode] = left
            else:
                self.lookups.pop(inode, None)

    async def getattr(self, inode: int, ctx: Any = None) -> pyfuse3.EntryAttributes:
        return self._attr(self._node(inode))

    async def readlink(self, inode: int, ctx: Any) -> bytes:
        node = self._node(inode)
        if node.kind is not Kind.SYMLINK:
            raise FUSEError(errno.EINVAL)
        return os.fsencode(node.target)

    async def opendir(self, inode: int, ctx: Any) -> int:
        if self._node(inode).kind is not Kind.DIR:
            raise FUSEError(errno.ENOTDIR)
        return inode

    async def readdir(self, fh: int, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        with _eio_on_tree_error():
            for name, node, next_id in self.tree.readdir(fh, start_id):
                if not pyfuse3.readdir_reply(token, os.fsencode(name), self._attr(node),
                                             next_id):
                    return
                self.lookups[node.inode] = self.lookups.get(node.inode, 0) + 1

    async def releasedir(self, fh: int) -> None:
        pass

    async def listxattr(self, inode: int, ctx: Any) -> list[bytes]:
        return [os.fsencode(name) for name, _ in self._node(inode).xattrs]

    async def getxattr(self, inode: int, name: bytes, ctx: Any) -> bytes:
        wanted = os.fsdecode(name)
        for key, value in self._node(inode).xattrs:
            if key == wanted:
                return value
        raise FUSEError(pyfuse3.ENOATTR)

    async def statfs(self, ctx: Any) -> pyfuse3.StatvfsData:
        out = pyfuse3.StatvfsData()
        out.f_bsize = out.f_frsize = 4096
        out.f_blocks = (self.tree.total_bytes + 4095) // 4096
        out.f_bfree = out.f_bavail = 0
        out.f_files = len(self.tree)
        out.f_ffree = out.f_favail = 0
        out.f_namemax = NAME_MAX
        return out

    async def access(self, inode: int, mode: int, ctx: Any) -> bool:
        self._node(inode)
        if mode & os.W_OK:
            raise FUSEError(errno.EROFS)
        return True

    # ---- data -------------------------------------------------------------------------

    async def open(self, inode: int, flags: int, ctx: Any) -> pyfuse3.FileInfo:
        node = self._node(inode)
        if flags & os.O_ACCMODE != os.O_RDONLY or flags & os.O_TRUNC:
            raise FUSEError(errno.EROFS)
        if node.kind is not Kind.FILE:
            raise FUSEError(errno.EISDIR if node.kind is Kind.DIR else errno.EINVAL)
        return pyfuse3.FileInfo(fh=inode, keep_cache=True)

    async def read(self, fh: int, off: int, size: int) -> Any:
        self.reads += 1
        self.read_bytes += size
        with _eio_on_tree_error():
            extents = self.tree.map_range(fh, off, size)
        try:
            if len(extents) == 1:
                e = extents[0]
                return await self.source.read(e.content, e.offset, e.length)
            return b"".join([await self.source.read(e.content, e.offset, e.length)
                             for e in extents])
        except SourceError as exc:
            self.failed_reads += 1
            log.warning("read of inode %d, %d bytes at %d: EIO: %s", fh, size, off, exc)
            raise FUSEError(errno.EIO) from None

    async def release(self, fh: int) -> None:
        pass

    # ---- everything that would write ----------------------------------------------------

    async def _read_only(self, *args: Any, **kwargs: Any) -> Any:
        raise FUSEError(errno.EROFS)

    setattr = mknod = mkdir = unlink = rmdir = symlink = rename = link = _read_only
    write = create = setxattr = removexattr = _read_only

    # ---- helpers ------------------------------------------------------------------------

    def _node(self, inode: int) -> Node:
        try:
            with _eio_on_tree_error():
                return self.tree.node(inode)
        except KeyError:
            raise FUSEError(errno.ENOENT) from None

    def _attr(self, node: Node) -> pyfuse3.EntryAttributes:
        attr = self._attrs.get(node.inode)
        if attr is None:
            attr = self._attrs[node.inode] = entry_attributes(node)
        return attr


@contextlib.contextmanager
def _eio_on_tree_error() -> Iterator[None]:
    """EIO for a packed tree's fault, found at its first use (`fusefs.packedtree`)."""
    try:
        yield
    except TreeError as exc:
        log.warning("%s: EIO", exc)
        raise FUSEError(errno.EIO) from None


def _negative_entry() -> pyfuse3.EntryAttributes:
    """A lookup miss the kernel keeps for TIMEOUT_S (st_ino 0: pyfuse3's negative entry)."""
    attr = pyfuse3.EntryAttributes()
    attr.st_ino = 0
    attr.entry_timeout = TIMEOUT_S
    return attr


_NEGATIVE = _negative_entry()


def entry_attributes(node: Node) -> pyfuse3.EntryAttributes:
    attr = pyfuse3.EntryAttributes()
    attr.st_ino = node.inode
    attr.generation = 0
    attr.entry_timeout = attr.attr_timeout = TIMEOUT_S
    attr.st_mode = node.mode
    attr.st_nlink = node.nlink
    attr.st_uid, attr.st_gid = node.uid, node.gid
    attr.st_rdev = 0
    attr.st_size = node.size
    attr.st_blksize = BLOCK_SIZE
    attr.st_blocks = (node.size + 511) // 512
    attr.st_atime_ns = attr.st_mtime_ns = attr.st_ctime_ns = node.mtime_ns
    return attr
