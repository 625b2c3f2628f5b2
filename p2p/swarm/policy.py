"""Named policies: which chunk next, and which peer to ask for it.

A policy is a small pure object chosen by name from a registry, so a
simulation sweep is a loop over names rather than a fork of the code. Each
takes the seeded `random.Random` that its `Swarm` owns; none reads a clock.

Chunk pickers order *candidates* (chunks we lack, that some connected peer
holds, and that are not already requested); the swarm then walks that order
and gives each chunk to the first peer with a free request slot. Reader demand
and prefetch lists are placed before the picker's order by the swarm itself,
so a picker only decides the background order.

Peer choosers rank the holders of one chunk that still have a free slot.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Protocol

from p2p.content import PeerId
from p2p.draws import below


class ChunkPicker(Protocol):
    def order(self, candidates: list[int], availability: list[int], limit: int,
              rng: random.Random) -> Iterator[int]:
        """Up to `limit` candidates, best first (lists, not any sequence: compiled, a list
        is indexed natively). Every random draw is made in the call;
        the caller may leave the iterator unfinished (a request pass stops when its free
        peers are taken), so an order may be worked out as it is read."""
        ...

    def draw(self, count: int, limit: int, rng: random.Random) -> None:
        """Make the draws `order` makes for `count` candidates, without ordering them."""
        ...


class RarestFirst:
    """Chunks held by the fewest peers first; ties broken by the rng.

    Rare chunks are the ones a departing peer could take with it, and spreading
    them early gives every peer something the others want.
    """

    def order(self, candidates: list[int], availability: list[int], limit: int,
              rng: random.Random) -> Iterator[int]:
        # One draw per candidate, in order, up front (as a keyed sort calls its key); the
        # order is that of the keys (availability, draw, position), selected as it is
        # read: a request pass takes one or two chunks of a dozen or more candidates (most
        # passes follow a chunk's arrival, which frees one peer). No tuple is built or
        # compared: where the core is compiled, the selection compares machine numbers.
        if limit <= 0:
            return iter(())
        draw = rng.random  # (looked up once, not per candidate)
        draws = [draw() for _ in candidates]
        levels = [availability[c] for c in candidates]
        return _selected(candidates, levels, draws, min(limit, len(candidates)))

    def draw(self, count: int, limit: int, rng: random.Random) -> None:
        if limit > 0:
            draw = rng.random
            for _ in range(count):
                draw()


def _selected(candidates: list[int], levels: list[int], draws: list[float],
              limit: int) -> Iterator[int]:
    """`RarestFirst`'s order: the smallest key left, `limit` times. A taken candidate's
    level becomes -1 (levels are counts of holders, never negative)."""
    for _ in range(limit):
        best, best_level, best_draw = -1, 0, 0.0
        for i, level in enumerate(levels):
            if level < 0:
                continue
            if best < 0 or level < best_level or (level == best_level and draws[i] < best_draw):
                best, best_level, best_draw = i, level, draws[i]
        levels[best] = -1
        yield candidates[best]


class InOrder:
    """Lowest index first: for streaming readers and for the origin-only baseline."""

    def order(self, candidates: list[int], availability: list[int], limit: int,
              rng: random.Random) -> Iterator[int]:
        return iter(sorted(candidates)[:limit])

    def draw(self, count: int, limit: int, rng: random.Random) -> None:
        pass  # (no draws)


class RandomOrder:
    """Uniformly random order (the BitTorrent-like baseline without rarity)."""

    def order(self, candidates: list[int], availability: list[int], limit: int,
              rng: random.Random) -> Iterator[int]:
        return iter(rng.sample(list(candidates), min(limit, len(candidates))))

    def draw(self, count: int, limit: int, rng: random.Random) -> None:
        rng.sample(range(count), min(limit, count))  # (its draws depend on the sizes only)


CHUNK_PICKERS: dict[str, type[ChunkPicker]] = {
    "rarest_first": RarestFirst,
    "in_order": InOrder,
    "random": RandomOrder,
}


class PeerLoad:
    """What a peer chooser may know about one holder of a chunk (read-only).

    A plain slotted class, not a frozen dataclass like the other values: the swarm
    builds one per free holder for every request, and a frozen dataclass's
    `__init__` runs in Python (one `object.__setattr__` per field) even where the
    core is compiled, while this one compiles to a few stores.
    """

    __slots__ = ("failures", "inflight", "peer", "rate", "same_rack")

    def __init__(self, peer: PeerId, same_rack: bool, inflight: int, failures: int,
                 rate: float) -> None:
        self.peer = peer
        self.same_rack = same_rack
        self.inflight = inflight
        self.failures = failures
        self.rate = rate  # smoothed bytes per second seen from this peer, 0 if unknown

    def __repr__(self) -> str:
        return (f"PeerLoad({self.peer!r}, same_rack={self.same_rack}, inflight={self.inflight}, "
                f"failures={self.failures}, rate={self.rate})")


class PeerChooser(Protocol):
    def choose(self, holders: list[PeerLoad], rng: random.Random) -> PeerId:
        """One of the (non-empty) holders."""
        ...


class RackAware:
    """Same rack first, then fewest requests in flight, fewest failures, fastest."""

    def choose(self, holders: list[PeerLoad], rng: random.Random) -> PeerId:
        # `min` with a key, written out (one key and one draw per holder, in order; the
        # first of equal keys wins): the swarm asks this for every request, and a key
        # function is a call per holder even where the core is compiled.
        # The key (other rack, in flight, failures, -rate, draw) is compared field by
        # field, not as a tuple: no tuple is built, and where the core is compiled each
        # comparison is a machine one.
        best = holders[0]
        best_draw = rng.random()
        for i in range(1, len(holders)):
            h = holders[i]
            draw = rng.random()
            if _before(h, draw, best, best_draw):
                best, best_draw = h, draw
        return best.peer


def _before(a: PeerLoad, a_draw: float, b: PeerLoad, b_draw: float) -> bool:
    """Whether `a` ranks before `b` for `RackAware`: its key is smaller."""
    if a.same_rack != b.same_rack:
        return a.same_rack
    if a.inflight != b.inflight:
        return a.inflight < b.inflight
    if a.failures != b.failures:
        return a.failures < b.failures
    if a.rate != b.rate:
        return a.rate > b.rate
    return a_draw < b_draw


class LeastLoaded:
    """Fewest requests in flight, ignoring racks."""

    def choose(self, holders: list[PeerLoad], rng: random.Random) -> PeerId:
        return min(holders, key=lambda h: (h.inflight, h.failures, rng.random())).peer


class RandomPeer:
    """Any holder, uniformly (the BitTorrent-like baseline)."""

    def choose(self, holders: list[PeerLoad], rng: random.Random) -> PeerId:
        return holders[below(rng, len(holders))].peer


PEER_CHOOSERS: dict[str, type[PeerChooser]] = {
    "rack_aware": RackAware,
    "least_loaded": LeastLoaded,
    "random": RandomPeer,
}
