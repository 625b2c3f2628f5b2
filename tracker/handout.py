"""Peer handout policies: which members of a swarm the tracker hands a peer.

Theory of operation. A handout answers one announce: given the requester, its
rack, the swarm's candidates (the members minus banned peers, indexed; see
tracker.index) and a `limit`, return at most `limit` members, never the
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

Cost: the policies draw from `tracker.index.Candidates`, the swarm indexed
by rack and completeness, so a handout costs O(limit) draws plus the racks it
visits (at most `limit`), whatever the swarm size; a rack's best sources are
ranked among a bounded random sample (exact for racks of up to
`4 n` incomplete members; see tracker.index). Only the given
`random.Random` is used, so a seed reproduces a handout exactly. No I/O, no
clock.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Final

from p2p.content import PeerId
from p2p.draws import below
from tracker.index import Candidates
from tracker.registry import Member

HandoutPolicy = Callable[[PeerId, str, Candidates, int, random.Random], list[Member]]

SAME_RACK_SHARE: Final = 2 / 3


def rack_aware(requester: PeerId, rack: str, members: Candidates, limit: int,
               rng: random.Random) -> list[Member]:
    """Same rack first, then every other rack represented; see the module docstring."""
    if limit <= 0:
        return []
    racks = members.racks()
    others = len(racks) - (1 if members.index.rack(rack) is not None else 0)
    same_quota = max(1, round(limit * SAME_RACK_SHARE)) if others else limit
    ranked_same = members.best(rack, limit, rng, skip=(requester,))
    chosen = ranked_same[:same_quota]
    budget = limit - len(chosen)
    if budget > 0 and others:
        chosen += _spread(members, rack, racks, others, budget, rng)
        budget = limit - len(chosen)
    if budget > 0:
        chosen += ranked_same[same_quota:same_quota + budget]
        budget = limit - len(chosen)
    if budget > 0 and others:
        taken = {m.peer for m in chosen}
        taken.add(requester)
        chosen += members.others(budget, rack, rng, taken)
    return chosen


def _spread(members: Candidates, rack: str, racks: list[str], others: int, budget: int,
            rng: random.Random) -> list[Member]:
    """Up to `budget` members, `per_rack` from each other rack, from an rng-chosen rack on."""
    per_rack = max(1, budget // others)
    start = below(rng, len(racks))
    picked: list[Member] = []
    for i in range(len(racks)):
        if len(picked) >= budget:
            break
        name = racks[(start + i) % len(racks)]
        if name != rack:
            picked += members.best(name, min(per_rack, budget - len(picked)), rng)
    return picked


def uniform(requester: PeerId, rack: str, members: Candidates, limit: int,
            rng: random.Random) -> list[Member]:
    """A uniform random sample of the members other than the requester."""
    if limit <= 0:
        return []
    return members.sample(limit, rng, skip=(requester,))


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
