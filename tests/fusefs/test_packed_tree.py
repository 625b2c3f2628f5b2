"""The packed tree: the same answers as the tree it packs, and hostile bytes refused.

Every hostile case starts from a good packed tree and changes one field in place
(then fixes the digest, as a forger would), so each test names the check it needs.
"""

from __future__ import annotations

import array
import struct

import pytest
import xxhash

from fusefs.packedtree import HEADER, PackedTree, _Counts, pack_tree
from fusefs.tree import ROOT_INODE, Entry, Extent, Kind, Layer, Tree, TreeError, build_tree

A = "c1-" + "a" * 64
B = "c1-" + "b" * 64


def sample() -> Tree:
    def f(path: str, size: int, content: str = A, offset: int = 0) -> Entry:
        return Entry(path, Kind.FILE, mode=0o640, uid=7, gid=8, mtime_ns=123, size=size,
                     extents=(Extent(content, offset, size),))

    lower = [Entry("usr", Kind.DIR), Entry("usr/bin", Kind.DIR), f("usr/bin/python3", 4096),
             f("usr/bin/gone", 3), Entry("etc", Kind.DIR, mode=0o700),
             Entry("etc/x", Kind.FILE, size=10, xattrs={"user.k": b"v\0w"},
                   extents=(Extent(A, 0, 4), Extent(B, 100, 6))),
             Entry("bin", Kind.SYMLINK, target="usr/bin"),
             Entry("usr/bin/py", Kind.HARDLINK, target="usr/bin/python3"),
             Entry("caf\udcc3", Kind.DIR), f("empty", 0)]
    upper = [Entry("usr/bin/.wh.gone", Kind.FILE), f("usr/bin/new", 5, B, 512)]
    return build_tree([Layer("L0", lower), Layer("L1", upper)])


def test_it_answers_as_the_tree_it_packs() -> None:
    tree = sample()
    packed = PackedTree(pack_tree(tree))
    packed.check()
    assert len(packed) == len(tree) and packed.total_bytes == tree.total_bytes
    assert sorted(packed.walk()) == sorted(tree.walk())
    for inode in range(1, len(tree) + 1):
        assert packed.node(inode) == tree.node(inode)
        assert sorted(n for n, _, _ in packed.readdir(inode)) == \
            sorted(n for n, _, _ in tree.readdir(inode))
    x = tree.resolve("etc/x")
    assert x is not None and packed.resolve("etc/x") == x
    assert packed.map_range(x.inode, 2, 5) == tree.map_range(x.inode, 2, 5) == [
        Extent(A, 2, 2), Extent(B, 100, 3)]
    assert packed.lookup(ROOT_INODE, "nothing") is None
    assert packed.lookup(x.inode, "under-a-file") is None
    assert packed.resolve("usr/bin/gone") is None
    with pytest.raises(KeyError):
        packed.node(len(tree) + 1)


def test_readdir_offsets_resume_where_they_stopped() -> None:
    packed = PackedTree(pack_tree(sample()))
    usr_bin = packed.resolve("usr/bin")
    assert usr_bin is not None
    whole = list(packed.readdir(usr_bin.inode))
    assert [n for n, _, _ in whole] == ["new", "py", "python3"]
    assert list(packed.readdir(usr_bin.inode, whole[0][2])) == whole[1:]


def test_packing_is_deterministic() -> None:
    assert pack_tree(sample()) == pack_tree(sample())


# ---- hostile bytes ----------------------------------------------------------------------


def forged(data: bytes, section: str, row: int, value: int) -> bytes:
    """`data` with column `section`'s row set to `value`, and the digest made to match."""
    counts = _Counts(*HEADER.unpack_from(data)[3:])
    at = HEADER.size
    for name, code, rows in counts.sections():
        width = array.array(code).itemsize
        if name == section:
            out = bytearray(data)
            struct.pack_into("<" + code, out, at + row * width, value)
            out[8:24] = xxhash.xxh3_128_digest(bytes(out[HEADER.size:]))
            return bytes(out)
        at += rows * width
    raise AssertionError(section)


def test_a_flipped_byte_fails_the_digest_at_open() -> None:
    data = bytearray(pack_tree(sample()))
    data[-1] ^= 1
    with pytest.raises(TreeError, match="digest"):
        PackedTree(bytes(data))


@pytest.mark.parametrize("cut", [10, 65, -1])
def test_a_short_or_long_file_is_refused_at_open(cut: int) -> None:
    data = pack_tree(sample())
    with pytest.raises(TreeError):
        PackedTree(data[:cut] if cut > 0 else data + b"\0")


def test_a_huge_count_in_the_header_is_refused_before_anything_is_read() -> None:
    data = bytearray(pack_tree(sample()))
    struct.pack_into("<I", data, 32, 1 << 30)  # nodes
    with pytest.raises(TreeError, match="larger than any tree"):
        PackedTree(bytes(data))


def child_row(tree: Tree, path: str) -> tuple[int, int]:
    """(row in the child table of `path`'s entry, its parent's inode)."""
    data = pack_tree(tree)
    packed = PackedTree(data)
    parent_path, _, name = path.rpartition("/")
    parent = packed.resolve(parent_path)
    assert parent is not None
    first = packed._cols["first"][parent.inode - 1]
    names = [n for n, _, _ in packed.readdir(parent.inode)]
    return first + names.index(name), parent.inode


def test_a_directory_listed_under_a_second_parent_is_eio_not_a_loop() -> None:
    tree = sample()
    row, _ = child_row(tree, "usr/bin/new")
    usr = tree.resolve("usr")
    assert usr is not None
    packed = PackedTree(forged(pack_tree(tree), "child", row, usr.inode))  # usr/bin/new -> usr
    with pytest.raises(TreeError, match="another parent"):
        packed.resolve("usr/bin/new")
    with pytest.raises(TreeError):
        packed.check()


def test_a_child_naming_its_own_ancestor_is_refused() -> None:
    tree = sample()
    row, _ = child_row(tree, "usr/bin")
    packed = PackedTree(forged(pack_tree(tree), "child", row, ROOT_INODE))
    with pytest.raises(TreeError, match="not listed"):
        packed.lookup(packed.resolve("usr").inode, "bin")  # type: ignore[union-attr]


def test_a_name_with_a_slash_is_refused() -> None:
    tree = sample()
    data = pack_tree(tree)
    at = data.index(b"python3")
    bad = bytearray(data)
    bad[at + 2] = ord("/")
    bad[8:24] = xxhash.xxh3_128_digest(bytes(bad[HEADER.size:]))
    with pytest.raises(TreeError, match="bad name"):
        PackedTree(bytes(bad)).resolve("usr/bin/python3")


def test_extents_that_do_not_add_up_are_refused_at_first_use() -> None:
    tree = sample()
    x = tree.resolve("etc/x")
    assert x is not None
    packed = PackedTree(forged(pack_tree(tree), "size", x.inode - 1, 11))
    packed.resolve("etc")  # the rest of the tree still serves
    with pytest.raises(TreeError, match="add up"):
        packed.node(x.inode)


def test_an_extent_of_an_unlisted_content_is_refused() -> None:
    tree = sample()
    packed = PackedTree(forged(pack_tree(tree), "ext_content", 0, 9))
    with pytest.raises(TreeError):
        packed.check()


def test_a_device_node_is_refused() -> None:
    tree = sample()
    x = tree.resolve("etc/x")
    assert x is not None
    packed = PackedTree(forged(pack_tree(tree), "mode", x.inode - 1, 0o020644))
    with pytest.raises(TreeError, match="not a file, directory or symlink"):
        packed.node(x.inode)


def test_an_unreachable_node_fails_the_full_check() -> None:
    tree = sample()
    row, _ = child_row(tree, "empty")
    hard = tree.resolve("usr/bin/python3")
    assert hard is not None
    packed = PackedTree(forged(pack_tree(tree), "child", row, hard.inode))
    with pytest.raises(TreeError, match="not reachable"):
        packed.check()
