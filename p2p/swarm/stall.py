"""What a swarm tried while it made no progress, and when it must give up.

A content whose every source is gone (a dead origin, no honest peer) must not
wait for ever: once `deadline_s` passes with chunks still wanted and none
arriving, the swarm aborts, and the reason says what was tried so an operator
can tell a dead origin from an empty swarm. The clock is restarted by every
verified arrival and by every chunk lost from the store (the node wants
something again after a pause).

A definite answer from the origin (404, refused, wrong length: see
`p2p.origin.OriginError`) ends the wait much sooner: once the origin has
given only such answers for `refused_s` since the last progress (at least
two of them), the swarm gives up as soon as no connected peer holds or is
fetching a missing chunk (the swarm checks that, this class only keeps the
time). Transient errors (time-outs, 5xx) keep the long deadline, and the
swarm's backoff retries them.

No I/O and no clock: `now` comes from the caller, like everything in the core.
"""

from __future__ import annotations

from p2p.content import PeerId

_NAMED_PEERS = 5  # peers listed by name in the reason; the rest are counted


class Stall:
    def __init__(self, deadline_s: float, now: float, refused_s: float = 0.0) -> None:
        self.deadline_s = deadline_s
        self.refused_s = refused_s
        self.since = now
        self.origin_failures = 0
        self.origin_error: str | None = None
        self.refusals = 0  # definite answers since the last progress
        self.refused_since: float | None = None  # the first of them
        self._peers: dict[PeerId, None] = {}  # tried since the last progress, in order

    @property
    def due(self) -> float:
        return self.since + self.deadline_s

    @property
    def refused_due(self) -> float | None:
        """When the origin's definite answers have lasted long enough to give up on it."""
        if self.refused_since is None:
            return None
        return self.refused_since + self.refused_s

    def refused(self, now: float) -> bool:
        """Whether the origin, asked at least twice, has said only "no" for `refused_s`."""
        due = self.refused_due
        return due is not None and self.refusals >= 2 and now >= due

    def progressed(self, now: float) -> None:
        self.since = now
        self.origin_failures = 0
        self.origin_error = None
        self.refusals = 0
        self.refused_since = None
        self._peers.clear()

    def origin_failed(self, reason: str, now: float, definite: bool = False) -> None:
        self.origin_failures += 1
        self.origin_error = reason
        if definite:
            self.refusals += 1
            if self.refused_since is None:
                self.refused_since = now

    def peer_tried(self, peer: PeerId) -> None:
        self._peers[peer] = None

    def refused_reason(self, missing: int, chunks: int) -> str:
        """Why the swarm gives up on a content whose origin says it cannot serve it."""
        return (f"the origin cannot serve this content ({self.refusals} definite answers in "
                f"{self.refused_s:g} s, last: {self.origin_error}) and no peer holds any of "
                f"the {missing} of {chunks} chunks missing")

    def reason(self, missing: int, chunks: int) -> str:
        """Why the swarm gives up, naming what it tried."""
        if self.origin_failures:
            origin = (f"the origin failed {self.origin_failures} times, last: "
                      f"{self.origin_error}")
        else:
            origin = "the origin was never read (other nodes were appointed to read it)"
        if self._peers:
            names = list(self._peers)
            shown = ", ".join(names[:_NAMED_PEERS])
            more = f" and {len(names) - _NAMED_PEERS} more" if len(names) > _NAMED_PEERS else ""
            peers = f"asked peers {shown}{more}"
        else:
            peers = "no peer offered a missing chunk"
        return (f"no chunk arrived for {self.deadline_s:g} s with {missing} of {chunks} chunks "
                f"missing: {origin}; {peers}")
