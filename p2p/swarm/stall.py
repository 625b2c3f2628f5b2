"""What a swarm tried while it made no progress, and when it must give up.

A content whose every source is gone (a dead origin, no honest peer) must not
wait for ever: once `deadline_s` passes with chunks still wanted and none
arriving, the swarm aborts, and the reason says what was tried so an operator
can tell a dead origin from an empty swarm. The clock is restarted by every
verified arrival and by every chunk lost from the store (the node wants
something again after a pause).

No I/O and no clock: `now` comes from the caller, like everything in the core.
"""

from __future__ import annotations

from p2p.content import PeerId

_NAMED_PEERS = 5  # peers listed by name in the reason; the rest are counted


class Stall:
    def __init__(self, deadline_s: float, now: float) -> None:
        self.deadline_s = deadline_s
        self.since = now
        self.origin_failures = 0
        self.origin_error: str | None = None
        self._peers: dict[PeerId, None] = {}  # tried since the last progress, in order

    @property
    def due(self) -> float:
        return self.since + self.deadline_s

    def progressed(self, now: float) -> None:
        self.since = now
        self.origin_failures = 0
        self.origin_error = None
        self._peers.clear()

    def origin_failed(self, reason: str) -> None:
        self.origin_failures += 1
        self.origin_error = reason

    def peer_tried(self, peer: PeerId) -> None:
        self._peers[peer] = None

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
