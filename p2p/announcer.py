"""Announcing the agent's contents to the tracker, and passing on what it hands out.

Theory of operation. The agent has one announce loop (`run`), and each pass
announces every open session's content in one request (the tracker's
batched announce): what we hold of each, whether it is complete. Then it
waits for the interval the tracker last asked for (the configured one before
its first answer) unless `soon` wakes it first: a session opened, or a peer
the tracker did not hand out joined, so a swarm grew and our origin-fetcher
slot may have changed. Announces woken early come no faster than one per
EARLY_ANNOUNCE_GAP_S. A content asks for peers only while it is incomplete
and has fewer links than the swarm would open (`want: 0` otherwise, as the
simulator assumes). Every content's reply (peers, origin slot) goes to the
owner, which hands it to that content's swarm; a failed announce is logged
and the loop goes on.

A content that fails or is evicted is announced "stopped" with nothing held
(`gone`); a stopping agent says "stopped" for all its contents in one
request (`goodbye`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Protocol

from p2p.content import ContentId
from p2p.peer import PeerInfo
from p2p.session import Session
from p2p.swarm import bits
from p2p.tracker_client import (
    AnnounceReply,
    ContentState,
    TrackerClient,
    TrackerError,
    TrackerUnavailable,
)

log = logging.getLogger(__name__)
EARLY_ANNOUNCE_GAP_S = 0.2  # announces prompted by new peers come no faster


class AnnouncerOwner(Protocol):
    me: PeerInfo | None  # None until the agent has started
    sessions: dict[ContentId, Session]

    def tracker_replied(self, session: Session, reply: AnnounceReply) -> None: ...


def _want(session: Session) -> int | None:
    """0 (no handout) once the content is complete or we hold as many links as the
    swarm would open; else None, the tracker's limit. The simulator models exactly
    this, and it spares the tracker most handouts of a running launch."""
    swarm = session.swarm
    return 0 if swarm.complete or len(session.links) >= swarm.config.max_peers else None


class Announcer:
    """The agent's announces; see the module docstring."""

    def __init__(self, owner: AnnouncerOwner, tracker: TrackerClient, interval_s: float) -> None:
        self._owner = owner
        self._tracker = tracker
        self._interval_s = interval_s
        self._wake = asyncio.Event()
        self._urgent = False  # a content just opened: no gap before its first announce

    async def run(self) -> None:
        """The node's announce loop; runs until cancelled."""
        loop = asyncio.get_running_loop()
        interval = self._interval_s
        while True:
            self._wake.clear()
            self._urgent = False
            last = loop.time()
            interval = await self._announce(list(self._owner.sessions)) or interval
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), interval)
            gap = last + EARLY_ANNOUNCE_GAP_S - loop.time()
            if gap > 0 and not self._urgent:
                await asyncio.sleep(gap)

    def soon(self, new_content: bool = False) -> None:
        """Announce early (all contents: one request covers them). A content just opened
        goes out at once: its launch waits on its first peers (an image opens six
        contents one after another, and a gap for each cost 0.3 s of a 2.3 s launch);
        other prompts (a peer joined) come no faster than EARLY_ANNOUNCE_GAP_S."""
        self._urgent = self._urgent or new_content
        self._wake.set()

    async def once(self, content: ContentId, event: str | None = None) -> float | None:
        """Announce `content`'s session alone, if it has one; the interval asked for."""
        return await self._announce([content], event)

    async def _announce(self, contents: list[ContentId],
                        event: str | None = None) -> float | None:
        me, sessions = self._owner.me, self._owner.sessions
        states = [ContentState(c, bits.count(s.swarm.have), s.swarm.complete, event,
                               want=_want(s), origin_bytes=s.origin_bytes)
                  for c in contents if (s := sessions.get(c)) is not None]
        if me is None or not states:
            return None
        try:
            replies = await self._tracker.announce_all(me.peer, me.addr, me.rack, states)
        except (TrackerUnavailable, TrackerError) as exc:
            log.warning("announce of %d contents failed: %s", len(states), exc)
            return None
        if event is not None:
            return None
        for state in states:
            session = sessions.get(state.content)
            if session is not None:  # it may have closed while we waited
                self._owner.tracker_replied(session, replies[state.content])
        return next(iter(replies.values())).interval

    async def goodbye(self) -> None:
        await self._announce(list(self._owner.sessions), event="stopped")

    async def gone(self, session: Session) -> None:
        me = self._owner.me
        assert me is not None
        with contextlib.suppress(TrackerUnavailable, TrackerError):
            await self._tracker.announce_all(me.peer, me.addr, me.rack,
                                             [ContentState(session.content, 0, False, "stopped")])
