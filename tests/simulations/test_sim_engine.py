"""The event loop: callbacks run in (time, order scheduled), whether heap or lane."""

from __future__ import annotations

import random

import pytest

from simulations.engine import Loop


def test_callbacks_run_by_time_then_in_the_order_they_were_scheduled() -> None:
    rng = random.Random(7)
    loop = Loop()
    lanes = [loop.lane(0.003), loop.lane(0.0), loop.lane(0.001)]
    assert loop.lane(0.003) == lanes[0]  # one lane per delay
    scheduled: list[tuple[float, int]] = []  # (when, n) in the order scheduled
    ran: list[int] = []

    def schedule() -> None:
        for _ in range(rng.randrange(4)):
            n = len(scheduled)
            kind = rng.randrange(4)
            if kind == 0:  # coarse times: many ties
                when = loop.now + rng.randrange(5) * 0.001
                loop.at(when, fire, n)
            elif kind == 1:
                lane = rng.choice(lanes)
                when = loop.now + loop._delays[lane]
                loop.after_lane(lane, fire, n)
            elif kind == 2:
                when = loop.now + rng.random() * 0.01
                loop.after(when - loop.now, fire, n)
                when = loop.now + (when - loop.now)
            else:
                whens = [loop.now + rng.randrange(3) * 0.002, loop.now - 1.0]
                loop.at_many(whens, fire, [n, n + 1])
                scheduled.append((whens[0], n))
                n, when = n + 1, loop.now  # (a time in the past runs now)
            scheduled.append((when, n))

    def fire(n: int) -> None:
        ran.append(n)
        if len(scheduled) < 5000:
            schedule()

    for _ in range(20):
        schedule()
    loop.run()
    order = sorted(range(len(scheduled)), key=lambda i: (scheduled[i][0], i))
    assert ran == [scheduled[i][1] for i in order]
    assert len(ran) == len(scheduled) > 1000
    assert loop.pending() == 0


def test_the_run_stops_at_the_time_limit_with_callbacks_left() -> None:
    loop, ran = Loop(), []
    lane = loop.lane(1.0)
    for i in range(5):
        loop.after_lane(lane, ran.append, i)
        loop.at(0.5 + i, ran.append, 10 + i)
    loop.run(until=2.0)
    assert ran == [10, 0, 1, 2, 3, 4, 11]
    assert loop.stopped == "virtual time passed the limit of 2 s"
    assert loop.pending() == 3


def test_a_lane_needs_a_delay_that_is_not_negative() -> None:
    with pytest.raises(ValueError, match="must be 0 or more"):
        Loop().lane(-0.001)
