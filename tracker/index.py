"""The members of one content, indexed so that a handout never walks the swarm.

Theory of operation. A handout wants a few dozen peers out of a swarm that may
hold ten thousand; the tracker answers thousands of announces a second, so
the work per announce must not grow with the swarm. `SwarmIndex` keeps each
content's members three ways, all updated in O(1) per announce:

- by peer id (a dict), for refreshes and lookups;
- per rack, split into complete and incomplete members, each an indexable
  bag (`_Bag`: a list plus positions, removal swaps in the last item), so a
  rack's members can be sampled without a scan;
- all of them in one more bag, for uniform draws;
- the sorted list of racks with members (changes only when a rack appears or
  empties), so a walk over racks can start anywhere.

`Candidates` is what a handout policy (tracker.handout) sees: the index and
a ban predicate. Its `best(rack, n)` returns a rack's best `n` sources:
complete members first (equal sources), then incomplete ones by chunks
held, ranked among at most `4 n` of them. Both groups are read as a
*window*: a run of the bag from an rng-chosen start, wrapping around. One
draw per group instead of one per member matters here (Python's rng costs
about as much as the rest of the handout), and it still spreads equal
members' load: requesters get different starts, and ties go to the earlier
member of the window. A rack no larger than the window is ranked exactly.
`others(n, rack, skip)` takes `n` members of other racks, windows rack by
rack from a random rack on; `sample` is a uniform draw (the `random`
policy). All cost O(n + skipped), not O(members); banned members are
skipped as they are met, so a ban costs only the draws it wastes.

Order is deterministic: bags keep insertion order (swap-remove changes it
the same way every run), racks are sorted, and all randomness comes from the
`random.Random` the caller passes; nothing iterates a set. No I/O, no clock.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable, Collection, Iterable, Iterator
from typing import TYPE_CHECKING, Final

from p2p.content import PeerId
from p2p.draws import below

if TYPE_CHECKING:
    from tracker.registry import Member

RANK_SAMPLE_PER_PEER: Final = 4  # incomplete members ranked per `best` call, per peer asked for


class _Bag:
    """Peer ids with O(1) add, remove and random access; see the module docstring."""

    __slots__ = ("items", "pos")

    def __init__(self) -> None:
        self.items: list[PeerId] = []
        self.pos: dict[PeerId, int] = {}

    def __len__(self) -> int:
        return len(self.items)

    def add(self, peer: PeerId) -> None:
        self.pos[peer] = len(self.items)
        self.items.append(peer)

    def remove(self, peer: PeerId) -> None:
        i = self.pos.pop(peer)
        last = self.items.pop()
        if last != peer:
            self.items[i] = last
            self.pos[last] = i

    def draw(self, k: int, rng: random.Random) -> list[PeerId]:
        """Up to `k` distinct items, a uniform sample in random order."""
        return rng.sample(self.items, min(k, len(self.items)))

    def window(self, k: int, rng: random.Random) -> list[PeerId]:
        """Up to `k` consecutive items (wrapping) from a random start: one rng draw."""
        items = self.items
        if k >= len(items):
            start = below(rng, len(items)) if items else 0
            return items[start:] + items[:start]
        start = below(rng, len(items))
        end = start + k
        return items[start:end] if end <= len(items) else items[start:] + items[:end - len(items)]


class _Rack:
    __slots__ = ("complete", "incomplete")

    def __init__(self) -> None:
        self.complete = _Bag()
        self.incomplete = _Bag()

    def bag(self, complete: bool) -> _Bag:
        return self.complete if complete else self.incomplete

    def __len__(self) -> int:
        return len(self.complete) + len(self.incomplete)


class SwarmIndex:
    """One content's members by peer, by rack and completeness. See the module docstring."""

    __slots__ = ("_racks", "by_peer", "complete_count", "everyone", "rack_names")

    def __init__(self) -> None:
        self.complete_count = 0
        self.by_peer: dict[PeerId, Member] = {}
        self.everyone = _Bag()
        self._racks: dict[str, _Rack] = {}
        self.rack_names: list[str] = []  # sorted; only racks with members

    def __len__(self) -> int:
        return len(self.by_peer)

    def put(self, member: Member) -> bool:
        """Insert or refresh `member`; True if its peer is new here."""
        old = self.by_peer.get(member.peer)
        self.by_peer[member.peer] = member
        if old is not None and old.rack == member.rack and old.complete == member.complete:
            return False
        if old is not None:
            self._unfile(old)
        else:
            self.everyone.add(member.peer)
        rack = self._racks.get(member.rack)
        if rack is None:
            rack = self._racks[member.rack] = _Rack()
            self.rack_names.insert(_bisect(self.rack_names, member.rack), member.rack)
        rack.bag(member.complete).add(member.peer)
        self.complete_count += member.complete
        return old is None

    def remove(self, peer: PeerId) -> Member | None:
        member = self.by_peer.pop(peer, None)
        if member is not None:
            self._unfile(member)
            self.everyone.remove(peer)
        return member

    def _unfile(self, member: Member) -> None:
        rack = self._racks[member.rack]
        rack.bag(member.complete).remove(member.peer)
        self.complete_count -= member.complete
        if not rack:
            del self._racks[member.rack]
            del self.rack_names[_bisect(self.rack_names, member.rack)]

    def rack(self, name: str) -> _Rack | None:
        return self._racks.get(name)

    @classmethod
    def of(cls, members: Iterable[Member]) -> SwarmIndex:
        """An index holding `members` (for tests and one-off callers)."""
        index = cls()
        for m in members:
            index.put(m)
        return index


def _bisect(names: list[str], name: str) -> int:
    lo, hi = 0, len(names)
    while lo < hi:
        mid = (lo + hi) // 2
        if names[mid] < name:
            lo = mid + 1
        else:
            hi = mid
    return lo


def _never(member: Member) -> bool:
    return False


def _have(member: Member) -> int:
    return member.have


class Candidates:
    """The members a handout may draw from: an index minus banned members."""

    __slots__ = ("_banned", "index")

    def __init__(self, index: SwarmIndex,
                 banned: Callable[[Member], bool] | None = None) -> None:
        self.index = index
        self._banned = banned or _never

    def __iter__(self) -> Iterator[Member]:
        """Every candidate, sorted by peer id: O(members log members), for tests and pages."""
        by_peer = self.index.by_peer
        return (m for p in sorted(by_peer) if not self._banned(m := by_peer[p]))

    def __len__(self) -> int:
        return len(self.index)

    def racks(self) -> list[str]:
        """Racks with members, sorted (do not modify)."""
        return self.index.rack_names

    def best(self, rack: str, n: int, rng: random.Random,
             skip: Collection[PeerId] = ()) -> list[Member]:
        """Up to `n` of `rack`'s best sources, best first; see the module docstring."""
        group = self.index.rack(rack)
        if group is None or n <= 0:
            return []
        if n == 1 and not skip and self._banned is _never:
            return [self._one(group, rng)]  # a handout's spread asks this of many racks
        chosen = self._take(group.complete, n, len(skip), rng, skip, window=True)
        if len(chosen) < n:
            sample = RANK_SAMPLE_PER_PEER * n
            pool = self._take(group.incomplete, sample, len(skip), rng, skip, window=True)
            need = n - len(chosen)
            if need == 1 and pool:
                chosen.append(max(pool, key=_have))
            else:
                chosen += heapq.nlargest(need, pool, key=_have)
        return chosen

    def _one(self, group: _Rack, rng: random.Random) -> Member:
        """`best(rack, 1)` without bans or skips, in fewer steps: same answer."""
        by_peer = self.index.by_peer
        if group.complete.items:
            return by_peer[group.complete.window(1, rng)[0]]
        window = group.incomplete.window(RANK_SAMPLE_PER_PEER, rng)
        return max(map(by_peer.__getitem__, window), key=_have)

    def others(self, n: int, rack: str, rng: random.Random,
               skip: Collection[PeerId]) -> list[Member]:
        """Up to `n` random members outside `rack` and `skip`, rack by rack."""
        names = self.index.rack_names
        if n <= 0 or not names:
            return []
        picked: list[Member] = []
        start = below(rng, len(names))
        for i in range(len(names)):
            name = names[(start + i) % len(names)]
            group = self.index.rack(name)
            if name == rack or group is None:
                continue
            for bag in (group.complete, group.incomplete):
                need = n - len(picked)
                if need > 0:
                    picked += self._take(bag, need, len(skip), rng, skip, window=True)
            if len(picked) >= n:
                break
        return picked

    def sample(self, n: int, rng: random.Random, skip: Collection[PeerId]) -> list[Member]:
        """Up to `n` members drawn uniformly, none in `skip`."""
        return self._take(self.index.everyone, n, len(skip), rng, skip)

    def _take(self, bag: _Bag, k: int, extra: int, rng: random.Random,
              skip: Collection[PeerId], window: bool = False) -> list[Member]:
        """Up to `k` members of `bag`, skipping `skip` and banned ones: a uniform sample,
        or (`window`) a run of the bag from a random start, which costs one draw."""
        by_peer, banned = self.index.by_peer, self._banned
        drawn = bag.window(k + extra, rng) if window else bag.draw(k + extra, rng)
        if banned is _never:  # the usual case: no ban anywhere
            return [by_peer[p] for p in drawn if p not in skip][:k]
        out = [m for p in drawn if p not in skip and not banned(m := by_peer[p])]
        if len(out) < k and len(drawn) < len(bag):  # bans ate the slack: widen, rarely
            drawn = bag.draw(len(bag), rng)
            out = [m for p in drawn if p not in skip and not banned(m := by_peer[p])]
        return out[:k]
