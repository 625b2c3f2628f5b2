"""The simulated tracker: the real registry and handout policy, called in virtual time.

Theory of operation
-------------------
An announce here is what `tracker.app` does for one HTTP announce, minus
HTTP: refresh the member in `tracker.registry.Registry`, draw a handout from
the named policy in `tracker.handout.HANDOUT_POLICIES` over the registry's
candidates, and read the member's origin slot from the registry (the first
`origin_fetchers` incomplete members to announce fetch from the origin). The
answer becomes the swarm's `PeersFound` event. Nothing of the policy is
copied here: a test checks that this module imports it.

Dead members are not removed at once: the real tracker forgets a peer only
when its announces stop for `peer_ttl_s`, and until then it keeps handing
it out. `fail` schedules exactly that removal.

`want=0` (an agent with enough peers asks for none) skips the handout, as
the real tracker does.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from p2p.content import ContentId, PeerId
from p2p.swarm.events import PeerHint, PeersFound
from tracker.handout import get_policy
from tracker.registry import Member, Registry


@dataclass(frozen=True, slots=True)
class TrackerSpec:
    handout_limit: int = 30
    announce_interval_s: float = 2.0
    peer_ttl_s: float = 10.0
    origin_fetchers: int = 4


class SimTracker:
    """One logical tracker (replicas share state, so one object stands for all)."""

    def __init__(self, spec: TrackerSpec, policy: str, rng: random.Random) -> None:
        self.spec = spec
        self.policy = get_policy(policy)
        self.registry = Registry(origin_fetchers=spec.origin_fetchers)
        self.rng = rng
        self.announces = 0
        self.handouts = 0

    def announce(self, content: ContentId, peer: PeerId, rack: str, have: int, complete: bool,
                 now: float, want: int) -> PeersFound:
        self.announces += 1
        self.registry.announce(content, Member(peer, peer, rack, have, complete, now), now)
        limit = min(want, self.spec.handout_limit)
        hints: tuple[PeerHint, ...] = ()
        if limit > 0:
            self.handouts += 1
            handed = self.policy(peer, rack, self.registry.candidates(content, now), limit,
                                 self.rng)
            hints = tuple(PeerHint(m.peer, m.rack) for m in handed)
        slot = self.registry.origin_slot(content, peer)
        return PeersFound(hints, origin_slot=slot.slot, origin_slots=slot.slots,
                          origin_filled=slot.filled)

    def leave(self, content: ContentId, peer: PeerId) -> None:
        self.registry.leave(content, peer)

    def report(self, peer: PeerId, reporter: PeerId, reason: str, now: float) -> None:
        self.registry.report(peer, reporter, reason, now)
