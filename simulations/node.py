"""A simulated node: its real `Swarm` objects, connections, transfers and counters.

Theory of operation
-------------------
A `SimNode` owns one `p2p.swarm.Swarm` per content it needs, exactly as an
agent does, plus what the agent's I/O would hold: the set of open
connections per content, the chunks it is fetching from the origin (sent as
`pending` when a peer joins), and the transfers it takes part in. It holds
no policy: the simulation feeds its swarms events and carries out their
actions (see `simulations.simulation`).

A `Transfer` is one chunk in flight, from a peer or an origin. It waits one
latency (the request travelling), then becomes a flow in the network model,
or is dropped if it was cancelled meanwhile.
"""

from __future__ import annotations

from dataclasses import dataclass

from p2p.content import PeerId
from p2p.swarm import Swarm

ORIGIN = -1  # the `src` of a transfer from an origin

TransferKey = tuple[int, int, int, int]  # (dst node, content, src node or ORIGIN, chunk)


class Transfer:
    __slots__ = ("cancelled", "chunk", "content", "dst", "flow", "nbytes", "origin", "src")

    def __init__(self, dst: int, content: int, src: int, chunk: int, nbytes: int,
                 origin: int = -1) -> None:
        self.dst, self.content, self.src, self.chunk = dst, content, src, chunk
        self.nbytes, self.origin = nbytes, origin
        self.flow = -1  # network flow id once bytes move
        self.cancelled = False

    @property
    def key(self) -> TransferKey:
        return (self.dst, self.content, self.src, self.chunk)


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
    __slots__ = ("alive", "complete_s", "conns", "counters", "fail_s", "hot_left", "index",
                 "needs", "origin_pending", "peer", "rack", "rack_index", "ready_left",
                 "ready_s", "start_s", "swarms", "timer_at", "transfers", "unfinished")

    def __init__(self, index: int, rack_index: int, needs: tuple[int, ...], start_s: float,
                 fail_s: float | None) -> None:
        self.index = index
        self.peer = PeerId(f"n{index:06d}")
        self.rack_index = rack_index
        self.rack = f"rack{rack_index:04d}"
        self.needs = needs
        self.start_s = start_s
        self.fail_s = fail_s
        self.alive = False
        self.swarms: dict[int, Swarm] = {}
        self.conns: dict[int, dict[int, None]] = {}  # content -> connected nodes, in order
        self.origin_pending: dict[int, int] = {}  # content -> mask of chunks from the origin
        self.transfers: dict[TransferKey, None] = {}  # as sender or receiver
        self.timer_at: dict[int, float] = {}
        self.hot_left: dict[int, int] = {}  # content -> hot chunks still missing (prefetch)
        self.ready_left = len(needs)  # contents not yet ready to start on
        self.unfinished = len(needs)  # contents not yet complete
        self.ready_s: float | None = None
        self.complete_s: float | None = None
        self.counters = Counters()

    def have_flags(self, content: int) -> tuple[bool, ...]:
        swarm = self.swarms[content]
        mask = swarm.have
        return tuple(bool(mask >> i & 1) for i in range(swarm.chunks))

    def pending_chunks(self, content: int) -> tuple[int, ...]:
        mask = self.origin_pending.get(content, 0)
        return tuple(i for i in range(mask.bit_length()) if mask >> i & 1)
