"""The registry of swarm members: who holds which content, and who misbehaves.

Theory of operation. For every content the registry keeps the members that
announced it, keyed by peer id. An announce inserts or refreshes a member and
stamps it with the caller's `now`; a member that stops announcing is dropped
by `expire(now, ttl)` once `ttl` seconds have passed since its last announce;
a member that says it is stopping is dropped at once by `leave`. A member
that leaves or goes silent before it held its content whole is kept among the
recent departures (`departures`), for the status page: a content every node
gives up on (its origin answers 404, say) would otherwise vanish from view.

Identity. A node is the address it is seen at (`Member.host`, the source IP of
its announces, passed in by the caller as data). The first announce of a peer
id binds the id to its host for as long as the id is a member of any content;
an announce, leave or report that uses a bound id from another host raises
`IdentityError`. Bans and reports are about hosts, not ids: a host that
reappears under a new peer id is still banned. A member without a host (the
simulator's) is its own node, named by its peer id, and binds nothing.

The registry also appoints each content's *origin fetchers*: the first
`origin_fetchers` (`k`) eligible incomplete members to announce get slots
0..k-1, and fetcher `i` owns the chunks `c % k == i` that no peer holds yet
(see p2p.swarm); while only `f` < `k` are appointed, fetcher `v % f` also
covers vacant slot `v`. `k` never changes, so fetchers appointed at the same moment
never claim the same chunk. So each byte leaves the origin about once,
whatever the swarm size. Slots stay dense: when a fetcher leaves or expires,
the last fetcher takes its slot and the next eligible member to announce is
appointed. A fetcher also loses its slot when its host is banned, when its
held count has not grown for `fetcher_stall_seconds` while it is incomplete,
when it has shown no progress at all `fetcher_start_seconds` after its
appointment (a fetcher that is fetching shows its first chunk at its next
announce: a squatter that holds a slot and fetches nothing is out after that
short window, not after the stall time), or when a member reports it
unreachable (`fetcher_unreachable`). Its node (host) is then not appointed
again in that content, under any peer id, until a member at that host holds
more than it did; and a node holds at most its share of the slots, `k` over
the number of distinct nodes with incomplete members (rounded up; complete
members never fetch), however many peer ids it announces: one slot each once
there are `k` nodes, all of them for agents that share one host alone (a test
cluster on loopback); slots a node took beyond its share before others joined
are freed while their fetchers have shown no progress. So ten squatting
addresses cost the honest nodes at most two short windows (eight squatters
out, then the two that took the freed slots first). Everyone learns the new
slots at their next announce.

Peers report peers that sent them bad chunks. One report proves little (the
reporter may be the broken one), so a host is banned only when enough
distinct reporter hosts reported it within `ban_seconds`: `reporters_to_ban`,
or in a larger swarm one per `MEMBERS_PER_REPORTER` members of the content
reported in, up to `MAX_REPORTERS_TO_BAN` (a bad peer is linked to a few dozen
peers, whatever the swarm size, so more could never be met). A report from
the offender's own host counts for nothing, and a report about a content
counts only as evidence from a reporter that could have received a chunk in
it: a member of that content that has announced chunks of it (`have` > 0, or
complete). Two addresses holding nothing can then ban no one. The tracker
does not see transfers, so this is the evidence it has: a reporter that
claims chunks it lacks can still report, which is why the count of
reporters grows with the swarm (docs/trust.md). A report that does not count
is kept among the recent reports, marked so. The ban then lasts
`ban_seconds`. A banned member stays a member (it may still download, and it
keeps announcing) but is left out of `candidates`, the list that peer
handouts are drawn from, and of the origin-fetcher slots.

Time enters only as the `now` argument, in seconds on the caller's clock; the
caller must pass a non-decreasing `now`. Nothing here reads a clock, touches a
socket or a file, or draws random numbers, so the tracker and the simulator
drive it unchanged. Every list it returns is in a deterministic order (peers
sorted by id, contents sorted by id): policies that consume those lists are
then reproducible for a given random seed.

Cost: announce and leave are O(1) plus O(k) fetcher upkeep (a new rack adds
a sorted insert into that content's racks); `candidates` is O(1), a view of
the content's index (tracker.index) that handouts sample from, so no call
here walks a swarm; `members` sorts, for tests and the status page; `expire`
is O(expired), because refreshed members move to the back of one queue
ordered by last announce.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass

from p2p.content import ContentId, PeerId
from tracker.index import Candidates, SwarmIndex

BAN_SECONDS = 600.0
REPORTERS_TO_BAN = 2
MEMBERS_PER_REPORTER = 16  # a swarm of 64 needs 4 reporters, of 128 or more 8
MAX_REPORTERS_TO_BAN = 8
# Eight, not four: each fetcher then uploads less of what it reads, and with relays
# (p2p.relay) the eight last chunks spread while they arrive. 8 agents x 256 MiB at
# 50 MB/s: 1.11-1.13x the lower bound with 8, 1.26x (simulated) with 4.
ORIGIN_FETCHERS = 8
RECENT_REPORTS = 20  # kept for the status page, newest last
RECENT_DEPARTURES = 20  # likewise


class IdentityError(Exception):
    """A peer id was used from a host other than the one it is bound to."""


@dataclass(frozen=True, slots=True, init=False)
class Member:
    """One peer's latest announce for one content."""

    peer: PeerId
    addr: str  # "host:port" where the peer serves chunks
    rack: str
    have: int  # chunks held
    complete: bool
    last_seen: float  # `now` of the latest announce, seconds on the caller's clock
    host: str = ""  # the address the announce came from; "" = unknown (the node is the id)
    origin_bytes: int = 0  # what this member says it fetched from the origin, so far

    def __init__(self, peer: PeerId, addr: str, rack: str, have: int, complete: bool,
                 last_seen: float, host: str = "", origin_bytes: int = 0) -> None:
        object.__setattr__(self, "peer", peer)
        object.__setattr__(self, "addr", addr)
        object.__setattr__(self, "rack", rack)
        object.__setattr__(self, "have", have)
        object.__setattr__(self, "complete", complete)
        object.__setattr__(self, "last_seen", last_seen)
        object.__setattr__(self, "host", host)
        object.__setattr__(self, "origin_bytes", origin_bytes)

    @property
    def node(self) -> str:
        """What bans and reports are about: the host, or the peer id without one."""
        return self.host or self.peer


@dataclass(frozen=True, slots=True)
class Report:
    """One node's complaint about another."""

    reporter: str  # the reporter's node (host, or peer id without one)
    reason: str
    at: float


@dataclass(frozen=True, slots=True)
class Departure:
    """A member that left its content before it held it whole."""

    content: ContentId
    peer: PeerId
    have: int  # chunks it held at the end
    went_silent: bool  # it expired, rather than said it stopped
    at: float


@dataclass(frozen=True, slots=True, init=False)
class OriginSlot:
    """A member's share of the origin fetching: slot `slot` of `slots` (None: none).

    `slots` is the configured fetcher count, fixed for the swarm's life, so a
    chunk's owner does not change as fetchers are appointed; `filled` says how
    many slots have a fetcher now (vacant slot `v` is covered by fetcher `v % filled`).
    """

    slot: int | None
    slots: int
    filled: int

    def __init__(self, slot: int | None, slots: int, filled: int) -> None:
        object.__setattr__(self, "slot", slot)
        object.__setattr__(self, "slots", slots)
        object.__setattr__(self, "filled", filled)


class _Swarm:
    """The members of one content (indexed: tracker.index), and its origin fetchers."""

    __slots__ = ("demoted", "fetchers", "index", "nodes", "origin_bytes", "progress",
                 "unproven")

    def __init__(self) -> None:
        self.index = SwarmIndex()
        self.origin_bytes = 0  # the members' origin fetches, summed as they grow
        self.fetchers: list[PeerId] = []  # index = origin slot
        self.progress: dict[PeerId, tuple[int, float]] = {}  # fetcher -> (have, since when)
        self.unproven: dict[PeerId, float] = {}  # fetcher without progress yet -> appointed at
        self.demoted: dict[str, int] = {}  # node that lost its slot -> held count at the time
        self.nodes: dict[str, int] = {}  # node -> its incomplete members (ids at that host)

    @property
    def by_peer(self) -> dict[PeerId, Member]:
        return self.index.by_peer

    def put(self, member: Member) -> bool:
        """Insert or refresh; True if the peer is new to this content."""
        old = self.index.by_peer.get(member.peer)
        if old is not None and not old.complete:
            self._count(old.node, -1)
        if not member.complete:
            self._count(member.node, 1)
        return self.index.put(member)

    def _count(self, node: str, delta: int) -> None:
        left = self.nodes.get(node, 0) + delta
        if left:
            self.nodes[node] = left
        else:
            del self.nodes[node]

    def remove(self, peer: PeerId) -> bool:
        member = self.index.remove(peer)
        if member is None:
            return False
        if not member.complete:
            self._count(member.node, -1)
        self.unappoint(peer)  # a demoted node stays demoted: it may come back as another id
        return True

    def unappoint(self, peer: PeerId) -> bool:
        if peer not in self.fetchers:
            return False
        i = self.fetchers.index(peer)
        self.fetchers[i] = self.fetchers[-1]  # the last fetcher takes the free slot
        self.fetchers.pop()
        del self.progress[peer]
        self.unproven.pop(peer, None)
        return True

    def demote(self, peer: PeerId) -> bool:
        """Take `peer`'s slot until its node holds more; True if it had one."""
        member = self.by_peer.get(peer)
        if member is None or not self.unappoint(peer):
            return False
        self.demoted[member.node] = max(member.have, self.demoted.get(member.node, 0))
        return True

    def appoint(self, member: Member, now: float) -> None:
        self.fetchers.append(member.peer)
        self.progress[member.peer] = (member.have, now)
        self.unproven[member.peer] = now

    def eligible(self, member: Member, slots: int) -> bool:
        """Whether `member` may take a free slot of `slots` (bans aside): see the module
        docstring."""
        if member.complete or member.peer in self.progress:
            return False
        node = member.node
        demoted_at = self.demoted.get(node)
        if demoted_at is not None:
            if member.have <= demoted_at:
                return False
            del self.demoted[node]  # it made progress after all: eligible again
        by_peer = self.by_peer
        return sum(by_peer[f].node == node for f in self.fetchers) < self.share(slots)

    def share(self, slots: int) -> int:
        """The most of `slots` one node may hold: all when it is alone, 1 among `slots`."""
        return -(-slots // max(1, len(self.nodes)))

    def trim(self, slots: int) -> None:
        """Free the unproven slots a node holds beyond its share (nodes joined since)."""
        share = self.share(slots)
        if len(self.fetchers) <= share:
            return
        held: dict[str, int] = {}
        for fetcher in list(self.fetchers):
            node = self.by_peer[fetcher].node
            held[node] = held.get(node, 0) + 1
            if held[node] > share and fetcher in self.unproven:
                self.unappoint(fetcher)


_EMPTY = SwarmIndex()


class Registry:
    """All contents' members, bad-peer reports and bans. See the module docstring."""

    def __init__(self, ban_seconds: float = BAN_SECONDS,
                 reporters_to_ban: int = REPORTERS_TO_BAN,
                 origin_fetchers: int = ORIGIN_FETCHERS,
                 fetcher_stall_seconds: float | None = None,
                 fetcher_start_seconds: float | None = None) -> None:
        if ban_seconds <= 0 or reporters_to_ban < 1 or origin_fetchers < 1:
            raise ValueError(
                "ban_seconds must be > 0, reporters_to_ban and origin_fetchers >= 1")
        for window in (fetcher_stall_seconds, fetcher_start_seconds):
            if window is not None and not window > 0:
                raise ValueError("fetcher_stall_seconds and fetcher_start_seconds must be > 0 "
                                 "(or None: never)")
        self.ban_seconds = ban_seconds
        self.reporters_to_ban = reporters_to_ban
        self.origin_fetchers = origin_fetchers
        self.fetcher_stall_seconds = fetcher_stall_seconds
        self.fetcher_start_seconds = fetcher_start_seconds
        self.reset()

    def reset(self) -> None:
        """Forget every member, report and ban (keep the settings)."""
        self.fetchers_reassigned = 0  # slots taken from stalled, unreachable or banned fetchers
        self._swarms: dict[ContentId, _Swarm] = {}
        # (content, peer) in order of last announce: the front is the stalest.
        self._by_age: OrderedDict[tuple[ContentId, PeerId], float] = OrderedDict()
        self._contents_of: dict[PeerId, int] = {}  # peer -> number of contents it is in
        self._bound: dict[PeerId, str] = {}  # peer -> host, while the peer is a member
        self._reports: dict[str, dict[str, Report]] = {}  # offender node -> reporter node
        self._banned_until: dict[str, float] = {}  # node -> end of its ban
        self._recent: deque[tuple[str, Report]] = deque(maxlen=RECENT_REPORTS)
        self._departed: deque[Departure] = deque(maxlen=RECENT_DEPARTURES)
        # (when it runs out, node, reporter node or None for a ban), in the order made: every
        # report and ban lasts ban_seconds, so they run out in that order too, and expiry
        # pops only what ran out. An entry whose report or ban was replaced since is skipped.
        self._runs_out: deque[tuple[float, str, str | None]] = deque()

    def restore(self, other: Registry) -> None:
        """Take `other`'s members, reports and bans (a replica's snapshot); keep the settings."""
        settings = (self.ban_seconds, self.reporters_to_ban, self.origin_fetchers,
                    self.fetcher_stall_seconds, self.fetcher_start_seconds)
        vars(self).update(vars(other))
        (self.ban_seconds, self.reporters_to_ban, self.origin_fetchers,
         self.fetcher_stall_seconds, self.fetcher_start_seconds) = settings

    # -- identity -----------------------------------------------------------------

    def bound_host(self, peer: PeerId) -> str | None:
        """The host `peer` is bound to, or None if it is not a member anywhere."""
        return self._bound.get(peer)

    def check_identity(self, peer: PeerId, host: str) -> None:
        """IdentityError if `peer` is bound to a host other than `host` ("" = unknown)."""
        bound = self._bound.get(peer)
        if host and bound is not None and bound != host:
            raise IdentityError(f"peer id {peer!r} belongs to the node at {bound}; "
                                f"this request came from {host}")

    # -- membership ---------------------------------------------------------------

    def announce(self, content: ContentId, member: Member, now: float) -> bool:
        """Insert or refresh `member` of `content`, seen at `now`; True if it is new.

        IdentityError if its peer id is bound to another host.
        """
        self.check_identity(member.peer, member.host)
        swarm = self._swarms.get(content)
        if swarm is None:
            swarm = self._swarms[content] = _Swarm()
        old = swarm.by_peer.get(member.peer)
        if member.last_seen != now:  # the caller may have stamped it already
            member = Member(member.peer, member.addr, member.rack, member.have,
                            member.complete, now, member.host, member.origin_bytes)
        swarm.origin_bytes += max(0, member.origin_bytes - (old.origin_bytes if old else 0))
        new = swarm.put(member)
        key = (content, member.peer)
        self._by_age[key] = now
        self._by_age.move_to_end(key)
        if new:
            self._contents_of[member.peer] = self._contents_of.get(member.peer, 0) + 1
            if member.host:
                self._bound[member.peer] = member.host
        self._tend_fetchers(swarm, member, now)
        return new

    def leave(self, content: ContentId, peer: PeerId, host: str = "",
              now: float | None = None, *, went_silent: bool = False) -> bool:
        """Drop `peer` from `content`; True if it was a member. With `now`, a member that
        was not complete is kept among the recent departures.

        IdentityError if `host` is given and `peer` is bound to another one.
        """
        self.check_identity(peer, host)
        swarm = self._swarms.get(content)
        member = None if swarm is None else swarm.by_peer.get(peer)
        if swarm is None or member is None or not swarm.remove(peer):
            return False
        if now is not None and not member.complete:
            self._departed.append(Departure(content, peer, member.have, went_silent, now))
        del self._by_age[(content, peer)]
        if not swarm.index:
            del self._swarms[content]
        left = self._contents_of[peer] - 1
        if left:
            self._contents_of[peer] = left
        else:
            del self._contents_of[peer]
            self._bound.pop(peer, None)
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
            self.leave(*key, now=now, went_silent=True)
            gone.append(key)
        self._forget_old_reports(now)
        return gone

    def members(self, content: ContentId) -> list[Member]:
        """The members of `content`, sorted by peer id: O(members log members)."""
        swarm = self._swarms.get(content)
        if swarm is None:
            return []
        by_peer = swarm.by_peer
        return [by_peer[p] for p in sorted(by_peer)]

    def candidates(self, content: ContentId, now: float) -> Candidates:
        """What handouts draw from at `now`: the members not banned, indexed (O(1)).

        Iterating it lists them sorted by peer id (O(members log members)).
        """
        swarm = self._swarms.get(content)
        index = swarm.index if swarm is not None else _EMPTY
        if not self._banned_until:
            return Candidates(index)
        return Candidates(index, lambda m: self.is_banned(m.node, now))

    def member(self, content: ContentId, peer: PeerId) -> Member | None:
        swarm = self._swarms.get(content)
        return None if swarm is None else swarm.by_peer.get(peer)

    # -- origin fetchers ----------------------------------------------------------

    def origin_slot(self, content: ContentId, peer: PeerId) -> OriginSlot:
        """`peer`'s origin slot in `content`; slots >= 1 even when no one is appointed."""
        swarm = self._swarms.get(content)
        if swarm is None:
            return OriginSlot(None, self.origin_fetchers, 0)
        filled = len(swarm.fetchers)
        if peer in swarm.fetchers:
            return OriginSlot(swarm.fetchers.index(peer), self.origin_fetchers, filled)
        return OriginSlot(None, self.origin_fetchers, filled)

    def fetcher_unreachable(self, content: ContentId, peer: PeerId) -> bool:
        """A member could not dial fetcher `peer`: free its slot. True if it had one."""
        swarm = self._swarms.get(content)
        if swarm is None or not swarm.demote(peer):
            return False
        self.fetchers_reassigned += 1
        return True

    def _tend_fetchers(self, swarm: _Swarm, member: Member, now: float) -> None:
        """Note `member`'s progress, drop fetchers that lost their claim, maybe appoint it."""
        peer = member.peer
        held = swarm.progress.get(peer)
        if held is not None and member.have > held[0]:
            swarm.progress[peer] = (member.have, now)
            swarm.unproven.pop(peer, None)
        for fetcher in list(swarm.fetchers):
            if self._lost_claim(swarm, fetcher, now):
                swarm.demote(fetcher)
                self.fetchers_reassigned += 1
        swarm.trim(self.origin_fetchers)
        if (len(swarm.fetchers) < self.origin_fetchers
                and swarm.eligible(member, self.origin_fetchers)
                and not self.is_banned(member.node, now)):
            swarm.appoint(member, now)

    def _lost_claim(self, swarm: _Swarm, fetcher: PeerId, now: float) -> bool:
        member = swarm.by_peer[fetcher]
        if self._banned_until and self.is_banned(member.node, now):  # no bans: the usual case
            return True
        if member.complete:
            return False
        start, stall = self.fetcher_start_seconds, self.fetcher_stall_seconds
        appointed = swarm.unproven.get(fetcher)
        if start is not None and appointed is not None and now - appointed > start:
            return True
        return stall is not None and now - swarm.progress[fetcher][1] > stall

    # -- counts, for metrics and the status page ----------------------------------

    def fetchers(self, content: ContentId) -> list[PeerId]:
        """`content`'s origin fetchers, by slot."""
        swarm = self._swarms.get(content)
        return list(swarm.fetchers) if swarm is not None else []

    def origin_bytes(self, content: ContentId) -> int:
        """Bytes `content`'s members say they fetched from the origin while members."""
        swarm = self._swarms.get(content)
        return swarm.origin_bytes if swarm is not None else 0

    def complete_count(self, content: ContentId) -> int:
        swarm = self._swarms.get(content)
        return swarm.index.complete_count if swarm is not None else 0

    def bans(self, now: float) -> list[tuple[str, float]]:
        """(node, seconds left) of the bans in force at `now`, sorted by node."""
        return sorted((n, until - now) for n, until in self._banned_until.items() if now < until)

    def recent_reports(self) -> list[tuple[str, Report]]:
        """The last RECENT_REPORTS reports as (offender node, report), oldest first."""
        return list(self._recent)

    def departures(self) -> list[Departure]:
        """The last RECENT_DEPARTURES members to leave incomplete, oldest first."""
        return list(self._departed)

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

    def report(self, peer: PeerId, reporter: PeerId, reason: str, now: float, *,
               host: str | None = None, reporter_host: str = "",
               content: ContentId | None = None) -> bool:
        """Record that `reporter` saw `peer` misbehave; True if this report banned it.

        `host` is where the reporter saw the offender (default: where `peer` is
        bound, else `peer` itself); the report is about that host. With a
        `reporter_host`, the reporter must be a member bound to it
        (IdentityError otherwise). With a `content`, the report counts only if
        the reporter announced chunks of it, and the reporters needed grow with
        its swarm (see the module docstring); without one (the simulator's
        nodes, which do not lie), it counts. A node's reports about itself are
        ignored; a reporter node's repeated reports about the same node count
        once (the latest reason is kept).
        """
        reporter_node = self.reporter_node(reporter, reporter_host)
        offender = host or self._bound.get(peer) or peer
        if offender in (reporter_node, reporter):
            return False
        if content is not None:
            lacking = self._no_evidence(content, reporter)
            if lacking:
                self._recent.append((offender, Report(
                    reporter_node, f"{reason} (not counted: {lacking})", now)))
                return False
        reports = self._reports.setdefault(offender, {})
        reports[reporter_node] = Report(reporter_node, reason, now)
        self._runs_out.append((now + self.ban_seconds, offender, reporter_node))
        self._recent.append((offender, reports[reporter_node]))
        fresh = sum(1 for r in reports.values() if now - r.at <= self.ban_seconds)
        if fresh < self.reporters_needed(content) or self.is_banned(offender, now):
            return False
        self._banned_until[offender] = now + self.ban_seconds
        self._runs_out.append((now + self.ban_seconds, offender, None))
        del self._reports[offender]  # the ban used them up; a new ban needs new reports
        return True

    def reporters_needed(self, content: ContentId | None) -> int:
        """Distinct reporter nodes that ban, for a report about `content`."""
        swarm = self._swarms.get(content) if content is not None else None
        members = len(swarm.index) if swarm is not None else 0
        scaled = min(MAX_REPORTERS_TO_BAN, members // MEMBERS_PER_REPORTER)
        return max(self.reporters_to_ban, scaled)

    def _no_evidence(self, content: ContentId, reporter: PeerId) -> str:
        """Why `reporter` cannot have received a chunk of `content` ("" if it can)."""
        swarm = self._swarms.get(content)
        member = swarm.by_peer.get(reporter) if swarm is not None else None
        if member is None:
            return "the reporter is not a member of that content"
        if not member.have and not member.complete:
            return "the reporter has announced no chunk of that content"
        return ""

    def reporter_node(self, reporter: PeerId, reporter_host: str) -> str:
        """The node a report counts for; IdentityError if `reporter` may not report.

        With a host, the reporter must be a member bound to that host.
        """
        if not reporter_host:
            return reporter
        bound = self._bound.get(reporter)
        if bound is None:
            raise IdentityError(f"peer id {reporter!r} is not a member of any swarm; "
                                "only members may report")
        self.check_identity(reporter, reporter_host)
        return reporter_host

    def is_banned(self, node: str, now: float) -> bool:
        """Whether `node` (a host, or a peer id without one) is banned at `now`."""
        until = self._banned_until.get(node)
        return until is not None and now < until

    def banned(self, now: float) -> list[str]:
        """Nodes banned at `now`, sorted."""
        return sorted(p for p, until in self._banned_until.items() if now < until)

    def reports(self, node: str) -> list[Report]:
        """Pending (not yet acted on) reports about `node`, sorted by reporter."""
        return sorted(self._reports.get(node, {}).values(), key=lambda r: r.reporter)

    def _forget_old_reports(self, now: float) -> None:
        """Drop the reports and bans that ran out before `now`: O(those), not O(all). (One
        that runs out exactly at `now` goes at the next call; `is_banned` and the report
        count look at the times themselves.)"""
        runs_out = self._runs_out
        while runs_out and runs_out[0][0] < now:
            at, node, reporter = runs_out.popleft()
            if reporter is None:
                if self._banned_until.get(node) == at:
                    del self._banned_until[node]
                continue
            reports = self._reports.get(node, {})
            report = reports.get(reporter)
            if report is not None and report.at + self.ban_seconds == at:
                del reports[reporter]
                if not reports:
                    del self._reports[node]
