"""A snapshot's mount tree: built from its entries, or packed once at capture.

`snapshot_tree` makes the `fusefs.tree.Tree` a mount serves: one extent per
file, `(pack content, member offset, size)` in its pack's raw bytes
(`depsnap.source` turns those into reads of frames). Building it makes several
Python objects per entry: 0.19-0.28 s of CPU for the 10,447 files of the
bench's ML snapshot on an idle core, 0.35-0.87 s under load, on the first
mount's critical path. So `capture` packs it once (`packed_tree`,
`fusefs.packedtree`, checked whole) and publishes it as a content the
snapshot names (`Snapshot.packed_tree`, pinned by the tree's own id), and a
mount opens it (`open_tree`) with the mounting user as owner. No I/O here.
"""

from __future__ import annotations

import logging

from depsnap.snapshot import Snapshot
from fusefs.tree import Entry, Extent, Kind, Layer, Tree, TreeError, TreeView, build_tree

log = logging.getLogger("bootseer.depsnap")
KINDS = {"dir": Kind.DIR, "file": Kind.FILE, "symlink": Kind.SYMLINK}


def snapshot_tree(snapshot: Snapshot, uid: int = 0, gid: int = 0) -> Tree:
    """The snapshot as a fusefs tree: one extent per file, into its pack."""
    where = snapshot.locations()
    entries = []
    for e in snapshot.entries:
        extents: tuple[Extent, ...] = ()
        if e.kind == "file":
            pack, member = where[e.digest]
            extents = (Extent(pack.content, member.offset, e.size),)
        entries.append(Entry(e.path, KINDS[e.kind], e.mode, uid, gid, e.mtime_ns, e.size,
                             extents, e.target))
    return build_tree([Layer(f"snapshot {snapshot.key}", entries)])


def packed_tree(snapshot: Snapshot) -> bytes:
    """The snapshot's mount tree, packed (`fusefs.packedtree`) and checked whole: made once
    at capture, so a mount opens it instead of building a tree of 10,000+ Python objects
    (0.2-0.5 s of a first mount's CPU here). Owners are the mounting user's, set at open."""
    from fusefs.packedtree import pack_checked

    return pack_checked(snapshot_tree(snapshot), f"packed tree of key {snapshot.key}")


def open_tree(snapshot: Snapshot, packed: bytes | None, uid: int, gid: int) -> TreeView:
    """The mount's tree: the published packed one if there is one that opens (its header
    and digest; nodes are checked at first use), else built from the snapshot."""
    from fusefs.packedtree import PackedTree

    if packed is not None:
        try:
            return PackedTree(packed, f"packed tree of key {snapshot.key}", (uid, gid))
        except TreeError as exc:
            log.warning("%s; building the tree", exc)
    return snapshot_tree(snapshot, uid, gid)
