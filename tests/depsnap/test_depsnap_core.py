"""The no-I/O core of dependency snapshots: keys, tree checks, packing."""

from __future__ import annotations

from dataclasses import replace

import pytest

from depsnap.frames import (
    FrameDecoder,
    FrameError,
    FrameWriter,
    decode_frame,
    frame_span,
    stored_offsets,
)
from depsnap.key import (
    Interpreter,
    KeyInputError,
    KeyInputs,
    canonical_inputs,
    canonical_lines,
    check_key,
    parse_command,
)
from depsnap.snapshot import (
    MISC_PACK,
    Entry,
    Member,
    Pack,
    Snapshot,
    SnapshotError,
    layout_packs,
    pack_unit,
)

PY311 = Interpreter("3.11.2", "cpython-311", "linux-x86_64", "/usr/bin/python3.11")
ENV = {"PIP_INDEX_URL": "http://index/simple", "PIP_CACHE_DIR": "/tmp/c", "HOME": "/root"}


def inputs(argv: list[str], files: dict[str, str], python: Interpreter = PY311,
           env: dict[str, str] | None = None, resolved: tuple[str, ...] = ()) -> KeyInputs:
    command = parse_command(argv)
    texts = [(option, files[name]) for option, name in command.files]
    return canonical_inputs(command, texts, resolved, "pip 23.0.1", python, "/opt/venv", "",
                            ENV if env is None else env)


def test_the_same_inputs_in_another_order_give_the_same_key() -> None:
    one = inputs(["pip", "install", "-r", "a.txt", "tabulate", "--no-index", "Numpy"],
                 {"a.txt": "six==1.17.0\n# pinned\nrequests  >=2\n"})
    two = inputs(["pip", "install", "numpy", "--no-index", "-r", "other-name.txt",
                  "tabulate"],
                 {"other-name.txt": "Requests>=2 # comment\n\nsix==1.17.0\n"},
                 env={"HOME": "/home/x", "PIP_INDEX_URL": "http://index/simple"})
    assert one.key() == two.key()
    assert one.describe()["files"] == [{"option": "-r", "lines": ["requests>=2",
                                                                  "six==1.17.0"]}]


@pytest.mark.parametrize("change", ["requirement", "python", "index", "prefix", "resolved",
                                    "installer", "package"])
def test_a_changed_input_gives_a_new_key(change: str) -> None:
    argv, files = ["pip", "install", "-r", "r.txt"], {"r.txt": "numpy==2.2.6\n"}
    base = inputs(argv, files)
    changed = {
        "requirement": lambda: inputs(argv, {"r.txt": "numpy==2.2.5\n"}),
        "python": lambda: inputs(argv, files, replace(PY311, version="3.11.9")),
        "index": lambda: inputs(argv, files, env={"PIP_INDEX_URL": "http://other/simple"}),
        "prefix": lambda: replace(base, prefix="/opt/other"),
        "resolved": lambda: inputs(argv, files, resolved=("numpy==2.2.6\n",)),
        "installer": lambda: replace(base, installer="pip 24.0"),
        "package": lambda: inputs([*argv, "six"], files),
    }[change]()
    assert changed.key() != base.key()


def test_requirement_lines_are_canonical() -> None:
    text = "NumPy==2.2.6 \\\n  ; python_version>'3'\n-r other.txt\n\n# only a comment\n"
    assert canonical_lines(text) == ("-r other.txt", "numpy==2.2.6;python_version>'3'")


def test_an_unknown_command_is_kept_as_given_and_a_dangling_option_is_refused() -> None:
    assert parse_command(["sh", "-c", "make install"]).tokens == ("sh", "-c", "make install")
    with pytest.raises(KeyInputError, match="-r needs a value"):
        parse_command(["pip", "install", "-r"])
    with pytest.raises(KeyInputError, match="not a snapshot key"):
        check_key("../etc")


# ---- the tree ------------------------------------------------------------------------

D = "ab" * 32


def tree(*entries: Entry, packs: tuple[Pack, ...] | None = None) -> Snapshot:
    files = [e for e in entries if e.kind == "file"]
    if packs is None:
        members = tuple(Member(e.digest, 0, e.size) for e in files[:1])
        packs = (Pack("misc", "c1-" + "0" * 64, sum(m.size for m in members), members),)
    return Snapshot("k" * 64, "/opt/venv", "/usr/bin/python3.11", entries, packs)


def d(path: str) -> Entry:
    return Entry(path, "dir", 0o755, 0)


def f(path: str, digest: str = D, size: int = 3) -> Entry:
    return Entry(path, "file", 0o644, 0, size, digest)


def link(path: str, target: str) -> Entry:
    return Entry(path, "symlink", 0o777, 0, target=target)


def test_a_tree_round_trips_through_json() -> None:
    snap = tree(d("bin"), f("bin/x"), link("bin/python", "/usr/bin/python3.11"),
                link("lib64", "lib"), d("lib"), link("bin/py", "../lib/../bin/x"))
    assert Snapshot.from_json(snap.to_json()) == snap


def test_the_packed_mount_tree_is_the_built_one_with_the_mounting_users_owner() -> None:
    from dataclasses import replace

    from depsnap.mounttree import open_tree, packed_tree, snapshot_tree

    snap = tree(d("bin"), f("bin/x"), link("bin/python", "/usr/bin/python3.11"),
                d("lib"), d("lib/pkg"), f("lib/pkg/mod.py"))
    snap = replace(snap, packed_tree="c1-" + "1" * 64)
    assert Snapshot.from_json(snap.to_json()).packed_tree == snap.packed_tree
    built = snapshot_tree(snap, 1000, 1001)
    packed = open_tree(snap, packed_tree(snap), 1000, 1001)
    assert type(packed).__name__ == "PackedTree"
    assert list(packed.walk()) == list(built.walk())
    # A packed tree that does not open (damaged bytes) is built instead, never served.
    bad = bytearray(packed_tree(snap))
    bad[-1] ^= 1
    assert list(open_tree(snap, bytes(bad), 1000, 1001).walk()) == list(built.walk())


@pytest.mark.parametrize(("entries", "why"), [
    ((f("../x"),), "'..'"),
    ((f("/etc/passwd"),), "relative"),
    ((d("a"), f("a//b")), "empty"),
    ((f("a/b"),), "directory is not listed"),
    ((f("x"), f("x")), "listed twice"),
    ((link("evil", "../../etc"),), "escapes"),
    ((d("a"), link("a/evil", "../..")), "escapes"),
    ((link("abs", "/etc/shadow"),), "absolute path"),
    ((f("x", size=4),), "no pack holds"),
    ((f(".depsnap-restoring"),), "keeps its lock"),  # the name a restore locks under
])
def test_unsafe_or_inconsistent_trees_are_refused(entries: tuple[Entry, ...], why: str) -> None:
    good = tree(f("ok"))
    with pytest.raises(SnapshotError, match=why):
        Snapshot(good.key, good.prefix, good.interpreter, entries, good.packs)
    raw = good.to_json().replace(b'"ok"', b'"../ok"')
    with pytest.raises(SnapshotError, match=r"'\.\.'"):
        Snapshot.from_json(raw)


def test_pack_members_must_be_in_order_and_inside_the_pack() -> None:
    members = (Member(D, 0, 3), Member("cd" * 32, 2, 3))
    with pytest.raises(SnapshotError, match="overlaps"):
        tree(f("ok"), packs=(Pack("p", "c1-" + "0" * 64, 5, members),))
    with pytest.raises(SnapshotError, match="outside"):
        tree(f("ok"), packs=(Pack("p", "c1-" + "0" * 64, 2, members[:1]),))
    with pytest.raises(SnapshotError, match="malformed"):
        Snapshot.from_json(b'{"version": 1, "entries": [[1]]}')


# ---- packing ---------------------------------------------------------------------------

SP = "lib/python3.11/site-packages"


def test_units_split_site_packages_by_top_level_entry_and_bytecode() -> None:
    assert pack_unit(f"{SP}/numpy/core/x.so") == "site-packages/numpy"
    assert pack_unit(f"{SP}/numpy/__pycache__/x.pyc") == "site-packages/numpy:bytecode"
    assert pack_unit(f"{SP}/numpy-2.2.6.dist-info/RECORD") == MISC_PACK
    assert pack_unit(f"{SP}/six.py") == MISC_PACK
    assert pack_unit("bin/tabulate") == MISC_PACK


def test_a_shared_distribution_packs_identically_in_two_environments() -> None:
    def env(extra: str, digest: str) -> list[Entry]:
        big = 1 << 20
        return [f(f"{SP}/numpy/a.so", "01" * 32, big), f(f"{SP}/numpy/b.py", "02" * 32, 10),
                f(f"{SP}/numpy/c.py", "02" * 32, 10),  # the same bytes twice: stored once
                f(f"{SP}/{extra}/x.py", digest, 5), f("bin/script", digest, 5)]

    one, two = layout_packs(env("six", "03" * 32)), layout_packs(env("tab", "04" * 32))
    assert [p.name for p in one] == ["site-packages/numpy", MISC_PACK]
    assert one[0] == two[0] and one[1] != two[1]
    assert one[0].members == (Member("01" * 32, 0, 1 << 20), Member("02" * 32, 1 << 20, 10))
    assert one[1].members == (Member("03" * 32, 0, 5),)


def test_a_big_unit_is_cut_at_file_boundaries_and_packs_do_not_depend_on_each_other() -> None:
    mib = 1 << 20
    lib = [f(f"{SP}/arrow/lib{i}.so", f"{i:02x}" * 32, 12 * mib) for i in range(3)]
    shared = f(f"{SP}/arrow/LICENSE", "aa" * 32, 10)
    alone = layout_packs([*lib, shared])
    assert [(p.name, p.size) for p in alone] == [("site-packages/arrow", 24 * mib + 10),
                                                 ("site-packages/arrow#2", 12 * mib)]
    # The same LICENSE bytes in a unit sorted before it do not take them out of its pack.
    other = [f(f"{SP}/aaa/big.so", "bb" * 32, 2 * mib), f(f"{SP}/aaa/LICENSE", "aa" * 32, 10)]
    assert layout_packs([*other, *lib, shared])[1:3] == alone


def test_a_key_record_must_name_its_key_and_its_last_manifest_and_certify_every_id() -> None:
    import json

    from depsnap.record import KeyRecordError, parse_record, record_bytes
    from p2p.content import ManifestBuilder

    builder = ManifestBuilder(16)
    builder.feed(b"tree bytes")
    tree = builder.finish("depsnap-tree", "file:///o/trees/x")
    key = "e" * 64
    good = record_bytes(key, [tree])
    assert parse_record(good, key, "r") == [tree]
    with pytest.raises(KeyRecordError, match="not the record of key"):
        parse_record(good, "f" * 64, "r")
    raw = json.loads(good)
    raw["tree"] = "c1-" + "0" * 64
    with pytest.raises(KeyRecordError, match="not the record of key"):
        parse_record(json.dumps(raw).encode(), key, "r")
    raw = json.loads(good)
    raw["manifests"][0]["size"] += 1
    with pytest.raises(KeyRecordError, match="not a key record"):
        parse_record(json.dumps(raw).encode(), key, "r")


# ---- compressed packs ------------------------------------------------------------------


def framed(raw: bytes, frame_bytes: int) -> tuple[Pack, bytes]:
    """A pack of `raw` as one member, stored as frames of `frame_bytes`."""
    writer = FrameWriter(frame_bytes)
    stored = b"".join([*writer.feed(raw[:5]), *writer.feed(raw[5:]), *writer.finish()])
    pack = Pack("p", "c1-" + "0" * 64, len(raw), (Member(D, 0, len(raw)),), frame_bytes,
                tuple(writer.frames))
    return pack, stored


def test_a_framed_pack_decodes_from_any_cut_of_its_stored_bytes() -> None:
    raw = bytes(range(256)) * 40 + b"tail"
    pack, stored = framed(raw, 1000)
    assert len(pack.frames) == 11 and pack.stored_size == len(stored) < len(raw)
    decoder = FrameDecoder(pack)
    out = b"".join(b"".join(decoder.feed(stored[i:i + 333]))
                   for i in range(0, len(stored), 333))
    decoder.check_done()
    assert out == raw


def test_a_raw_range_maps_to_the_whole_frames_under_it() -> None:
    raw = bytes(range(256)) * 40
    pack, stored = framed(raw, 1000)
    offsets = stored_offsets(pack)
    span = frame_span(pack, offsets, 1500, 1600)
    assert (span.first, span.last) == (1, 3)
    frames = [decode_frame(pack, i, stored[offsets[i]:offsets[i + 1]]) for i in (1, 2, 3)]
    assert b"".join(frames)[500:2100] == raw[1500:3100]
    assert frame_span(pack, offsets, len(raw) - 1, 1).last == len(pack.frames) - 1


def test_frames_that_lie_about_their_length_are_refused() -> None:
    raw = b"x" * 2500
    pack, stored = framed(raw, 1000)
    with pytest.raises(FrameError, match="declares 1000 bytes, the tree says 500"):
        decode_frame(pack, 2, stored[:pack.frames[0]])
    with pytest.raises(FrameError, match="does not decode"):
        decode_frame(pack, 0, stored[:pack.frames[0] - 3])
    decoder = FrameDecoder(pack)
    decoder.feed(stored[:-1])
    with pytest.raises(FrameError, match="end inside frame 2"):
        decoder.check_done()
    with pytest.raises(SnapshotError, match="frames do not hold"):
        tree(f("ok"), packs=(replace(pack, frames=pack.frames[:2]),))
    with pytest.raises(SnapshotError, match="frame size"):
        tree(f("ok"), packs=(replace(pack, frame_bytes=0),))
