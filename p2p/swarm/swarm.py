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
After every event it fills free request slots:

1. Peers. Candidates are chunks we lack that no one is fetching for us and
   that a peer with a free slot holds. Reader demand goes first, then the
   prefetch order, then the named chunk picker (rarest first by default).
   Each chunk goes to the holder the named peer chooser ranks best (same rack,
   least loaded, fewest failures). When every missing chunk is already
   requested and only `endgame_tail` are left of an eager download (the end
   game), idle slots duplicate those requests; the first copy to arrive
   cancels the others. A lazy swarm has no end game: its few missing chunks
   are its readers' latest reads, and each would be fetched twice.
   Chunks are megabytes, not BitTorrent's 16 KiB blocks, so duplicates are
   kept to the very tail. Slots still free then go to chunks a peer is
   fetching from the origin (`relay_pending`): it relays the bytes as they
   arrive (p2p.relay). A relay that ends without the chunk (the peer's origin
   read failed) is not held against the peer; its pending mark goes instead.
   With `relay_fetching`, a rare chunk we ask of a peer is announced as pending
   too, and relayed on while it arrives; that mark goes when its request fails
   (`_announce_fetching` says why marks must never outlive their source).
2. The origin, for chunks that no connected peer holds or is fetching. The
   tracker appoints a few *origin fetchers* per swarm; fetcher `i` of `k`
   owns chunks `c % k == i` and fetches them at once, announcing each as
   pending so that peers wait for it instead of fetching it too. Any other
   node goes to the origin only when it has been starved for
   `origin_patience_s` while the tracker has not answered, or for
   `appointed_patience_s` once the tracker has appointed fetchers (the owner
   died, or no one in its view covers a chunk). The second is long on
   purpose: in a swarm of thousands, most nodes see no holder of a chunk for
   a few hops' time, and a short patience would send them all to the origin
   at once.
   That is how each byte leaves the origin about once, whatever the swarm size.
   A new fetcher first hears from the peers the tracker named (their Join
   lists what they are fetching), for at most `settle_s`, so fetchers that
   still disagree about their count do not start on the same chunks, and
   the fetchers cover the vacant fetcher slots' chunks (slot `v` falls to
   fetcher `v % filled`) only `vacant_grace_s` after they are appointed and
   want them (longer if peers join meanwhile), and only once the tracker,
   asked again after that (`wants_view`: the node announces), still counts
   them vacant; last and from the end down (p2p.swarm.origin says why).
   A lazy swarm differs in one rule: a chunk a reader is blocked on that no
   connected peer holds, is fetching, or has pending goes to the origin as soon
   as the swarm has settled, owned or not; prefetched chunks follow the rules
   above (an appointed fetcher fetches the owned chunks it wants), so nodes that
   all prefetch the same hot list read each byte from the origin about once.
   Known limit: at a cold launch with no recorded list, many nodes blocked on
   the same chunk all read it from the origin.

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

import math
import random
from collections.abc import Iterator, Sequence
from itertools import chain

from p2p.content import PeerId
from p2p.swarm import bits
from p2p.swarm.config import SwarmConfig
from p2p.swarm.events import (
    Abort,
    Action,
    Advertise,
    Cancel,
    ChunkArrived,
    ChunkFailed,
    ChunkLost,
    Complete,
    Connect,
    Disconnect,
    Event,
    FetchFromOrigin,
    PeerHas,
    PeerJoined,
    PeerLost,
    PeerPending,
    PeersFound,
    PeerWithdrew,
    PrefetchGiven,
    ReaderWants,
    Report,
    Request,
    WantedAll,
    Withdraw,
)
from p2p.swarm.origin import origin_order, owned_chunks, region_start, vacant_chunks
from p2p.swarm.peers import PeerState, PeerTable
from p2p.swarm.policy import CHUNK_PICKERS, PEER_CHOOSERS, PeerLoad
from p2p.swarm.stall import Stall

# Events a finished swarm still takes: what is wanted may grow (a tuple, not a union
# written in `handle`, which would build one per call).
_REOPENING = (ReaderWants, PrefetchGiven, WantedAll)


class Swarm:
    """One content, as seen by one node.

    Driven by events (`handle`) and by time (`handle_timer`, due at
    `next_timer`). Both take `now` in seconds on the caller's clock and return
    the actions the caller must carry out.

    `lazy` is an argument, not a `SwarmConfig` knob: the config is the node's
    policy, shared by every content, while lazy or eager is a property of one
    content, decided by how it was asked for (read or ensured).
    """

    def __init__(self, me: PeerId, rack: str, chunks: int, have: Sequence[bool],
                 chunk_bytes: int, config: SwarmConfig, rng: random.Random, now: float,
                 *, lazy: bool = False) -> None:
        if len(have) != chunks:
            raise ValueError(f"have has {len(have)} entries for {chunks} chunks")
        self.me, self.rack, self.chunks, self.config = me, rack, chunks, config
        self._chunk_bytes = chunk_bytes
        self._rng = rng
        self._picker = CHUNK_PICKERS[config.chunk_picker]()
        self._chooser = PEER_CHOOSERS[config.peer_chooser]()
        self._all = (1 << chunks) - 1
        self._have = bits.from_bools(have)
        self._eager = not lazy
        self._wanted = 0 if lazy else self._all
        self._miss = self._wanted & ~self._have  # `_missing()`, kept as the two change
        self._table = PeerTable(chunks)
        self._peers = self._table.peers
        self._origin: dict[int, float] = {}  # chunk -> deadline
        self._origin_bits = 0  # the chunks of `_origin`, as a mask (every pass reads it)
        self._origin_failures = 0
        self._origin_corrupt = 0
        self._origin_backoff_until = 0.0
        # Own nothing until the tracker appoints us: starting nodes would otherwise
        # all fetch the same first chunks. If the tracker never answers, the
        # patience rule still sends us to the origin.
        self._owned = 0
        self._vacant = 0  # of `_owned`: the vacant fetcher slots' chunks we cover
        self._vacant_from = 0.0  # ... which it fetches from this time on
        self._vacant_latest = 0.0  # ... or this one at the latest (peers joining put it off)
        self._view_at = float("-inf")  # when the tracker last told us the fetcher count
        self._settle_until: float | None = None  # set by the first PeersFound
        self._fetchers_appointed = False
        self._unheard: set[PeerId] = set()
        self._origin_start = rng.randrange(chunks) if chunks else 0
        self._known: dict[PeerId, str] = {}  # tracker hints: peer -> rack
        self._connecting: set[PeerId] = set()
        self._retry_at: dict[PeerId, float] = {}
        # Per-content bans for bad bytes, keyed by the address the peer's connection came
        # from (`_ban_key`): a peer id is only what a connection claims, and banning a
        # claimed id would let any node with the secret cut us off from the real one.
        self._banned: set[str] = set()
        self._ban_keys: dict[PeerId, str] = {}  # joined peers -> their ban key
        self._demand: list[int] = []
        self._prefetch: list[int] = []
        self._prefetch_mask = 0  # the chunks of `_prefetch`
        # Chunks requested of peers that we announced as pending, each with the peer its
        # mark rests on our request to (`relay_fetching`).
        self._feeders: dict[int, PeerId] = {}
        self._asked = 0  # chunks requested of peers when we last looked (_announce_fetching)
        self._marks_failed = 0  # chunks whose mark went: marked again only if asked of a holder
        self._looked_changes, self._looked_have = -1, 0  # table and held at the last look
        self._last_progress = now
        self._stall = Stall(config.no_source_deadline_s, now, config.origin_refused_s)
        self._now = now
        self._finished = False
        self._aborted = False
        self.stats = {"origin_chunks": 0, "peer_chunks": 0, "corrupt": 0, "timeouts": 0}

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
        return bits.to_bools(self._have, self.chunks), tuple(bits.indices(pending))

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
        match event:
            case PeersFound():
                self._on_peers_found(event, now)
            case PeerJoined():
                actions += self._on_peer_joined(event, now)
            case PeerHas(peer, chunk):
                actions += self._on_peer_has(peer, chunk)
            case PeerPending(peer, chunk):
                actions += self._on_peer_pending(peer, chunk, now)
            case PeerWithdrew(peer, chunk):
                actions += self._on_peer_withdrew(peer, chunk)
            case PeerLost(peer, reason, hostile):
                self._drop_peer(peer, now)
                if hostile:
                    self._retry_at[peer] = now + self.config.backoff_max_s
                    actions.append(Report(peer, reason))
            case ChunkArrived():
                actions += self._on_chunk_arrived(event, now)
            case ChunkFailed():
                actions += self._on_chunk_failed(event, now)
            case ChunkLost():
                pass  # handled above: it may reopen a finished swarm
            case ReaderWants(chunks):
                self._demand = [c for c in chunks if 0 <= c < self.chunks] + self._demand
                self._want(bits.from_indices(self._demand), now)
            case PrefetchGiven(chunks):
                self._prefetch = [c for c in chunks if 0 <= c < self.chunks]
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
        key = _ban_key(peer, event.host)
        if key in self._banned:
            return [Disconnect(peer, "banned for sending corrupt data", hostile=True)]
        if len(event.have) != self.chunks or any(not 0 <= c < self.chunks for c in event.pending):
            return self._misbehaved(peer, "bad join message", now)
        if peer in self._peers:
            self._drop_peer(peer, now)
        self._ban_keys[peer] = key
        self._table.add(peer, PeerState(event.rack, bits.from_bools(event.have)),
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
        self._banned.add(self._ban_keys.get(source, _ban_key(source, "")))
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
        """When `handle_timer` must next run, on the caller's clock."""
        if self._finished:
            return None
        peers = self._peers.values()
        bookkeeping = chain(self._origin.values(), self._table.deadlines(),
                            self._retry_at.values())
        if self._missing():
            settle = self._settle_until if self._settle_until is not None and self._unheard \
                else 0.0
            times = chain(bookkeeping, (s.backoff_until for s in peers),
                          (self._origin_backoff_until, self._last_progress + self._patience(),
                           settle, self._vacant_from if self._vacant else 0.0,
                           self._stall.due, self._stall.refused_due or 0.0))
        else:  # an idle lazy swarm: nothing to fetch, so nothing to be patient about
            times = bookkeeping
        return min((t for t in times if t > self._now), default=None)

    def handle_timer(self, now: float) -> list[Action]:
        self._now = now
        if self._finished:
            return []
        if abort := self._given_up(now):
            self._finished = self._aborted = True
            return [abort]
        actions: list[Action] = []
        for peer, state in list(self._peers.items()):
            if not state.inflight:
                continue  # (most peers at most wake-ups)
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

    # ---- scheduling -----------------------------------------------------------

    def _schedule(self, now: float) -> list[Action]:
        actions = self._connect_more(now)
        if self.config.use_peers:
            actions += self._request_from_peers(now)
        actions += self._fetch_from_origin(now)
        if self.config.relay_fetching:
            actions += self._announce_fetching()
        return actions

    def _announce_fetching(self) -> list[Action]:
        """Pending marks for the rare chunks we just asked of peers, and withdrawals of
        those whose request ended without the chunk.

        A mark rests on the request it was made with: when that request fails, the
        mark goes, even if the chunk is asked of someone else at once. A chunk whose
        mark went is announced again only when it is asked of a peer that holds it,
        not of one that is itself still fetching it: the marks left after a failure
        may be stale, and marks made from them promise bytes no one has. Without
        these two rules, with every origin down, 24 simulated nodes kept asking each
        other for chunks no one had until the no-source deadline (28.6 M swarm calls in
        30 virtual seconds, against 11 k without relay marks). Marks made from marks
        are kept otherwise: a chunk then crosses several hops in about one chunk-time
        (marking only chunks asked of holders gave `scale` at 10,000 nodes a p99 of
        4.30 s, against 3.16 s).

        A look changes nothing when no request was made or cleared and no chunk
        arrived since the last one (each look leaves every mark resting on a
        request in flight, and `_asked` equal to what is requested), so it is
        skipped then: most passes that follow a have, a join or a timer."""
        if self._table.changes == self._looked_changes and self._have == self._looked_have:
            return []
        self._looked_changes, self._looked_have = self._table.changes, self._have
        requested = self._table.requested & ~self._have
        requesters = self._table.requesters
        gone = [c for c, peer in self._feeders.items() if peer not in requesters.get(c, ())]
        for chunk in gone:
            del self._feeders[chunk]
        gone_mask = bits.from_indices(gone) if gone else 0
        self._marks_failed = (self._marks_failed | gone_mask) & ~self._have
        fresh = requested & ~self._asked
        self._asked = requested
        if not fresh and not gone_mask:
            return []  # (most passes: nothing asked, nothing failed since the last)
        avail, rare = self._table.avail, self.config.relay_fetching_holders
        new = [c for c in bits.indices(fresh)
               if avail[c] <= rare
               and (not self._marks_failed >> c & 1 or self._holds(requesters[c][0], c))]
        for chunk in new:
            self._feeders[chunk] = requesters[chunk][0]
        taken_back = gone_mask & ~self._have & ~self._origin_mask()
        return [*(Advertise(c, pending=True) for c in new),
                *(Withdraw(c) for c in bits.indices(taken_back))]

    def _holds(self, peer: PeerId, chunk: int) -> bool:
        state = self._peers.get(peer)
        return state is not None and bool(state.have >> chunk & 1)

    def _connect_more(self, now: float) -> list[Action]:
        if not self.config.use_peers:
            return []
        room = self.config.max_peers - len(self._peers) - len(self._connecting)
        if room <= 0:
            return []
        busy = self._peers.keys() | self._connecting
        if self._banned:  # peers banned by id (no address known: simulations)
            busy |= {p for p in self._known if _ban_key(p, "") in self._banned}
        candidates = [p for p in sorted(self._known)
                      if p not in busy and self._retry_at.get(p, 0.0) <= now]
        candidates.sort(key=lambda p: (self._known[p] != self.rack, self._rng.random()))
        # Same rack first, but keep `cross_rack_share` of our connections for other racks.
        others = [p for p in candidates if self._known[p] != self.rack]
        linked = sum(1 for p in self._peers if self._peers[p].rack != self.rack) + \
            sum(1 for p in self._connecting if self._known.get(p) != self.rack)
        owed = math.ceil(self.config.max_peers * self.config.cross_rack_share) - linked
        first = others[:max(0, min(owed, room))]
        taken = set(first)
        chosen = first + [p for p in candidates if p not in taken][:room - len(first)]
        self._connecting.update(chosen)
        for peer in chosen:
            self._retry_at.pop(peer, None)
        return [Connect(peer) for peer in chosen]

    def _ordered(self, mask: int, limit: int) -> Iterator[int]:
        """Chunks of `mask`: demand first, then prefetch order, then the picker (whose
        draws are made here, however much of the order is read)."""
        head: list[int] = []
        if self._demand or mask & self._prefetch_mask:  # (else the loop takes nothing)
            for chunk in self._demand + self._prefetch:
                if mask >> chunk & 1:
                    head.append(chunk)
                    mask &= ~(1 << chunk)
            self._demand = [c for c in self._demand if not self._have >> c & 1]
        if len(head) >= limit or not mask:
            return iter(head[:limit])
        rest = self._picker.order(bits.indices(mask), self._table.avail, limit - len(head),
                                  self._rng)
        return chain(head, rest) if head else rest

    def _request_from_peers(self, now: float) -> list[Action]:
        budget = self.config.max_inflight - self._table.inflight_total
        if budget <= 0:
            return []
        per_peer = self.config.per_peer_inflight
        free: dict[PeerId, PeerState] = {}
        offered = 0
        for p, s in self._peers.items():
            if len(s.inflight) < per_peer and s.backoff_until <= now:
                free[p] = s
                offered |= s.have
        if not free:
            return []
        wanted = offered & self._missing() & ~self._table.requested & ~self._origin_mask()
        actions: list[Action] = []
        free_left = len(free)
        for chunk in self._ordered(wanted, limit=budget * 4):
            if budget == 0 or not free:
                break
            if not offered >> chunk & 1:
                continue  # no free peer holds it: `_ask` would find no one, and draw nothing
            if (peer := self._ask(chunk, free, now)) is not None:
                actions.append(Request(peer, chunk))
                budget -= 1
                if len(free) < free_left:  # that peer has no slot left: the others' offer
                    free_left = len(free)
                    offered = _offer(free, pending=False)
        if (budget and free and self._end_game()
                and not wanted & ~self._table.requested & ~self._have):
            actions += self._endgame(free, budget, now)
        if self.config.relay_pending and free:
            actions += self._relay(free, self.config.max_inflight - self._table.inflight_total,
                                   now)
        return actions

    def _relay(self, free: dict[PeerId, PeerState], budget: int, now: float) -> list[Action]:
        """Slots left over: ask peers for chunks they are fetching from the origin. They
        send the bytes as they arrive, so the origin's last chunks spread while they come
        in, not one chunk-time later (measured in the simulator: 8 x 256 MiB at 50 MB/s,
        1.18x the bound without, 1.05x with)."""
        streaming = (self._table.pending_mask & self._missing() & ~self._table.requested
                     & ~self._origin_mask())
        actions: list[Action] = []
        if not streaming:
            return actions  # (`_ordered` would draw nothing and change nothing)
        offered, free_left = _offer(free, pending=True), len(free)
        for chunk in self._ordered(streaming, limit=budget):
            if budget <= 0 or not free:
                break
            if not offered >> chunk & 1:
                continue  # (as in `_request_from_peers`)
            if (peer := self._ask(chunk, free, now, pending=True)) is not None:
                actions.append(Request(peer, chunk))
                budget -= 1
                if len(free) < free_left:
                    free_left = len(free)
                    offered = _offer(free, pending=True)
        return actions

    def _ask(self, chunk: int, free: dict[PeerId, PeerState], now: float,
             exclude: Sequence[PeerId] = (), pending: bool = False) -> PeerId | None:
        """Give `chunk` to the best free peer holding it (fetching it, if `pending`)."""
        holders = [PeerLoad(p, s.rack == self.rack, len(s.inflight), s.failures, s.rate)
                   for p, s in free.items()
                   if (chunk in s.pending if pending else s.have >> chunk & 1)
                   and p not in exclude]
        if not holders:
            return None
        peer = self._chooser.choose(holders, self._rng)
        self._stall.peer_tried(peer)
        self._table.asked(peer, chunk, now, now + self.config.request_timeout_s)
        if len(free[peer].inflight) >= self.config.per_peer_inflight:
            del free[peer]
        return peer

    def _endgame(self, free: dict[PeerId, PeerState], budget: int, now: float) -> list[Action]:
        """Every missing chunk is requested: duplicate the tail into idle slots."""
        actions: list[Action] = []
        for chunk, askers in sorted(self._table.requesters.items()):
            if budget == 0 or not free:
                break
            if len(askers) > self.config.endgame_duplicates:
                continue
            if (peer := self._ask(chunk, free, now, exclude=tuple(askers))) is not None:
                actions.append(Request(peer, chunk))
                budget -= 1
        return actions

    def _fetch_from_origin(self, now: float) -> list[Action]:
        room = self.config.max_origin_inflight - len(self._origin)
        if room <= 0 or now < self._origin_backoff_until:
            return []
        todo = self._missing() & ~self._origin_mask()
        if self.config.use_peers:
            table = self._table
            todo &= ~table.requested & ~table.avail_mask & ~table.pending_mask
            starved = now - self._last_progress >= self._patience()
            if not starved and not self._settled(now):
                todo = 0
            elif not starved:
                # A lazy swarm's reader is blocked: no one we see can give it the chunk,
                # so waiting out the patience would only stall the reader.
                demand = bits.from_indices(self._demand) if self.lazy else 0
                todo &= self._owned_now(now) | demand
        if not todo:
            return []
        actions: list[Action] = []
        for chunk in origin_order(todo, self._demand + self._prefetch, self._origin_start,
                                  room, self._vacant):
            self._origin[chunk] = now + self.config.origin_timeout_s
            self._origin_bits |= 1 << chunk
            actions.append(FetchFromOrigin(chunk))
            if self.config.use_peers:
                actions.append(Advertise(chunk, pending=True))
        return actions

    def _owned_now(self, now: float) -> int:
        """The chunks we fetch as an appointed fetcher now: the vacant slots' only once
        their grace is over and the tracker, asked again since, still counts them vacant,
        or if they are on the prefetch list (a launch's hot list). Without asking again,
        32 agents starting together read a chunk twice in 4 of 6 runs: fetcher 0, told
        it was alone, covered slot 7 at the end of its grace, 0.43 s after slot 7 had
        been filled by a node still settling (`settle_s`) before its first fetch."""
        if self._view_at >= self._vacant_from and now >= self._vacant_from:
            return self._owned
        return self._owned & ~(self._vacant & ~self._prefetch_mask)

    def _patience(self) -> float:
        """How long to wait without progress before reading from the origin ourselves."""
        if self._settle_until is None or not self._fetchers_appointed:
            return self.config.origin_patience_s
        return self.config.appointed_patience_s

    def _settled(self, now: float) -> bool:
        until = self._settle_until
        return until is not None and (not self._unheard or now >= until)

    def _origin_mask(self) -> int:
        return self._origin_bits

    def _origin_done(self, chunk: int) -> None:
        """Our origin fetch of `chunk` ended (or never was)."""
        self._origin.pop(chunk, None)
        self._origin_bits &= ~(1 << chunk)

    def _missing(self) -> int:
        """Wanted chunks not held: what the swarm works on."""
        return self._miss

    def _end_game(self) -> bool:
        """The tail of a download: duplicate requests may go out. A lazy swarm's few
        missing chunks are what its readers asked for just now, not a tail."""
        return self._eager and bits.count(self._missing()) <= self.config.endgame_tail


def _offer(free: dict[PeerId, PeerState], pending: bool) -> int:
    """The chunks some peer of `free` holds (is fetching, if `pending`): a chunk outside
    them is one `Swarm._ask` would find no holder of. The request walks skip those
    without the call, which builds a holder list over every free peer; a pass asks
    most of its chunks of no one (its first request takes the one free peer that a
    chunk's arrival left, typically), 5.6 of them per request made in `launch`."""
    mask = 0
    for state in free.values():
        if pending:
            if state.pending:
                mask |= bits.from_indices(state.pending)
        else:
            mask |= state.have
    return mask


def _ban_key(peer: PeerId, host: str) -> str:
    """What a ban of `peer` seen at `host` holds: the address, or the id if there is none."""
    return f"host {host}" if host else f"peer {peer}"
