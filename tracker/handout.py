"""Peer handout policies: which members of a swarm the tracker hands a peer.

Theory of operation. A handout answers one announce: given the requester, its
rack, the swarm's members (already stripped of banned peers, in a
deterministic order) and a `limit`, return at most `limit` members, never the
requester itself. Policies are pure functions registered by name in
`HANDOUT_POLICIES`, so the tracker and the simulator pick one by name and a
simulation sweep is a loop over names.

`rack_aware` is the default. Traffic inside a rack crosses one top-of-rack
switch; traffic between racks crosses the oversubscribed spine. So:

1. Same rack first. Up to about two thirds of `limit` (`SAME_RACK_SHARE`) come
   from the requester's rack, best sources first: complete members, then the
   ones holding more chunks, ties broken by the rng so that equal members
   share the load.
2. Then a few from every other rack. The remaining budget is spread evenly,
   `per_rack = max(1, budget // other_racks)` members per rack, best first.
   When there are more racks than budget, the walk over racks (sorted by
   name) starts at an rng-chosen rack, so different requesters - and so the
   peers of one rack taken together - reach different racks, and every rack
   is linked to the others early. That is what lets a chunk that appeared in
   one rack reach every rack after one cross-rack hop, instead of each rack
   fetching it from the origin.
3. Fill the rest: same-rack members left over from step 1 (locality still
   wins), then other racks' leftovers drawn at random.

The result lists same-rack members first, which an agent may read as a
preference order.

`random` is the baseline the simulator compares against: a uniform sample.

Cost: one pass over the members to group them by rack, then work
proportional to the members of the racks actually visited; O(members) per
call, whatever the number of racks. Only the given `random.Random` is used,
so a seed reproduces a handout exactly. No I/O, no clock.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable, Sequence

from p2p.content import PeerId
from tracker.registry import Member

HandoutPolicy = Callable[[PeerId, str, Sequence[Member], int, random.Random], list[Member]]

SAME_RACK_SHARE = 2 / 3


def _best(group: Sequence[Member], n: int, rng: random.Random) -> list[Member]:
    """The `n` best sources in `group`: complete first, then most chunks, rng ties."""
    if n <= 0:
        return []
    return heapq.nlargest(n, group, key=lambda m: (m.complete, m.have, rng.random()))


def rack_aware(requester: PeerId, rack: str, members: Sequence[Member], limit: int,
               rng: random.Random) -> list[Member]:
    """Same rack first, then every other rack represented; see the module docstring."""
    if limit <= 0:
        return []
    same: list[Member] = []
    others: dict[str, list[Member]] = {}
    for m in members:
        if m.peer == requester:
            continue
        if m.rack == rack:
            same.append(m)
        elif (group := others.get(m.rack)) is not None:
            group.append(m)
        else:
            others[m.rack] = [m]

    same_quota = max(1, round(limit * SAME_RACK_SHARE)) if others else limit
    ranked_same = _best(same, limit, rng)
    chosen = ranked_same[:same_quota]
    budget = limit - len(chosen)
    if budget > 0 and others:
        chosen += _spread(others, budget, rng)
        budget = limit - len(chosen)
    if budget > 0:
        chosen += ranked_same[same_quota:same_quota + budget]
        budget = limit - len(chosen)
    if budget > 0 and others:
        taken = {m.peer for m in chosen}
        leftovers = [m for group in others.values() for m in group if m.peer not in taken]
        chosen += rng.sample(leftovers, min(budget, len(leftovers)))
    return chosen


def _spread(others: dict[str, list[Member]], budget: int, rng: random.Random) -> list[Member]:
    """Up to `budget` members, `per_rack` from each other rack, from an rng-chosen rack on."""
    racks = sorted(others)
    per_rack = max(1, budget // len(racks))
    start = rng.randrange(len(racks))
    picked: list[Member] = []
    for i in range(len(racks)):
        if len(picked) >= budget:
            break
        group = others[racks[(start + i) % len(racks)]]
        picked += _best(group, min(per_rack, budget - len(picked)), rng)
    return picked


def uniform(requester: PeerId, rack: str, members: Sequence[Member], limit: int,
            rng: random.Random) -> list[Member]:
    """A uniform random sample of the members other than the requester."""
    if limit <= 0:
        return []
    pool = [m for m in members if m.peer != requester]
    return rng.sample(pool, min(limit, len(pool)))


HANDOUT_POLICIES: dict[str, HandoutPolicy] = {
    "rack_aware": rack_aware,
    "random": uniform,
}


def get_policy(name: str) -> HandoutPolicy:
    """The policy registered as `name`; ValueError naming the known ones otherwise."""
    try:
        return HANDOUT_POLICIES[name]
    except KeyError:
        known = ", ".join(sorted(HANDOUT_POLICIES))
        raise ValueError(f"unknown handout policy {name!r} (known: {known})") from None
