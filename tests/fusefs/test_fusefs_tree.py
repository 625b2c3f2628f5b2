"""The no-I/O tree: OCI layer merge, bad paths, lookups, readdir offsets, extents, JSON.

Fixtures are lists of entries written with one-letter helpers; `listing(tree)`
renders a tree as strings (`dir/`, `file:SIZE`, `link->target`) so that each
expectation reads as the directory listing it is.
"""

from __future__ import annotations

import json
import stat

import pytest

from fusefs.tree import (
    ROOT_INODE,
    Entry,
    Extent,
    Kind,
    Layer,
    Tree,
    TreeError,
    build_tree,
)

A = "c1-" + "a" * 64
B = "c1-" + "b" * 64


def f(path: str, size: int = 1, content: str = A, offset: int = 0, **kw: object) -> Entry:
    return Entry(path, Kind.FILE, size=size, extents=(Extent(content, offset, size),) if size
                 else (), **kw)  # type: ignore[arg-type]


def d(path: str, mode: int = 0o755, **kw: object) -> Entry:
    return Entry(path, Kind.DIR, mode=mode, **kw)  # type: ignore[arg-type]


def sym(path: str, target: str) -> Entry:
    return Entry(path, Kind.SYMLINK, target=target)


def hard(path: str, target: str) -> Entry:
    return Entry(path, Kind.HARDLINK, target=target)


def dev(path: str) -> Entry:
    return Entry(path, Kind.DEVICE)


def layers(*entry_lists: list[Entry]) -> list[Layer]:
    return [Layer(f"L{i}", entries) for i, entries in enumerate(entry_lists)]


def listing(tree: Tree) -> list[str]:
    out = []
    for path, node in tree.walk():
        match node.kind:
            case Kind.DIR:
                out.append(path + "/")
            case Kind.SYMLINK:
                out.append(f"{path}->{node.target}")
            case _:
                out.append(f"{path}:{node.size}")
    return out


# ---- merging ------------------------------------------------------------------------


def test_later_layers_override_and_add() -> None:
    tree = build_tree(layers([d("etc"), f("etc/a", 3), f("etc/b", 1)],
                             [f("etc/a", 5), f("etc/c", 2)]))
    assert listing(tree) == ["etc/", "etc/a:5", "etc/b:1", "etc/c:2"]


def test_whiteout_deletes_lower_file_and_whole_directory() -> None:
    tree = build_tree(layers([f("a"), d("dir"), f("dir/x"), d("dir/sub"), f("dir/sub/y")],
                             [f(".wh.a", 0), f("dir/.wh.sub", 0), f(".wh.missing", 0)]))
    assert listing(tree) == ["dir/", "dir/x:1"]


def test_whiteout_never_hides_its_own_layer() -> None:
    tree = build_tree(layers([f("a", 1)], [f("a", 7), f(".wh.a", 0)]))
    assert listing(tree) == ["a:7"]


def test_opaque_directory_hides_lower_children_keeps_its_own() -> None:
    tree = build_tree(layers([d("opt"), f("opt/old"), d("opt/olddir"), f("keep")],
                             [d("opt", 0o700), f("opt/.wh..wh..opq", 0), f("opt/new", 4)]))
    assert listing(tree) == ["keep:1", "opt/", "opt/new:4"]
    opt = tree.resolve("opt")
    assert opt is not None and stat.S_IMODE(opt.mode) == 0o700


def test_other_aufs_metadata_is_ignored() -> None:
    tree = build_tree(layers([f("a")], [d(".wh..wh.plnk"), f(".wh..wh.aufs", 0)]))
    assert listing(tree) == ["a:1"]


def test_entry_types_replace_each_other() -> None:
    tree = build_tree(layers([d("x"), f("x/in"), f("y"), d("z"), f("z/keep")],
                             [f("x", 2), d("y"), d("z", 0o750)]))
    assert listing(tree) == ["x:2", "y/", "z/", "z/keep:1"]


def test_device_nodes_are_skipped_and_hide_what_was_below() -> None:
    tree = build_tree(layers([d("dev"), f("dev/null")], [dev("dev/null"), dev("dev/zero")]))
    assert listing(tree) == ["dev/"]


def test_missing_parents_are_made_as_root_owned_0755_dirs() -> None:
    tree = build_tree(layers([f("a/b/c", 1, uid=5)]))
    assert listing(tree) == ["a/", "a/b/", "a/b/c:1"]
    b = tree.resolve("a/b")
    assert b is not None and b.mode == stat.S_IFDIR | 0o755 and b.uid == 0


def test_dot_slash_prefix_and_trailing_slash_name_the_same_path() -> None:
    tree = build_tree(layers([d("./"), d("./usr/"), f("./usr/x")], [f("usr/./x", 3)]))
    assert listing(tree) == ["usr/", "usr/x:3"]


# ---- links ----------------------------------------------------------------------------


def test_hard_links_share_one_node() -> None:
    tree = build_tree(layers([f("bin/a", 9, mode=0o755)], [hard("bin/b", "bin/a"),
                                                          hard("c", "./bin/a")]))
    a, b, c = (tree.resolve(p) for p in ("bin/a", "bin/b", "c"))
    assert a is not None and a is b is c
    assert a.nlink == 3 and a.mode == stat.S_IFREG | 0o755


def test_hard_link_keeps_its_node_when_the_target_path_is_replaced() -> None:
    tree = build_tree(layers([f("a", 1), hard("b", "a")], [f("a", 2)]))
    assert listing(tree) == ["a:2", "b:1"]
    b = tree.resolve("b")
    assert b is not None and b.nlink == 1


def test_hard_link_within_one_layer_to_an_earlier_member() -> None:
    tree = build_tree(layers([f("x", 4), hard("y", "x")]))
    assert tree.resolve("x") is tree.resolve("y")


@pytest.mark.parametrize(("entries", "why"), [
    ([hard("b", "nope")], "not in this layer or those below"),
    ([d("dir"), hard("b", "dir")], "directory"),
    ([hard("b", "../etc/passwd")], "'..'"),
    ([hard("b", "/etc/passwd")], "absolute"),
])
def test_bad_hard_links_are_refused_naming_layer_and_path(entries: list[Entry],
                                                          why: str) -> None:
    with pytest.raises(TreeError, match=why) as caught:
        build_tree([Layer("sha256:feed", entries)])
    assert caught.value.layer == "sha256:feed" and caught.value.path == "b"
    assert "sha256:feed" in str(caught.value) and "'b'" in str(caught.value)


def test_symlink_targets_are_stored_as_is_and_never_followed() -> None:
    tree = build_tree(layers([d("usr"), d("usr/lib"), f("usr/lib/x"), sym("lib", "usr/lib"),
                              sym("esc", "../../../../etc/shadow"), sym("abs", "/etc/passwd")]))
    lib, esc, abs_ = (tree.resolve(p) for p in ("lib", "esc", "abs"))
    assert lib is not None and lib.target == "usr/lib" and lib.size == len("usr/lib")
    assert lib.mode == stat.S_IFLNK | 0o777
    assert esc is not None and esc.target == "../../../../etc/shadow"
    assert abs_ is not None and abs_.target == "/etc/passwd"
    assert tree.resolve("lib/x") is None  # lookups do not go through the link


def test_a_member_below_a_symlink_is_refused_not_redirected() -> None:
    with pytest.raises(TreeError, match="'lib' is a symlink") as caught:
        build_tree(layers([d("usr/lib"), sym("lib", "usr/lib")], [f("lib/evil")]))
    assert caught.value.layer == "L1" and caught.value.path == "lib/evil"


# ---- bad paths ------------------------------------------------------------------------


@pytest.mark.parametrize(("path", "why"), [
    ("/etc/passwd", "absolute"),
    ("../escape", r"'\.\.'"),
    ("a/../../b", r"'\.\.'"),
    ("", "empty path"),
    ("a//b", "empty name"),
    ("a/\0b", "NUL"),
    ("x" * 256, "longer than 255"),
])
def test_bad_member_paths_are_refused_naming_layer_and_path(path: str, why: str) -> None:
    with pytest.raises(TreeError, match=why) as caught:
        build_tree([Layer("L0", [f("ok")]), Layer("sha256:bad", [f(path)])])
    assert caught.value.layer == "sha256:bad" and caught.value.path == path


def test_duplicate_entries_in_one_layer_are_refused() -> None:
    with pytest.raises(TreeError, match="listed twice in one layer") as caught:
        build_tree(layers([f("etc/a"), f("etc/b"), f("./etc/a", 2)]))
    assert caught.value.path == "./etc/a"


def test_extents_must_add_up_to_the_size() -> None:
    bad = Entry("f", Kind.FILE, size=10, extents=(Extent(A, 0, 4),))
    with pytest.raises(TreeError, match="extents hold 4 bytes, the size is 10"):
        build_tree(layers([bad]))


def test_the_root_cannot_be_replaced_by_a_file() -> None:
    with pytest.raises(TreeError, match="root must be a directory"):
        build_tree(layers([f("./")]))


# ---- answering from memory -----------------------------------------------------------


def test_lookup_getattr_and_directory_link_counts() -> None:
    tree = build_tree(layers([d("a", uid=3, gid=4, mtime_ns=17), d("a/b"), d("a/c"), f("a/f"),
                              Entry("x", Kind.FILE, mode=0o4755, xattrs={"user.k": b"v"})]))
    a = tree.lookup(ROOT_INODE, "a")
    assert a is not None and (a.uid, a.gid, a.mtime_ns, a.nlink) == (3, 4, 17, 4)
    assert tree.lookup(a.inode, "f") is not None
    assert tree.lookup(a.inode, "nope") is None
    x = tree.resolve("x")
    assert x is not None and x.mode == stat.S_IFREG | 0o4755 and x.size == 0
    assert x.xattrs == (("user.k", b"v"),)
    assert tree.lookup(x.inode, "anything") is None  # a file has no children
    assert tree.node(ROOT_INODE).nlink == 3


def test_readdir_offsets_resume_where_they_left_off() -> None:
    tree = build_tree(layers([f(name) for name in "edcba"]))
    first = list(tree.readdir(ROOT_INODE))
    assert [name for name, _, _ in first] == list("abcde")
    assert [off for _, _, off in first] == [1, 2, 3, 4, 5]
    resumed = [name for name, _, _ in tree.readdir(ROOT_INODE, first[1][2])]
    assert resumed == list("cde")
    assert list(tree.readdir(ROOT_INODE, 5)) == []


def test_inode_numbers_are_deterministic() -> None:
    entries = [d("z"), f("z/1"), f("a"), sym("m", "a")]
    one, two = build_tree(layers(entries)), build_tree(layers(list(reversed(entries))))
    assert [(p, n.inode) for p, n in one.walk()] == [(p, n.inode) for p, n in two.walk()]
    assert sorted(n.inode for _, n in one.walk()) == [2, 3, 4, 5]


def test_map_range_across_extents_and_clipped_at_the_end() -> None:
    entry = Entry("f", Kind.FILE, size=10, extents=(Extent(A, 100, 4), Extent(B, 0, 0),
                                                    Extent(B, 50, 6)))
    tree = build_tree(layers([entry]))
    inode = tree.resolve("f").inode  # type: ignore[union-attr]
    assert tree.map_range(inode, 0, 10) == [Extent(A, 100, 4), Extent(B, 50, 6)]
    assert tree.map_range(inode, 3, 2) == [Extent(A, 103, 1), Extent(B, 50, 1)]
    assert tree.map_range(inode, 8, 1 << 20) == [Extent(B, 54, 2)]
    assert tree.map_range(inode, 10, 5) == []
    assert tree.contents() == [A, B]
    assert tree.total_bytes == 10


# ---- the shipped form -----------------------------------------------------------------


def sample() -> Tree:
    return build_tree(layers([d("bin"), f("bin/sh", 5, mode=0o755), hard("bin/ash", "bin/sh"),
                              sym("sh", "bin/sh"), Entry("e", Kind.FILE, xattrs={"a": b"\0\xff"}),
                              d("empty", 0o700, uid=7)]))


def test_json_round_trip_keeps_every_node() -> None:
    tree = sample()
    again = Tree.from_json(tree.to_json())
    assert list(again.walk()) == list(tree.walk())
    assert again.to_json() == tree.to_json()


def nodes_of(tree: Tree) -> list[dict[str, object]]:
    """The JSON nodes with the root first and a file (bin/sh) third."""
    raw: list[dict[str, object]] = json.loads(tree.to_json())["nodes"]
    file = next(n for n in raw if n["kind"] == "file" and n["size"] == 5)
    raw.remove(file)
    raw.insert(2, file)
    return raw


@pytest.mark.parametrize(("mutate", "why"), [
    (lambda n: n[0]["children"].append(["sh2", 1]), "two parents"),
    (lambda n: n[0]["children"].append(["x/y", 2]), "bad name"),
    (lambda n: n[0]["children"].append(["..", 2]), "bad name"),
    (lambda n: n[0]["children"].append(["ghost", 99]), "not listed"),
    (lambda n: n.append({**n[-1], "inode": 50}), "not reachable"),
    (lambda n: n[2].update(size=999), "add up"),
    (lambda n: n[2].update(mode=0o40755), "is not a file"),
    (lambda n: n[2].update(extents=[["c", -1, 5]]), "bad extent"),
    (lambda n: n[0].update(kind="hardlink"), "cannot be a node"),
    (lambda n: n.pop(0), "no root"),
])
def test_a_malformed_tree_file_is_refused(mutate: object, why: str) -> None:
    nodes = nodes_of(sample())
    assert nodes[2]["kind"] == "file"
    mutate(nodes)  # type: ignore[operator]
    with pytest.raises(TreeError, match=why):
        Tree.from_json(json.dumps({"version": 1, "nodes": nodes}), "t.json")


def test_not_json_is_a_tree_error() -> None:
    with pytest.raises(TreeError, match="not JSON"):
        Tree.from_json(b"\x80garbage")
    with pytest.raises(TreeError, match="not a version 1 tree"):
        Tree.from_json(b"[]")
