"""The stripe plan, read-ahead, and HDFS URIs and versions: no sockets, no loop."""

from __future__ import annotations

import pytest

from hdfs_stripe.naming import (
    FileChanged,
    UriError,
    Version,
    check_same,
    content_name,
    origin_url,
    parse_origin_url,
    parse_uri,
)
from hdfs_stripe.stripe import Block, Piece, PlanError, ReadAhead, Schedule, StripePlan
from p2p.units import MiB


def blocks(sizes_mib: list[int], replicas: list[str]) -> list[Block]:
    """Blocks of the given sizes, each on two replicas picked round-robin."""
    out, at = [], 0
    for i, size in enumerate(sizes_mib):
        nodes = (replicas[i % len(replicas)], replicas[(i + 1) % len(replicas)])
        out.append(Block(at, size * MiB, nodes))
        at += size * MiB
    return out


def test_stripes_cut_at_block_boundaries_into_pieces() -> None:
    plan = StripePlan(10 * MiB, 4 * MiB, blocks([6, 4], ["a", "b", "c"]))
    assert [s.length for s in plan.stripes] == [4 * MiB, 4 * MiB, 2 * MiB]
    middle = plan.stripes[1]
    assert middle.pieces == (Piece(4 * MiB, 2 * MiB, ("a", "b")),
                             Piece(6 * MiB, 2 * MiB, ("b", "c")))
    assert list(plan.for_range(3 * MiB, 2 * MiB)) == [0, 1]
    assert plan.for_range(0, 0) == range(0)
    assert [(p.offset, p.length) for p in plan.pieces(5 * MiB, 2 * MiB)] == [
        (5 * MiB, MiB), (6 * MiB, MiB)]


def test_assign_spreads_stripes_over_every_replica() -> None:
    plan = StripePlan(96 * MiB, 8 * MiB, blocks([32, 32, 32], ["a", "b", "c"]))
    reads = plan.assign(range(len(plan.stripes)))
    per_node: dict[str, int] = {}
    for read in reads:
        assert read.node in read.piece.nodes
        per_node[read.node] = per_node.get(read.node, 0) + read.piece.length
    assert sorted(per_node) == ["a", "b", "c"]
    assert max(per_node.values()) - min(per_node.values()) <= 8 * MiB
    assert plan.assign(range(len(plan.stripes))) == reads  # the same answer every time


def test_assign_counts_load_in_flight_and_avoids_dead_nodes() -> None:
    plan = StripePlan(8 * MiB, 8 * MiB, [Block(0, 8 * MiB, ("a", "b"))])
    assert plan.assign([0], load={"a": 100})[0].node == "b"
    assert plan.assign([0], avoid=frozenset({"b"}))[0].node == "a"
    only = plan.stripes[0].pieces[0]
    assert StripePlan.fallback(only, frozenset({"a"})) == "b"
    assert StripePlan.fallback(only, frozenset({"a", "b"})) is None


def drain(schedule: Schedule, order: str) -> dict[str, list[int]]:
    """Let the nodes take stripes in the given order of turns ("abcab..."), each turn
    one stripe; what each node took."""
    taken: dict[str, list[int]] = {node: [] for node in sorted(set(order))}
    for node in order:
        index = schedule.next_for(node)
        if index is not None:
            taken[node].append(index)
    return taken


def test_schedule_keeps_every_datanode_busy_from_the_first_stripe() -> None:
    # 64 MiB blocks of 8 MiB stripes: reading in file order would keep only the two
    # replicas of block 0 busy; the schedule gives each node a queue from the start.
    plan = StripePlan(192 * MiB, 8 * MiB, blocks([64, 64, 64], ["a", "b", "c"]))
    schedule = Schedule(plan, range(len(plan.stripes)))
    assert schedule.nodes() == ["a", "b", "c"]
    taken = drain(schedule, "abc" * 8)
    assert [len(v) for v in taken.values()] == [8, 8, 8]
    for node, indices in taken.items():
        assert all(node in plan.stripes[i].pieces[0].nodes for i in indices)
    assert sorted(i for v in taken.values() for i in v) == list(range(24))
    assert schedule.next_for("a") is None


def test_a_node_whose_queue_is_empty_steals_the_tail_it_holds() -> None:
    plan = StripePlan(128 * MiB, 8 * MiB, [Block(0, 64 * MiB, ("a", "b")),
                                           Block(64 * MiB, 64 * MiB, ("b", "c"))])
    schedule = Schedule(plan, range(len(plan.stripes)))
    taken = drain(schedule, "a" * 16)  # b and c never come: a takes what it holds
    assert sorted(taken["a"]) == list(range(8))  # block 0 only: it has no replica of block 1
    assert schedule.next_for("b") is not None


def test_schedule_leaves_down_nodes_out() -> None:
    plan = StripePlan(64 * MiB, 8 * MiB, [Block(0, 64 * MiB, ("a", "b"))])
    schedule = Schedule(plan, range(len(plan.stripes)), avoid=frozenset({"a"}))
    assert schedule.nodes() == ["b"]


@pytest.mark.parametrize("bad", [
    [Block(0, MiB, ("a",)), Block(2 * MiB, MiB, ("a",))],  # a gap
    [Block(0, MiB, ("a",))],  # short of the file
    [Block(0, 0, ("a",)), Block(0, 3 * MiB, ("a",))],  # an empty block
])
def test_block_lists_that_do_not_describe_the_file_are_refused(bad: list[Block]) -> None:
    with pytest.raises(PlanError):
        StripePlan(3 * MiB, MiB, bad)


def test_a_piece_without_replicas_is_an_error() -> None:
    plan = StripePlan(MiB, MiB, [Block(0, MiB, ())])
    with pytest.raises(PlanError, match="no replica"):
        plan.assign([0])


def test_read_ahead_grows_on_sequential_reads_and_stops_on_a_seek() -> None:
    ra = ReadAhead(plan_stripes=100, first=2, max_stripes=8)
    assert ra.on_read(0, MiB, MiB) == []  # the first read: nothing known yet
    assert ra.on_read(MiB, MiB, MiB) == [3, 4]
    assert ra.on_read(2 * MiB, MiB, MiB) == [5, 6, 7]  # window 4, already asked 3-4
    assert ra.on_read(3 * MiB, MiB, MiB) == [8, 9, 10, 11, 12]  # window 8 (the cap)
    assert ra.on_read(50 * MiB, MiB, MiB) == []  # a seek
    assert ra.on_read(51 * MiB, MiB, MiB) == [53, 54]
    tail = ReadAhead(plan_stripes=4)
    tail.on_read(0, MiB, MiB)
    assert tail.on_read(MiB, MiB, MiB) == [3]  # never past the last stripe


# ---- URIs, versions and names (no I/O either) ----------------------------------------------


def test_uris_parse_and_pin_a_version_in_the_origin_url() -> None:
    uri = parse_uri("hdfs://nn.example:9870/ckpt/step 100/model.safetensors")
    assert (uri.host, uri.port, uri.path) == ("nn.example", 9870,
                                              "/ckpt/step 100/model.safetensors")
    assert parse_uri("hdfs://nn/x").port == 9870  # the WebHDFS default
    version = Version(123, 1_700_000_000_000, 16400)
    assert parse_origin_url(origin_url(uri, version)) == (uri, version)
    name = content_name(uri, version)
    assert name.startswith("hdfs-file/") and name == content_name(parse_uri(str(uri)), version)
    assert content_name(uri, Version(124, version.mtime_ms, 16400)) != name
    assert content_name(uri, Version(123, version.mtime_ms + 1, 16400)) != name


@pytest.mark.parametrize("bad", ["http://nn:9870/x", "hdfs:///x", "hdfs://nn:9870/a/../b",
                                 "hdfs://nn:port/x"])
def test_bad_uris_are_refused_in_plain_words(bad: str) -> None:
    with pytest.raises(UriError, match=r"hdfs://HOST:PORT/path|absolute|bad port"):
        parse_uri(bad)


def test_a_changed_version_is_reported_with_both_versions() -> None:
    uri = parse_uri("hdfs://nn:9870/ckpt/a")
    check_same(uri, Version(1, 2, 3), Version(1, 2, 3))
    with pytest.raises(FileChanged, match=r"it was 1 bytes.*it is now 5 bytes"):
        check_same(uri, Version(1, 2, 3), Version(5, 9, 3))
