"""Snapshot symlinks are resolved against the tree, with their chains, not read as text:
a chain that reaches outside the prefix is refused wherever a tree is parsed (publish,
restore, mount all build a `Snapshot`), and a venv's own chains still pass."""

from __future__ import annotations

import pytest

from depsnap.snapshot import Entry, Member, Pack, Snapshot, SnapshotError

INTERPRETER = "/usr/bin/python3.11"
D = "ab" * 32


def link(path: str, target: str) -> Entry:
    return Entry(path, "symlink", 0o777, 0, target=target)


def snapshot(*entries: Entry) -> Snapshot:
    files = [e for e in entries if e.kind == "file"]
    members = tuple(Member(e.digest, 0, e.size) for e in files[:1])
    packs = (Pack("misc", "c1-" + "0" * 64, sum(m.size for m in members), members),)
    return Snapshot("k" * 64, "/opt/venv", INTERPRETER, entries, packs)


def test_the_chain_that_reached_the_hosts_passwd_is_refused() -> None:
    # x -> . ; c1 -> x/.. (the prefix's parent) ; c2 -> c1/.. ; ... ; pw -> c6/etc/passwd
    chain = [link("x", "."), link("c1", "x/..")]
    chain += [link(f"c{i}", f"c{i - 1}/..") for i in range(2, 7)]
    chain.append(link("pw", "c6/etc/passwd"))
    with pytest.raises(SnapshotError, match="leaves the prefix"):
        snapshot(*chain)
    with pytest.raises(SnapshotError, match=r"'c1'.*leaves the prefix"):
        snapshot(link("x", "."), link("c1", "x/.."))


def test_links_through_directories_and_loops() -> None:
    d = Entry("lib", "dir", 0o755, 0)
    with pytest.raises(SnapshotError, match="leaves the prefix"):
        snapshot(d, link("lib/up", ".."), link("out", "lib/up/.."))
    with pytest.raises(SnapshotError, match="more than 40 links"):
        snapshot(link("a", "b"), link("b", "a"))
    with pytest.raises(SnapshotError, match="past the interpreter"):
        snapshot(Entry("bin", "dir", 0o755, 0), link("bin/python", INTERPRETER),
                 link("bin/etc", "python/../../etc"))


def test_a_venvs_own_links_still_pass() -> None:
    snapshot(Entry("bin", "dir", 0o755, 0), link("bin/python", INTERPRETER),
             link("bin/python3", "python"), link("bin/python3.11", "python3"),
             Entry("lib", "dir", 0o755, 0), link("lib64", "lib"),
             Entry("lib/x", "file", 0o644, 0, 3, D), link("bin/x", "../lib64/x"),
             link("lib/self", "../lib/./x"))
