"""One content, as seen by one node: the swarm state machine.

Theory of operation
-------------------
The swarm tracks which chunks this node holds, which it *wants*, which
connected peers hold or are fetching which chunks, and which requests are in
flight. An eager swarm (the default) wants every chunk. A lazy one (`lazy=True`,
for a content that is read, not copied: a container image) starts wanting
nothing; reader demand (`ReaderWants`) and prefetch lists (`PrefetchGiven`) add
to what it wants, for good, and `WantedAll` makes it eager. Everything below
works on the *missing* chunks, wanted and not held; a lazy swarm with none
missing is idle (no requests, no origin, no deadline) but still connects, so
peers can read from it. `Complete` still means every chunk is held.
After every event and timer it fills free request slots, by the rules of
`p2p.swarm.scheduling` (peers first, then the origin, each byte from the origin
about once), whose class holds the state this one changes.

Failures: a request that times out or is rejected counts against the peer,
which then backs off exponentially. One that times out while it still waits
for our download budget is cancelled and its budget comes back (without that,
on a capped node, re-asked chunks pile up budget debt until nothing goes out);
one already sent is left to finish: its piece is taken if the chunk is still
missing when it comes (cancelling those too took twice as long in a swarm whose
requests time out, tests/simulations/test_sim.py's late-piece scenario). A peer that sends
bytes failing verification is banned, disconnected and reported. An origin that fails is
retried with backoff; one that keeps serving bad bytes aborts the content.
When no chunk arrives for `no_source_deadline_s` while chunks are missing, the
content aborts with what was tried (see `stall.py`); when the origin's only
answers for `origin_refused_s` were definite ones (404, refused) and no
connected peer holds or is fetching a missing chunk, it aborts then, with the
origin's answer. A held chunk that the
store later finds damaged (`ChunkLost`) is fetched again if it is wanted, even
after Complete.

It never reads a clock, touches a socket or a file, or uses the global random
module: `now` comes with every call and the rng is passed in. That is why the
agent and the simulator run it unchanged.
"""

from __future__ import annotations

from typing import Final

from p2p.content import PeerId
from p2p.swarm import bits
from p2p.swarm.events import (
    Abort,
    Action,
    Advertise,
    Cancel,
    ChunkArrived,
    ChunkFailed,
    ChunkLost,
    Complete,
    Disconnect,
    Event,
    PeerHas,
    PeerJoined,
    PeerLost,
    PeerPending,
    PeersFound,
    PeerWithdrew,
    PrefetchGiven,
    ReaderWants,
    Report,
    WantedAll,
    Withdraw,
)
from p2p.swarm.origin import owned_chunks, region_start, vacant_chunks
from p2p.swarm.peers import PeerState
from p2p.swarm.scheduling import Scheduling, ban_key

# Events a finished swarm still takes: what is wanted may grow (a tuple, not a union
# written in `handle`, which would build one per call).
_REOPENING: Final = (ReaderWants, PrefetchGiven, WantedAll)


class Swarm(Scheduling):
    """One content, as seen by one node.

    Driven by events (`handle`) and by time (`handle_timer`, due at
    `next_timer`). Both take `now` in seconds on the caller's clock and return
    the actions the caller must carry out.

    `lazy` is an argument, not a `SwarmConfig` knob: the config is the node's
    policy, shared by every content, while lazy or eager is a property of one
    content, decided by how it was asked for (read or ensured).
    """

    # ---- queries --------------------------------------------------------------

    @property
    def complete(self) -> bool:
        return self._have == self._all

    @property
    def have(self) -> int:
        """Held chunks as a bit mask (see `p2p.swarm.bits`)."""
        return self._have

    def held(self, chunk: int) -> bool:
        return bool(self._have >> chunk & 1)

    def relaying(self, chunk: int) -> bool:
        """Whether we announced `chunk` as pending because we fetch it from a peer
        (`relay_fetching`): a peer may ask us to relay it as it arrives."""
        return chunk in self._feeders

    def relay_feeder(self, chunk: int) -> PeerId | None:
        """The peer a relayable chunk comes from (the request its mark rests on): we
        never relay the chunk to it, or each would wait on the other (p2p.relay)."""
        return self._feeders.get(chunk)

    @property
    def relayable(self) -> int:
        """The chunks `relaying` says so of, as a bit mask (a Join lists them as pending)."""
        return bits.from_indices(self._feeders) & ~self._have

    def join_view(self) -> tuple[tuple[bool, ...], tuple[int, ...]]:
        """What our Join says of this content: the chunks held (flag `i` is chunk `i`),
        and those listed as pending, which we read from the origin now or may relay
        (`relaying`)."""
        pending = (self._origin_mask() | bits.from_indices(self._feeders)) & ~self._have
        if self._have != self._flags_of:  # (most Joins go out while nothing new arrived)
            self._flags, self._flags_of = bits.to_bools(self._have, self.chunks), self._have
        return self._flags, tuple(bits.indices(pending))

    @property
    def held_bytes(self) -> int:
        """Bytes held, counting every chunk as full-sized (the last may be shorter)."""
        return self._have.bit_count() * self._chunk_bytes

    def wants_view(self, now: float) -> bool:
        """Whether we wait for a fresh answer of the tracker before covering the vacant
        fetcher slots: their grace is over, and the count of fetchers we have is from
        before it ended (the driver announces soon; `_owned_now` says why)."""
        return self._view_at < self._vacant_from <= now and bool(self._vacant & self._missing())

    def peer_progress(self, peer: PeerId) -> int:
        """Chunks `peer` holds, as far as we know (0 if it is not connected): the rank
        of its requests for our upload slots (p2p.swarm.uploads)."""
        state = self._peers.get(peer)
        return 0 if state is None else state.have.bit_count()

    @property
    def lazy(self) -> bool:
        """Fetching only what readers and prefetch lists asked for (until `WantedAll`)."""
        return not self._eager

    @property
    def wanted(self) -> int:
        """Chunks to fetch, held or not, as a bit mask: all of them unless lazy."""
        return self._wanted

    @property
    def fetching(self) -> bool:
        """Some wanted chunk is not held yet."""
        return bool(self._missing())

    @property
    def peers(self) -> list[PeerId]:
        return sorted(self._peers)

    @property
    def peer_count(self) -> int:
        """Peers joined to this swarm (linked, their Join heard)."""
        return len(self._peers)

    def joined(self, peer: PeerId) -> bool:
        """Whether `peer` is joined to this swarm."""
        return peer in self._peers

    def start(self, now: float) -> list[Action]:
        """The first actions: connect to known peers, fetch owned chunks."""
        if self.complete:
            self._finished = True
            return [Complete()]
        return self._schedule(now)

    # ---- events ---------------------------------------------------------------

    def handle(self, event: Event, now: float) -> list[Action]:
        self._now = now
        if isinstance(event, ChunkLost):
            return self._on_chunk_lost(event.chunk, now)
        if self._finished and not isinstance(event, _REOPENING):
            return []  # what is wanted is still recorded: a lost chunk may reopen the swarm
        kind = type(event)
        if kind is PeerHas:
            assert isinstance(event, PeerHas)
            state = self._peers.get(event.peer)
            chunk = event.chunk
            if state is not None and 0 <= chunk < self.chunks \
                    and not self._could_ask(state, chunk, now):
                # The common case in a big swarm: only availability changes. Nothing new
                # can be asked of this peer, so skip the scheduling pass.
                self._table.has(state, chunk)
                return []
        elif kind is PeerPending:
            assert isinstance(event, PeerPending)
            state = self._peers.get(event.peer)
            chunk = event.chunk
            if state is None:
                return []  # (what `_on_peer_pending` does for a peer we do not know)
            if not 0 <= chunk < self.chunks:
                return self._on_peer_pending(event.peer, chunk, now)  # (hostile: Disconnect)
            if not self._may_relay(state, chunk, now):
                # Someone else fetching a chunk can only take work off our hands.
                if not self._have >> chunk & 1:  # a mark of a held chunk is moot
                    self._table.pending(state, chunk, now + self.config.pending_ttl_s)
                return []
        actions: list[Action] = []
        # (No positional captures in these patterns: compiled, a capture is a generic
        # attribute lookup, and these arms run for most events of a big simulation.)
        match event:
            case PeersFound():
                self._on_peers_found(event, now)
            case PeerJoined():
                actions += self._on_peer_joined(event, now)
            case PeerHas():
                actions += self._on_peer_has(event.peer, event.chunk)
            case PeerPending():
                actions += self._on_peer_pending(event.peer, event.chunk, now)
            case PeerWithdrew():
                actions += self._on_peer_withdrew(event.peer, event.chunk)
            case PeerLost():
                self._drop_peer(event.peer, now)
                if event.hostile:
                    self._retry_at[event.peer] = now + self.config.backoff_max_s
                    actions.append(Report(event.peer, event.reason))
            case ChunkArrived():
                actions += self._on_chunk_arrived(event, now)
            case ChunkFailed():
                actions += self._on_chunk_failed(event, now)
            case ChunkLost():
                pass  # handled above: it may reopen a finished swarm
            case ReaderWants():
                self._demand = [c for c in event.chunks if 0 <= c < self.chunks] + self._demand
                self._want(bits.from_indices(self._demand), now)
            case PrefetchGiven():
                self._prefetch = [c for c in event.chunks if 0 <= c < self.chunks]
                self._prefetch_mask = bits.from_indices(self._prefetch)
                self._want(self._prefetch_mask, now)
            case WantedAll():
                self._eager = True
                self._want(self._all, now)
        if self._finished:
            return actions
        if self._stall.refusals >= 2 and (abort := self._given_up(now)):
            self._finished = self._aborted = True  # the origin said "no" and no peer is left
            return [*actions, abort]
        return actions + self._schedule(now)

    def _want(self, chunks: int, now: float) -> None:
        if not self._missing() and chunks & ~self._have:
            # Idle until now: patience and the no-source deadline count from here, not
            # from the last arrival, which may be hours old.
            self._last_progress = now
            self._stall.progressed(now)
        if chunks & self._vacant & ~self._have and not self._missing() & self._vacant:
            self._start_grace(now)
        self._wanted |= chunks
        self._miss = self._wanted & ~self._have

    def _start_grace(self, now: float) -> None:
        """Fetcher 0 leaves the vacant slots' chunks alone until `vacant_grace_s` from now:
        from its appointment, or from when it first wants them if that is later (a lazy
        content attached at mount time and ensured when the launch needs it: the nodes
        that attached with it ensure it at about the same moment, too)."""
        self._vacant_from = now + self.config.vacant_grace_s
        self._vacant_latest = now + 2 * self.config.vacant_grace_s

    def _on_chunk_lost(self, chunk: int, now: float) -> list[Action]:
        if self._aborted or not 0 <= chunk < self.chunks or not self.held(chunk):
            return []
        self._have &= ~(1 << chunk)
        self._miss = self._wanted & ~self._have
        self._finished = False
        self._stall.progressed(now)  # the deadline counts from when we want it again
        return self._schedule(now)

    def _on_peers_found(self, event: PeersFound, now: float) -> None:
        for hint in event.peers:
            if hint.peer != self.me:
                self._known[hint.peer] = hint.rack
        if self._settle_until is None:
            # Before our first origin fetch, hear what the peers we were just told
            # about are fetching (their Join carries it), or wait `settle_s`.
            self._unheard = {h.peer for h in event.peers
                             if h.peer != self.me and h.peer not in self._peers}
            self._settle_until = now + self.config.settle_s if self._unheard else now
        self._view_at = now
        self._owned = owned_chunks(self.chunks, event.origin_slot, event.origin_slots,
                                   event.origin_filled)
        vacant = vacant_chunks(self.chunks, event.origin_slot, event.origin_slots,
                               event.origin_filled)
        if vacant & self._missing() and not self._vacant:
            self._start_grace(now)
        self._vacant = vacant
        self._fetchers_appointed = event.origin_filled is None or event.origin_filled > 0
        if event.origin_slot is not None:
            self._origin_start = region_start(self.chunks, event.origin_slot, event.origin_slots)

    def _on_peer_joined(self, event: PeerJoined, now: float) -> list[Action]:
        peer = event.peer
        self._connecting.discard(peer)
        self._unheard.discard(peer)
        key = ban_key(peer, event.host)
        if key in self._banned:
            return [Disconnect(peer, "banned for sending corrupt data", hostile=True)]
        if len(event.have) != self.chunks or any(not 0 <= c < self.chunks for c in event.pending):
            return self._misbehaved(peer, "bad join message", now)
        if peer in self._peers:
            self._drop_peer(peer, now)
        self._ban_keys[peer] = key
        self._table.add(PeerState(peer, event.rack, bits.from_bools(event.have),
                                  event.rack == self.rack),
                        [c for c in event.pending if not self.held(c)],
                        now + self.config.pending_ttl_s)
        self._known.setdefault(peer, event.rack)
        if self._vacant and now < self._vacant_from:
            # Likely a node that started with us, appointed to a vacant slot this moment:
            # its pending marks come right after its Join (seen: 0.13 s later on a loaded
            # machine, after our grace had sent us to the origin for its chunk too).
            self._vacant_from = min(now + self.config.vacant_grace_s, self._vacant_latest)
        return []

    def _could_ask(self, state: PeerState, chunk: int, now: float) -> bool:
        """Could a have of `chunk` (in range) from the peer of `state` lead to a request
        right now? (If not, the have changes only availability.)"""
        return (bool(self._miss >> chunk & 1) and self._has_room(state, now)
                and (not self._table.requested >> chunk & 1 or self._end_game()))

    def _may_relay(self, state: PeerState, chunk: int, now: float) -> bool:
        """Could a pending mark of `chunk` (in range) from the peer of `state` lead to a
        relay request right now?"""
        return (self.config.relay_pending and bool(self._miss >> chunk & 1)
                and not self._table.requested >> chunk & 1 and self._has_room(state, now))

    def _has_room(self, state: PeerState, now: float) -> bool:
        """Whether `state`'s peer can take a request from us now."""
        return (len(state.inflight) < self.config.per_peer_inflight
                and state.backoff_until <= now
                and self._table.inflight_total < self.config.max_inflight)

    def _on_peer_has(self, peer: PeerId, chunk: int) -> list[Action]:
        state, refused = self._peer_chunk(peer, chunk, "announced")
        if state is not None:
            self._table.has(state, chunk)
        return refused

    def _on_peer_pending(self, peer: PeerId, chunk: int, now: float) -> list[Action]:
        state, refused = self._peer_chunk(peer, chunk, "pending")
        if state is not None and not self.held(chunk):  # a mark of a held chunk is moot
            self._table.pending(state, chunk, now + self.config.pending_ttl_s)
        return refused

    def _on_peer_withdrew(self, peer: PeerId, chunk: int) -> list[Action]:
        state, refused = self._peer_chunk(peer, chunk, "withdrawn")
        if state is not None:
            self._table.withdrawn(state, chunk)
            if chunk in state.inflight and not state.have >> chunk & 1:
                # We asked it to relay the chunk: it has nothing to send now (it rejects
                # the request), and that is not its fault.
                self._table.clear_request(chunk, peer)
        return refused

    def _peer_chunk(self, peer: PeerId, chunk: int,
                    what: str) -> tuple[PeerState | None, list[Action]]:
        """The state of a connected peer that said something of `chunk` (None if we do not
        know it), and the actions if the index is out of range: that is hostile."""
        state = self._peers.get(peer)
        if state is None or 0 <= chunk < self.chunks:
            return state, []
        return None, [Disconnect(peer, f"{what} chunk {chunk} out of range", hostile=True)]

    def _on_chunk_arrived(self, event: ChunkArrived, now: float) -> list[Action]:
        chunk, source = event.chunk, event.source
        if not 0 <= chunk < self.chunks:
            return []
        if not event.ok:
            return self._on_corrupt(chunk, source, now)
        actions: list[Action] = []
        sent = self._table.clear_request(chunk, source)
        if source is None:
            self._origin_done(chunk)
            self._origin_failures = 0
        elif (state := self._peers.get(source)) is not None:
            state.failures = 0
            if sent is not None and now > sent:
                rate = self._chunk_bytes / (now - sent)
                state.rate = rate if state.rate == 0 else 0.7 * state.rate + 0.3 * rate
        actions += [Cancel(other, chunk) for other in self._table.clear_all(chunk)]
        if self.held(chunk):
            return actions
        self._have |= 1 << chunk
        self._miss &= ~(1 << chunk)
        self._table.forget_pending(chunk)
        self._last_progress = now
        self._stall.progressed(now)
        self.stats["origin_chunks" if source is None else "peer_chunks"] += 1
        actions.append(Advertise(chunk))
        if self.complete:
            self._finished = True
            actions.append(Complete())
        return actions

    def _on_corrupt(self, chunk: int, source: PeerId | None, now: float) -> list[Action]:
        self.stats["corrupt"] += 1
        if source is None:
            self._origin_corrupt += 1
            gave_up = self._origin_failed(chunk, f"chunk {chunk} did not match the manifest",
                                          now)
            if self._origin_corrupt >= self.config.max_origin_corrupt:
                self._finished = self._aborted = True
                return [Abort(f"the origin served {self._origin_corrupt} chunks that do not "
                              "match the manifest")]
            return gave_up
        self._table.clear_request(chunk, source)
        self._banned.add(self._ban_keys.get(source, ban_key(source, "")))
        self._drop_peer(source, now)
        return [Disconnect(source, f"sent corrupt chunk {chunk}", hostile=True),
                Report(source, f"corrupt chunk {chunk}")]

    def _on_chunk_failed(self, event: ChunkFailed, now: float) -> list[Action]:
        if event.source is None:
            if event.chunk not in self._origin:
                return []
            return self._origin_failed(event.chunk, event.reason, now, event.definite)
        if self._table.clear_request(event.chunk, event.source) is None:
            return []
        state = self._peers.get(event.source)
        if state is not None and not state.have >> event.chunk & 1:
            # A relay that ended without the chunk: its origin fetch failed, which is not
            # the peer's fault. Its pending mark goes too, or we would ask again at once.
            self._table.withdrawn(state, event.chunk)
            return []
        return self._peer_failed(event.source, now)

    def _misbehaved(self, peer: PeerId, reason: str, now: float) -> list[Action]:
        self._drop_peer(peer, now)
        self._retry_at[peer] = now + self.config.backoff_max_s
        return [Disconnect(peer, reason)]

    # ---- time -----------------------------------------------------------------

    def next_timer(self) -> float | None:
        """When `handle_timer` must next run, on the caller's clock: the earliest of its
        deadlines still ahead (written as loops: the node asks after most events)."""
        if self._finished:
            return None
        after = self._now
        times = [*self._origin.values(), *self._retry_at.values()]
        if self._missing():
            settle = self._settle_until if self._settle_until is not None and self._unheard \
                else 0.0
            times += [self._origin_backoff_until, self._last_progress + self._patience(),
                      settle, self._vacant_from if self._vacant else 0.0,
                      self._stall.due, self._stall.refused_due or 0.0]
            for state in self._table.states:
                times.append(state.backoff_until)
        # (an idle lazy swarm has nothing to fetch, so nothing to be patient about)
        self._table.add_deadlines(times)
        best: float | None = None
        for t in times:
            if t > after and (best is None or t < best):
                best = t
        return best

    def handle_timer(self, now: float) -> list[Action]:
        self._now = now
        if self._finished:
            return []
        if abort := self._given_up(now):
            self._finished = self._aborted = True
            return [abort]
        actions: list[Action] = []
        for state in list(self._table.states):
            if not state.inflight:
                continue  # (most peers at most wake-ups)
            peer = state.peer
            late = [c for c, (_, deadline) in state.inflight.items() if deadline <= now]
            for chunk in late:
                self.stats["timeouts"] += 1
                self._table.clear_request(chunk, peer)
                actions.append(Cancel(peer, chunk, if_unsent=True))
            if late and peer in self._peers:
                actions += self._peer_failed(peer, now)
        for chunk in [c for c, deadline in self._origin.items() if deadline <= now]:
            actions += self._origin_failed(
                chunk, f"chunk {chunk} timed out after {self.config.origin_timeout_s:g} s", now)
        self._table.expire_pending(now)
        return actions + self._schedule(now)

    def _given_up(self, now: float) -> Abort | None:
        """An Abort if no source is left: the deadline passed, or the origin said "no" for
        long enough while no connected peer offers a missing chunk."""
        missing = self._missing()
        if not missing:
            return None
        if now >= self._stall.due:
            return Abort(self._stall.reason(bits.count(missing), self.chunks))
        offered = self._table.avail_mask | self._table.pending_mask
        if self._stall.refused(now) and not missing & offered:
            return Abort(self._stall.refused_reason(bits.count(missing), self.chunks))
        return None

    # ---- bookkeeping ----------------------------------------------------------

    def _drop_peer(self, peer: PeerId, now: float) -> None:
        self._ban_keys.pop(peer, None)
        self._connecting.discard(peer)
        self._unheard.discard(peer)
        self._retry_at.setdefault(peer, now + self.config.backoff_base_s)
        self._table.drop(peer)

    def _peer_failed(self, peer: PeerId, now: float) -> list[Action]:
        state = self._peers[peer]
        state.failures += 1
        if state.failures >= self.config.max_peer_failures:
            return self._misbehaved(peer, f"{state.failures} failed requests in a row", now)
        state.backoff_until = now + self._backoff(state.failures)
        return []

    def _origin_failed(self, chunk: int, why: str, now: float,
                       definite: bool = False) -> list[Action]:
        """Our origin fetch of `chunk` failed: back off, and take back its pending mark so
        that peers waiting on us for it look elsewhere at once."""
        self._origin_done(chunk)
        self._stall.origin_failed(why, now, definite)
        self._origin_backoff(now)
        return [Withdraw(chunk)] if self.config.use_peers else []

    def _origin_backoff(self, now: float) -> None:
        self._origin_failures += 1
        self._origin_backoff_until = now + self._backoff(self._origin_failures)

    def _backoff(self, failures: int) -> float:
        base = self.config.backoff_base_s * float(2 ** min(failures - 1, 16))
        return min(self.config.backoff_max_s, base) * (0.5 + self._rng.random() / 2)
