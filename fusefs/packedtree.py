"""A merged tree packed once, at `image index`, and opened by a mount in milliseconds.

Theory of operation
-------------------
Merging an image's layers (`fusefs.tree.build_tree`) makes several Python
objects per tar entry, at every mount: 0.65-1.4 s for the 37,000 entries of an
ML image. The merged tree depends only on the image, so the indexer builds it
once and packs it (`pack_tree`) into columns of fixed-width integers and two
byte blobs. `PackedTree` reads those columns through memoryviews: opening one
checks the header, the sections' bounds and an xxh3-128 digest of the body,
and makes no object per entry. A node becomes a `fusefs.tree.Node` when it is
first asked for, a directory's names a dict when it is first looked up or
listed; both are kept (a mount asks for a few thousand of them).

Layout (version 1, little-endian). A 64-byte header: magic, the digest of
everything after the header, the total file bytes, then the counts (nodes,
children, extents, contents, xattrs, name bytes, string bytes). Then the
columns, 8-byte ones first so every column is aligned: per node (inode i at
row i - 1) mtime_ns and size; per extent its offset and length; per node
mode (with the type bits), uid, gid, nlink, `first` and `count` (a
directory's rows in the child table, a file's in the extent table, a
symlink's target in the strings), its xattrs' first row and count, and a
directory's parent; per child its inode and the end of its name in the names
blob (names are stored back to back, a directory's children in the byte
order of their names); per extent its content's row; per content, and per
xattr key and value, an offset and a length in the strings blob. Then the
names blob and the strings blob.

Trust. The file reaches a node through the swarm, pinned by the content id
the image's bindings name, like the layer indexes; still, no field is used
unchecked. What a mount uses is checked when it is first used, not at open,
which is what keeps opening in milliseconds: a node's type bits, extents
(rows in range, contents listed, lengths adding up to the size), symlink
target and xattrs when it becomes a `Node`; a directory's listing when it is
first read: child inodes in range, names non-empty, at most 255 bytes,
without '/' or NUL, not '.' or '..', unique, and every child directory
numbered after its parent and naming that parent as its own, so no directory
has two parents and no walk can loop. A fault is a `TreeError` (the shells
answer EIO and log it). `check` does all of it at once: the indexer calls it
on what it packed, and the tests do.

This module does no I/O and reads no clock.
"""

from __future__ import annotations

import array
import stat
import struct
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import cast

import xxhash

from fusefs.tree import (
    MAX_NAME_BYTES,
    ROOT_INODE,
    Extent,
    Kind,
    Node,
    Tree,
    TreeError,
    clip,
    extent_starts,
)

MAGIC = b"BSTREE\x00\x01"
HEADER = struct.Struct("<8s16sQ7I4x")
MAX_COUNT = 1 << 28  # rows in any table: far beyond any image, bounds what a header claims
_NODE_U32 = ("mode", "uid", "gid", "nlink", "first", "count", "xfirst", "xcount", "parent")
_KINDS = {stat.S_IFREG: Kind.FILE, stat.S_IFDIR: Kind.DIR, stat.S_IFLNK: Kind.SYMLINK}

assert HEADER.size == 64
assert array.array("I").itemsize == 4 and array.array("Q").itemsize == 8


@dataclass(frozen=True, slots=True)
class _Counts:
    nodes: int
    children: int
    extents: int
    contents: int
    xattrs: int
    names: int
    strings: int

    def sections(self) -> list[tuple[str, str, int]]:
        """(name, array type code, rows) of each section, in file order."""
        return [("mtime", "q", self.nodes), ("size", "Q", self.nodes),
                ("ext_offset", "Q", self.extents), ("ext_length", "Q", self.extents),
                *((name, "I", self.nodes) for name in _NODE_U32),
                ("child", "I", self.children), ("name_end", "I", self.children),
                ("ext_content", "I", self.extents),
                ("content_off", "I", self.contents), ("content_len", "I", self.contents),
                ("xkey_off", "I", self.xattrs), ("xkey_len", "I", self.xattrs),
                ("xval_off", "I", self.xattrs), ("xval_len", "I", self.xattrs),
                ("names", "B", self.names), ("strings", "B", self.strings)]


# ---- packing (at index time) --------------------------------------------------------


def pack_tree(tree: Tree) -> bytes:
    """`tree` in the packed form; deterministic (the same tree gives the same bytes)."""
    cols = {name: array.array(code) for name, code, _ in _Counts(0, 0, 0, 0, 0, 0, 0).sections()}
    names, strings = bytearray(), bytearray()
    contents: dict[str, int] = {}
    parents = [0] * (len(tree) + 1)

    def put_string(data: bytes) -> tuple[int, int]:
        strings.extend(data)
        return len(strings) - len(data), len(data)

    for inode in range(1, len(tree) + 1):
        node = tree.node(inode)
        first = count = 0
        match node.kind:
            case Kind.DIR:
                first = len(cols["child"])
                for raw, child in sorted((_encode(name), kid.inode)
                                         for name, kid, _ in tree.readdir(inode)):
                    names.extend(raw)
                    cols["child"].append(child)
                    cols["name_end"].append(len(names))
                    if tree.node(child).kind is Kind.DIR:
                        parents[child] = inode
                count = len(cols["child"]) - first
            case Kind.FILE:
                first, count = len(cols["ext_content"]), len(node.extents)
                for extent in node.extents:
                    row = contents.setdefault(extent.content, len(contents))
                    cols["ext_content"].append(row)
                    cols["ext_offset"].append(extent.offset)
                    cols["ext_length"].append(extent.length)
            case Kind.SYMLINK:
                first, count = put_string(_encode(node.target))
        xfirst = len(cols["xkey_off"])
        for key, data in node.xattrs:
            for (off, length), prefix in ((put_string(_encode(key)), "xkey"),
                                          (put_string(data), "xval")):
                cols[f"{prefix}_off"].append(off)
                cols[f"{prefix}_len"].append(length)
        values = (node.mode, node.uid, node.gid, node.nlink, first, count, xfirst,
                  len(node.xattrs), 0)
        for name, value in zip(_NODE_U32, values, strict=True):
            cols[name].append(value)
        cols["mtime"].append(node.mtime_ns)
        cols["size"].append(node.size)
    for inode in range(1, len(tree) + 1):
        cols["parent"][inode - 1] = parents[inode]
    for content in contents:
        off, length = put_string(content.encode())
        cols["content_off"].append(off)
        cols["content_len"].append(length)
    cols["names"].frombytes(names)
    cols["strings"].frombytes(strings)
    counts = _Counts(len(tree), len(cols["child"]), len(cols["ext_content"]), len(contents),
                     len(cols["xkey_off"]), len(names), len(strings))
    if sys.byteorder != "little":
        for column in cols.values():
            column.byteswap()
    body = b"".join(cols[name].tobytes() for name, _, _ in counts.sections())
    header = HEADER.pack(MAGIC, xxhash.xxh3_128_digest(body), tree.total_bytes,
                         counts.nodes, counts.children, counts.extents, counts.contents,
                         counts.xattrs, counts.names, counts.strings)
    return header + body


def pack_checked(tree: Tree, name: str) -> bytes:
    """`pack_tree`, then every node of what was packed checked (`PackedTree.check`): what a
    publisher does before it names a packed tree (an image's at index, a snapshot's at
    capture), so a fault shows there, not at a mount."""
    data = pack_tree(tree)
    PackedTree(data, name).check()
    return data


def _encode(name: str) -> bytes:
    return name.encode("utf-8", "surrogateescape")


def _decode(raw: bytes | memoryview) -> str:
    return bytes(raw).decode("utf-8", "surrogateescape")


# ---- reading (at every mount) --------------------------------------------------------


class PackedTree:
    """A `fusefs.tree.TreeView` over packed bytes (see the module docstring)."""

    def __init__(self, data: bytes, name: str = "packed tree",
                 owner: tuple[int, int] | None = None) -> None:
        """TreeError (naming `name`) unless `data` has the header, sections and digest of a
        packed tree; the rest is checked as it is used. With `owner` (uid, gid), every
        node shows that owner instead of the packed one (a snapshot mount shows its
        files as the mounting user's, as `depsnap.mounttree.snapshot_tree` does)."""
        self.name = name
        self._owner = owner
        if len(data) < HEADER.size:
            raise TreeError(name, "", "shorter than a packed tree's header")
        magic, digest, total, *counts = HEADER.unpack_from(data)
        if magic != MAGIC:
            raise TreeError(name, "", "not a version 1 packed tree")
        self._counts = _Counts(*counts)
        if not (self._counts.nodes >= 1 and all(c < MAX_COUNT for c in counts)):
            raise TreeError(name, "", "no root, or tables larger than any tree")
        sections = self._counts.sections()
        size = HEADER.size + sum(rows * array.array(code).itemsize
                                 for _, code, rows in sections)
        if len(data) != size:
            raise TreeError(name, "", f"{len(data)} bytes where its header says {size}")
        body = memoryview(data)[HEADER.size:]
        if xxhash.xxh3_128_digest(body) != digest:
            raise TreeError(name, "", "its digest does not match its bytes")
        if sys.byteorder != "little":  # columns are little-endian: swap once, into arrays
            body = memoryview(_swapped(body, sections))
        self.total_bytes: int = total
        self._cols: dict[str, memoryview] = {}
        at = 0
        for section, code, rows in sections:
            width = array.array(code).itemsize
            self._cols[section] = body[at:at + rows * width].cast(code)  # type: ignore[call-overload]
            at += rows * width
        if not stat.S_ISDIR(self._cols["mode"][0]):
            raise TreeError(name, "", "its root (inode 1) is not a directory")
        self._names = bytes(self._cols["names"])
        self._strings = bytes(self._cols["strings"])
        self._nodes: dict[int, Node] = {}
        self._dirs: dict[int, tuple[list[str], dict[str, int]]] = {}
        self._starts: dict[int, list[int]] = {}

    def __len__(self) -> int:
        return self._counts.nodes

    def node(self, inode: int) -> Node:
        """The node with this inode; KeyError if there is none, TreeError if it is bad."""
        node = self._nodes.get(inode)
        if node is None:
            if not 1 <= inode <= self._counts.nodes:
                raise KeyError(inode)
            node = self._nodes[inode] = self._make_node(inode)
        return node

    def lookup(self, parent: int, name: str) -> Node | None:
        listing = self._listing(parent)
        inode = None if listing is None else listing[1].get(name)
        return None if inode is None else self.node(inode)

    def readdir(self, inode: int, offset: int = 0) -> Iterator[tuple[str, Node, int]]:
        listing = self._listing(inode)
        if listing is None:
            return
        names, kids = listing
        for index in range(max(offset, 0), len(names)):
            yield names[index], self.node(kids[names[index]]), index + 1

    def map_range(self, inode: int, offset: int, length: int) -> list[Extent]:
        node = self.node(inode)
        starts = self._starts.get(inode)
        if starts is None:
            starts = self._starts[inode] = extent_starts(node.extents)
        return clip(node, starts, offset, length)

    def resolve(self, path: str) -> Node | None:
        """The node at `path` (relative to the root), never following symlinks."""
        node: Node | None = self.node(ROOT_INODE)
        for part in (p for p in path.split("/") if p and p != "."):
            if node is None:
                return None
            node = self.lookup(node.inode, part)
        return node

    def walk(self, inode: int = ROOT_INODE, prefix: str = "") -> Iterator[tuple[str, Node]]:
        """(path, node) of every path under `inode`, depth first, in listing order."""
        for name, node, _ in self.readdir(inode):
            yield f"{prefix}{name}", node
            if node.kind is Kind.DIR:
                yield from self.walk(node.inode, f"{prefix}{name}/")

    def check(self) -> None:
        """Check every node and listing now (TreeError on the first fault), and that
        every node is reachable from the root."""
        seen = {ROOT_INODE}
        for _, node in self.walk():
            seen.add(node.inode)
        if len(seen) != len(self):
            raise TreeError(self.name, "", f"{len(self) - len(seen)} nodes are not reachable "
                                           "from the root")

    # ---- the checks, at first use ------------------------------------------------------

    def _make_node(self, inode: int) -> Node:
        c, row = self._cols, inode - 1
        mode = c["mode"][row]
        kind = _KINDS.get(stat.S_IFMT(mode))
        if kind is None:
            raise self._bad(inode, f"mode {mode:o} is not a file, directory or symlink")
        first, count = c["first"][row], c["count"][row]
        size, target, extents = c["size"][row], "", cast(tuple[Extent, ...], ())
        match kind:
            case Kind.FILE:
                extents = self._extents(inode, first, count, size)
            case Kind.SYMLINK:
                raw = self._string(inode, first, count)
                if not raw or b"\0" in raw or len(raw) != size:
                    raise self._bad(inode, "a symlink with an empty, NUL or mis-sized target")
                target = _decode(raw)
            case Kind.DIR:
                if first + count > self._counts.children:
                    raise self._bad(inode, "children out of range")
        uid, gid = self._owner or (c["uid"][row], c["gid"][row])
        return Node(inode, kind, mode, uid, gid, c["mtime"][row], size,
                    c["nlink"][row], target, extents, self._xattrs(inode, row))

    def _extents(self, inode: int, first: int, count: int, size: int) -> tuple[Extent, ...]:
        c = self._cols
        if first + count > self._counts.extents:
            raise self._bad(inode, "extents out of range")
        out = []
        for row in range(first, first + count):
            content, length = c["ext_content"][row], c["ext_length"][row]
            if content >= self._counts.contents or length == 0:
                raise self._bad(inode, "an extent of no content or no bytes")
            off, n = c["content_off"][content], c["content_len"][content]
            out.append(Extent(self._string(inode, off, n).decode("ascii", "replace"),
                              c["ext_offset"][row], length))
        if sum(e.length for e in out) != size:
            raise self._bad(inode, "extents do not add up to the size")
        return tuple(out)

    def _xattrs(self, inode: int, row: int) -> tuple[tuple[str, bytes], ...]:
        c = self._cols
        first, count = c["xfirst"][row], c["xcount"][row]
        if not count:
            return ()
        if first + count > self._counts.xattrs:
            raise self._bad(inode, "xattrs out of range")
        return tuple((_decode(self._string(inode, c["xkey_off"][x], c["xkey_len"][x])),
                      self._string(inode, c["xval_off"][x], c["xval_len"][x]))
                     for x in range(first, first + count))

    def _string(self, inode: int, off: int, length: int) -> bytes:
        if off + length > self._counts.strings:
            raise self._bad(inode, "a string out of range")
        return self._strings[off:off + length]

    def _listing(self, inode: int) -> tuple[list[str], dict[str, int]] | None:
        """A directory's names in order and name -> inode; None if `inode` is no directory."""
        listing = self._dirs.get(inode)
        if listing is None:
            if self.node(inode).kind is not Kind.DIR:
                return None
            listing = self._dirs[inode] = self._make_listing(inode)
        return listing

    def _make_listing(self, inode: int) -> tuple[list[str], dict[str, int]]:
        c, row = self._cols, inode - 1
        first, count = c["first"][row], c["count"][row]
        names: list[str] = []
        kids: dict[str, int] = {}
        start = c["name_end"][first - 1] if first else 0
        for index in range(first, first + count):
            end, child = c["name_end"][index], c["child"][index]
            raw = self._names[start:end] if start <= end <= self._counts.names else b"/"
            start = end
            if (not raw or len(raw) > MAX_NAME_BYTES or raw in (b".", b"..")
                    or b"/" in raw or b"\0" in raw):
                raise self._bad(inode, f"a bad name {raw[:40]!r}")
            if not 2 <= child <= self._counts.nodes:
                raise self._bad(inode, f"a child names inode {child}, which is not listed")
            if stat.S_ISDIR(c["mode"][child - 1]) and (child <= inode
                                                      or c["parent"][child - 1] != inode):
                raise self._bad(inode, f"directory inode {child} has another parent")
            name = _decode(raw)
            if name in kids:
                raise self._bad(inode, f"{name!r} listed twice")
            names.append(name)
            kids[name] = child
        return names, kids

    def _bad(self, inode: int, why: str) -> TreeError:
        return TreeError(self.name, f"inode {inode}", why)


def _swapped(body: memoryview, sections: list[tuple[str, str, int]]) -> bytes:
    out = []
    at = 0
    for _, code, rows in sections:
        column = array.array(code)
        column.frombytes(body[at:at + rows * column.itemsize])
        column.byteswap()
        out.append(column.tobytes())
        at += rows * column.itemsize
    return b"".join(out)
