"""Announcing the agent's contents to the tracker: the I/O of the node core's announces.

Theory of operation. When to announce and what each content asks for are
the node core's decisions (p2p.swarm.node: one request for all contents, at
once when a content opens or completes, early when the swarm grows, `want`
0 once a content needs no more peers). This module only carries them out:
`send` makes the core's `AnnounceAll` one batched request, hands each
content's answer (peers, origin slot) to the owner, which gives it to that
content's swarm, and then tells the owner the announce is over (`announced`,
with the interval the tracker asks for, or None if it failed: a failed
announce is logged and the core tries again later).

A content that fails or is evicted is announced "stopped" with nothing held
(`gone`, the core's `Leave`); a stopping agent says "stopped" for all its
contents in one request (`goodbye`).
"""

from __future__ import annotations

import contextlib
import logging
from typing import Protocol

from p2p.auth import AuthError
from p2p.content import ContentId, PeerId
from p2p.metrics import AgentMetrics
from p2p.peer import PeerInfo
from p2p.session import Session
from p2p.swarm.node import AnnounceItem
from p2p.tracker_client import (
    AnnounceReply,
    ContentState,
    TrackerClient,
    TrackerError,
    TrackerUnavailable,
)

log = logging.getLogger(__name__)

START_CHECK_NAME = "bootseer/agent-start-check"  # never published: the tracker says 404


class AnnouncerOwner(Protocol):
    me: PeerInfo | None  # None until the agent has started
    sessions: dict[ContentId, Session]

    def tracker_replied(self, session: Session, reply: AnnounceReply) -> None: ...
    def announced(self, interval_s: float | None, handed_out: tuple[PeerId, ...]) -> None: ...


class Announcer:
    """The agent's announces; see the module docstring."""

    def __init__(self, owner: AnnouncerOwner, tracker: TrackerClient,
                 metrics: AgentMetrics | None = None) -> None:
        self._owner = owner
        self._tracker = tracker
        self._metrics = metrics

    async def send(self, items: tuple[AnnounceItem, ...]) -> None:
        """One announce of `items`; the owner always hears that it ended."""
        sessions = self._owner.sessions
        states = [ContentState(i.content, i.have, i.complete, want=i.want,
                               origin_bytes=s.origin_bytes if (s := sessions.get(i.content))
                               else 0) for i in items]
        try:
            replies = await self._announce(states)
        except (TrackerUnavailable, TrackerError) as exc:
            log.warning("announce of %d contents failed: %s", len(states), exc)
            if self._metrics is not None:
                self._metrics.tracker_reachable.set(0)
                self._metrics.announce_failures.inc()
            self._owner.announced(None, ())
            return
        except BaseException:  # a bug, or the agent stopping: the core must not wait forever
            self._owner.announced(None, ())
            raise
        if self._metrics is not None:
            self._metrics.tracker_reachable.set(1)
        handed_out: list[PeerId] = []
        for state in states:
            reply = replies[state.content]
            handed_out += [info.peer for info in reply.peers]
            session = sessions.get(state.content)
            if session is not None:  # it may have closed while we waited
                self._owner.tracker_replied(session, reply)
        self._owner.announced(next(iter(replies.values())).interval, tuple(handed_out))

    async def check(self) -> None:
        """Ask the tracker once, at start, so that a tracker down or a wrong cluster secret is
        said at once, not at the first announce (which waits for a content to announce)."""
        try:
            await self._tracker.get_name(START_CHECK_NAME)
        except TrackerError as exc:
            if exc.status != 404:  # 404: it answered us, and has no such name
                self._unreachable(f"the tracker at {self._tracker.base_url} refused this "
                                  f"node ({exc}); if it says unauthenticated, this node's "
                                  "cluster secret is not the tracker's")
                return
        except TrackerUnavailable as exc:
            self._unreachable(f"{exc}; the agent keeps trying at every announce")
            return
        except AuthError as exc:  # the reply's signature: the tracker holds another secret
            self._unreachable(f"the tracker at {self._tracker.base_url} signs its replies "
                              f"with another cluster secret ({exc})")
            return
        if self._metrics is not None:
            self._metrics.tracker_reachable.set(1)
        log.info("the tracker at %s answers", self._tracker.base_url)

    def _unreachable(self, message: str) -> None:
        log.error("%s", message)
        if self._metrics is not None:
            self._metrics.tracker_reachable.set(0)

    async def goodbye(self) -> None:
        if self._owner.sessions:
            await self._announce([ContentState(c, 0, False, "stopped")
                                  for c in self._owner.sessions])

    async def gone(self, content: ContentId) -> None:
        with contextlib.suppress(TrackerUnavailable, TrackerError):
            await self._announce([ContentState(content, 0, False, "stopped")])

    async def _announce(self, states: list[ContentState]) -> dict[ContentId, AnnounceReply]:
        me = self._owner.me
        assert me is not None
        return await self._tracker.announce_all(me.peer, me.addr, me.rack, states)
