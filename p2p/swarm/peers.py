"""What one node knows of its connected peers for one content. No I/O.

Bookkeeping only: which chunks each peer holds and is fetching from the
origin, and our requests to it. Which peer to ask, when, and what a failure
costs are the swarm's decisions (`scheduling.py`, `swarm.py`); this table keeps the figures
those decisions read consistent with each other: how many peers hold each
chunk, the masks of chunks held, pending and requested, and the number of
requests in flight. Times are passed in; nothing here reads a clock or draws
a random number.
"""

from __future__ import annotations

from collections.abc import Iterable

from p2p.content import PeerId
from p2p.swarm import bits


class PeerState:
    """What we know of one connected peer."""

    __slots__ = ("backoff_until", "failures", "have", "inflight", "peer", "pending", "rack",
                 "rate", "same_rack")

    def __init__(self, peer: PeerId, rack: str, have: int, same_rack: bool) -> None:
        self.peer = peer
        self.rack = rack
        self.same_rack = same_rack  # in our rack (the rack-aware chooser's first key)
        self.have = have
        self.pending: dict[int, float] = {}  # chunk -> when the mark expires
        self.inflight: dict[int, tuple[float, float]] = {}  # chunk -> (sent, deadline)
        self.failures = 0
        self.backoff_until = 0.0
        self.rate = 0.0


class PeerTable:
    """Connected peers, their chunks, and our requests to them; see the module docstring.

    Pending marks are counted per chunk, like holders, so that a have or a
    withdrawal costs O(1) however many marks there are: with `relay_fetching`
    every request a peer makes is a mark. Their earliest expiry is kept too,
    recomputed only when the mark that held it goes.
    """

    def __init__(self, chunks: int) -> None:
        self.peers: dict[PeerId, PeerState] = {}
        # The same states in the order they joined (the dict's order): the scheduling
        # pass walks them every time, and a list is walked without a dict iterator.
        self.states: list[PeerState] = []
        self.avail = [0] * chunks  # connected peers holding each chunk
        self.avail_mask = 0
        self._pending_count = [0] * chunks  # connected peers with a mark of each chunk
        self.pending_mask = 0  # chunks some peer is fetching (from the origin, or relayable)
        self._expiry: float | None = None  # the earliest mark's expiry (None: recompute)
        self.requested = 0  # chunks with at least one request in flight
        self.inflight_total = 0  # requests in flight, duplicates included
        self.requesters: dict[int, list[PeerId]] = {}
        self.changes = 0  # bumped whenever `requested` or `requesters` may have changed

    def add(self, state: PeerState, pending: Iterable[int], until: float) -> None:
        self.drop(state.peer)  # (a peer joining again starts afresh, last in the order)
        self.peers[state.peer] = state
        self.states.append(state)
        avail = self.avail
        for chunk in bits.indices(state.have):
            avail[chunk] += 1
        self.avail_mask |= state.have
        for chunk in pending:
            self.pending(state, chunk, until)

    def has(self, state: PeerState, chunk: int) -> None:
        bit = 1 << chunk  # (once: past 62 chunks each mask operation makes an int)
        if not state.have & bit:
            state.have |= bit
            self.avail[chunk] += 1
            if self.avail[chunk] == 1:
                self.avail_mask |= bit
        if state.pending and chunk in state.pending:  # (else `withdrawn` does nothing)
            self.withdrawn(state, chunk)

    def pending(self, state: PeerState, chunk: int, until: float) -> None:
        old = state.pending.get(chunk)
        state.pending[chunk] = until
        if old is None:
            self._pending_count[chunk] += 1
            self.pending_mask |= 1 << chunk
        elif old == self._expiry:
            self._expiry = None
        if self._expiry is not None and until < self._expiry:
            self._expiry = until

    def withdrawn(self, state: PeerState, chunk: int) -> None:
        until = state.pending.pop(chunk, None)
        if until is None:
            return
        self._pending_count[chunk] -= 1
        if not self._pending_count[chunk]:
            self.pending_mask &= ~(1 << chunk)
        if until == self._expiry:
            self._expiry = None

    def forget_pending(self, chunk: int) -> None:
        """Drop every peer's mark of `chunk` (we hold it now)."""
        if self.pending_mask >> chunk & 1:
            count = self._pending_count
            for state in self.states:
                if chunk in state.pending:
                    self.withdrawn(state, chunk)
                    if not count[chunk]:
                        break  # that was the last mark: the other peers have none

    def asked(self, peer: PeerId, chunk: int, now: float, deadline: float) -> None:
        self.peers[peer].inflight[chunk] = (now, deadline)
        self.inflight_total += 1
        self.changes += 1
        self.requesters.setdefault(chunk, []).append(peer)
        self.requested |= 1 << chunk

    def clear_request(self, chunk: int, peer: PeerId | None) -> float | None:
        """Forget `peer`'s request for `chunk`; returns when it was sent, if it was."""
        if peer is None:
            return None
        state = self.peers.get(peer)
        entry = state.inflight.pop(chunk, None) if state else None
        if entry is not None:
            self.inflight_total -= 1
        askers = self.requesters.get(chunk)
        if askers and peer in askers:
            self.changes += 1
            askers.remove(peer)
            if not askers:
                del self.requesters[chunk]
                self.requested &= ~(1 << chunk)
        return entry[0] if entry else None

    def clear_all(self, chunk: int) -> list[PeerId]:
        """Forget every request for `chunk` (it arrived); the peers still asked."""
        others = self.requesters.pop(chunk, None)
        if others is None:
            return []  # (no one asked: nothing changes, `requested` lacks the chunk already)
        self.changes += 1
        for other in others:
            if self.peers[other].inflight.pop(chunk, None) is not None:
                self.inflight_total -= 1
        self.requested &= ~(1 << chunk)
        return others

    def drop(self, peer: PeerId) -> None:
        state = self.peers.get(peer)
        if state is None:
            return
        for chunk in list(state.inflight):
            self.clear_request(chunk, peer)
        for chunk in list(state.pending):
            self.withdrawn(state, chunk)
        del self.peers[peer]
        self.states.remove(state)
        for chunk in bits.indices(state.have):
            self.avail[chunk] -= 1
            if self.avail[chunk] == 0:
                self.avail_mask &= ~(1 << chunk)

    def expire_pending(self, now: float) -> None:
        expiry = self.pending_expiry()
        if expiry is None or expiry > now:
            return
        for state in self.states:
            for chunk in [c for c, until in state.pending.items() if until <= now]:
                self.withdrawn(state, chunk)

    def pending_expiry(self) -> float | None:
        """When the earliest pending mark expires (None: there is none)."""
        if self._expiry is None and self.pending_mask:
            self._expiry = min(until for state in self.states
                               for until in state.pending.values())
        return self._expiry if self.pending_mask else None

    def add_deadlines(self, times: list[float]) -> None:
        """Append when requests time out and the earliest pending mark expires."""
        for state in self.states:
            for _, deadline in state.inflight.values():
                times.append(deadline)
        expiry = self.pending_expiry()
        if expiry is not None:
            times.append(expiry)
