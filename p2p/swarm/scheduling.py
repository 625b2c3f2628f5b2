"""The swarm's state and its scheduling pass: what to ask of whom, and when of the origin.

Theory of operation
-------------------
`Scheduling` holds what one node knows of one content (held, wanted and missing
chunks, the peer table, requests in flight, origin fetches, fetcher appointment,
bans) and the pass that runs after every event and timer of `Swarm`
(p2p.swarm.swarm), which is this class with its event and timer handlers.
The pass fills free request slots:

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

Like the rest of the swarm it never reads a clock, touches a socket or a file, or
uses the global random module.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Sequence
from itertools import chain

from p2p.content import PeerId
from p2p.draws import below
from p2p.swarm import bits
from p2p.swarm.config import SwarmConfig
from p2p.swarm.events import Action, Advertise, Connect, FetchFromOrigin, Request, Withdraw
from p2p.swarm.origin import origin_order
from p2p.swarm.peers import PeerState, PeerTable
from p2p.swarm.policy import CHUNK_PICKERS, PEER_CHOOSERS, PeerLoad
from p2p.swarm.stall import Stall


class Scheduling:
    """The state of one content at one node, and its scheduling pass (`_schedule`).
    Not used alone: `Swarm` adds what changes the state (events, timers)."""

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
        self._flags, self._flags_of = bits.to_bools(self._have, chunks), self._have  # (join_view)
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
        self._origin_start = below(rng, chunks) if chunks else 0
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
            busy |= {p for p in self._known if ban_key(p, "") in self._banned}
        candidates = [p for p in sorted(self._known)
                      if p not in busy and self._retry_at.get(p, 0.0) <= now]
        candidates.sort(key=lambda p: (self._known[p] != self.rack, self._rng.random()))
        # Same rack first, but keep `cross_rack_share` of our connections for other racks.
        others = [p for p in candidates if self._known[p] != self.rack]
        linked = sum(1 for s in self._table.states if not s.same_rack) + \
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
        head, rest = self._listed_first(mask)
        if len(head) >= limit or not rest:
            return iter(head[:limit])
        order = self._picker.order(bits.indices(rest), self._table.avail, limit - len(head),
                                   self._rng)
        return chain(head, order) if head else order

    def _unordered(self, mask: int, limit: int) -> None:
        """What `_ordered` changes when its order would not be read: the picker's draws
        (a pass that can ask no one must leave the rng as one that could)."""
        head, rest = self._listed_first(mask)
        if len(head) < limit and rest:
            self._picker.draw(bits.count(rest), limit - len(head), self._rng)

    def _listed_first(self, mask: int) -> tuple[list[int], int]:
        """The chunks of `mask` on the demand and prefetch lists, in that order, and the
        rest of `mask`."""
        head: list[int] = []
        if self._demand or mask & self._prefetch_mask:  # (else the loop takes nothing)
            for chunk in self._demand + self._prefetch:
                if mask >> chunk & 1:
                    head.append(chunk)
                    mask &= ~(1 << chunk)
            self._demand = [c for c in self._demand if not self._have >> c & 1]
        return head, mask

    def _request_from_peers(self, now: float) -> list[Action]:
        budget = self.config.max_inflight - self._table.inflight_total
        if budget <= 0:
            return []
        per_peer = self.config.per_peer_inflight
        free: list[PeerState] = []  # peers with a free slot, in the table's order
        offered = 0
        for s in self._table.states:
            if len(s.inflight) < per_peer and s.backoff_until <= now:
                free.append(s)
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

    def _relay(self, free: list[PeerState], budget: int, now: float) -> list[Action]:
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
        if not streaming & offered:
            # No free peer is fetching any of them (most passes): the walk below would
            # skip every chunk of the order.
            self._unordered(streaming, budget)
            return actions
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

    def _ask(self, chunk: int, free: list[PeerState], now: float,
             exclude: Sequence[PeerId] = (), pending: bool = False) -> PeerId | None:
        """Give `chunk` to the best free peer holding it (fetching it, if `pending`); a
        peer left without a free slot leaves `free`."""
        holders = [PeerLoad(s.peer, s.same_rack, len(s.inflight), s.failures, s.rate)
                   for s in free
                   if (chunk in s.pending if pending else s.have >> chunk & 1)
                   and s.peer not in exclude]
        if not holders:
            return None
        peer = self._chooser.choose(holders, self._rng)
        self._stall.peer_tried(peer)
        self._table.asked(peer, chunk, now, now + self.config.request_timeout_s)
        state = self._peers[peer]
        if len(state.inflight) >= self.config.per_peer_inflight:
            free.remove(state)
        return peer

    def _endgame(self, free: list[PeerState], budget: int, now: float) -> list[Action]:
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
                demand = bits.from_indices(self._demand) if not self._eager else 0
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


def _offer(free: list[PeerState], pending: bool) -> int:
    """The chunks some peer of `free` holds (is fetching, if `pending`): a chunk outside
    them is one `Scheduling._ask` would find no holder of. The request walks skip those
    without the call, which builds a holder list over every free peer; a pass asks
    most of its chunks of no one (its first request takes the one free peer that a
    chunk's arrival left, typically), 5.6 of them per request made in `launch`."""
    mask = 0
    for state in free:
        if pending:
            if state.pending:
                mask |= bits.from_indices(state.pending)
        else:
            mask |= state.have
    return mask


def ban_key(peer: PeerId, host: str) -> str:
    """What a ban of `peer` seen at `host` holds: the address, or the id if there is none."""
    return f"host {host}" if host else f"peer {peer}"
