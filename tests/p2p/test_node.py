"""The node core, driven by hand: no sockets, no event loop, explicit `now`.

These were the agent's announce loop, reader waiters and per-swarm timers;
what they check now holds for the simulator too, since it drives the same
`Node`.
"""

from __future__ import annotations

import random

import pytest

from p2p.content import ContentId, PeerId
from p2p.swarm import Swarm, SwarmConfig
from p2p.swarm.events import (
    Abort,
    Action,
    Advertise,
    ChunkArrived,
    Complete,
    Connect,
    Disconnect,
    FetchFromOrigin,
    PeerHas,
    PeerHint,
    PeerJoined,
    PeerLost,
    PeersFound,
    ReaderWants,
)
from p2p.swarm.links import (
    JOIN_TIMEOUT_S,
    CloseLinks,
    JoinHeard,
    LinkId,
    LinkOpened,
    SendJoin,
)
from p2p.swarm.node import (
    EARLY_ANNOUNCE_GAP_S,
    AnnounceAll,
    Announced,
    AnnounceFailed,
    AnnounceItem,
    ChunkStored,
    Leave,
    Node,
    NodeAction,
    Pin,
    ReaderWaiting,
    SwarmActions,
    Unpin,
    WakeReaders,
)

X, Y = ContentId("x"), ContentId("y")
A, B = PeerId("a"), PeerId("b")
L1, L2 = LinkId(1), LinkId(2)
INTERVAL = 2.0


def swarm(mine: str, max_peers: int = 30, max_origin_corrupt: int = 3) -> Swarm:
    return Swarm(PeerId("me"), "r1", len(mine), [c == "1" for c in mine], 100,
                 SwarmConfig(max_peers=max_peers, max_origin_corrupt=max_origin_corrupt),
                 random.Random(1), now=0.0)


def node(**swarms: Swarm) -> Node:
    n = Node(INTERVAL, now=0.0)
    for content, s in swarms.items():
        n.add(ContentId(content), s, 0.0)
    return n


def fire(n: Node) -> list[NodeAction]:
    """Run the node's timer when it is due."""
    when = n.next_timer()
    assert when is not None
    return n.handle_timer(when)


def announced(actions: list[NodeAction]) -> list[AnnounceItem]:
    [action] = actions
    assert isinstance(action, AnnounceAll)
    return list(action.items)


def join(s: Swarm, peer: PeerId, now: float = 0.0) -> None:
    s.handle(PeerJoined(peer, "r1", (False,) * s.chunks), now)


def heard(content: ContentId, peer: PeerId, link: LinkId = L1, have: str = "00") -> JoinHeard:
    """`peer`'s Join for `content` (of len(have) chunks) on `link`."""
    return JoinHeard(content, peer, link, "r1", tuple(c == "1" for c in have))


# ---- the announce schedule ----------------------------------------------------------


def test_one_announce_covers_every_content_at_once() -> None:
    n = node(x=swarm("10"), y=swarm("11"))
    assert n.next_timer() == 0.0
    assert announced(n.handle_timer(0.0)) == [AnnounceItem(X, 1, False, None),
                                              AnnounceItem(Y, 2, True, 0)]


def test_no_second_announce_while_one_is_in_flight() -> None:
    n = node(x=swarm("11"))  # complete: its swarm sets no timer when a peer joins
    announced(fire(n))
    assert n.next_timer() is None
    assert n.handle_timer(100.0) == []
    n.handle(heard(X, A), 1.0)  # due at once, but after the answer
    assert n.next_timer() is None
    n.handle(Announced(INTERVAL), 1.5)
    assert n.next_timer() == 1.0
    assert len(announced(n.handle_timer(1.5))) == 1


def test_the_next_announce_comes_the_trackers_interval_after_its_answer() -> None:
    n = node(x=swarm("00"))
    fire(n)
    n.handle(Announced(7.0), 0.5)
    assert n.next_timer() == 7.5
    assert n.handle_timer(7.4) == []
    fire(n)
    n.handle(AnnounceFailed(), 8.0)  # the last interval still holds
    assert n.next_timer() == 15.0


def test_a_content_that_opens_is_announced_at_once() -> None:
    n = node(x=swarm("00"))
    fire(n)
    n.handle(Announced(INTERVAL), 0.1)
    n.add(Y, swarm("0"), 0.15)  # no early-announce gap for a new content
    assert n.next_timer() == 0.15
    assert [i.content for i in announced(fire(n))] == [X, Y]


def test_a_peer_the_tracker_did_not_hand_out_brings_the_announce_forward_but_not_too_far() -> None:
    n = node(x=swarm("11"))
    fire(n)
    n.handle(Announced(INTERVAL, handed_out=(A,)), 0.05)
    assert n.handle(heard(X, A, L1), 0.06) == [SendJoin(L1, X), Unpin(X)]  # (complete)
    assert n.next_timer() == 0.05 + INTERVAL  # A came from the tracker: nothing new
    n.handle(heard(X, B, L2), 0.1)
    assert n.next_timer() == EARLY_ANNOUNCE_GAP_S  # the gap counts from the last announce
    n.handle(heard(X, B, L2), 1.0)
    assert [type(a) for a in fire(n)] == [AnnounceAll]
    assert not any(isinstance(a, AnnounceAll) for a in n.handle_timer(50.0))  # in flight


def test_a_swarm_about_to_cover_vacant_fetcher_slots_brings_the_announce_forward() -> None:
    s = swarm("0000")
    n = node(x=s)
    fire(n)
    n.handle(Announced(INTERVAL), 0.01)
    n.swarm_event(X, PeersFound((), origin_slot=0, origin_slots=2, origin_filled=1), 0.01)
    grace = SwarmConfig().vacant_grace_s
    assert n.next_timer() == 0.01 + grace  # the swarm's grace ends before the announce
    assert announced(fire(n))  # asked at once, not INTERVAL after the last answer
    assert s.wants_view(0.01 + grace)  # until the answer comes


def test_a_completed_content_is_announced_at_once_and_asks_for_no_peers() -> None:
    s = swarm("0")
    n = node(x=s)
    fire(n)
    n.handle(Announced(INTERVAL), 0.0)
    assert n.swarm_event(X, ChunkArrived(0, None, ok=True), 1.0) == [
        SwarmActions(X, [Advertise(0), Complete()]), Unpin(X)]  # heard it: no event needed
    assert n.next_timer() == 1.0
    assert announced(fire(n)) == [AnnounceItem(X, 1, True, 0)]


def test_want_is_0_once_the_swarm_has_as_many_peers_as_it_would_open() -> None:
    s = swarm("00", max_peers=2)
    n = node(x=s)
    join(s, A)
    assert announced(fire(n)) == [AnnounceItem(X, 0, False, None)]
    join(s, B)
    n.handle(Announced(INTERVAL), 0.0)
    assert announced(fire(n)) == [AnnounceItem(X, 0, False, 0)]
    s.handle(PeerLost(B, "gone"), 2.0)
    n.handle(Announced(INTERVAL), 2.0)
    assert announced(fire(n)) == [AnnounceItem(X, 0, False, None)]


def test_a_removed_content_is_left_and_announced_no_more() -> None:
    n = node(x=swarm("0"), y=swarm("0"))
    assert n.remove(X) == [Leave(X)]
    assert n.remove(X) == []
    assert [i.content for i in announced(fire(n))] == [Y]
    n.remove(Y)
    n.handle(Announced(INTERVAL), 1.0)
    assert n.handle_timer(3.0) == []  # nothing to announce: wait another interval
    assert n.next_timer() == 3.0 + INTERVAL


# ---- reader waiters -----------------------------------------------------------------


def test_a_reader_of_a_held_chunk_is_woken_at_once() -> None:
    n = node(x=swarm("10"))
    assert n.handle(ReaderWaiting(X, 0), 0.0) == [WakeReaders(X, 0)]


def test_a_blocked_reader_is_woken_when_its_chunk_is_stored_and_only_then() -> None:
    s = swarm("00")
    n = node(x=s)
    assert n.handle(ReaderWaiting(X, 1), 0.0) == []
    assert n.handle(ReaderWaiting(X, 1), 0.0) == []  # a second reader of the same chunk
    assert n.handle(ChunkStored(X, 0), 1.0) == []
    assert n.handle(ChunkStored(X, 1), 2.0) == [WakeReaders(X, 1)]
    assert n.handle(ChunkStored(X, 1), 3.0) == []  # woken once


def test_readers_of_a_removed_content_are_forgotten() -> None:
    n = node(x=swarm("0"))
    n.handle(ReaderWaiting(X, 0), 0.0)
    n.remove(X)
    assert n.handle(ChunkStored(X, 0), 1.0) == []


# ---- join time-outs -------------------------------------------------------------------


def quiet(n: Node) -> Node:
    """`n` with its first announce answered (A and B handed out): its timer is the
    announce interval's."""
    fire(n)
    n.handle(Announced(100.0, handed_out=(A, B)), 0.0)
    return n


def test_a_join_unanswered_in_time_gives_the_peer_up() -> None:
    n, alone = quiet(node(x=swarm("00"))), swarm("00")
    n.handle(LinkOpened(L1, A, dialled=False), 1.0)
    assert n.connect(X, A, 1.0) == [SendJoin(L1, X)]
    assert n.next_timer() == 1.0 + JOIN_TIMEOUT_S
    assert n.handle_timer(1.0 + JOIN_TIMEOUT_S - 0.1) == []
    lost = alone.handle(PeerLost(A, "no join reply"), 1.0 + JOIN_TIMEOUT_S)
    assert fire(n) == tagged(X, lost)  # its swarm heard that A is lost
    assert n.swarm_calls == 1


def test_a_join_answered_starts_no_time_out() -> None:
    s = swarm("00")
    n = quiet(node(x=s))
    n.handle(LinkOpened(L1, A, dialled=False), 1.0)
    n.connect(X, A, 1.0)
    assert n.handle(heard(X, A, L1), 2.0) == []  # our Join went out on L1 already
    assert s.joined(A)
    assert not n.links.deadlines


def test_a_join_answered_on_another_link_stops_the_clock_too() -> None:
    # We dialled A while A dialled us: our Join went out on the link we opened, and
    # A's came on the one it opened. A is one peer, joined: it is not given up.
    n = quiet(node(x=swarm("00")))
    n.handle(LinkOpened(L1, A, dialled=False), 1.0)
    n.connect(X, A, 1.0)
    assert n.handle(heard(X, A, L2), 1.5)[0] == SendJoin(L2, X)
    assert not n.links.deadlines


def test_a_join_on_a_second_link_to_a_joined_peer_starts_no_clock() -> None:
    # Both sides dialled at once: the peer joined on one link, and we answer its Join
    # on the other. The peer is one peer; the second Join is not a new question.
    n = quiet(node(x=swarm("00")))
    n.handle(heard(X, A, L1), 1.5)
    assert n.handle(heard(X, A, L2), 2.0) == [SendJoin(L2, X)]
    assert not n.links.deadlines


def test_joins_of_a_removed_or_reopened_content_are_forgotten() -> None:
    n = quiet(node(x=swarm("00"), y=swarm("0")))
    n.handle(LinkOpened(L1, A, dialled=False), 1.0)
    n.handle(LinkOpened(L2, B, dialled=False), 1.0)
    n.connect(X, A, 1.0)
    n.connect(Y, B, 1.0)
    n.remove(X)
    n.add(Y, swarm("0"), 2.0)
    assert [type(a) for a in fire(n)] == [AnnounceAll]  # the reopened content's announce
    n.handle(Announced(100.0), 2.0)
    assert n.next_timer() == 102.0
    assert n.connect(Y, B, 3.0) == [SendJoin(L2, Y)]  # the new swarm introduces itself


def test_a_peer_disconnected_as_hostile_is_cut_off_on_every_link() -> None:
    n = quiet(node(x=swarm("00"), y=swarm("00")))
    n.handle(LinkOpened(L1, A, dialled=False), 1.0)
    n.handle(LinkOpened(L2, A, dialled=True), 1.0)
    n.handle(heard(X, A, L1), 1.0)
    n.handle(heard(Y, A, L2), 1.0)
    bad = n.swarm_event(X, ChunkArrived(0, A, ok=False), 2.0)
    [swarm_actions, close] = bad
    assert isinstance(swarm_actions, SwarmActions)
    assert any(isinstance(a, Disconnect) and a.hostile for a in swarm_actions.actions)
    assert isinstance(close, CloseLinks) and close.links == (L1, L2)
    assert not n.links.joined(X, A) and n.links.joined(Y, A)  # Y hears it as the links close


def test_a_peer_disconnected_for_a_fault_keeps_its_links() -> None:
    s = swarm("00")
    n = quiet(node(x=s))
    n.handle(LinkOpened(L1, A, dialled=False), 1.0)
    n.handle(heard(X, A, L1), 1.0)
    actions = n.swarm_event(X, PeerLost(A, "gone quiet"), 2.0)
    assert not any(isinstance(a, CloseLinks) for a in actions)


def test_a_content_is_pinned_while_its_swarm_fetches_and_only_then() -> None:
    n = node()
    lazy = Swarm(PeerId("me"), "r1", 2, [False, False], 100, SwarmConfig(),
                 random.Random(1), now=0.0, lazy=True)
    n.add(X, lazy, 0.0)  # the caller attached (pinned) it to add it
    assert n.start(X, 0.0)[-1] == Unpin(X)  # lazy, nothing asked for yet: evictable
    assert n.swarm_event(X, ReaderWants((1,)), 1.0)[-1] == Pin(X)
    assert Pin(X) not in n.swarm_event(X, ReaderWants((1,)), 1.1)  # said once
    assert n.swarm_event(X, ChunkArrived(1, None, ok=True), 2.0)[-1] == Unpin(X)


def test_a_join_says_what_is_held_and_what_is_read_from_the_origin() -> None:
    s = swarm("100")
    assert s.join_view() == ((True, False, False), ())
    s.start(0.0)
    actions = s.handle(PeersFound((), origin_slot=0, origin_slots=1, origin_filled=0), 0.0)
    while not any(isinstance(a, FetchFromOrigin) for a in actions):  # no peer offers any
        when = s.next_timer()
        assert when is not None
        actions = s.handle_timer(when)
    fetched = tuple(sorted(a.chunk for a in actions if isinstance(a, FetchFromOrigin)))
    assert s.join_view() == ((True, False, False), fetched)


# ---- driving the swarms -------------------------------------------------------------


def found(*peers: PeerId) -> PeersFound:
    return PeersFound(tuple(PeerHint(p, "r1") for p in peers))


def tagged(content: ContentId, actions: list[Action]) -> list[NodeAction]:
    return [SwarmActions(content, actions)] if actions else []


def test_a_swarm_event_returns_the_swarms_actions_tagged_with_its_content() -> None:
    alone = swarm("00")
    n = quiet(node(x=swarm("00")))
    expected = alone.handle(found(A, B), 1.0)
    assert expected == [Connect(A), Connect(B)]
    assert n.swarm_event(X, found(A, B), 1.0) == [SwarmActions(X, expected)]
    assert n.swarm_calls == 1


def test_an_event_for_a_content_the_node_does_not_have_is_ignored() -> None:
    n = quiet(node(x=swarm("00")))
    assert n.swarm_event(Y, found(A), 1.0) == []
    n.remove(X)
    assert n.swarm_event(X, found(A), 1.0) == []
    assert n.start(X, 1.0) == []
    assert n.swarm_calls == 0
    assert n.next_timer() == 100.0


def test_a_swarm_timer_due_before_the_announce_is_the_nodes_timer() -> None:
    s, alone = swarm("00"), swarm("00")
    n = quiet(node(x=s))
    assert n.next_timer() == 100.0  # a swarm the node never called has no timer yet
    n.swarm_event(X, found(A), 1.0)
    alone.handle(found(A), 1.0)
    when = alone.next_timer()
    assert when is not None and when < 100.0
    assert n.next_timer() == when
    assert n.handle_timer(when - 0.01) == []
    assert n.handle_timer(when) == tagged(X, alone.handle_timer(when))
    assert n.swarm_calls == 2
    assert n.next_timer() == alone.next_timer()


def test_a_removed_contents_timer_is_forgotten() -> None:
    n = quiet(node(x=swarm("00")))
    n.swarm_event(X, found(A), 1.0)
    assert n.next_timer() != 100.0
    n.remove(X)
    assert n.next_timer() == 100.0


def test_due_swarms_run_before_the_announce() -> None:
    n = node(x=swarm("00"), y=swarm("00"))
    n.swarm_event(Y, found(A), 0.0)  # settles at 0.5
    n.swarm_event(X, found(A), 0.2)  # settles at 0.7
    assert n.next_timer() == 0.0  # the first announce
    assert [type(a) for a in n.handle_timer(1.0)] == [AnnounceAll]
    assert n.swarm_calls == 4  # both swarms' timers ran


def test_a_swarm_timer_is_no_further_ahead_than_the_slack() -> None:
    n = Node(100.0, now=0.0, timer_slack_s=0.1)
    s = swarm("00")
    n.add(X, s, 0.0)
    fire(n)
    n.handle(Announced(100.0), 0.0)
    n.swarm_event(X, found(A), 1.0)
    assert s.next_timer() == 1.5
    assert n.next_timer() == 1.1


def test_a_have_that_changes_nothing_keeps_the_timer_and_says_so() -> None:
    n = Node(100.0, now=0.0, timer_slack_s=5.0)
    n.add(X, swarm("10"), 0.0)
    fire(n)
    n.handle(Announced(100.0), 0.0)
    n.swarm_event(X, found(A), 1.0)
    n.swarm_event(X, PeerJoined(A, "r1", (False, False)), 1.0)
    before = n.next_timer()
    assert n.swarm_event(X, PeerHas(A, 0), 1.2) == []  # a chunk we hold: availability only
    assert n.timer_kept and n.next_timer() == before
    n.swarm_event(X, PeerLost(A, "gone"), 1.3)  # a lost peer may bring a deadline forward
    assert not n.timer_kept


def test_without_slack_every_swarm_call_may_move_the_timer() -> None:
    n = quiet(node(x=swarm("10")))
    n.swarm_event(X, found(A), 1.0)
    n.swarm_event(X, PeerJoined(A, "r1", (False, False)), 1.0)
    n.swarm_event(X, PeerHas(A, 0), 1.2)
    assert not n.timer_kept  # the agent asks its swarm again after every call


def test_a_swarm_that_aborts_is_left_by_the_node() -> None:
    n = quiet(node(x=swarm("00", max_origin_corrupt=1)))
    n.swarm_event(X, PeersFound((), origin_slot=0, origin_slots=1), 1.0)
    actions = n.swarm_event(X, ChunkArrived(0, None, ok=False), 2.0)
    assert [type(a) for a in actions] == [SwarmActions, Leave]
    assert isinstance(actions[0], SwarmActions) and type(actions[0].actions[-1]) is Abort
    assert n.remove(X) == []  # gone already: the caller's own remove is harmless
    assert n.swarm_event(X, found(A), 3.0) == []


# ---- the node's due (p2p.swarm.uploads: earliest_due) ----------------------------

def test_due_is_the_launch_start_plus_what_is_held_at_the_line_rate() -> None:
    n = Node(INTERVAL, now=0.0, line_Bps=100.0)  # one 100-byte chunk a second
    assert n.due(3.0) == 3.0  # nothing to fetch: due now
    n.add(X, swarm("0000"), 10.0)
    assert n.due(12.0) == 10.0  # started at 10, holds nothing: 2 s behind at 12
    n.add(Y, swarm("1100"), 11.0)  # added later, holding 200 bytes: they count
    assert n.due(12.0) == 12.0


def test_due_forgets_finished_launches_and_lazy_contents() -> None:
    n = Node(INTERVAL, now=0.0, line_Bps=100.0)
    n.add(X, swarm("11"), 0.0)  # finished long ago
    lazy = Swarm(PeerId("me"), "r1", 2, [False, False], 100, SwarmConfig(),
                 random.Random(1), now=0.0, lazy=True)
    n.add(ContentId("mount"), lazy, 1.0)  # a mount: fetches what is read, for hours
    n.add(Y, swarm("100"), 50.0)
    assert n.due(60.0) == 51.0  # from Y's start, Y's one chunk: X and the mount left out
    n.remove(Y)
    assert n.due(60.0) == 60.0


def test_a_node_core_needs_a_positive_line_rate() -> None:
    with pytest.raises(ValueError, match="line rate"):
        Node(INTERVAL, now=0.0, line_Bps=0.0)
