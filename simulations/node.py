"""A simulated node: its real `Swarm` objects, connections, transfers and counters.

Theory of operation
-------------------
A `SimNode` owns one `p2p.swarm.Swarm` per content it needs and the agent's
own node core (`p2p.swarm.node.Node`: the announce schedule, what it asks of
the tracker, which peers are joined for each content, and the one timer of
all its swarms), exactly as an agent does, plus what the agent's I/O would
hold: the chunks it is fetching from the origin (sent as `pending` when a
peer joins), and the transfers it takes part in. It holds no policy: the
simulation feeds its swarms events through the core and carries out their
actions (see `simulations.simulation`).

A `Transfer` is one chunk in flight, from a peer or an origin. It waits one
latency (the request travelling); a peer's transfer then waits in the
sender's `Uploads`, an origin's in the origin's queue, and only then becomes
a flow in the network model.

`Uploads` is the agent's upload side (p2p/link.py), not a policy: every link
serves its peer's requests one at a time, in order, and a node-wide
semaphore lets at most `upload_slots` pieces go out at once; a link whose
next piece waits for a slot queues behind the links that waited first. So a
new chunk reaches its first few requesters at a large share of the sender's
upload, and they can relay it sooner than if every requester got a thin
share at once. A request the receiver has cancelled is skipped if the cancel
reaches the sender before the piece starts going out (p2p.link); a piece
sent anyway is dropped by the receiver and counted as wasted bytes.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from p2p.content import PeerId
from p2p.ratelimit import BURST_BYTES, TokenBucket
from p2p.swarm import Swarm
from p2p.swarm.node import DEFAULT_LINE_BPS, Node
from p2p.swarm.uploads import UPLOAD_ORDER, UPLOAD_SLOTS, UploadSlots

ORIGIN: Final = -1  # the `src` of a transfer from an origin
_COMPACT_AT: Final = 16  # SimNode.transfers: the fewest entries at which ended ones are dropped
TIMER_SLACK_S: Final = 5.0  # a swarm's wake-up is never further away than this (p2p.swarm.node)



@dataclass(frozen=True, slots=True)
class AgentSpec:
    """The agent settings the simulation models (p2p.config.AgentConfig's names).

    `upload_cap_Bps` caps the bytes a node serves: its NIC's upload link in
    the network model gets the smaller of the two. `download_cap_Bps` paces
    the node's requests, as the agent does: a request (or origin read) goes out
    only when the node's download token bucket has room for the chunk, so a
    piece itself then arrives at whatever rate the network gives it. None: no cap.
    """

    upload_slots: int = UPLOAD_SLOTS
    upload_order: str = UPLOAD_ORDER  # p2p.swarm.uploads.UPLOAD_ORDERS
    upload_cap_Bps: float | None = None
    download_cap_Bps: float | None = None
    burst_bytes: int = BURST_BYTES
    # A cancel travels to the sender, which skips the request unless its piece is
    # going out (wire protocol 2). False: protocol 1, where the sender sent it anyway.
    cancel_on_wire: bool = True


class Transfer:
    """One chunk in flight (module docstring). `key` names it among the transfers in
    flight: one int for (receiver, content, sender, chunk), which the simulation makes
    (`Simulation._key`); a dict keyed by it costs less than one keyed by the 4-tuple."""

    __slots__ = ("cancelled", "chunk", "content", "cut", "dst", "due_ms", "flow", "key",
                 "nbytes", "origin", "orphan", "src", "stage", "tracked")

    def __init__(self, dst: int, content: int, src: int, chunk: int, nbytes: int,
                 origin: int = -1, key: int = -1) -> None:
        self.dst, self.content, self.src, self.chunk = dst, content, src, chunk
        self.nbytes, self.origin, self.key = nbytes, origin, key
        self.tracked = False  # in its nodes' `transfers` (SimNode.track)
        self.flow = -1  # network flow id once bytes move
        self.stage = TRAVELLING
        self.cancelled = False  # a connection broke: nothing more happens
        self.orphan = False  # the receiver cancelled it: bytes still move, then are dropped
        self.due_ms = 0  # its receiver's due when the request went out (p2p.swarm.uploads)
        self.cut = False  # a cut-through relay (TAILING)


# Transfer.stage
TRAVELLING: Final = 0  # the request is on its way
QUEUED: Final = 1  # in its link's queue at the sender
READY: Final = 2  # at the head of its link, waiting for an upload slot
SENDING: Final = 3  # a flow in the network model
# A request for a chunk the sender is still fetching from the origin (a relay:
# p2p.relay). It waits for the fetch to end, then is a flow outside the upload
# slots and the link's queue. The agent streams a relay as the bytes arrive, no
# faster than the origin sends them, in its upload slots; the model's relay is
# the late bound of that. Measured on the calibration (simulations/CALIBRATION.md,
# stop 25), the agents sit between the two bounds, nearer this one; a relay flow
# that started at once, as the model had it before, made 16 and 32 agents 25-37%
# faster than the agents were.
RELAYING: Final = 4
# A cut-through relay (SwarmConfig.relay_fetching): a request for a chunk the sender
# is still fetching from a peer. It goes through the sender's upload slots like any
# request, and its last byte cannot land before the sender holds the chunk: a relay
# flow that ends first waits here, outside the slots, for the sender's copy.
TAILING: Final = 5
# Waiting at its receiver for download budget (AgentSpec.download_cap_Bps): a
# cancel now means it never goes out, and the budget it reserved comes back.
PACED: Final = 6


class Uploads:
    """A node's upload side: a FIFO per link, at most `slots` pieces sent at once.

    The slots are the agent's own `p2p.swarm.uploads.UploadSlots`, in the
    agent's order; `rank` gives a transfer's rank there: its receiver's
    progress. (The agent knows it from the receiver's haves, exact up to a
    have's latency; the simulation reads the receiver's swarm, because it
    skips haves that cannot change what the *receiving* swarm does.) `add` and `finished` return the
    transfers that start sending now; the caller turns them into flows. Links
    are keyed by the receiving node.
    """

    __slots__ = ("engaged", "queues", "rank", "slots")

    def __init__(self, slots: int, order: str = UPLOAD_ORDER,
                 rank: Callable[[Transfer], int] = lambda t: 0) -> None:
        self.slots: UploadSlots[Transfer] = UploadSlots(slots, order)
        self.rank = rank
        self.queues: dict[int, deque[Transfer]] = {}  # link -> requests behind its current one
        self.engaged: set[int] = set()  # links whose current request is ready or sending

    @property
    def busy(self) -> int:
        return self.slots.busy

    def add(self, t: Transfer) -> list[Transfer]:
        if t.dst in self.engaged:
            t.stage = QUEUED
            self.queues.setdefault(t.dst, deque()).append(t)
            return []
        self.engaged.add(t.dst)
        return [t] if self._acquire(t) else []

    def finished(self, t: Transfer) -> list[Transfer]:
        """`t` stopped sending (done or aborted): its slot and its link move on."""
        started = []
        nxt = self.slots.done()
        if nxt is not None:
            nxt.stage = SENDING
            started.append(nxt)
        nxt = self._next_on_link(t.dst)
        if nxt is not None:
            started.append(nxt)
        return started

    def drop(self, t: Transfer) -> list[Transfer]:
        """Forget `t`, which has not started sending; returns what starts instead."""
        if t.stage == QUEUED:
            queue = self.queues[t.dst]
            queue.remove(t)
            if not queue:
                del self.queues[t.dst]
            return []
        if t.stage == READY:
            self.slots.withdraw(t)
            nxt = self._next_on_link(t.dst)
            return [] if nxt is None else [nxt]
        return []

    def _next_on_link(self, link: int) -> Transfer | None:
        """The link's next request, if it starts sending now."""
        queue = self.queues.get(link)
        if not queue:
            self.engaged.discard(link)
            return None
        nxt = queue.popleft()
        if not queue:
            del self.queues[link]
        return nxt if self._acquire(nxt) else None

    def cleared(self) -> Uploads:
        """A new, empty upload side with the same slots, order and rank (a failed node)."""
        return Uploads(self.slots.slots, self.slots.order, self.rank)

    def _acquire(self, t: Transfer) -> bool:
        """Whether `t` got a slot and starts sending (else it waits, READY)."""
        if self.slots.ask(t, self.rank(t)):
            t.stage = SENDING
            return True
        t.stage = READY
        return False


@dataclass(slots=True)
class Counters:
    """Bytes and events of one node; what the per-node Parquet row reports."""

    down_same_rack: int = 0
    down_cross_rack: int = 0
    down_origin: int = 0
    up: int = 0
    wasted_down: float = 0.0  # bytes of cancelled transfers (end-game duplicates)
    wasted_up: float = 0.0
    requests: int = 0
    origin_fetches: int = 0
    failed_requests: int = 0
    reports: int = 0
    aborts: int = 0


class SimNode:
    __slots__ = ("_compact_at", "alive", "complete_s", "core", "counters", "download",
                 "fail_s", "finished", "hot_left", "index", "needs", "origin_pending", "peer",
                 "rack", "rack_index", "ready_left", "ready_s", "start_s", "swarms",
                 "transfers", "unfinished", "uploads", "wakes")

    def __init__(self, index: int, rack_index: int, needs: tuple[int, ...], start_s: float,
                 fail_s: float | None, announce_interval_s: float,
                 agent: AgentSpec = AgentSpec(),
                 upload_rank: Callable[[Transfer], int] = lambda t: 0,
                 line_Bps: float = DEFAULT_LINE_BPS) -> None:
        self.index = index
        self.peer = PeerId(f"n{index:06d}")
        self.rack_index = rack_index
        self.rack = f"rack{rack_index:04d}"
        self.needs = needs
        self.start_s = start_s
        self.fail_s = fail_s
        self.alive = False
        self.swarms: dict[int, Swarm] = {}
        self.core = Node(announce_interval_s, start_s, timer_slack_s=TIMER_SLACK_S,
                         line_Bps=line_Bps)
        # When the core (and so its swarms) will be woken, each pending wake-up once:
        # `Simulation._arm` adds only one earlier than all, so the list is decreasing.
        self.wakes: list[float] = []
        self.origin_pending: dict[int, int] = {}  # content -> mask of chunks from the origin
        # As sender or receiver, in start order; those no longer `tracked` are dropped
        # only now and then (`track`), which costs less than a dict's pop per transfer.
        self.transfers: list[Transfer] = []
        self._compact_at = _COMPACT_AT
        self.uploads = Uploads(agent.upload_slots, agent.upload_order, upload_rank)
        self.download = (None if agent.download_cap_Bps is None
                         else TokenBucket(agent.download_cap_Bps, agent.burst_bytes))
        self.finished: set[int] = set()  # contents whose swarm finished (complete or aborted)
        self.hot_left: dict[int, int] = {}  # content -> hot chunks still missing (prefetch)
        self.ready_left = len(needs)  # contents not yet ready to start on
        self.unfinished = len(needs)  # contents not yet complete
        self.ready_s: float | None = None
        self.complete_s: float | None = None
        self.counters = Counters()

    def track(self, transfer: Transfer) -> None:
        """`transfer` starts and this node sends or receives it; the caller sets its
        `tracked`, and clears it when it ends."""
        if len(self.transfers) >= self._compact_at:  # the ended ones go: amortised O(1)
            self.transfers = [t for t in self.transfers if t.tracked]
            self._compact_at = max(_COMPACT_AT, 2 * len(self.transfers))
        self.transfers.append(transfer)

    def in_flight(self) -> list[Transfer]:
        """The transfers this node sends or receives that have not ended, in start order."""
        return [t for t in self.transfers if t.tracked]

    def holds(self, content: int, chunk: int) -> bool:
        swarm = self.swarms.get(content)
        return swarm is not None and swarm.held(chunk)
