"""The registry of swarm members: who holds which content, and who misbehaves.

Theory of operation. For every content the registry keeps the members that
announced it, keyed by peer id. An announce inserts or refreshes a member and
stamps it with the caller's `now`; a member that stops announcing is dropped
by `expire(now, ttl)` once `ttl` seconds have passed since its last announce;
a member that says it is stopping is dropped at once by `leave`.

The registry also appoints each content's *origin fetchers*: the first
`origin_fetchers` (`k`) incomplete members to announce get slots 0..k-1, and
fetcher `i` owns the chunks `c % k == i` that no peer holds yet (see
p2p.swarm); while fewer than `k` are appointed, fetcher 0 also covers the
vacant slots. `k` never changes, so fetchers appointed at the same moment
never claim the same chunk. So each byte leaves the origin about once,
whatever the swarm size. Slots stay dense: when a fetcher leaves or expires,
the last fetcher takes its slot and the next incomplete member to announce
is appointed. Everyone learns the new slots at their next announce.

Peers report peers that sent them bad chunks. One report proves little (the
reporter may be the broken one), so a peer is banned only when at least
`reporters_to_ban` distinct reporters reported it within `ban_seconds`; the
ban then lasts `ban_seconds`. A banned peer stays a member (it may still
download, and it keeps announcing) but is left out of `candidates`, the list
that peer handouts are drawn from.

Time enters only as the `now` argument, in seconds on the caller's clock; the
caller must pass a non-decreasing `now`. Nothing here reads a clock, touches a
socket or a file, or draws random numbers, so the tracker and the simulator
drive it unchanged. Every list it returns is in a deterministic order (peers
sorted by id, contents sorted by id): policies that consume those lists are
then reproducible for a given random seed.

Cost: announce, leave and report are O(log n) plus a list insert; `members`
and `candidates` are O(members of that content); `expire` is O(expired),
because refreshed members move to the back of one queue ordered by last
announce.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict
from dataclasses import dataclass, replace

from p2p.content import ContentId, PeerId

BAN_SECONDS = 600.0
REPORTERS_TO_BAN = 2
ORIGIN_FETCHERS = 4


@dataclass(frozen=True, slots=True)
class Member:
    """One peer's latest announce for one content."""

    peer: PeerId
    addr: str  # "host:port" where the peer serves chunks
    rack: str
    have: int  # chunks held
    complete: bool
    last_seen: float  # `now` of the latest announce, seconds on the caller's clock


@dataclass(frozen=True, slots=True)
class Report:
    """One peer's complaint about another."""

    reporter: PeerId
    reason: str
    at: float


@dataclass(frozen=True, slots=True)
class OriginSlot:
    """A member's share of the origin fetching: slot `slot` of `slots` (None: none).

    `slots` is the configured fetcher count, fixed for the swarm's life, so a
    chunk's owner does not change as fetchers are appointed; `filled` says how
    many slots have a fetcher now (fetcher 0 covers the vacant ones).
    """

    slot: int | None
    slots: int
    filled: int


class _Swarm:
    """The members of one content, with their ids kept sorted, and its origin fetchers."""

    __slots__ = ("by_peer", "fetchers", "order")

    def __init__(self) -> None:
        self.by_peer: dict[PeerId, Member] = {}
        self.order: list[PeerId] = []
        self.fetchers: list[PeerId] = []  # index = origin slot

    def put(self, member: Member, max_fetchers: int) -> bool:
        """Insert or refresh; True if the peer is new to this content."""
        new = member.peer not in self.by_peer
        self.by_peer[member.peer] = member
        if new:
            bisect.insort(self.order, member.peer)
        if (len(self.fetchers) < max_fetchers and not member.complete
                and member.peer not in self.fetchers):
            self.fetchers.append(member.peer)
        return new

    def remove(self, peer: PeerId) -> bool:
        if self.by_peer.pop(peer, None) is None:
            return False
        del self.order[bisect.bisect_left(self.order, peer)]
        if peer in self.fetchers:
            i = self.fetchers.index(peer)
            self.fetchers[i] = self.fetchers[-1]  # the last fetcher takes the free slot
            self.fetchers.pop()
        return True


class Registry:
    """All contents' members, bad-peer reports and bans. See the module docstring."""

    def __init__(self, ban_seconds: float = BAN_SECONDS,
                 reporters_to_ban: int = REPORTERS_TO_BAN,
                 origin_fetchers: int = ORIGIN_FETCHERS) -> None:
        if ban_seconds <= 0 or reporters_to_ban < 1 or origin_fetchers < 1:
            raise ValueError(
                "ban_seconds must be > 0, reporters_to_ban and origin_fetchers >= 1")
        self.ban_seconds = ban_seconds
        self.reporters_to_ban = reporters_to_ban
        self.origin_fetchers = origin_fetchers
        self._swarms: dict[ContentId, _Swarm] = {}
        # (content, peer) in order of last announce: the front is the stalest.
        self._by_age: OrderedDict[tuple[ContentId, PeerId], float] = OrderedDict()
        self._contents_of: dict[PeerId, int] = {}  # peer -> number of contents it is in
        self._reports: dict[PeerId, dict[PeerId, Report]] = {}
        self._banned_until: dict[PeerId, float] = {}

    # -- membership ---------------------------------------------------------------

    def announce(self, content: ContentId, member: Member, now: float) -> bool:
        """Insert or refresh `member` of `content`, seen at `now`; True if it is new."""
        swarm = self._swarms.get(content)
        if swarm is None:
            swarm = self._swarms[content] = _Swarm()
        new = swarm.put(replace(member, last_seen=now), self.origin_fetchers)
        key = (content, member.peer)
        self._by_age[key] = now
        self._by_age.move_to_end(key)
        if new:
            self._contents_of[member.peer] = self._contents_of.get(member.peer, 0) + 1
        return new

    def leave(self, content: ContentId, peer: PeerId) -> bool:
        """Drop `peer` from `content`; True if it was a member."""
        swarm = self._swarms.get(content)
        if swarm is None or not swarm.remove(peer):
            return False
        del self._by_age[(content, peer)]
        if not swarm.by_peer:
            del self._swarms[content]
        left = self._contents_of[peer] - 1
        if left:
            self._contents_of[peer] = left
        else:
            del self._contents_of[peer]
        return True

    def expire(self, now: float, ttl: float) -> list[tuple[ContentId, PeerId]]:
        """Drop members silent for more than `ttl` seconds; return them, stalest first.

        Also forgets reports and bans that have run out, so memory stays bounded
        by the peers actually present and misbehaving.
        """
        gone: list[tuple[ContentId, PeerId]] = []
        while self._by_age:
            key, seen = next(iter(self._by_age.items()))
            if now - seen <= ttl:
                break
            self.leave(*key)
            gone.append(key)
        self._forget_old_reports(now)
        return gone

    def members(self, content: ContentId) -> list[Member]:
        """The members of `content`, sorted by peer id."""
        swarm = self._swarms.get(content)
        if swarm is None:
            return []
        by_peer = swarm.by_peer
        return [by_peer[p] for p in swarm.order]

    def candidates(self, content: ContentId, now: float) -> list[Member]:
        """The members that may be handed out at `now` (not banned), sorted by peer id."""
        members = self.members(content)
        if not self._banned_until:
            return members
        return [m for m in members if not self.is_banned(m.peer, now)]

    def origin_slot(self, content: ContentId, peer: PeerId) -> OriginSlot:
        """`peer`'s origin slot in `content`; slots >= 1 even when no one is appointed."""
        swarm = self._swarms.get(content)
        if swarm is None:
            return OriginSlot(None, self.origin_fetchers, 0)
        filled = len(swarm.fetchers)
        if peer in swarm.fetchers:
            return OriginSlot(swarm.fetchers.index(peer), self.origin_fetchers, filled)
        return OriginSlot(None, self.origin_fetchers, filled)

    def member(self, content: ContentId, peer: PeerId) -> Member | None:
        swarm = self._swarms.get(content)
        return None if swarm is None else swarm.by_peer.get(peer)

    # -- counts, for metrics ------------------------------------------------------

    def contents(self) -> list[ContentId]:
        """Contents with at least one member, sorted."""
        return sorted(self._swarms)

    def content_count(self) -> int:
        return len(self._swarms)

    def peer_count(self) -> int:
        """Distinct peers that are a member of at least one content."""
        return len(self._contents_of)

    def member_count(self) -> int:
        """(content, peer) pairs: a peer in three contents counts three times."""
        return len(self._by_age)

    # -- reports and bans ---------------------------------------------------------

    def report(self, peer: PeerId, reporter: PeerId, reason: str, now: float) -> bool:
        """Record that `reporter` saw `peer` misbehave; True if this report banned it.

        A peer's reports about itself are ignored; a reporter's repeated reports
        about the same peer count once (the latest reason is kept).
        """
        if peer == reporter:
            return False
        reports = self._reports.setdefault(peer, {})
        reports[reporter] = Report(reporter, reason, now)
        fresh = sum(1 for r in reports.values() if now - r.at <= self.ban_seconds)
        if fresh < self.reporters_to_ban or self.is_banned(peer, now):
            return False
        self._banned_until[peer] = now + self.ban_seconds
        del self._reports[peer]  # the ban used them up; a new ban needs new reports
        return True

    def is_banned(self, peer: PeerId, now: float) -> bool:
        until = self._banned_until.get(peer)
        return until is not None and now < until

    def banned(self, now: float) -> list[PeerId]:
        """Peers banned at `now`, sorted."""
        return sorted(p for p, until in self._banned_until.items() if now < until)

    def reports(self, peer: PeerId) -> list[Report]:
        """Pending (not yet acted on) reports about `peer`, sorted by reporter."""
        return sorted(self._reports.get(peer, {}).values(), key=lambda r: r.reporter)

    def _forget_old_reports(self, now: float) -> None:
        for peer in [p for p, until in self._banned_until.items() if now >= until]:
            del self._banned_until[peer]
        for peer in list(self._reports):
            reports = self._reports[peer]
            for reporter in [r for r, rep in reports.items() if now - rep.at > self.ban_seconds]:
                del reports[reporter]
            if not reports:
                del self._reports[peer]
