"""Announcing the agent's contents to the tracker, and passing on what it hands out.

Theory of operation. Each session has one announce loop: it announces, then
waits for the interval the tracker last asked for (the configured one before
its first answer) unless `soon` wakes it first: a peer the tracker did
not hand out joined, so the swarm grew and our origin-fetcher slot may have
changed. Announces woken early come no faster than one per
EARLY_ANNOUNCE_GAP_S. Every reply (peers, origin slot) goes to the owner,
which hands it to the swarm; a failed announce is logged and the loop goes on.

A content that fails or is evicted is announced "stopped" with nothing held
(`gone`); a stopping agent says "stopped" for all its contents at once
(`goodbye`).
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
from p2p.tracker_client import AnnounceReply, TrackerClient, TrackerError, TrackerUnavailable

log = logging.getLogger(__name__)
EARLY_ANNOUNCE_GAP_S = 0.2  # announces prompted by new peers come no faster


class AnnouncerOwner(Protocol):
    me: PeerInfo | None  # None until the agent has started
    sessions: dict[ContentId, Session]

    def tracker_replied(self, session: Session, reply: AnnounceReply) -> None: ...


class Announcer:
    """The agent's announces; see the module docstring."""

    def __init__(self, owner: AnnouncerOwner, tracker: TrackerClient, interval_s: float) -> None:
        self._owner = owner
        self._tracker = tracker
        self._interval_s = interval_s

    async def loop(self, session: Session) -> None:
        interval = self._interval_s
        while True:
            session.wake_announcer.clear()
            interval = await self.once(session.content) or interval
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(session.wake_announcer.wait(), interval)
            await asyncio.sleep(EARLY_ANNOUNCE_GAP_S)

    def soon(self, session: Session) -> None:
        session.wake_announcer.set()

    async def once(self, content: ContentId, event: str | None = None) -> float | None:
        """Announce `content`'s session, if it has one; the interval the tracker asks for."""
        session, me = self._owner.sessions.get(content), self._owner.me
        if session is None or me is None:
            return None
        try:
            reply = await self._tracker.announce(
                content, me.peer, me.addr, me.rack,
                bits.count(session.swarm.have), session.swarm.complete, event=event)
        except (TrackerUnavailable, TrackerError) as exc:
            log.warning("announce for %s failed: %s", content, exc)
            return None
        if event is not None:
            return None
        self._owner.tracker_replied(session, reply)
        return reply.interval

    async def goodbye(self) -> None:
        await asyncio.gather(*(self.once(content, event="stopped")
                               for content in list(self._owner.sessions)))

    async def gone(self, session: Session) -> None:
        me = self._owner.me
        assert me is not None
        with contextlib.suppress(TrackerUnavailable, TrackerError):
            await self._tracker.announce(session.content, me.peer, me.addr, me.rack, 0, False,
                                         event="stopped")
