"""tracker.snapshot: a registry survives the round trip, and no mangled snapshot gets in.

Every value of a real snapshot is replaced in turn by values of other types
(what a writer to Redis with the cluster secret could put there): `load`
either refuses it with a SnapshotError, or gives a registry that ops still
apply to without an error. No Redis needed: this is the check itself.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import msgpack
import pytest

from p2p.content import ContentId, PeerId
from tracker import snapshot
from tracker.handout import rack_aware
from tracker.index import Candidates
from tracker.machine import Announce, ContentAnnounce, Machine, Report, Tick
from tracker.registry import IdentityError, Member, Registry

C, D = ContentId("c1-" + "a" * 64), ContentId("c1-" + "b" * 64)


def busy_registry() -> Registry:
    """Members in two contents and racks, fetchers, a demotion, reports, a ban and
    departures."""
    reg = Registry(ban_seconds=100.0, origin_fetchers=2, fetcher_stall_seconds=5.0,
                   fetcher_start_seconds=3.0)
    for i in range(12):
        host = f"10.0.0.{i}"
        for content in (C, D)[: 1 + i % 2]:
            reg.announce(content, Member(PeerId(f"p{i}"), f"{host}:1", f"r{i % 3}", i % 4,
                                         i % 5 == 0, float(i), host), float(i))
    reg.leave(C, PeerId("p4"), "10.0.0.4")  # a swap-remove: bag order is not join order
    reg.fetcher_unreachable(C, reg.fetchers(C)[0])
    reg.report(PeerId("p9"), PeerId("p1"), "bad chunk", 12.0, reporter_host="10.0.0.1")
    for r in (1, 2, 3):
        reg.report(PeerId("p7"), PeerId(f"p{r}"), "bad chunk", 13.0, reporter_host=f"10.0.0.{r}")
    reg.leave(D, PeerId("p3"), "10.0.0.3", 13.5)  # incomplete: a departure
    reg.expire(13.5, 12.0)  # p0 and p1 (last seen at 0 and 1) went silent
    return reg


def view(reg: Registry) -> Any:
    """Everything a reply or a later op can depend on, in order."""
    return (
        [(c, [vars_of(m) for m in reg.members(c)], reg.fetchers(c), reg.origin_bytes(c),
          [m.peer for m in Candidates(reg._swarms[c].index)],
          list(reg._swarms[c].index.everyone.items),
          [(n, list(g.complete.items), list(g.incomplete.items))
           for n in reg._swarms[c].index.rack_names if (g := reg._swarms[c].index.rack(n))],
          dict(reg._swarms[c].progress), dict(reg._swarms[c].unproven),
          dict(reg._swarms[c].demoted))
         for c in reg.contents()],
        list(reg._by_age.items()), reg._bound, reg._contents_of,
        {n: dict(r) for n, r in reg._reports.items()}, reg._banned_until,
        list(reg._recent), list(reg._runs_out), reg.fetchers_reassigned, reg.departures())


def vars_of(m: Member) -> tuple[Any, ...]:
    return (m.peer, m.addr, m.rack, m.have, m.complete, m.last_seen, m.host, m.origin_bytes)


def test_a_registry_comes_back_as_it_was_bag_order_included() -> None:
    reg = busy_registry()
    assert [(d.content, d.peer, d.went_silent) for d in reg.departures()] == [
        (D, PeerId("p3"), False), (C, PeerId("p1"), True), (D, PeerId("p1"), True)]  # (p0 was
    #                                                      complete: not a departure)
    back = snapshot.load(snapshot.dump(reg), reg)
    assert view(back) == view(reg) and reg.banned(14.0) == back.banned(14.0) == ["10.0.0.7"]
    rng_a, rng_b = random.Random(3), random.Random(3)  # the same handouts, draw for draw
    assert [m.peer for m in rack_aware(PeerId("x"), "r1", back.candidates(C, 14.0), 4, rng_a)] \
        == [m.peer for m in rack_aware(PeerId("x"), "r1", reg.candidates(C, 14.0), 4, rng_b)]


def paths(value: Any, at: tuple[int, ...] = ()) -> Iterator[tuple[int, ...]]:
    yield at
    if isinstance(value, list):
        for i, item in enumerate(value):
            yield from paths(item, (*at, i))


def replaced(value: Any, at: tuple[int, ...], new: Any) -> Any:
    if not at:
        return new
    return [replaced(v, at[1:], new) if i == at[0] else v for i, v in enumerate(value)]


STRANGERS = [None, True, -1, 1.5, "x", "", [], [[]], {"k": 1}, b"\x00", 2**63]


def test_no_mangled_snapshot_gets_in_or_breaks_a_later_op() -> None:
    reg = busy_registry()
    plain = msgpack.unpackb(snapshot.dump(reg))
    tried = refused = 0
    for at in paths(plain):
        for stranger in STRANGERS:
            raw = msgpack.packb(replaced(plain, at, stranger))
            tried += 1
            try:
                back = snapshot.load(raw, reg)
            except snapshot.SnapshotError:
                refused += 1
                continue
            ops_still_apply(back)
    assert tried > 1000 and refused > tried * 0.8, (tried, refused)


def ops_still_apply(reg: Registry) -> None:
    m = Machine(reg, rack_aware, 10.0)
    items = (ContentAnnounce(C, 3, False, 5, None), ContentAnnounce(D, 0, False, 5, None))
    for i in range(12):
        with_rng = random.Random(i)
        try:
            m.apply(Announce(PeerId(f"p{i}"), f"10.0.0.{i}", f"10.0.0.{i}:1", "r0", items),
                    20.0 + i, with_rng)
            m.apply(Report(PeerId(f"p{i}"), PeerId("p7"), C, "bad", f"10.0.0.{i}", None),
                    20.0 + i, None)
        except IdentityError:
            pass
    m.apply(Tick(), 200.0, None)


@pytest.mark.parametrize("raw", [b"", b"\xc1", msgpack.packb({"a": 1}), msgpack.packb([1] * 8),
                                 msgpack.packb([2, 0, [], [], [], [], [], []]),
                                 msgpack.packb([1, 0, [], [], [], [], [], []])])
def test_what_is_not_a_snapshot_is_refused(raw: bytes) -> None:
    with pytest.raises(snapshot.SnapshotError):
        snapshot.load(raw, Registry())
