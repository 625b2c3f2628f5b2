"""Links and joins: which peers a node is joined with, for each content.

Theory of operation
-------------------
Peers talk over links (one authenticated connection each, shared by every
content). A peer takes part in our swarm for a content once it is *joined*:
each side sends the other a Join for the content on a link, and the peer is
joined when its Join is heard. `Links` is the one table of who is joined,
for the agent and the simulator alike, and it decides what follows from a
Join heard, a link opened or closed, a dial that failed, and a swarm's
Connect or Disconnect (`p2p.swarm.node.Node` owns it and tells the swarms):

* Connect: our Join goes out on the peer's newest open link; with none, the
  peer is dialled, once however many contents wait on it. The dial's own
  link carries our Join for every content waiting on it; a dial that fails
  loses the peer to each of them that it has not joined meanwhile, and a
  peer the tracker handed out is reported unreachable there.
* A Join heard on link L from peer P for content C:
  - P not joined for C: it joins, on L, and our Join answers it on L unless
    it went out there already.
  - P joined on L already: P restarted its swarm for C (it failed and
    reopened). It joins afresh, and our Join goes out again: its new swarm
    needs our bits.
  - P joined on another link (both sides dialled at once, so two links
    join the same pair): P is one peer, joined on the first link. The
    second gets our answer, and nothing else changes.
* A link that closes loses the peers joined on it, in every content.
* A swarm that disconnects a peer drops it from that content, and our Join
  to it with it: should the swarm connect to it again, the Join goes out
  again (the peer takes it as a restart, above, and answers). A peer
  disconnected as hostile is cut off altogether: every link to it closes
  (`CloseLinks`), in every content.
* Join time-outs: a Join we send a peer that has not joined must be answered
  (its Join, on any link) within JOIN_TIMEOUT_S; else the peer is lost.

Link handles are the caller's: any int that names one link while it is open
(the agent numbers its links; the simulator, which models one link per pair
of nodes and each join exchange as one step, uses the other node's index and
never opens, closes or dials).

What it deliberately does not know: sockets, the wire format of a Join (the
caller builds it when told `SendJoin`), and the swarms: whether a peer joined
or was lost is returned, and the node tells the swarm. Time enters only as
`now`, for the time-outs. Order is kept wherever it reaches a caller: peers
in the order they joined, contents in their sorted order.
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass
from typing import NewType

from p2p.content import ContentId, PeerId

LinkId = NewType("LinkId", int)
JOIN_TIMEOUT_S = 10.0  # a peer has this long to answer our Join with its own


# ---- events -------------------------------------------------------------------


@dataclass(frozen=True, slots=True, init=False)
class LinkOpened:
    """`link` to `peer` is up: one we dialled (`dialled`), or one the peer opened."""

    link: LinkId
    peer: PeerId
    dialled: bool

    def __init__(self, link: LinkId, peer: PeerId, dialled: bool) -> None:
        object.__setattr__(self, "link", link)
        object.__setattr__(self, "peer", peer)
        object.__setattr__(self, "dialled", dialled)


@dataclass(frozen=True, slots=True, init=False)
class LinkClosed:
    """`link` closed; `hostile`: the peer broke the protocol or failed authentication."""

    link: LinkId
    reason: str
    hostile: bool = False

    def __init__(self, link: LinkId, reason: str, hostile: bool = False) -> None:
        object.__setattr__(self, "link", link)
        object.__setattr__(self, "reason", reason)
        object.__setattr__(self, "hostile", hostile)


@dataclass(frozen=True, slots=True, init=False)
class DialFailed:
    """A dial to `peer` failed. `unreachable`: it could not be reached where the tracker
    said it is (not a refusal for misbehaviour), so the tracker should hear of it."""

    peer: PeerId
    reason: str
    hostile: bool = False
    unreachable: bool = False

    def __init__(self, peer: PeerId, reason: str, hostile: bool = False,
                 unreachable: bool = False) -> None:
        object.__setattr__(self, "peer", peer)
        object.__setattr__(self, "reason", reason)
        object.__setattr__(self, "hostile", hostile)
        object.__setattr__(self, "unreachable", unreachable)


@dataclass(frozen=True, slots=True, init=False)
class JoinHeard:
    """`peer` sent its Join for `content` on `link`: what it holds and is fetching."""

    content: ContentId
    peer: PeerId
    link: LinkId
    rack: str
    have: tuple[bool, ...]
    pending: tuple[int, ...] = ()
    host: str = ""  # the address the link comes from ("" where there is none: simulations)

    def __init__(self, content: ContentId, peer: PeerId, link: LinkId, rack: str,
                 have: tuple[bool, ...], pending: tuple[int, ...] = (), host: str = "") -> None:
        object.__setattr__(self, "content", content)
        object.__setattr__(self, "peer", peer)
        object.__setattr__(self, "link", link)
        object.__setattr__(self, "rack", rack)
        object.__setattr__(self, "have", have)
        object.__setattr__(self, "pending", pending)
        object.__setattr__(self, "host", host)


LinkEvent = LinkOpened | LinkClosed | DialFailed | JoinHeard


# ---- actions ------------------------------------------------------------------


@dataclass(frozen=True, slots=True, init=False)
class Dial:
    """Open a link to `peer`; answer with `LinkOpened(dialled=True)` or `DialFailed`."""

    peer: PeerId

    def __init__(self, peer: PeerId) -> None:
        object.__setattr__(self, "peer", peer)


@dataclass(frozen=True, slots=True, init=False)
class SendJoin:
    """Send our Join for `content` (what we hold and fetch from the origin) on `link`."""

    link: LinkId
    content: ContentId

    def __init__(self, link: LinkId, content: ContentId) -> None:
        object.__setattr__(self, "link", link)
        object.__setattr__(self, "content", content)


@dataclass(frozen=True, slots=True, init=False)
class ReportUnreachable:
    """Tell the tracker that `peer`, which it handed out for `content`, cannot be reached."""

    content: ContentId
    peer: PeerId

    def __init__(self, content: ContentId, peer: PeerId) -> None:
        object.__setattr__(self, "content", content)
        object.__setattr__(self, "peer", peer)


@dataclass(frozen=True, slots=True, init=False)
class CloseLinks:
    """Close these links, all to one peer that broke the protocol (a swarm said so)."""

    links: tuple[LinkId, ...]
    reason: str

    def __init__(self, links: tuple[LinkId, ...], reason: str) -> None:
        object.__setattr__(self, "links", links)
        object.__setattr__(self, "reason", reason)


LinkAction = Dial | SendJoin | ReportUnreachable | CloseLinks


class Links:
    """The join table of one node; see the module docstring.

    Its methods return the actions to carry out and, where a swarm must hear it,
    the peers that joined or were lost; the caller keeps the swarms in step.
    """

    def __init__(self) -> None:
        self._peer_of: dict[LinkId, PeerId] = {}  # open links
        self._newest: dict[PeerId, LinkId] = {}  # each peer's newest open link
        # Per content, the peers joined and the link each joined on (our Join went
        # out there too), in the order they joined.
        self._joined: dict[ContentId, dict[PeerId, LinkId]] = {}
        # Per content, the links our Join went out on that its peer has not joined on.
        self._unanswered: dict[ContentId, dict[LinkId, PeerId]] = {}
        # Joins unanswered -> when the peer is given up. Read it (the node's timer asks
        # whether it is empty on every call, and the simulator never fills it); only
        # the table changes it.
        self.deadlines: dict[tuple[ContentId, PeerId], float] = {}
        self._dial_for: dict[PeerId, set[ContentId]] = {}  # dials under way -> contents

    # ---- questions ----------------------------------------------------------------

    def joined(self, content: ContentId, peer: PeerId) -> bool:
        return peer in self._joined.get(content, ())

    def link_of(self, content: ContentId, peer: PeerId) -> LinkId | None:
        """The link `peer` is joined on for `content`: requests go there."""
        joined = self._joined.get(content)  # (no `{}` default: one would be made per call)
        return None if joined is None else joined.get(peer)

    def joined_links(self, content: ContentId) -> list[LinkId]:
        """The links of the peers joined for `content`, in the order they joined."""
        joined = self._joined.get(content)
        return [] if joined is None else list(joined.values())

    def peer_count(self, content: ContentId) -> int:
        return len(self._joined.get(content, ()))

    def told(self, content: ContentId) -> list[LinkId]:
        """One link to each peer our Join for `content` went to, joined or not yet:
        what we hold and fetch must reach them all (a chunk finished before a peer's
        answer comes would otherwise never be announced to it)."""
        joined = self._joined.get(content, {})
        links = list(joined.values())
        seen = set(joined)
        for link, peer in self._unanswered.get(content, {}).items():
            if peer not in seen:
                seen.add(peer)
                links.append(link)
        return links

    def links_to(self, peer: PeerId) -> list[LinkId]:
        """Every open link to `peer`, oldest first."""
        return [link for link, p in self._peer_of.items() if p == peer]

    # ---- contents -----------------------------------------------------------------

    def forget(self, content: ContentId) -> None:
        """`content` is gone, or starts afresh: its joins, and our Joins for it, are
        forgotten (a new swarm introduces itself again). Dials it waits on go on."""
        self._joined.pop(content, None)
        self._unanswered.pop(content, None)
        for key in [k for k in self.deadlines if k[0] == content]:
            del self.deadlines[key]

    # ---- what happened ------------------------------------------------------------

    def connect(self, content: ContentId, peer: PeerId, now: float) -> list[LinkAction]:
        """A swarm asks to connect to `peer` for `content`."""
        link = self._newest.get(peer)
        if link is not None:
            return self._send_join(content, peer, link, now)
        dialling = peer in self._dial_for
        self._dial_for.setdefault(peer, set()).add(content)
        return [] if dialling else [Dial(peer)]

    def opened(self, event: LinkOpened, now: float,
               present: Container[ContentId]) -> list[LinkAction]:
        """A link is up; a dialled one carries our Join for the contents (of
        `present`) that waited on it."""
        self._peer_of[event.link] = event.peer
        self._newest[event.peer] = event.link
        if not event.dialled:
            return []
        actions: list[LinkAction] = []
        for content in sorted(self._dial_for.pop(event.peer, ())):
            if content in present:
                actions += self._send_join(content, event.peer, event.link, now)
        return actions

    def dial_failed(self, event: DialFailed) -> tuple[list[LinkAction], list[ContentId]]:
        """The reports to make, and the contents (sorted) whose swarms lose the peer."""
        contents = sorted(self._dial_for.pop(event.peer, ()))
        reports: list[LinkAction] = ([ReportUnreachable(c, event.peer) for c in contents]
                                     if event.unreachable else [])
        return reports, [c for c in contents if not self.joined(c, event.peer)]

    def heard(self, event: JoinHeard, now: float) -> tuple[list[LinkAction], bool]:
        """A peer's Join: our answer, and whether its swarm hears it joined."""
        content, peer, link = event.content, event.peer, event.link
        joined = self._joined.setdefault(content, {})
        current = joined.get(peer)
        if current is not None and current != link:
            return self._send_join(content, peer, link, now), False  # a second link
        self.deadlines.pop((content, peer), None)
        answered = self._unanswered.get(content, {}).pop(link, None) is not None
        joined[peer] = link
        if current is None and answered:
            return [], True
        return [SendJoin(link, content)], True  # first answer, or a restart: again

    def closed(self, link: LinkId) -> list[tuple[ContentId, PeerId]]:
        """A link closed: the (content, peer) joins it carried, which are lost."""
        peer = self._peer_of.pop(link, None)
        if peer is None:
            return []
        if self._newest.get(peer) == link:
            del self._newest[peer]
        lost = []
        for content, joined in self._joined.items():
            if joined.get(peer) == link:
                del joined[peer]
                lost.append((content, peer))
        for unanswered in self._unanswered.values():
            unanswered.pop(link, None)
        return lost

    def drop(self, content: ContentId, peer: PeerId) -> bool:
        """Forget `peer` in `content`, and our Join to it: a swarm disconnected it.
        Whether it was joined."""
        unanswered = self._unanswered.get(content)
        if unanswered:
            for link in [k for k, p in unanswered.items() if p == peer]:
                del unanswered[link]
        return self._joined.get(content, {}).pop(peer, None) is not None

    def due(self, now: float) -> list[tuple[ContentId, PeerId]]:
        """The Joins unanswered past their deadline (a peer's Join, on any link, stops
        its clock): those peers are lost to their contents' swarms."""
        late = [key for key, deadline in self.deadlines.items() if deadline <= now]
        for key in late:
            del self.deadlines[key]
        return late

    def _send_join(self, content: ContentId, peer: PeerId, link: LinkId,
                   now: float) -> list[LinkAction]:
        if link in self._unanswered.get(content, ()) or self.link_of(content, peer) == link:
            return []  # it went out there already
        self._unanswered.setdefault(content, {})[link] = peer
        if not self.joined(content, peer):
            self.deadlines.setdefault((content, peer), now + JOIN_TIMEOUT_S)
        return [SendJoin(link, content)]
