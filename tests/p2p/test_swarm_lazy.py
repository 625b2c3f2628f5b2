"""The lazy swarm core, driven by hand: it fetches only what it is asked for."""

from __future__ import annotations

import random

from test_swarm import A, B, have, join, origin_fetches, requests

from p2p.content import PeerId
from p2p.swarm import Swarm, SwarmConfig
from p2p.swarm.events import (
    Abort,
    ChunkArrived,
    ChunkFailed,
    ChunkLost,
    Complete,
    PeerHas,
    PeerHint,
    PeersFound,
    PrefetchGiven,
    ReaderWants,
    WantedAll,
)


def lazy(mine: str, slot: int | None = None, slots: int = 1, peers: tuple[PeerId, ...] = (),
         **config: object) -> tuple[Swarm, list[object]]:
    """A lazy swarm after the tracker's first answer, and that answer's actions."""
    s = Swarm(PeerId("me"), "r1", len(mine), have(mine), 100, SwarmConfig(**config),  # type: ignore[arg-type]
              random.Random(1), now=0.0, lazy=True)
    hints = tuple(PeerHint(p, "r1") for p in peers)
    first = s.start(0.0)
    return s, first + s.handle(PeersFound(hints, origin_slot=slot, origin_slots=slots), 0.0)


def test_lazy_swarm_asks_peers_only_for_demanded_and_prefetched_chunks() -> None:
    s, _ = lazy("000000", per_peer_inflight=4)
    assert requests(join(s, A, "111111")) == []
    assert s.handle(PeerHas(A, 0), 0.1) == []
    assert requests(s.handle(ReaderWants((2,)), 0.2)) == [(A, 2)]
    assert sorted(requests(s.handle(PrefetchGiven((4, 5)), 0.3))) == [(A, 4), (A, 5)]
    for chunk in (2, 4, 5):
        acts = s.handle(ChunkArrived(chunk, A, ok=True), 0.4)
        assert requests(acts) == [] and Complete() not in acts
    assert s.have == 0b110100 and s.wanted == 0b110100
    assert not s.fetching and not s.complete and s.lazy


def test_lazy_fetcher_reads_nothing_from_the_origin_unasked() -> None:
    s, acts = lazy("0000", slot=0)
    assert origin_fetches(acts) == [] and s.next_timer() is None
    assert s.handle_timer(1000.0) == []
    assert origin_fetches(s.handle(ReaderWants((1,)), 1000.0)) == [1]


def test_demanded_chunk_no_peer_can_give_goes_to_the_origin_once_settled() -> None:
    s, _ = lazy("0000", peers=(A,), settle_s=0.5, appointed_patience_s=20.0)
    s.handle(PrefetchGiven((2,)), 0.0)
    assert origin_fetches(s.handle(ReaderWants((3,)), 0.1)) == []  # A may be fetching it
    assert s.next_timer() == 0.5
    # Not the 20 s a non-owner waits; the prefetched chunk still waits them.
    assert origin_fetches(s.handle_timer(0.5)) == [3]
    assert s.next_timer() == 20.0


def test_demanded_chunk_a_peer_holds_is_asked_of_the_peer() -> None:
    s, _ = lazy("0000", peers=(A,))
    join(s, A, "0001")
    acts = s.handle(ReaderWants((3,)), 1.0)
    assert requests(acts) == [(A, 3)] and origin_fetches(acts) == []


def test_prefetched_chunks_keep_the_ownership_rule() -> None:
    s, _ = lazy("0000", slot=1, slots=2, appointed_patience_s=20.0)
    assert sorted(origin_fetches(s.handle(PrefetchGiven((0, 1, 2, 3)), 0.0))) == [1, 3]
    assert s.next_timer() == 20.0  # the owner of 0 and 2 gets its patience
    for chunk in (1, 3):
        s.handle(ChunkArrived(chunk, None, ok=True), 1.0)
    assert s.next_timer() == 21.0
    assert sorted(origin_fetches(s.handle_timer(21.0))) == [0, 2]


def test_prefetch_lists_accumulate_and_the_order_is_the_latest() -> None:
    s, _ = lazy("00000", max_inflight=1)
    join(s, A, "11111")
    assert requests(s.handle(PrefetchGiven((1, 2)), 0.0)) == [(A, 1)]
    s.handle(PrefetchGiven((4, 3)), 0.1)
    assert requests(s.handle(ChunkArrived(1, A, ok=True), 0.2)) == [(A, 4)]
    assert requests(s.handle(ChunkArrived(4, A, ok=True), 0.3)) == [(A, 3)]
    assert requests(s.handle(ChunkArrived(3, A, ok=True), 0.4)) == [(A, 2)]
    assert s.wanted == 0b11110


def test_idle_lazy_swarm_never_aborts_and_its_deadline_starts_when_it_wants() -> None:
    s, _ = lazy("000", slot=None, no_source_deadline_s=60.0, appointed_patience_s=20.0)
    assert s.next_timer() is None
    assert s.handle_timer(10_000.0) == []
    s.handle(PrefetchGiven((0,)), 10_000.0)
    assert s.next_timer() == 10_020.0  # patience counts from the prefetch, not from 0
    now, acts = 10_020.0, s.handle_timer(10_020.0)
    assert origin_fetches(acts) == [0]
    while not any(isinstance(a, Abort) for a in acts):
        for chunk in origin_fetches(acts):
            acts = s.handle(ChunkFailed(chunk, None, "connection refused"), now)
            break
        else:
            when = s.next_timer()
            assert when is not None
            now, acts = when, s.handle_timer(when)
    assert now == 10_060.0
    (abort,) = [a for a in acts if isinstance(a, Abort)]
    assert "1 of 3 chunks missing" in abort.reason


def test_wanted_all_fetches_the_rest_then_completes() -> None:
    s, _ = lazy("0000", per_peer_inflight=4)
    join(s, A, "1111")
    s.handle(ReaderWants((1,)), 0.0)
    assert s.handle(ChunkArrived(1, A, ok=True), 0.1)
    acts = s.handle(WantedAll(), 0.2)
    assert sorted(requests(acts)) == [(A, 0), (A, 2), (A, 3)] and not s.lazy
    done = [a for c in (0, 2, 3) for a in s.handle(ChunkArrived(c, A, ok=True), 0.3)]
    assert Complete() in done and s.complete


def test_lost_chunk_is_fetched_again_only_if_wanted() -> None:
    s, _ = lazy("0110", peers=(A,))
    join(s, A, "1111")
    assert s.handle(ChunkLost(1), 0.0) == [] and not s.fetching
    s.handle(ReaderWants((2,)), 0.1)
    assert requests(s.handle(ChunkLost(2), 0.2)) == [(A, 2)]


def test_a_lazy_swarm_has_no_end_game() -> None:
    # A lazy swarm's missing chunks are its readers' latest reads, one or two at a
    # time, not the tail of a download: duplicating each to a second holder fetched
    # 115 MB for 70 MB of chunks in a depsnap mount with two seeds.
    s, _ = lazy("000000", endgame_duplicates=1)
    join(s, A, "111111")
    join(s, B, "111111")
    assert len(requests(s.handle(ReaderWants((0,)), 0.0))) == 1
    # Made eager, its last chunk is the tail of a download again, and duplicated.
    t, _ = lazy("111110", endgame_duplicates=1)
    join(t, A, "111111")
    join(t, B, "111111")
    assert requests(t.handle(ReaderWants((5,)), 0.0)) == [(A, 5)]
    assert sorted(requests(t.handle(WantedAll(), 0.1))) == [(B, 5)]


def test_a_complete_lazy_swarm_records_that_it_became_eager() -> None:
    s, acts = lazy("11")
    assert acts == [Complete()]
    assert s.lazy and s.handle(WantedAll(), 1.0) == [] and not s.lazy
