"""The simulated tracker: the real tracker's state machine, driven in virtual time.

Theory of operation
-------------------
An announce here is the op `tracker.app` makes of one HTTP announce, minus
HTTP, applied by the same `tracker.machine.Machine`: one op for all of a
node's contents, as the agent's batched announce is. it refreshes the member
in `tracker.registry.Registry`, draws a handout from the named policy in
`tracker.handout.HANDOUT_POLICIES` over the registry's candidates, and reads
the member's origin slot (the first `origin_fetchers` incomplete members to
announce fetch from the origin). The answer becomes the swarm's `PeersFound`
event. Nothing of the tracker is copied here: a test checks that this module
imports it. A simulated member has no host: its node is its peer id.

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
from tracker.machine import Announce, ContentAnnounce, Machine
from tracker.registry import ORIGIN_FETCHERS, Registry

ContentState = tuple[ContentId, int, bool, int]  # content, chunks held, complete, want


@dataclass(frozen=True, slots=True)
class TrackerSpec:
    handout_limit: int = 30
    announce_interval_s: float = 2.0
    peer_ttl_s: float = 10.0
    origin_fetchers: int = ORIGIN_FETCHERS  # the tracker's default


class SimTracker:
    """One logical tracker (replicas share state, so one object stands for all)."""

    def __init__(self, spec: TrackerSpec, policy: str, rng: random.Random) -> None:
        self.spec = spec
        self.registry = Registry(origin_fetchers=spec.origin_fetchers)
        self.machine = Machine(self.registry, get_policy(policy), spec.peer_ttl_s)
        self.rng = rng
        self.announces = 0
        self.handouts = 0
        # A hint is a frozen value, so one per member serves every answer that names it:
        # a handout names up to `handout_limit` peers, each a dataclass built in Python.
        self._hints: dict[str, PeerHint] = {}

    def announce(self, peer: PeerId, rack: str, items: list[ContentState],
                 now: float) -> list[PeersFound]:
        """One node's announce of `items`; the answer for each, in order."""
        checked = []
        for content, have, complete, want in items:
            limit = min(want, self.spec.handout_limit)
            self.handouts += limit > 0
            checked.append(ContentAnnounce(content, have, complete, limit, None))
        self.announces += len(items)
        reply = self.machine.apply(Announce(peer, "", peer, rack, tuple(checked)), now, self.rng)
        return [PeersFound(tuple(self._hint(p["peer"], p["rack"]) for p in got["peers"]),
                           origin_slot=got["origin_slot"], origin_slots=got["origin_slots"],
                           origin_filled=got["origin_filled"])
                for got in (reply[item.content] for item in checked)]

    def _hint(self, peer: str, rack: str) -> PeerHint:
        hint = self._hints.get(peer)
        if hint is None or hint.rack != rack:
            hint = self._hints[peer] = PeerHint(PeerId(peer), rack)
        return hint

    def leave(self, content: ContentId, peer: PeerId) -> None:
        self.registry.leave(content, peer)

    def report(self, peer: PeerId, reporter: PeerId, reason: str, now: float) -> None:
        self.registry.report(peer, reporter, reason, now)
