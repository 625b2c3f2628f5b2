"""The agent's upload side as the simulator models it: a FIFO per link, node-wide slots."""

from __future__ import annotations

import pytest

from p2p.swarm.uploads import UploadSlots, request_rank
from simulations.node import (
    QUEUED,
    READY,
    SENDING,
    Transfer,
    Uploads,
)


def t(dst: int, chunk: int) -> Transfer:
    return Transfer(dst, 0, 9, chunk, 100)


def test_one_piece_at_a_time_per_link_and_slots_across_links() -> None:
    up = Uploads(slots=2)
    a1, a2, b1, c1 = t(1, 0), t(1, 1), t(2, 0), t(3, 0)
    assert up.add(a1) == [a1]
    assert up.add(a2) == []  # same link: waits behind a1
    assert up.add(b1) == [b1]
    assert up.add(c1) == []  # no slot left
    assert (a2.stage, c1.stage) == (QUEUED, READY)
    # a1 ends: its slot goes to c1, which waited first; a2 then waits for a slot
    assert up.finished(a1) == [c1]
    assert a2.stage == READY
    assert up.finished(b1) == [a2]
    assert up.finished(c1) == [] and up.finished(a2) == []
    assert up.busy == 0 and not up.engaged and not up.slots and not up.queues


def test_dropping_a_waiting_request_lets_its_link_move_on() -> None:
    up = Uploads(slots=1)
    a1, b1, b2 = t(1, 0), t(2, 0), t(2, 1)
    assert up.add(a1) == [a1]
    up.add(b1)
    up.add(b2)
    assert up.drop(b2) == []  # queued behind b1
    assert up.drop(b1) == []  # ready: its link has nothing else
    assert up.finished(a1) == []
    assert up.busy == 0 and not up.engaged
    c1, c2 = t(3, 0), t(3, 1)
    assert up.add(c1) == [c1] and up.add(c2) == []
    assert up.finished(c1) == [c2] and c2.stage == SENDING


def test_neediest_first_gives_a_free_slot_to_the_requester_furthest_behind() -> None:
    slots: UploadSlots[str] = UploadSlots(1, "neediest_first")
    assert slots.ask("first", rank=50)
    assert not slots.ask("nearly-done", rank=90)
    assert not slots.ask("behind", rank=3)
    assert not slots.ask("also-behind", rank=3)  # ties: whoever asked first
    assert [slots.done(), slots.done(), slots.done()] == ["behind", "also-behind",
                                                           "nearly-done"]
    assert slots.done() is None and slots.busy == 0


def test_earliest_due_ranks_by_the_due_a_request_carries_not_by_chunks_held() -> None:
    order = "earliest_due"
    slots: UploadSlots[str] = UploadSlots(1, order)
    assert slots.ask("first", request_rank(order, held=0, due_ms=0))
    # started long ago, holds many chunks, but is 2 s behind its line rate ...
    assert not slots.ask("old", request_rank(order, held=60, due_ms=-2000))
    # ... goes before one that just started and holds nothing
    assert not slots.ask("new", request_rank(order, held=0, due_ms=-10))
    assert [slots.done(), slots.done()] == ["old", "new"]
    assert request_rank("neediest_first", held=60, due_ms=-2000) == 60


def test_fifo_ignores_ranks_and_a_withdrawn_waiter_is_skipped() -> None:
    slots: UploadSlots[str] = UploadSlots(1, "fifo")
    assert slots.ask("a", rank=9)
    assert not slots.ask("b", rank=5) and not slots.ask("c", rank=1)
    slots.withdraw("b")
    assert len(slots) == 1 and slots.done() == "c" and slots.done() is None


def test_an_unknown_order_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="unknown upload order 'lifo'"):
        UploadSlots(2, "lifo")


def test_the_simulated_uploads_rank_receivers_as_the_agent_does() -> None:
    ranks = {1: 40, 2: 2, 3: 7}
    up = Uploads(slots=1, rank=lambda tr: ranks[tr.dst])
    a, b, c = t(1, 0), t(2, 0), t(3, 0)
    assert up.add(a) == [a] and up.add(c) == [] and up.add(b) == []
    assert up.finished(a) == [b]  # node 2 holds the fewest chunks: it goes first
    assert up.finished(b) == [c]
