"""The swarm core, driven by hand: no sockets, no event loop, explicit `now`."""

from __future__ import annotations

import random

import pytest

from p2p.content import PeerId
from p2p.swarm import Swarm, SwarmConfig, bits
from p2p.swarm.events import (
    Abort,
    Advertise,
    Cancel,
    ChunkArrived,
    ChunkFailed,
    ChunkLost,
    Complete,
    Connect,
    Disconnect,
    FetchFromOrigin,
    PeerHas,
    PeerHint,
    PeerJoined,
    PeerLost,
    PeerPending,
    PeersFound,
    PeerWithdrew,
    PrefetchGiven,
    ReaderWants,
    Report,
    Request,
    WantedAll,
    Withdraw,
)
from p2p.swarm.policy import CHUNK_PICKERS, RarestFirst

A, B, C = PeerId("a"), PeerId("b"), PeerId("c")


def have(pattern: str) -> tuple[bool, ...]:
    return tuple(ch == "1" for ch in pattern)


def swarm(mine: str, *, seed: int = 1, **config: object) -> Swarm:
    """A swarm that is not an origin fetcher, unless a test says so."""
    s = Swarm(PeerId("me"), "r1", len(mine), have(mine), 100, SwarmConfig(**config),  # type: ignore[arg-type]
              random.Random(seed), now=0.0)
    s.handle(PeersFound((), origin_slot=None, origin_slots=1), 0.0)
    return s


def alone(mine: str, **config: object) -> tuple[Swarm, list[object]]:
    """A swarm the tracker made the only origin fetcher, and its first actions."""
    s = Swarm(PeerId("me"), "r1", len(mine), have(mine), 100, SwarmConfig(**config),  # type: ignore[arg-type]
              random.Random(1), now=0.0)
    return s, list(s.handle(PeersFound((), origin_slot=0, origin_slots=1), 0.0))


def requests(actions: list[object]) -> list[tuple[str, int]]:
    return [(a.peer, a.chunk) for a in actions if isinstance(a, Request)]


def origin_fetches(actions: list[object]) -> list[int]:
    return [a.chunk for a in actions if isinstance(a, FetchFromOrigin)]


def join(s: Swarm, peer: PeerId, pattern: str, rack: str = "r1", now: float = 0.0) -> list[object]:
    return list(s.handle(PeerJoined(peer, rack, have(pattern)), now))


@pytest.mark.parametrize("seed", range(12))
def test_rarest_chunk_is_requested_next(seed: int) -> None:
    s = swarm("0000", seed=seed, max_inflight=1, endgame_duplicates=0)
    [(_, first)] = requests(join(s, C, "1111", rack="far"))
    join(s, B, "1100")  # no free slot yet
    [(_, second)] = requests(s.handle(ChunkArrived(first, C, ok=True), 1.0))
    assert second in {2, 3} - {first}  # held by C alone, while 0 and 1 are held by both


@pytest.mark.parametrize("chunks,limit", [(1, 1), (16, 4), (64, 16), (64, 64), (1024, 64),
                                          (1024, 1), (5, 0)])
def test_rarest_first_takes_a_keyed_sorts_chunks_and_draws_them_all_at_once(
        chunks: int, limit: int) -> None:
    """It orders a level of availability at a time, as it is read: what the simulator and the
    agents compute must be what a keyed sort gives (the draws included), and every draw
    is made in the call, however little of the order the caller reads."""
    avail = [random.Random(chunks).randrange(6) for _ in range(chunks)]
    ours, theirs = random.Random(7), random.Random(7)
    order = RarestFirst().order(list(range(chunks)), avail, limit, ours)
    want = sorted(range(chunks), key=lambda c: (avail[c], theirs.random()))[:limit] \
        if limit else []
    assert ours.getstate() == theirs.getstate()  # (before a chunk is read)
    assert list(order) == want
    assert ours.random() == theirs.random()


@pytest.mark.parametrize("name", sorted(CHUNK_PICKERS))
@pytest.mark.parametrize("count,limit", [(0, 3), (1, 1), (16, 4), (64, 64), (70, 0)])
def test_a_pickers_draw_alone_leaves_the_rng_as_its_order_does(name: str, count: int,
                                                                limit: int) -> None:
    """A pass that can ask no one only draws (`Scheduling._unordered`): the run must go on
    as if it had ordered the chunks."""
    picker = CHUNK_PICKERS[name]()
    ordered, drawn = random.Random(3), random.Random(3)
    list(picker.order(list(range(0, 2 * count, 2)), [1] * (2 * count), limit, ordered))
    picker.draw(count, limit, drawn)
    assert ordered.getstate() == drawn.getstate()


def test_demand_goes_before_rarest() -> None:
    s = swarm("0000", max_inflight=1, per_peer_inflight=1)
    s.handle(ReaderWants((3,)), 0.0)
    acts = join(s, A, "1111")
    assert requests(acts) == [(A, 3)]


def test_prefetch_order_is_followed() -> None:
    s = swarm("00000", max_inflight=2, per_peer_inflight=2)
    s.handle(PrefetchGiven((4, 2)), 0.0)
    acts = join(s, A, "11111")
    assert requests(acts) == [(A, 4), (A, 2)]


@pytest.mark.parametrize("seed", range(6))
def test_same_rack_peer_is_preferred(seed: int) -> None:
    s = swarm("000", seed=seed, max_inflight=1, endgame_duplicates=0)
    [(_, first)] = requests(join(s, C, "111", rack="far"))
    join(s, B, "111", rack="r1")
    assert [p for p, _ in requests(s.handle(ChunkArrived(first, C, ok=True), 1.0))] == [B]


def test_rack_and_load_decide_between_holders() -> None:
    # Both peers hold everything; the same-rack peer gets requests until its pipe is full.
    s = swarm("0000", max_inflight=3, per_peer_inflight=2)
    s.handle(PeerJoined(A, "far", have("0000")), 0.0)
    s.handle(PeerJoined(B, "r1", have("0000")), 0.0)
    s.handle(PeerHas(A, 0), 0.0)  # A gets chunk 0 (only holder)
    for c in (1, 2, 3):
        s.handle(PeerHas(A, c), 0.0)
    # A's pipe (2) is full after chunk 1; chunk 2 waits. Now B announces all:
    acts = []
    for c in (0, 1, 2, 3):
        acts += s.handle(PeerHas(B, c), 0.0)
    assert [p for p, _ in requests(acts)] == [B]


def test_timeout_reissues_to_another_peer() -> None:
    s = swarm("0", max_inflight=2, per_peer_inflight=1, request_timeout_s=5.0,
              endgame_duplicates=0)
    assert requests(join(s, A, "1")) == [(A, 0)]
    assert requests(join(s, B, "1")) == []  # only one missing chunk, already requested...
    t = s.next_timer()
    assert t is not None and t <= 5.0
    acts = s.handle_timer(5.0)
    assert (B, 0) in requests(acts)
    assert Cancel(A, 0, if_unsent=True) in acts  # dropped if it has not gone out yet
    assert s.stats["timeouts"] == 1


def test_endgame_duplicates_tail_and_cancels_loser() -> None:
    s = swarm("0", max_inflight=2, per_peer_inflight=1, endgame_duplicates=1)
    join(s, A, "1")
    acts = join(s, B, "1")
    assert requests(acts) == [(B, 0)]  # end game: duplicate into B's idle slot
    done = s.handle(ChunkArrived(0, A, ok=True), 1.0)
    assert Cancel(B, 0) in done and Complete() in done and Advertise(0) in done


def test_owner_fetches_uncovered_chunks_from_origin() -> None:
    s = Swarm(PeerId("me"), "r1", 4, have("0000"), 100, SwarmConfig(), random.Random(1), 0.0)
    acts = s.handle(PeersFound((PeerHint(A, "r1"),), origin_slot=1, origin_slots=2), 0.0)
    assert Connect(A) in acts
    assert origin_fetches(acts) == []  # first hear what A is fetching
    acts = s.handle(PeerJoined(A, "r1", have("0000"), pending=(3,)), 0.1)
    assert origin_fetches(acts) == [1]
    assert Advertise(1, pending=True) in acts


def test_fetcher_starts_after_settle_time_if_peers_stay_silent() -> None:
    s = Swarm(PeerId("me"), "r1", 2, have("00"), 100, SwarmConfig(settle_s=0.5),
              random.Random(1), 0.0)
    assert origin_fetches(s.handle(PeersFound((PeerHint(A, "r1"),), 0, 1), 0.0)) == []
    assert s.next_timer() == 0.5
    assert sorted(origin_fetches(s.handle_timer(0.5))) == [0, 1]


def test_non_owner_waits_for_peers_then_falls_back_to_origin() -> None:
    s = swarm("00", origin_patience_s=3.0, appointed_patience_s=20.0)
    assert origin_fetches(s.handle(PeersFound((), origin_slot=None, origin_slots=1), 0.0)) == []
    t = s.next_timer()
    assert t == 20.0  # others were appointed: give them time
    assert sorted(origin_fetches(s.handle_timer(20.0))) == [0, 1]


def test_no_fetcher_appointed_means_short_patience() -> None:
    s = Swarm(PeerId("me"), "r1", 2, have("00"), 100,
              SwarmConfig(origin_patience_s=3.0, appointed_patience_s=20.0),
              random.Random(1), 0.0)
    s.handle(PeersFound((), origin_slot=None, origin_slots=4, origin_filled=0), 0.0)
    assert s.next_timer() == 3.0


def test_pending_peer_keeps_origin_owner_away() -> None:
    s = Swarm(PeerId("me"), "r1", 2, have("00"), 100, SwarmConfig(max_origin_inflight=1),
              random.Random(1), 0.0)
    s.handle(PeerJoined(A, "r1", have("00"), pending=(0,)), 0.0)
    acts = s.handle(PeersFound((PeerHint(A, "r1"),), origin_slot=0, origin_slots=1), 0.0)
    assert origin_fetches(acts) == [1]


def test_a_fetcher_whose_origin_fetch_fails_withdraws_and_its_peers_stop_waiting() -> None:
    fetcher, first = alone("0", backoff_base_s=2.0)
    assert Advertise(0, pending=True) in first
    # Failing, timing out and serving bad bytes each take the pending mark back.
    assert Withdraw(0) in fetcher.handle(ChunkFailed(0, None, "503"), 0.5)
    timed, _ = alone("0", origin_timeout_s=5.0)
    assert Withdraw(0) in timed.handle_timer(5.0)
    corrupt, _ = alone("0")
    assert Withdraw(0) in corrupt.handle(ChunkArrived(0, None, ok=False), 1.0)
    # A peer that waited on the fetcher goes to the origin itself once starved,
    # instead of waiting out the pending mark (pending_ttl_s).
    s = Swarm(PeerId("me"), "r1", 1, have("0"), 100,
              SwarmConfig(origin_patience_s=3.0, pending_ttl_s=30.0), random.Random(1), 0.0)
    s.handle(PeerJoined(A, "r1", have("0"), pending=(0,)), 0.0)
    s.handle(PeersFound((PeerHint(A, "r1"),), origin_slot=None, origin_slots=1), 0.0)
    assert origin_fetches(s.handle_timer(4.0)) == []  # starved, but A is fetching it
    s.handle(PeerWithdrew(A, 0), 4.5)
    assert origin_fetches(s.handle_timer(max(4.5, s.next_timer() or 4.5))) == [0]


def test_a_free_slot_asks_a_fetcher_to_relay_the_chunk_it_is_fetching() -> None:
    s = swarm("00")
    # A holds chunk 1 and fetches chunk 0 from the origin: the held chunk goes first.
    assert requests(s.handle(PeerJoined(A, "r1", have("01"), pending=(0,)), 0.0)) == [(A, 1)]
    assert requests(s.handle(ChunkArrived(1, A, ok=True), 0.2)) == [(A, 0)]
    # A relay is a request like any other: one copy (B fetching it too changes nothing),
    # and the chunk's arrival ends it.
    s.handle(PeerJoined(B, "r1", have("00")), 0.25)
    assert requests(s.handle(PeerPending(B, 0), 0.3)) == []
    assert Complete() in s.handle(ChunkArrived(0, A, ok=True), 1.0)


def test_a_pending_mark_heard_while_idle_is_relayed_at_once() -> None:
    s = swarm("0")
    s.handle(PeerJoined(A, "r1", have("0")), 0.0)
    assert requests(s.handle(PeerPending(A, 0), 0.1)) == [(A, 0)]
    off = swarm("0", relay_pending=False)
    off.handle(PeerJoined(A, "r1", have("0")), 0.0)
    assert requests(off.handle(PeerPending(A, 0), 0.1)) == []


def test_a_withdrawn_relay_is_no_failure_of_the_peer() -> None:
    s = swarm("00", backoff_base_s=5.0)
    assert requests(s.handle(PeerJoined(A, "r1", have("00"), pending=(0,)), 0.0)) == [(A, 0)]
    # Its origin fetch failed: no bytes will come, and its Reject is not held against it,
    # so the chunk it gets next is asked of it at once (no back-off).
    assert requests(s.handle(PeerWithdrew(A, 0), 0.5)) == []
    assert s.handle(ChunkFailed(0, A, "rejected: origin fetch failed"), 0.6) == []
    assert requests(s.handle(PeerHas(A, 1), 0.7)) == [(A, 1)]


def test_with_relay_fetching_a_chunk_asked_of_a_peer_is_announced_until_it_comes() -> None:
    s = swarm("000", relay_fetching=True, backoff_base_s=5.0)
    acts = s.handle(PeerJoined(A, "r1", have("110")), 0.0)
    assert requests(acts) == [(A, 0)] or requests(acts) == [(A, 1)]
    asked = requests(acts)[0][1]
    assert Advertise(asked, pending=True) in acts and s.relaying(asked)
    # It arrives: held, so no longer relayable, and no withdrawal.
    acts = s.handle(ChunkArrived(asked, A, ok=True), 0.5)
    assert not s.relaying(asked) and not [a for a in acts if isinstance(a, Withdraw)]
    other = 1 - asked
    assert (A, other) in requests(acts) and Advertise(other, pending=True) in acts
    # Its request fails and no other source has it: the mark is taken back, once.
    acts = s.handle(ChunkFailed(other, A, "rejected: busy"), 0.7)
    assert Withdraw(other) in acts and not s.relaying(other)
    assert Withdraw(other) not in s.handle(PeerHas(A, 2), 0.8)
    off = swarm("0", relay_fetching=False)
    acts = off.handle(PeerJoined(A, "r1", have("1")), 0.0)
    assert requests(acts) == [(A, 0)] and Advertise(0, pending=True) not in acts
    # Only rare chunks are announced: held by at most `relay_fetching_holders` peers.
    common = swarm("0", relay_fetching=True, relay_fetching_holders=0)
    acts = common.handle(PeerJoined(A, "r1", have("1")), 0.0)
    assert requests(acts) == [(A, 0)] and Advertise(0, pending=True) not in acts
    assert not common.relaying(0)


def test_a_relayable_chunk_names_its_feeder_and_leaves_the_join_list_once_held() -> None:
    """The peer a relayable chunk comes from is never relayed it (each would wait on the
    other: p2p.relay); `relayable` is what a Join lists as pending besides origin fetches."""
    s = swarm("00", relay_fetching=True)
    acts = s.handle(PeerJoined(A, "r1", have("10")), 0.0)
    assert requests(acts) == [(A, 0)]
    assert s.relay_feeder(0) == A and s.relayable == 0b01
    assert s.relay_feeder(1) is None  # not asked of anyone: nothing to relay
    s.handle(ChunkArrived(0, A, ok=True), 0.5)
    assert s.relay_feeder(0) is None and s.relayable == 0


def test_a_mark_goes_with_its_request_and_after_a_failure_only_a_holder_renews_it() -> None:
    """Marks made from marks relay a chunk over several hops; once one fails, the marks
    still heard may be stale, so the chunk is announced again only when asked of a holder
    (with every origin down, marks made from stale marks kept a swarm asking itself for
    chunks no one had: tests/simulations/test_sim.py)."""
    s = swarm("0", relay_fetching=True)
    acts = s.handle(PeerJoined(A, "r1", have("0"), pending=(0,)), 0.0)
    assert requests(acts) == [(A, 0)] and Advertise(0, pending=True) in acts  # a relay of A's
    s.handle(PeerJoined(B, "r1", have("0"), pending=(0,)), 0.1)
    # A's fetch failed: the chunk is asked of B at once, but the mark goes all the same.
    acts = s.handle(ChunkFailed(0, A, "rejected: the origin fetch it relayed failed"), 0.2)
    assert requests(acts) == [(B, 0)] and Withdraw(0) in acts and not s.relaying(0)
    acts = s.handle(ChunkFailed(0, B, "chunk not held"), 0.3)
    assert requests(acts) == [] and Withdraw(0) not in acts
    # A fetches it again: asked of A, a peer still fetching it, it is not announced on.
    acts = s.handle(PeerPending(A, 0), 0.35)
    assert requests(acts) == [(A, 0)] and Advertise(0, pending=True) not in acts
    assert not s.relaying(0)
    s.handle(ChunkFailed(0, A, "rejected: the origin fetch it relayed failed"), 0.38)
    # A holder turns up: asked of it, the chunk is announced again.
    acts = s.handle(PeerJoined(C, "r1", have("1")), 0.4)
    assert requests(acts) == [(C, 0)] and Advertise(0, pending=True) in acts
    assert s.relay_feeder(0) == C


def test_a_pending_mark_of_a_held_chunk_is_not_kept() -> None:
    """Marks matter only for chunks we lack: one heard before the chunk came is dropped
    when it comes, and one heard after is not recorded (the simulator skips both)."""
    s = swarm("00", pending_ttl_s=30.0, request_timeout_s=100.0, origin_patience_s=100.0,
              appointed_patience_s=100.0)
    assert requests(s.handle(PeerJoined(A, "r1", have("00"), pending=(0,)), 0.0)) == [(A, 0)]
    assert requests(s.handle(PeerJoined(B, "r1", have("01")), 0.0)) == [(B, 1)]
    assert s.next_timer() == 30.0  # A's mark expires then
    s.handle(ChunkArrived(0, A, ok=True), 0.1)
    s.handle(PeerPending(B, 0), 0.2)
    assert s.next_timer() == 100.0  # B's request times out; no mark of chunk 0 is left


@pytest.mark.parametrize("share, cross", [(0.0, 0), (0.5, 2), (1.0, 4)])
def test_a_share_of_connections_goes_to_other_racks(share: float, cross: int) -> None:
    s = Swarm(PeerId("me"), "r1", 1, have("0"), 100,
              SwarmConfig(max_peers=4, cross_rack_share=share), random.Random(1), 0.0)
    hints = [PeerHint(PeerId(f"near{i}"), "r1") for i in range(10)]
    hints += [PeerHint(PeerId(f"far{i}"), f"r{i + 2}") for i in range(10)]
    acts = s.handle(PeersFound(tuple(hints), origin_slot=None, origin_slots=1), 0.0)
    dialled = [a.peer for a in acts if isinstance(a, Connect)]
    assert len(dialled) == 4
    assert sum(p.startswith("far") for p in dialled) == cross


def test_corrupt_peer_is_banned_and_chunk_refetched() -> None:
    s = swarm("0", max_inflight=2, per_peer_inflight=1, endgame_duplicates=0)
    assert requests(join(s, A, "1")) == [(A, 0)]
    join(s, B, "1")
    acts = s.handle(ChunkArrived(0, A, ok=False), 1.0)
    assert Disconnect(A, "sent corrupt chunk 0", hostile=True) in acts
    assert any(isinstance(a, Report) and a.peer == A for a in acts)
    assert requests(acts) == [(B, 0)]
    # A reconnecting is refused
    again = s.handle(PeerJoined(A, "r1", have("1")), 2.0)
    assert any(isinstance(a, Disconnect) and a.peer == A for a in again)
    assert not s.complete


def test_origin_serving_bad_bytes_aborts() -> None:
    s, first = alone("0", max_origin_corrupt=2, backoff_base_s=1.0)
    assert origin_fetches(first) == [0]
    s.handle(ChunkArrived(0, None, ok=False), 1.0)
    acts = s.handle_timer(10.0)
    assert origin_fetches(acts) == [0]
    final = s.handle(ChunkArrived(0, None, ok=False), 11.0)
    assert any(isinstance(a, Abort) for a in final)
    assert s.handle_timer(100.0) == [] and s.next_timer() is None


def test_origin_failure_backs_off_then_retries() -> None:
    s, first = alone("0", backoff_base_s=2.0)
    assert origin_fetches(first) == [0]
    assert s.handle(ChunkFailed(0, None, "503"), 0.5) == [Withdraw(0)]  # the pending mark
    t = s.next_timer()
    assert t is not None and 0.5 < t <= 2.5
    assert origin_fetches(s.handle_timer(t)) == [0]


def test_origin_only_never_connects() -> None:
    s = Swarm(PeerId("me"), "r1", 3, have("000"), 100,
              SwarmConfig(use_peers=False, chunk_picker="in_order", max_origin_inflight=2),
              random.Random(1), 0.0)
    acts = s.handle(PeersFound((PeerHint(A, "r1"),), origin_slot=None, origin_slots=1), 0.0)
    assert not any(isinstance(a, Connect) for a in acts)
    assert origin_fetches(acts) == [0, 1]


def test_lost_peer_releases_its_requests() -> None:
    s = swarm("0", max_inflight=1)
    join(s, A, "1")
    acts = s.handle(PeerLost(A, "reset"), 1.0)
    assert requests(acts) == []
    assert requests(join(s, B, "1", now=1.0)) == [(B, 0)]


def test_repeated_failures_disconnect_peer() -> None:
    s = swarm("0", max_inflight=1, max_peer_failures=2, backoff_base_s=0.1)
    join(s, A, "1")
    s.handle(ChunkFailed(0, A, "rejected"), 1.0)
    acts = s.handle_timer(2.0)
    assert requests(acts) == [(A, 0)]
    acts = s.handle(ChunkFailed(0, A, "rejected"), 3.0)
    assert any(isinstance(a, Disconnect) and a.peer == A for a in acts)


def test_pending_from_unknown_peer_or_bad_index() -> None:
    s = swarm("00")
    assert s.handle(PeerPending(A, 0), 0.0) == []
    join(s, A, "00")
    assert any(isinstance(a, Disconnect) for a in s.handle(PeerPending(A, 7), 0.0))


def test_bad_bitfield_length_disconnects() -> None:
    s = swarm("00")
    acts = s.handle(PeerJoined(A, "r1", have("000")), 0.0)
    assert any(isinstance(a, Disconnect) for a in acts)


def test_complete_content_finishes_at_start() -> None:
    s = Swarm(PeerId("me"), "r1", 2, have("11"), 100, SwarmConfig(), random.Random(1), 0.0)
    assert s.start(0.0) == [Complete()]


def test_same_seed_same_actions() -> None:
    def run(seed: int) -> list[object]:
        s = swarm("0" * 16, seed=seed, max_inflight=4)
        return join(s, A, "1" * 16) + join(s, B, "1" * 16)
    assert run(7) == run(7)


@pytest.mark.parametrize("name", ["nope"])
def test_unknown_policy_is_rejected(name: str) -> None:
    with pytest.raises(ValueError, match="unknown chunk picker"):
        SwarmConfig(chunk_picker=name)


def test_negative_chunk_index_from_peer_disconnects() -> None:
    s = swarm("00")
    join(s, A, "00")
    assert any(isinstance(a, Disconnect) for a in s.handle(PeerHas(A, -1), 0.0))


def test_no_origin_fetch_before_the_tracker_appoints_us() -> None:
    s = Swarm(PeerId("me"), "r1", 2, have("00"), 100, SwarmConfig(origin_patience_s=3.0),
              random.Random(1), now=0.0)
    assert origin_fetches(s.start(0.0)) == []
    assert s.next_timer() == 3.0  # the tracker stays silent: patience sends us anyway
    assert sorted(origin_fetches(s.handle_timer(3.0))) == [0, 1]


def test_fetchers_share_the_vacant_slots() -> None:
    # 4 slots, 2 filled: slot 2 is covered by fetcher 0, slot 3 by fetcher 1 (v % filled).
    for slot, own, vacant in ((0, [0, 4], [2, 6]), (1, [1, 5], [3, 7])):
        s = Swarm(PeerId("me"), "r1", 8, have("0" * 8), 100,
                  SwarmConfig(max_origin_inflight=8), random.Random(1), 0.0)
        acts = s.handle(PeersFound((), origin_slot=slot, origin_slots=4, origin_filled=2), 0.0)
        assert sorted(origin_fetches(acts)) == own  # its own now; the vacant ones after a grace
        grace = s.next_timer()
        assert grace == SwarmConfig().vacant_grace_s
        assert origin_fetches(s.handle_timer(grace)) == [] and s.wants_view(grace)
        acts = s.handle(PeersFound((), origin_slot=slot, origin_slots=4, origin_filled=2),
                        grace + 0.01)  # the tracker, asked again, still has two fetchers
        assert sorted(origin_fetches(acts)) == vacant and not s.wants_view(grace + 0.01)


def test_a_fetcher_asks_the_tracker_again_before_it_covers_a_vacant_slot() -> None:
    # Fetcher 0 was told it is alone; by the end of its grace the tracker has filled
    # slot 1 with a node that is still settling and has announced nothing yet.
    s = swarm("0000", max_origin_inflight=4)
    acts = s.handle(PeersFound((), origin_slot=0, origin_slots=2, origin_filled=1), 0.0)
    assert origin_fetches(acts) == [0, 2]
    grace = SwarmConfig().vacant_grace_s
    assert not s.wants_view(grace - 0.01)
    assert origin_fetches(s.handle_timer(grace)) == [] and s.wants_view(grace)
    acts = s.handle(PeersFound((), origin_slot=0, origin_slots=2, origin_filled=2), 0.3)
    assert origin_fetches(acts) == [] and not s.wants_view(0.3)
    assert origin_fetches(s.handle_timer(10.0)) == []  # slot 1's chunks are its owner's


def test_a_full_set_of_fetchers_covers_no_vacant_slot() -> None:
    s = Swarm(PeerId("me"), "r1", 8, have("0" * 8), 100, SwarmConfig(max_origin_inflight=8),
              random.Random(1), 0.0)
    acts = s.handle(PeersFound((), origin_slot=1, origin_slots=4, origin_filled=4), 0.0)
    assert sorted(origin_fetches(acts)) == [1, 5]
    assert s.next_timer() != SwarmConfig().vacant_grace_s


@pytest.mark.parametrize("seed", range(20))
def test_random_event_storm_keeps_bookkeeping_consistent(seed: int) -> None:
    """Whatever order events come in, counters match the state and requests stay sane."""
    rng = random.Random(seed)
    n = 12
    s = Swarm(PeerId("me"), "r1", n, have("0" * n), 100, SwarmConfig(max_inflight=6),
              random.Random(seed), 0.0)
    s.handle(PeersFound((), origin_slot=None, origin_slots=1), 0.0)
    peers = [PeerId(f"p{i}") for i in range(5)]
    now = 0.0
    outstanding: list[tuple[PeerId | None, int]] = []
    for _ in range(400):
        now += rng.random()
        kind = rng.randrange(6)
        peer = rng.choice(peers)
        if kind == 0:
            event: object = PeerJoined(peer, rng.choice(["r1", "r2"]),
                                       tuple(rng.random() < 0.5 for _ in range(n)))
        elif kind == 1:
            event = PeerHas(peer, rng.randrange(n))
        elif kind == 2 and outstanding:
            source, chunk = outstanding.pop(rng.randrange(len(outstanding)))
            event = ChunkArrived(chunk, source, ok=rng.random() < 0.95)
        elif kind == 3 and outstanding:
            source, chunk = outstanding.pop(rng.randrange(len(outstanding)))
            event = ChunkFailed(chunk, source, "rejected")
        elif kind == 4:
            event = PeerLost(peer, "gone")
        else:
            acts = s.handle_timer(now)
            event = None
        if event is not None:
            acts = s.handle(event, now)  # type: ignore[arg-type]
        for a in acts:
            if isinstance(a, Request):
                outstanding.append((a.peer, a.chunk))
            elif isinstance(a, FetchFromOrigin):
                outstanding.append((None, a.chunk))
        inflight = sum(len(st.inflight) for st in s._peers.values())
        assert s._table.inflight_total == inflight <= 6 + s.config.endgame_duplicates * 6
        for a in acts:
            if isinstance(a, Request):
                assert not s.held(a.chunk)
        if s.complete:
            break


def test_chunk_coming_from_the_origin_is_not_also_asked_of_a_peer() -> None:
    s, first = alone("0000", max_origin_inflight=4)
    assert sorted(origin_fetches(first)) == [0, 1, 2, 3]
    join(s, A, "0000")
    assert requests(s.handle(PeerHas(A, 0), 1.0)) == []


def test_peer_failing_authentication_is_reported_and_not_redialled_soon() -> None:
    s = swarm("0", backoff_max_s=30.0)
    s.handle(PeersFound((PeerHint(A, "r1"),), origin_slot=None, origin_slots=1), 0.0)
    acts = s.handle(PeerLost(A, "connect failed: bad secret", hostile=True), 0.1)
    assert Report(A, "connect failed: bad secret") in acts
    assert not any(isinstance(a, Connect) for a in s.handle_timer(5.0))


def test_origin_order_lists_each_chunk_once_demand_first_then_from_region() -> None:
    from p2p.swarm.origin import origin_order, owned_chunks

    assert origin_order(0b11111111, [3, 3], start=5, limit=8) == [3, 5, 6, 7, 0, 1, 2, 4]
    assert origin_order(0b1111, [9], start=0, limit=2) == [0, 1]
    assert owned_chunks(8, 2, 4, filled=4) == 0b01000100
    assert owned_chunks(8, 0, 4, filled=2) == 0b01010101
    assert owned_chunks(8, 0, 4, filled=1) == 0b11111111
    assert owned_chunks(8, None, 4, filled=2) == 0


def test_fetchers_take_the_vacant_slots_chunks_last_from_the_end_down() -> None:
    from p2p.swarm.origin import origin_order, vacant_chunks

    # 4 slots, 2 filled: residue 2 is fetcher 0's to cover, residue 3 fetcher 1's.
    assert vacant_chunks(8, 0, 4, filled=2) == 0b01000100
    assert vacant_chunks(8, 1, 4, filled=2) == 0b10001000
    assert vacant_chunks(8, 0, 4, filled=4) == 0 and vacant_chunks(8, 3, 4, filled=2) == 0
    # 8 slots, 3 filled: 3 and 6 go to fetcher 0, 4 and 7 to fetcher 1, 5 to fetcher 2.
    assert [vacant_chunks(8, i, 8, filled=3) for i in range(3)] == [
        0b01001000, 0b10010000, 0b00100000]
    vacant = vacant_chunks(8, 0, 2, filled=1)  # fetcher 0 of 1 covers the odd chunks
    assert vacant == 0b10101010
    assert origin_order(0b11111111, [], start=0, limit=8, vacant=vacant) == [
        0, 2, 4, 6, 7, 5, 3, 1]
    assert origin_order(0b11111111, [], start=0, limit=2, vacant=vacant) == [0, 2]
    assert origin_order(0b11111111, [5], start=0, limit=3, vacant=vacant) == [5, 0, 2]


def test_fetcher_zero_waits_for_newcomers_before_it_covers_their_slots() -> None:
    # Fetcher 0 of 1 (of 4 slots) covers all 5 chunks. Nodes that start with it are
    # appointed a moment later; their chunks wait out the grace, unless a newcomer's
    # pending mark or the tracker says it has them, and are then read from the end down.
    s = swarm("00000", max_origin_inflight=2)
    acts = s.handle(PeersFound((), origin_slot=0, origin_slots=4, origin_filled=1), 0.0)
    assert origin_fetches(acts) == [0, 4]
    assert origin_fetches(s.handle(ChunkArrived(0, None, ok=True), 0.1)) == []
    join(s, A, "00000", now=0.2)
    s.handle(PeerPending(A, 1), 0.2)  # fetcher 1 started on chunk 1
    assert s.next_timer() == 0.2 + SwarmConfig().vacant_grace_s  # a joiner puts it off
    assert origin_fetches(s.handle_timer(0.5)) == []  # asks the tracker again first
    acts = s.handle(PeersFound((), origin_slot=0, origin_slots=4, origin_filled=1), 0.5)
    assert origin_fetches(acts) == [3]
    assert origin_fetches(s.handle(ChunkArrived(3, None, ok=True), 0.6)) == [2]


def test_a_lazy_content_ensured_later_gets_its_grace_from_then() -> None:
    # A launch attaches its checkpoint lazily when it mounts it and ensures it a
    # moment later, as do the nodes that started with it: the grace counts from
    # then, or fetcher 0 reads the newcomers' chunks as they do (seen: HDFS served a
    # 2-stripe file 1.5 times over to 2 nodes).
    s = Swarm(PeerId("me"), "r1", 4, have("0000"), 100, SwarmConfig(max_origin_inflight=4),
              random.Random(1), now=0.0, lazy=True)
    assert origin_fetches(s.handle(PeersFound((), origin_slot=0, origin_slots=2,
                                              origin_filled=1), 0.0)) == []
    assert origin_fetches(s.handle(WantedAll(), 5.0)) == [0, 2]
    assert s.next_timer() == 5.0 + SwarmConfig().vacant_grace_s
    join(s, A, "0000", now=5.1)
    s.handle(PeerPending(A, 1), 5.1)  # fetcher 1 ensured it too
    end = 5.1 + SwarmConfig().vacant_grace_s
    assert origin_fetches(s.handle_timer(end)) == [] and s.wants_view(end)
    acts = s.handle(PeersFound((), origin_slot=0, origin_slots=2, origin_filled=1), end)
    assert origin_fetches(acts) == [3]


def test_a_peer_joining_during_the_grace_puts_it_off_for_its_pending_marks() -> None:
    # Seen on a loaded machine: fetcher 1 joined 0.02 s before fetcher 0's grace ended,
    # with nothing pending yet; its mark for chunk 1 came 0.13 s later, after fetcher 0
    # had sent itself to the origin for chunk 1 as well.
    grace = SwarmConfig().vacant_grace_s
    s = swarm("00", max_origin_inflight=2)
    assert origin_fetches(s.handle(PeersFound((), origin_slot=0, origin_slots=4,
                                              origin_filled=1), 0.0)) == [0]
    join(s, A, "00", now=grace - 0.02)
    assert s.next_timer() == 2 * grace - 0.02
    s.handle(PeerPending(A, 1), grace + 0.11)
    assert origin_fetches(s.handle_timer(2 * grace)) == []
    # ... and no later than twice the grace from its start, whoever else joins.
    t = swarm("00", max_origin_inflight=2)
    t.handle(PeersFound((), origin_slot=0, origin_slots=4, origin_filled=1), 0.0)
    join(t, A, "00", now=0.2)
    join(t, B, "00", now=0.4)
    assert t.next_timer() == 2 * grace
    assert origin_fetches(t.handle_timer(2 * grace)) == [] and t.wants_view(2 * grace)
    acts = t.handle(PeersFound((), origin_slot=0, origin_slots=4, origin_filled=1), 2 * grace)
    assert origin_fetches(acts) == [1]


def test_prefetched_chunks_are_not_held_back_by_the_grace() -> None:
    s = swarm("00000", max_origin_inflight=2)
    s.handle(PrefetchGiven((2,)), 0.0)
    acts = s.handle(PeersFound((), origin_slot=0, origin_slots=4, origin_filled=1), 0.0)
    assert origin_fetches(acts) == [2, 0]  # the launch's hot list first, vacant or not


# ---- a chunk lost from the store; a content with no source --------------------------


def test_lost_chunk_of_a_complete_content_is_fetched_again() -> None:
    s, _ = alone("11")
    assert s.complete
    acts = s.handle(ChunkLost(1), 10.0)
    assert not s.complete and not s.held(1)
    assert origin_fetches(acts) == [1]
    acts = s.handle(ChunkArrived(1, None, ok=True), 11.0)
    assert Complete() in acts and s.complete


def test_lost_chunk_goes_to_a_peer_that_holds_it() -> None:
    s = swarm("11")
    join(s, A, "11")
    acts = s.handle(ChunkLost(0), 5.0)
    assert requests(acts) == [("a", 0)]


def test_lost_chunk_out_of_range_or_not_held_is_ignored() -> None:
    s = swarm("10")
    assert s.handle(ChunkLost(1), 1.0) == []
    assert s.handle(ChunkLost(-1), 1.0) == []
    assert s.handle(ChunkLost(2), 1.0) == []
    assert s.held(0)


def test_no_source_aborts_after_the_deadline_saying_what_was_tried() -> None:
    s, acts = alone("000", no_source_deadline_s=60.0, max_origin_inflight=1)
    now = 0.0
    while True:
        for chunk in origin_fetches(acts):
            acts = s.handle(ChunkFailed(chunk, None, "connection refused"), now)
            break
        else:
            when = s.next_timer()
            assert when is not None and when <= 60.0
            now = when
            acts = s.handle_timer(now)
        if any(isinstance(a, Abort) for a in acts):
            break
    assert now == 60.0
    (abort,) = [a for a in acts if isinstance(a, Abort)]
    assert "3 of 3 chunks missing" in abort.reason
    assert "last: connection refused" in abort.reason
    assert "no peer offered" in abort.reason
    assert s.next_timer() is None and s.handle(ChunkLost(0), now) == []


def test_deadline_names_the_peers_tried_and_restarts_on_progress() -> None:
    s = swarm("000", no_source_deadline_s=30.0, request_timeout_s=100.0)
    ((_, first),) = requests(join(s, A, "111"))
    assert s.handle(ChunkArrived(first, A, ok=True), 20.0)  # progress: the clock restarts
    now, acts = 30.0, s.handle_timer(30.0)
    while not any(isinstance(a, Abort) for a in acts):
        when = s.next_timer()
        assert when is not None
        now, acts = when, s.handle_timer(when)
    assert now == 50.0
    (abort,) = [a for a in acts if isinstance(a, Abort)]
    assert "2 of 3 chunks missing" in abort.reason and "asked peers a" in abort.reason


@pytest.mark.parametrize("width", [0, 1, 61, 62, 63, 64, 65, 200])
def test_bits_indices_lists_set_bits_in_ascending_order_at_every_width(width: int) -> None:
    rng = random.Random(width)
    for mask in [0, (1 << width) - 1, *(rng.getrandbits(width) for _ in range(50))]:
        assert bits.indices(mask) == [i for i in range(width) if mask >> i & 1]


@pytest.mark.parametrize("width", [0, 1, 7, 8, 9, 61, 62, 63, 64, 65, 200])
def test_bits_flags_and_masks_convert_both_ways_at_every_width(width: int) -> None:
    rng = random.Random(width)
    for mask in [0, (1 << width) - 1, *(rng.getrandbits(width) for _ in range(50))]:
        flags = bits.to_bools(mask, width)
        assert flags == tuple(bool(mask >> i & 1) for i in range(width))
        assert bits.from_bools(flags) == mask
        assert bits.from_bools(list(flags)) == mask
