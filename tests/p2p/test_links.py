"""The node core's join table, driven by hand: no sockets, no event loop.

These were the agent's links per content, its dials and its resolution of two
links to one peer; the simulator drives the same table (who is joined, what a
Join heard and a Disconnect do), so what they check holds there too.
"""

from __future__ import annotations

import random

from p2p.content import ContentId, PeerId
from p2p.swarm import Swarm, SwarmConfig
from p2p.swarm.events import (
    ChunkFailed,
    Disconnect,
    PeerHint,
    PeersFound,
    Report,
    Request,
)
from p2p.swarm.links import (
    JOIN_TIMEOUT_S,
    Dial,
    DialFailed,
    JoinHeard,
    LinkClosed,
    LinkId,
    LinkOpened,
    ReportUnreachable,
    SendJoin,
)
from p2p.swarm.node import Announced, Node, NodeAction, SwarmActions

X, Y = ContentId("x"), ContentId("y")
A, B = PeerId("a"), PeerId("b")
L1, L2, L3 = LinkId(1), LinkId(2), LinkId(3)


def swarm(mine: str = "00", max_peer_failures: int = 3) -> Swarm:
    return Swarm(PeerId("me"), "r1", len(mine), [c == "1" for c in mine], 100,
                 SwarmConfig(max_peer_failures=max_peer_failures), random.Random(1), now=0.0)


def node(**swarms: Swarm) -> Node:
    """A node whose first announce was answered, far from its next one."""
    n = Node(100.0, now=0.0)
    for content, s in swarms.items():
        n.add(ContentId(content), s, 0.0)
    n.handle_timer(0.0)
    n.handle(Announced(100.0, handed_out=(A, B)), 0.0)
    return n


def heard(content: ContentId, peer: PeerId, link: LinkId, have: str = "00") -> JoinHeard:
    return JoinHeard(content, peer, link, "r1", tuple(c == "1" for c in have))


def link_actions(actions: list[NodeAction]) -> list[NodeAction]:
    return [a for a in actions if not isinstance(a, SwarmActions)]


def swarm_events(actions: list[NodeAction]) -> list[object]:
    return [a for action in actions if isinstance(action, SwarmActions) for a in action.actions]


# ---- connecting ---------------------------------------------------------------------


def test_a_peer_with_no_link_is_dialled_once_and_its_link_carries_every_waiting_join() -> None:
    n = node(x=swarm(), y=swarm())
    assert n.connect(Y, A, 1.0) == [Dial(A)]
    assert n.connect(X, A, 1.0) == []  # a dial is under way
    assert n.handle(LinkOpened(L1, A, dialled=True), 2.0) == [SendJoin(L1, X), SendJoin(L1, Y)]
    assert n.links.told(X) == [L1] and n.links.told(Y) == [L1]
    assert min(n.links.deadlines.values()) == 2.0 + JOIN_TIMEOUT_S  # both wait for an answer


def test_a_link_the_peer_opened_carries_no_join_for_a_dial_under_way() -> None:
    n = node(x=swarm())
    n.connect(X, A, 1.0)
    assert n.handle(LinkOpened(L1, A, dialled=False), 1.5) == []
    assert n.handle(LinkOpened(L2, A, dialled=True), 2.0) == [SendJoin(L2, X)]


def test_a_peer_with_an_open_link_gets_our_join_there_once() -> None:
    n = node(x=swarm())
    n.handle(LinkOpened(L1, A, dialled=False), 1.0)
    n.handle(LinkOpened(L2, A, dialled=False), 1.1)
    assert n.connect(X, A, 2.0) == [SendJoin(L2, X)]  # the newest link
    assert n.connect(X, A, 2.5) == []


def test_a_failed_dial_loses_the_peer_to_each_waiting_swarm_not_joined_meanwhile() -> None:
    n = node(x=swarm(), y=swarm())
    n.connect(X, A, 1.0)
    n.connect(Y, A, 1.0)
    n.handle(LinkOpened(L1, A, dialled=False), 1.5)
    n.handle(heard(Y, A, L1), 1.5)  # A joined Y on a link it opened
    calls = n.swarm_calls
    actions = n.handle(DialFailed(A, "refused", unreachable=True), 2.0)
    assert link_actions(actions) == [ReportUnreachable(X, A), ReportUnreachable(Y, A)]
    assert n.swarm_calls == calls + 1  # X's swarm hears A is lost; Y's keeps it
    assert n.links.joined(Y, A) and not n.links.joined(X, A)
    assert n.connect(X, A, 3.0) == [SendJoin(L1, X)]  # the dial is over: use the open link


def test_a_failed_dial_tells_the_swarm_and_a_hostile_one_is_reported_by_it() -> None:
    s = swarm()
    n = node(x=s)
    n.swarm_event(X, PeersFound((PeerHint(A, "r1"),)), 0.5)  # the swarm connects to A
    n.connect(X, A, 1.0)
    actions = n.handle(DialFailed(A, "bad secret", hostile=True), 2.0)
    assert link_actions(actions) == []  # not unreachable: no report of that kind
    assert Report(A, "bad secret") in swarm_events(actions)


# ---- Joins heard ------------------------------------------------------------------


def test_a_join_heard_joins_the_peer_and_is_answered() -> None:
    s = swarm()
    n = node(x=s)
    actions = n.handle(heard(X, A, L1, have="10"), 1.0)
    assert link_actions(actions) == [SendJoin(L1, X)]
    assert s.joined(A) and s.peer_progress(A) == 1
    assert n.links.link_of(X, A) == L1 and n.links.joined_links(X) == [L1]


def test_a_join_again_on_the_same_link_is_a_restart_and_is_answered_again() -> None:
    s = swarm()
    n = node(x=s)
    n.handle(heard(X, A, L1, have="10"), 1.0)
    actions = n.handle(heard(X, A, L1, have="00"), 2.0)  # A's swarm failed and reopened
    assert link_actions(actions) == [SendJoin(L1, X)]  # its new swarm needs our bits
    assert s.peer_progress(A) == 0  # its state starts afresh


def test_a_join_on_a_second_link_is_answered_there_and_changes_nothing_else() -> None:
    s = swarm()
    n = node(x=s)
    n.handle(heard(X, A, L1, have="10"), 1.0)
    calls = n.swarm_calls
    assert n.handle(heard(X, A, L2, have="00"), 1.1) == [SendJoin(L2, X)]
    assert n.swarm_calls == calls  # the swarm hears nothing
    assert s.peer_progress(A) == 1
    assert n.links.link_of(X, A) == L1  # requests still go on the first link
    assert n.links.told(X) == [L1]  # one link per peer for haves


def test_a_join_answering_ours_gets_no_second_join() -> None:
    n = node(x=swarm())
    n.handle(LinkOpened(L1, A, dialled=False), 1.0)
    n.connect(X, A, 1.0)
    assert link_actions(n.handle(heard(X, A, L1), 1.2)) == []


def test_a_join_for_a_content_the_node_does_not_have_is_left_to_the_caller() -> None:
    n = node(x=swarm())
    assert n.handle(heard(Y, A, L1), 1.0) == []
    assert not n.links.joined(Y, A)


# ---- links closing, swarms disconnecting ---------------------------------------------


def test_a_link_that_closes_loses_the_peers_joined_on_it_in_every_content() -> None:
    sx, sy = swarm(), swarm()
    n = node(x=sx, y=sy)
    for link, peer in ((L1, A), (L3, B)):
        n.handle(LinkOpened(link, peer, dialled=False), 0.5)
    n.handle(heard(X, A, L1), 1.0)
    n.handle(heard(Y, A, L1), 1.0)
    n.handle(heard(X, B, L3), 1.0)
    n.handle(LinkClosed(L1, "reset"), 2.0)
    assert not sx.joined(A) and not sy.joined(A) and sx.joined(B)
    assert n.links.joined_links(X) == [L3] and n.links.peer_count(Y) == 0
    assert n.connect(X, A, 3.0) == [Dial(A)]  # no open link to A any more


def test_a_second_link_that_closes_loses_nothing() -> None:
    s = swarm()
    n = node(x=s)
    n.handle(LinkOpened(L1, A, dialled=False), 0.5)
    n.handle(LinkOpened(L2, A, dialled=False), 0.6)
    n.handle(heard(X, A, L1), 1.0)
    n.handle(heard(X, A, L2), 1.0)
    assert n.handle(LinkClosed(L2, "reset"), 2.0) == []
    assert s.joined(A) and n.links.link_of(X, A) == L1


def test_a_peer_the_swarm_disconnects_is_dropped_and_joined_again_when_it_connects() -> None:
    s = swarm(max_peer_failures=1)
    n = node(x=s)
    n.handle(LinkOpened(L1, A, dialled=False), 0.5)
    requests = swarm_events(n.handle(heard(X, A, L1, have="11"), 1.0))
    assert Request(A, 0) in requests
    failed = n.swarm_event(X, ChunkFailed(0, A, "rejected: not held"), 1.1)
    assert any(isinstance(a, Disconnect) for a in swarm_events(failed))
    assert not n.links.joined(X, A) and n.links.told(X) == []
    # Asked to connect again, our Join goes out again on the same link (the peer
    # takes it as a restart and answers), and waits for its answer.
    assert n.connect(X, A, 100.0) == [SendJoin(L1, X)]
    assert min(n.links.deadlines.values()) == 100.0 + JOIN_TIMEOUT_S


def test_a_peer_disconnected_after_joining_on_two_links_gets_our_join_again() -> None:
    s = swarm(max_peer_failures=1)
    n = node(x=s)
    n.handle(LinkOpened(L1, A, dialled=False), 0.5)
    n.handle(LinkOpened(L2, A, dialled=False), 0.6)
    n.handle(heard(X, A, L1, have="11"), 1.0)
    n.handle(heard(X, A, L2, have="11"), 1.0)  # answered on L2 too
    n.swarm_event(X, ChunkFailed(0, A, "rejected: not held"), 1.1)
    assert n.links.told(X) == []
    assert n.connect(X, A, 100.0) == [SendJoin(L2, X)]


def test_a_hostile_link_closing_makes_the_swarm_report_the_peer() -> None:
    n = node(x=swarm())
    n.handle(heard(X, A, L1), 1.0)
    n.handle(LinkOpened(L1, A, dialled=False), 1.0)
    actions = n.handle(LinkClosed(L1, "protocol error", hostile=True), 2.0)
    assert Report(A, "protocol error") in swarm_events(actions)


def test_a_join_that_comes_after_its_time_out_still_joins_the_peer() -> None:
    s = swarm()
    n = node(x=s)
    n.handle(LinkOpened(L1, A, dialled=False), 1.0)
    n.connect(X, A, 1.0)
    calls = n.swarm_calls
    n.handle_timer(1.0 + JOIN_TIMEOUT_S)
    assert n.swarm_calls == calls + 1  # the swarm heard that A is lost
    assert link_actions(n.handle(heard(X, A, L1), 20.0)) == []  # ours went out on L1
    assert s.joined(A)
