"""One node and all its contents: the decisions that span a node's swarms.

Theory of operation
-------------------
A `Swarm` decides for one content. A node swarms on several at once, and a
few decisions belong to the node, not to any one content. They live here,
so that the asyncio agent and the simulator make them with the same code:

* The announce schedule. One announce covers every open content (the
  tracker's batched announce), and at most one is in flight: the driver
  answers each `AnnounceAll` with `Announced` or `AnnounceFailed`. The next
  is due `interval` after that answer (the tracker's interval once it has
  given one, the configured one before), or sooner: at once when a content
  opens or completes (a launch waits on a new content's first peers; an
  image opens six contents one after another, and a gap for each cost
  0.3 s of a 2.3 s launch), and no sooner than `EARLY_ANNOUNCE_GAP_S` after
  the last announce when a peer the tracker did not hand us joins one of our
  swarms (the swarm grew, so our origin-fetcher slot may have changed) or a
  swarm is about to cover vacant fetcher slots on an old count
  (`Swarm.wants_view`).
* What each content asks of the tracker (`want`): 0, no handout, once it is
  complete or its swarm is linked to as many peers as it would open itself;
  else None, the tracker's own limit. This spares the tracker most handouts
  of a running launch.
* Leaving: a content that fails or is evicted is removed (`remove`), which
  tells the tracker we stopped (`Leave`), and is announced no more. A swarm
  that aborts is removed by the node itself.
* The node's due (`due`), which its requests carry for the senders' upload
  order (p2p.swarm.uploads, `earliest_due`): when it would hold what it
  holds of its unfinished contents had it received at its line rate
  (`line_Bps`: its download cap, or its NIC) since it began wanting them.
* Pinning. A content is pinned in the store (not evictable) while its
  swarm fetches, and only then (`Pin`, `Unpin`): a complete content, or a
  lazy one that holds all it was asked for, is seeded while it stays, but
  the store may evict it, least recently used first, for new ones (a lazy
  image on a node runs to many of those). A content is pinned when added.
* Reader waiters. A reader blocked on a chunk is woken (`WakeReaders`) when
  the chunk is stored (`ChunkStored`), or at once if it is held already:
  never as a side effect of announcing the chunk to peers.
* Links and joins (p2p.swarm.links). Which peers are joined for each
  content, on which link, and what a Join heard, a link opened or closed, a
  failed dial and a swarm's Connect (`connect`) lead to: our Joins
  (`SendJoin`), dials (`Dial`), and the swarms hearing that a peer joined
  (`PeerJoined`) or was lost (`PeerLost`, also when our Join goes
  unanswered for `JOIN_TIMEOUT_S`). The caller asks the table where to
  send (`links`).
* Driving the swarms. The caller hands each swarm's events to the node
  (`swarm_event`, and `start` once a content is added); the node calls that
  content's `Swarm` and returns its actions tagged with the content
  (`SwarmActions`), then reacts to them itself: a `Complete` brings the
  announce forward, an `Abort` removes the content (`Leave`), a
  `Disconnect` drops the peer from the join table. An event for
  a content the node does not have (removed, never added) is ignored.

What it deliberately does not know: sockets, futures, the tracker's wire
format, and what the swarms' actions mean to the network: those are the
caller's to carry out.

Time enters only as `now`, on the caller's clock. One timer covers the node:
`next_timer` is the earliest of its own deadlines and of its swarms' timers,
and `handle_timer` runs the swarms that are due (earliest first), then its
own deadlines. A swarm's timer is cached, and asked again only after the
swarm was called (an event, its timer, `start`): a swarm the node never
called has none yet. Without `timer_slack_s` (the agent) it is asked after
every call, exactly. With it (the simulator, for speed: asking costs
O(peers)) it is asked only when none is cached, after the swarm's timer ran,
or after an event or action that can bring a deadline forward (failures and
lost peers start back-offs, disconnections and reports retry times), and is
never taken further than `timer_slack_s` ahead; a deadline that another
event brings forward is met late, by less than `timer_slack_s`.

The node never reads a clock, touches a socket or a file, or uses the
global random module.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, assert_never

from p2p.content import ContentId, PeerId
from p2p.swarm import bits
from p2p.swarm.events import (
    Abort,
    Action,
    ChunkFailed,
    Complete,
    Disconnect,
    Event,
    PeerJoined,
    PeerLost,
    Report,
)
from p2p.swarm.links import (
    CloseLinks,
    DialFailed,
    JoinHeard,
    LinkAction,
    LinkClosed,
    LinkOpened,
    Links,
)
from p2p.swarm.swarm import Swarm

EARLY_ANNOUNCE_GAP_S: Final = 0.2  # announces prompted by new peers come no faster


# ---- events -------------------------------------------------------------------


@dataclass(frozen=True, slots=True, init=False)
class Announced:
    """The tracker answered our `AnnounceAll`: the next is due in `interval_s`, and
    these peers were handed out (in any content)."""

    interval_s: float
    handed_out: tuple[PeerId, ...] = ()

    def __init__(self, interval_s: float, handed_out: tuple[PeerId, ...] = ()) -> None:
        object.__setattr__(self, "interval_s", interval_s)
        object.__setattr__(self, "handed_out", handed_out)


@dataclass(frozen=True, slots=True, init=False)
class AnnounceFailed:
    """Our `AnnounceAll` got no answer (the tracker is down or refused it)."""


@dataclass(frozen=True, slots=True, init=False)
class ReaderWaiting:
    """A reader is blocked on `chunk` of `content`."""

    content: ContentId
    chunk: int

    def __init__(self, content: ContentId, chunk: int) -> None:
        object.__setattr__(self, "content", content)
        object.__setattr__(self, "chunk", chunk)


@dataclass(frozen=True, slots=True, init=False)
class ChunkStored:
    """`chunk` of `content` is verified and on disk: a reader may read it now."""

    content: ContentId
    chunk: int

    def __init__(self, content: ContentId, chunk: int) -> None:
        object.__setattr__(self, "content", content)
        object.__setattr__(self, "chunk", chunk)


NodeEvent = (Announced | AnnounceFailed | ReaderWaiting | ChunkStored | LinkOpened | LinkClosed
             | DialFailed | JoinHeard)


# ---- actions ------------------------------------------------------------------


@dataclass(frozen=True, slots=True, init=False)
class AnnounceItem:
    """One content's line of an announce. `want`: peers to hand out; 0 none, None as
    many as the tracker gives."""

    content: ContentId
    have: int  # chunks held
    complete: bool
    want: int | None

    def __init__(self, content: ContentId, have: int, complete: bool, want: int | None) -> None:
        object.__setattr__(self, "content", content)
        object.__setattr__(self, "have", have)
        object.__setattr__(self, "complete", complete)
        object.__setattr__(self, "want", want)


@dataclass(frozen=True, slots=True, init=False)
class AnnounceAll:
    """Announce these contents in one request; answer with `Announced` or
    `AnnounceFailed`, and hand each content's peers to its swarm."""

    items: tuple[AnnounceItem, ...]

    def __init__(self, items: tuple[AnnounceItem, ...]) -> None:
        object.__setattr__(self, "items", items)


@dataclass(frozen=True, slots=True, init=False)
class Leave:
    """Tell the tracker we stopped swarming on `content`."""

    content: ContentId

    def __init__(self, content: ContentId) -> None:
        object.__setattr__(self, "content", content)


@dataclass(frozen=True, slots=True, init=False)
class WakeReaders:
    """Readers blocked on `chunk` of `content` may read it now."""

    content: ContentId
    chunk: int

    def __init__(self, content: ContentId, chunk: int) -> None:
        object.__setattr__(self, "content", content)
        object.__setattr__(self, "chunk", chunk)


@dataclass(frozen=True, slots=True, init=False)
class Pin:
    """Keep `content` in the store: its swarm fetches again."""

    content: ContentId

    def __init__(self, content: ContentId) -> None:
        object.__setattr__(self, "content", content)


@dataclass(frozen=True, slots=True, init=False)
class Unpin:
    """`content` may be evicted from the store: its swarm fetches nothing now."""

    content: ContentId

    def __init__(self, content: ContentId) -> None:
        object.__setattr__(self, "content", content)


@dataclass(frozen=True, slots=True, init=False)
class SwarmActions:
    """What the swarm of `content` asks for, in its order: carry them out for that
    content."""

    content: ContentId
    actions: list[Action]

    def __init__(self, content: ContentId, actions: list[Action]) -> None:
        object.__setattr__(self, "content", content)
        object.__setattr__(self, "actions", actions)


NodeAction = AnnounceAll | Leave | WakeReaders | Pin | Unpin | SwarmActions | LinkAction

# The line rate a node's due assumes when its caller knows none (p2p.config: line_mbps).
DEFAULT_LINE_BPS: Final = 25e9 / 8

# After these events (ChunkFailed, PeerLost) or actions (Disconnect, Report) a swarm may have a
# deadline earlier than the cached one: back-offs of failures and lost peers, retry times
# of disconnections and reports.


def want(swarm: Swarm) -> int | None:
    """What a content asks of the tracker; see the module docstring."""
    if swarm.complete or swarm.peer_count >= swarm.config.max_peers:
        return 0
    return None


class Node:
    """One node's contents; see the module docstring.

    Driven by events (`handle`, and `swarm_event` for one content's swarm) and by
    time (`handle_timer`, due at `next_timer`); contents come and go with `add`
    and `remove`. Every call takes `now` in seconds on the caller's clock and
    returns the actions the caller must carry out. `swarm_calls` counts the
    swarm calls made (events and timers). `links` answers who is joined, and
    on which link; it changes only through the node.
    """

    def __init__(self, announce_interval_s: float, now: float, *,
                 timer_slack_s: float | None = None,
                 line_Bps: float = DEFAULT_LINE_BPS) -> None:
        if line_Bps <= 0:
            raise ValueError("the line rate must be positive")
        self._swarms: dict[ContentId, Swarm] = {}
        self._since: dict[ContentId, float] = {}  # when each content was added
        self._line_Bps = line_Bps
        self._interval_s = announce_interval_s
        self._due = now  # the next periodic announce: the first one at once
        self._early: float | None = None  # an announce due before `_due`
        self._in_flight = False
        self._last_sent = float("-inf")
        self._handed_out: set[PeerId] = set()
        self._waiting: dict[ContentId, set[int]] = {}  # chunks readers are blocked on
        self._unpinned: set[ContentId] = set()  # contents whose swarms fetch nothing now
        self.links = Links()
        self._slack_s = timer_slack_s
        # Each swarm's cached next timer, in the order they were set: ties run in it.
        self._swarm_due: dict[ContentId, float] = {}
        self.swarm_calls = 0
        # Whether the last `swarm_event` left `next_timer` as it was: a caller that
        # re-arms its timer after every call may skip asking (most haves of a big
        # simulation; the agent re-arms anyway).
        self.timer_kept = False

    # ---- contents ---------------------------------------------------------------

    def add(self, content: ContentId, swarm: Swarm, now: float) -> None:
        """Swarm on `content` (replacing a previous swarm for it); announced at once."""
        self._swarms[content] = swarm
        self._since[content] = now
        self._swarm_due.pop(content, None)
        self._unpinned.discard(content)
        self.links.forget(content)  # a new swarm sends its own Joins
        self._announce_at(now)

    def start(self, content: ContentId, now: float) -> list[NodeAction]:
        """The first actions of the swarm of `content`: connects, owned fetches, or
        Complete if it holds every chunk already."""
        swarm = self._swarms.get(content)
        if swarm is None:
            return []
        return self._swarm_did(content, swarm, swarm.start(now), False, now)

    def remove(self, content: ContentId) -> list[NodeAction]:
        """Stop swarming on `content` (it failed or was evicted): leave its swarm.
        Its blocked readers are the caller's to fail."""
        self._waiting.pop(content, None)
        self._unpinned.discard(content)
        self.links.forget(content)
        self._swarm_due.pop(content, None)
        self._since.pop(content, None)
        if self._swarms.pop(content, None) is None:
            return []
        return [Leave(content)]

    def due(self, now: float) -> float:
        """The node's due (module docstring), on the caller's clock. Its launch began
        when the oldest content it is still fetching was added; what it holds counts
        every content added since, finished or not (`now` when it fetches none). Lazy
        contents (mounts, which fetch what is read, for as long as they are mounted)
        count for neither."""
        start = now  # (every content was added at `now` or before)
        for content, swarm in self._swarms.items():  # two plain loops: a request asks this
            if not swarm.lazy and swarm.fetching and self._since[content] < start:
                start = self._since[content]
        held = 0
        for content, swarm in self._swarms.items():
            if not swarm.lazy and self._since[content] >= start:
                held += swarm.held_bytes
        return start + held / self._line_Bps

    # ---- events -----------------------------------------------------------------

    def handle(self, event: NodeEvent, now: float) -> list[NodeAction]:
        match event:  # (no positional captures: see Swarm.handle)
            case Announced():
                self._handed_out.update(event.handed_out)
                self._interval_s = event.interval_s
                self._answered(now)
            case AnnounceFailed():
                self._answered(now)
            case JoinHeard():
                return self._join_heard(event, now)
            case LinkOpened():
                return list(self.links.opened(event, now, self._swarms))
            case LinkClosed():
                return self._lose(self.links.closed(event.link), event.reason, event.hostile,
                                  now)
            case DialFailed():
                reports, contents = self.links.dial_failed(event)
                return [*reports, *self._lose([(c, event.peer) for c in contents],
                                              event.reason, event.hostile, now)]
            case ReaderWaiting():
                return self._reader_waiting(event.content, event.chunk)
            case ChunkStored():
                return self._chunk_stored(event.content, event.chunk)
            case _:
                assert_never(event)
        return []

    def connect(self, content: ContentId, peer: PeerId, now: float) -> list[NodeAction]:
        """Carry out the Connect of the swarm of `content`: our Join on a link to
        `peer`, or a dial."""
        if content not in self._swarms:
            return []
        return list(self.links.connect(content, peer, now))

    def _join_heard(self, event: JoinHeard, now: float) -> list[NodeAction]:
        content, peer = event.content, event.peer
        if content not in self._swarms:
            return []  # the caller decides whether to seed it
        answer, joins = self.links.heard(event, now)
        actions: list[NodeAction] = list(answer)
        if joins:
            actions += self.swarm_event(
                content, PeerJoined(peer, event.rack, event.have, event.pending, event.host),
                now)
            if peer not in self._handed_out:
                self._announce_at(max(now, self._last_sent + EARLY_ANNOUNCE_GAP_S))
        return actions

    def _lose(self, lost: list[tuple[ContentId, PeerId]], reason: str, hostile: bool,
              now: float) -> list[NodeAction]:
        actions: list[NodeAction] = []
        for content, peer in lost:
            actions += self.swarm_event(content, PeerLost(peer, reason, hostile), now)
        return actions

    def swarm_event(self, content: ContentId, event: Event, now: float) -> list[NodeAction]:
        """Hand `event` to the swarm of `content`; nothing if the node has none.
        Afterwards `timer_kept` says whether `next_timer` is sure to be what it was."""
        swarm = self._swarms.get(content)
        if swarm is None:
            self.timer_kept = True
            return []
        self.swarm_calls += 1
        actions = swarm.handle(event, now)
        kind = type(event)  # (compared by identity: compiled, a tuple's `in` is generic)
        advance = kind is ChunkFailed or kind is PeerLost
        if not actions and not advance and self._slack_s is not None \
                and content in self._swarm_due:
            self.timer_kept = True
            return []  # most events of a big simulation: nothing to do, timer kept
        self.timer_kept = False
        return self._swarm_did(content, swarm, actions, advance, now)

    def _swarm_did(self, content: ContentId, swarm: Swarm, actions: list[Action],
                   advance: bool, now: float) -> list[NodeAction]:
        """The node's share of a swarm call: tag its actions, react to them, and ask
        for its next timer again if need be."""
        if swarm.wants_view(now):  # (p2p.swarm.swarm: the vacant fetcher slots)
            self._announce_at(max(now, self._last_sent + EARLY_ANNOUNCE_GAP_S))
        done: list[NodeAction] = [SwarmActions(content, actions)] if actions else []
        for action in actions:
            kind = type(action)
            if kind is Complete:
                self._announce_at(now)
            elif kind is Abort:
                done += self.remove(content)
                return done
            elif kind is Disconnect or kind is Report:
                self._swarm_due.pop(content, None)
                if kind is Disconnect:
                    assert isinstance(action, Disconnect)
                    done += self._disconnect(content, action)
        if (content in self._unpinned) is swarm.fetching:  # it changed: say so
            self._unpinned.symmetric_difference_update((content,))
            done.append(Pin(content) if swarm.fetching else Unpin(content))
        self._refresh(content, swarm, advance, now)
        return done

    def _disconnect(self, content: ContentId, action: Disconnect) -> list[NodeAction]:
        """A swarm left a peer out: drop its join; cut a hostile one off altogether."""
        self.links.drop(content, action.peer)
        links = self.links.links_to(action.peer) if action.hostile else []
        return [CloseLinks(tuple(links), action.reason)] if links else []

    def _reader_waiting(self, content: ContentId, chunk: int) -> list[NodeAction]:
        swarm = self._swarms.get(content)
        if swarm is not None and swarm.held(chunk):
            return [WakeReaders(content, chunk)]
        self._waiting.setdefault(content, set()).add(chunk)
        return []

    def _chunk_stored(self, content: ContentId, chunk: int) -> list[NodeAction]:
        waiting = self._waiting.get(content)
        if waiting is None or chunk not in waiting:
            return []
        waiting.discard(chunk)
        if not waiting:
            del self._waiting[content]
        return [WakeReaders(content, chunk)]

    # ---- time -------------------------------------------------------------------

    def next_timer(self) -> float | None:
        """When `handle_timer` must next run, on the caller's clock: the earliest of
        the node's own deadlines and its swarms' timers."""
        when = self._announce_due()
        for due in self._swarm_due.values():  # (a loop, not min(): compiled, a float compare)
            if when is None or due < when:
                when = due
        if self.links.deadlines:  # (never, in the simulator: spare it the call)
            joins = min(self.links.deadlines.values())
            if when is None or joins < when:
                when = joins
        return when

    def handle_timer(self, now: float) -> list[NodeAction]:
        """Run the swarms that are due, then the node's own deadlines."""
        actions = self._swarm_timers(now)
        actions += self._lose(self.links.due(now), "no join reply", False, now)
        due = self._announce_due()
        if due is None or now < due:
            return actions
        self._early = None
        if not self._swarms:
            self._due = now + self._interval_s
            return actions
        self._in_flight = True
        self._last_sent = now
        items = tuple(AnnounceItem(content, bits.count(swarm.have), swarm.complete, want(swarm))
                      for content, swarm in self._swarms.items())
        return [*actions, AnnounceAll(items)]

    def _swarm_timers(self, now: float) -> list[NodeAction]:
        due = [content for content, when in self._swarm_due.items() if when <= now]
        due.sort(key=self._swarm_due.__getitem__)  # stable: ties in the order they were set
        actions: list[NodeAction] = []
        for content in due:
            del self._swarm_due[content]
            swarm = self._swarms[content]
            self.swarm_calls += 1
            actions += self._swarm_did(content, swarm, swarm.handle_timer(now), False, now)
        return actions

    def _refresh(self, content: ContentId, swarm: Swarm, advance: bool, now: float) -> None:
        """Ask the swarm for its next timer again, as the module docstring says when."""
        if content not in self._swarms:
            return  # removed meanwhile (it aborted)
        if self._slack_s is None:
            when = swarm.next_timer()
            if when is None:
                self._swarm_due.pop(content, None)
            else:
                self._swarm_due[content] = when
            return
        armed = self._swarm_due.get(content)
        if armed is not None and not advance:
            return
        when = swarm.next_timer()
        if when is None:
            return
        when = min(when, now + self._slack_s)
        if armed is None or when < armed:
            self._swarm_due.pop(content, None)  # set anew: it goes last among ties
            self._swarm_due[content] = when

    def _announce_due(self) -> float | None:
        if self._in_flight:
            return None  # the answer to the announce in flight comes as an event
        return self._due if self._early is None else min(self._due, self._early)

    def _answered(self, now: float) -> None:
        self._in_flight = False
        self._due = now + self._interval_s

    def _announce_at(self, when: float) -> None:
        self._early = when if self._early is None else min(self._early, when)
