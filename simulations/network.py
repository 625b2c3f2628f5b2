"""The network: racks, NICs, top-of-rack uplinks, origins, and how flows share them.

Theory of operation
-------------------
Nodes sit in racks. Every node has a NIC with an upload and a download
capacity; every rack has a top-of-rack (ToR) uplink and downlink whose
capacity is the rack's total NIC capacity divided by the oversubscription
ratio. Origins (a registry, HDFS) sit outside the racks: each has an egress
capacity, a cap on concurrent transfers (the rest wait in a FIFO queue) and a
first-byte latency. A transfer is a *flow* over up to four links:

- peer in the same rack: sender NIC up, receiver NIC down;
- peer in another rack: the same plus sender ToR up and receiver ToR down;
- origin: origin egress, receiver ToR down, receiver NIC down.

Bandwidth sharing is a fluid model refreshed every `rate_update_s` of virtual
time, vectorised with numpy so that 200,000 concurrent flows cost a few
milliseconds per refresh:

1. advance every flow by `rate * elapsed`;
2. give every flow an approximately max-min fair rate: start from the equal
   share `capacity / flows` of each link, then run `FAIR_ROUNDS` rounds of
   water-filling in which a link splits what its flows that are bottlenecked
   elsewhere leave unused among the flows it bottlenecks;
3. flows that finish before the next refresh get an exact completion event
   at `now + remaining / rate`.

A flow that starts between refreshes gets `min(capacity / flows)` over its
links until the next refresh; a flow that ends frees its share only at the
next refresh. So the model's error is bounded by one refresh interval per
rate change: choose `rate_update_s` well below a chunk's transfer time (the
scenarios use 2-5% of it). Three rounds of water-filling reach the exact
max-min rates on the two- and three-tier patterns a swarm makes (checked in
tests/simulations/test_sim_network.py); deeper chains converge more slowly and are then
slightly pessimistic. TCP dynamics (slow start, loss) are not modelled.

An agent's upload cap is a token bucket with a burst (p2p.ratelimit), not a
slower NIC: an uploader that was idle sends its next `burst` bytes at the
NIC's speed. The model gives each capped upload link that credit: at every
refresh the link's bucket gains `cap * elapsed` tokens (at most `burst`) and
pays for the bytes its flows moved since the last refresh, and the link's
capacity until the next refresh is `cap + tokens / rate_update_s` (at most
the NIC's, at least nothing while the bucket is in debt). With a chunk the
size of the burst, a 4-node swarm at 20 MB/s finished 12 % later in the model
without the credit than on real agents.
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, cast

import numpy as np

from simulations.engine import Loop

FAIR_ROUNDS: Final = 3
_UNLIMITED: Final = 1e30  # capacity of the padding link of flows that cross fewer than 4 links
_INITIAL_FLOWS: Final = 1024
# The four links of a flow, padded with `Topology.padding`. A tuple object, not a
# fixed-length tuple: compiled, that would be a C struct, boxed anew (four ints and
# a tuple allocated) wherever it is stored.
Links = tuple[int, ...]
_NO_LINKS: Final[Links] = (0, 0, 0, 0)  # links of a free flow slot

Done = Callable[[int], None]  # called with the flow id when its last byte arrives


@dataclass(frozen=True, slots=True)
class OriginSpec:
    name: str
    egress_Bps: float
    max_concurrent: int
    latency_s: float
    down_at_s: float | None = None  # from then on every fetch fails


@dataclass(frozen=True, slots=True)
class NetworkSpec:
    racks: int
    nic_up_Bps: float
    nic_down_Bps: float
    oversubscription: float  # rack NIC capacity / ToR uplink capacity
    same_rack_latency_s: float
    cross_rack_latency_s: float
    rate_update_s: float
    origins: tuple[OriginSpec, ...]


class Topology:
    """Which node is in which rack, and the index of every link."""

    def __init__(self, spec: NetworkSpec, nodes: int, upload_cap_Bps: float | None = None,
                 upload_burst_bytes: int = 0) -> None:
        if spec.racks > nodes:
            raise ValueError(f"{spec.racks} racks for {nodes} nodes: some racks would be empty")
        self.spec, self.nodes, self.racks = spec, nodes, spec.racks
        self.rack_of = [i * spec.racks // nodes for i in range(nodes)]
        size = [0] * spec.racks
        for r in self.rack_of:
            size[r] += 1
        n, r = nodes, spec.racks
        self.padding = 2 * n + 2 * r + len(spec.origins)
        caps = np.empty(self.padding + 1)
        # The agent's upload cap is shared by its concurrent pieces like a slower NIC.
        caps[:n] = min(spec.nic_up_Bps, upload_cap_Bps or spec.nic_up_Bps)
        caps[n:2 * n] = spec.nic_down_Bps
        tor = np.array(size, dtype=float) / spec.oversubscription
        caps[2 * n:2 * n + r] = tor * spec.nic_up_Bps
        caps[2 * n + r:2 * n + 2 * r] = tor * spec.nic_down_Bps
        for i, origin in enumerate(spec.origins):
            caps[2 * n + 2 * r + i] = origin.egress_Bps
        caps[self.padding] = _UNLIMITED
        self.capacity = caps
        # The upload cap's token bucket (module docstring), when it is slower than the NIC.
        capped = upload_cap_Bps is not None and upload_cap_Bps < spec.nic_up_Bps
        self.upload_burst = float(upload_burst_bytes) if capped else 0.0

    def rack_name(self, node: int) -> str:
        return f"rack{self.rack_of[node]:04d}"

    def peer_links(self, src: int, dst: int) -> Links:
        n, r = self.nodes, self.racks
        rs, rd = self.rack_of[src], self.rack_of[dst]
        if rs == rd:
            return (src, n + dst, self.padding, self.padding)
        return (src, n + dst, 2 * n + rs, 2 * n + r + rd)

    def origin_links(self, origin: int, dst: int) -> Links:
        n, r = self.nodes, self.racks
        return (2 * n + 2 * r + origin, n + dst, 2 * n + r + self.rack_of[dst], self.padding)

    def latency(self, src: int, dst: int) -> float:
        same = self.rack_of[src] == self.rack_of[dst]
        return self.spec.same_rack_latency_s if same else self.spec.cross_rack_latency_s


class Flows:
    """Every transfer in progress, and the fluid model that shares the links."""

    def __init__(self, topology: Topology, loop: Loop) -> None:
        self.top = topology
        self._at = loop.at  # schedules a callback on the event loop
        self._at_many = loop.at_many
        self._cap = topology.capacity
        # Flows per link, and the capacities, as Python lists too: starting and ending a
        # flow reads and writes a few of them, which costs several times more on numpy
        # scalars (the refresh, vectorised, uses the arrays).
        self._count = [0] * len(self._cap)
        self._cap_list: list[float] = self._cap.tolist()
        # Each flow's state, by flow id, in `array`s (a flow's start and end write them one
        # item at a time, which costs several times less than on a numpy array), with
        # numpy views of the same memory for the refresh (`_views`). `_links` holds the
        # four links of flow f at f, size + f, 2 size + f and 3 size + f.
        self._links = array("q", [topology.padding]) * (4 * _INITIAL_FLOWS)
        self._remaining, self._size = _floats(_INITIAL_FLOWS), _floats(_INITIAL_FLOWS)
        self._rate, self._since = _floats(_INITIAL_FLOWS), _floats(_INITIAL_FLOWS)
        self._active = _flags(_INITIAL_FLOWS)
        self._due = _flags(_INITIAL_FLOWS)  # its completion event is scheduled
        self._views()
        size = self._slots = _INITIAL_FLOWS
        self._done: list[Done | None] = [None] * size
        self._flow_links: list[Links] = [_NO_LINKS] * size
        self._generation = [0] * size  # bumped when a slot is freed: stale events see it
        self._free: list[int] = list(range(size - 1, -1, -1))
        self._now = 0.0
        self._tick_at: float | None = None
        self.active = 0
        self.refreshes = 0
        self._credit = _UploadCredit(topology) if topology.upload_burst > 0 else None
        if self._credit is not None:
            self._cap = topology.capacity.copy()  # the upload links' part changes with credit

    # ---- flows ----------------------------------------------------------------

    def start(self, links: Links, nbytes: float, now: float, done: Done) -> int:
        """Start moving `nbytes` over `links`; `done(flow)` runs when the last byte lands."""
        if self._tick_at is None and self._credit is not None:
            self._refresh_credit(now)
        if not self._free:
            self._grow()
        f = self._free.pop()
        size = self._slots
        a, b, c, d = links
        # Compiled, a write into an `array` is a generic call on objects: the index and
        # the values are passed boxed, once each (`i`, the tuple's own ints, `moved`),
        # not boxed anew (an int or float allocated) at every write.
        i: Any = f
        boxed = cast("tuple[Any, ...]", links)
        self._links[i], self._links[size + f] = boxed[0], boxed[1]
        self._links[2 * size + f], self._links[3 * size + f] = boxed[2], boxed[3]
        self._flow_links[f] = links
        # The smallest share of its four links, one call per link: a loop over the links
        # would first box them into a tuple.
        count, cap = self._count, self._cap_list
        rate = _joined(count, cap, a, _UNLIMITED)
        rate = _joined(count, cap, b, rate)
        rate = _joined(count, cap, c, rate)
        rate = _joined(count, cap, d, rate)
        moved: Any = nbytes
        self._remaining[i] = self._size[i] = moved
        self._rate[i], self._since[i] = rate, now
        self._active[i], self._due[i] = 1, 0
        self._done[f] = done
        self.active += 1
        self._schedule_if_soon(f, now, now + nbytes / rate)
        if self._tick_at is None:
            self._tick_at = now + self.top.spec.rate_update_s
            self._at(self._tick_at, self._tick, 0)
        return f

    def cancel(self, f: int, now: float) -> float:
        """Stop flow `f`; returns the bytes it had moved."""
        left = max(0.0, self._remaining[f] - self._rate[f] * (now - self._since[f]))
        if self._credit is not None:
            self._credit.sent(self._flow_links[f][0], self._remaining[f] - left)
        moved = self._size[f] - left
        self._finish(f)
        return moved

    def size(self, f: int) -> float:
        return self._size[f]

    def _schedule_if_soon(self, f: int, now: float, end: float) -> None:
        """Schedule the end of new flow `f` at `end` if it comes before the next refresh."""
        horizon = (self._tick_at if self._tick_at is not None
                   else now + self.top.spec.rate_update_s)
        if end <= horizon:
            self._due[f] = 1
            self._at(end, self._arrived, (f, self._generation[f]))

    def _arrived(self, arg: tuple[int, int]) -> None:
        f, generation = arg
        if self._generation[f] != generation:
            return  # cancelled after its completion was scheduled
        if self._credit is not None:
            self._credit.sent(self._flow_links[f][0], self._remaining[f])
        done = self._done[f]
        self._finish(f)
        if done is not None:
            done(f)

    def _finish(self, f: int) -> None:
        i: Any = f  # (boxed once: see `start`)
        if not self._active[i]:
            raise RuntimeError(f"flow {f} finished twice")
        count = self._count
        a, b, c, d = self._flow_links[f]
        count[a] -= 1
        count[b] -= 1
        count[c] -= 1
        count[d] -= 1
        self._active[i] = self._due[i] = 0
        self._done[f] = None
        self._generation[f] += 1
        self._free.append(f)
        self.active -= 1

    def _refresh_credit(self, now: float) -> None:
        """Settle the upload links' credit (their capacity until the next refresh)."""
        assert self._credit is not None
        self._credit.refresh(now, self._cap)
        self._cap_list[:self.top.nodes] = self._cap[:self.top.nodes].tolist()

    def _views(self) -> None:
        """numpy views of the flows' arrays, for the refresh (made anew when they grow)."""
        self._links_np = np.frombuffer(self._links, dtype=np.int64).reshape(4, -1)
        self._remaining_np = np.frombuffer(self._remaining, dtype=np.float64)
        self._rate_np = np.frombuffer(self._rate, dtype=np.float64)
        self._since_np = np.frombuffer(self._since, dtype=np.float64)
        self._active_np = np.frombuffer(self._active, dtype=np.bool_)
        self._due_np = np.frombuffer(self._due, dtype=np.bool_)

    def _grow(self) -> None:
        old = self._slots
        new = self._slots = old * 2
        # New arrays, never resized ones: the numpy views hold their buffers.
        links = array("q", [self.top.padding]) * (4 * new)
        for i in range(4):
            links[i * new:i * new + old] = self._links[i * old:(i + 1) * old]
        self._links = links
        for name in ("_remaining", "_size", "_rate", "_since"):
            floats = _floats(new)
            floats[:old] = getattr(self, name)
            setattr(self, name, floats)
        for name in ("_active", "_due"):
            flags = _flags(new)
            flags[:old] = getattr(self, name)
            setattr(self, name, flags)
        self._views()
        self._done.extend([None] * (new - old))
        self._flow_links.extend([_NO_LINKS] * (new - old))
        self._generation.extend([0] * (new - old))
        self._free.extend(range(new - 1, old - 1, -1))

    # ---- the fluid model ------------------------------------------------------

    def _tick(self, _: int) -> None:
        """Advance every flow to `now`, recompute rates, schedule the next finishes."""
        now = self._tick_at if self._tick_at is not None else 0.0
        self.refreshes += 1
        live = np.flatnonzero(self._active_np & ~self._due_np)
        remaining, rate, since = self._remaining_np, self._rate_np, self._since_np
        if live.size:
            moved = np.minimum(rate[live] * (now - since[live]), remaining[live])
            remaining[live] -= moved
            since[live] = now
            if self._credit is not None:
                self._credit.sent_many(self._links_np[0, live], moved)
        if self._credit is not None:
            self._refresh_credit(now)
        if live.size:
            rates = fair_rates(self._links_np[:, live], self._cap)
            rate[live] = rates
        if self.active == 0:
            self._tick_at = None
            return
        self._tick_at = now + self.top.spec.rate_update_s
        self._at(self._tick_at, self._tick, 0)
        if live.size:
            ends = now + remaining[live] / rate[live]
            soon = np.flatnonzero(ends <= self._tick_at)
            self._due_np[live[soon]] = True
            gen = self._generation
            due = live[soon].tolist()
            self._at_many(ends[soon].tolist(), self._arrived, [(f, gen[f]) for f in due])


def _joined(count: list[int], cap: list[float], link: int, rate: float) -> float:
    """Count one more flow on `link`; the smaller of `rate` and the link's share now."""
    count[link] += 1
    share = cap[link] / count[link]
    return share if share < rate else rate


class _UploadCredit:
    """The token buckets of the capped upload links, as capacity (module docstring)."""

    def __init__(self, topology: Topology) -> None:
        n = topology.nodes
        self._n = n
        self._base = topology.capacity[:n].copy()
        self._nic = topology.spec.nic_up_Bps
        self._burst = topology.upload_burst
        self._interval = topology.spec.rate_update_s
        self._tokens = np.full(n, self._burst)  # buckets start full, as the agent's do
        self._sent = np.zeros(len(topology.capacity))  # bytes moved since the last refresh
        self._stamp = 0.0

    def sent(self, link: int, nbytes: float) -> None:
        self._sent[link] += nbytes

    def sent_many(self, links: np.ndarray, nbytes: np.ndarray) -> None:
        self._sent += np.bincount(links, weights=nbytes, minlength=len(self._sent))

    def refresh(self, now: float, capacity: np.ndarray) -> None:
        """Settle the buckets at `now`; set the upload links' capacity until the next refresh."""
        tokens = self._tokens + self._base * (now - self._stamp) - self._sent[:self._n]
        np.minimum(tokens, self._burst, out=tokens)
        self._tokens, self._stamp = tokens, now
        self._sent[:] = 0.0
        capacity[:self._n] = np.clip(self._base + tokens / self._interval, 1.0, self._nic)


def fair_rates(links: np.ndarray, capacity: np.ndarray, rounds: int = FAIR_ROUNDS) -> np.ndarray:
    """Approximately max-min fair rates of flows over `links` (shape 4 x flows).

    Start from each link's equal share; then, `rounds` times, let each link
    split what its flows bottlenecked elsewhere leave unused among the flows it
    bottlenecks.
    """
    nlinks = len(capacity)
    flat = links.ravel()
    count = np.bincount(flat, minlength=nlinks).astype(float)
    share = capacity / np.maximum(count, 1.0)
    rate = share[links].min(axis=0)
    for _ in range(rounds):
        held = share[links] <= rate * (1 + 1e-9)  # this link is (one of) the flow's bottleneck
        elsewhere = np.where(held, 0.0, np.broadcast_to(rate, links.shape)).ravel()
        used_elsewhere = np.bincount(flat, weights=elsewhere, minlength=nlinks)
        bottlenecked = np.bincount(flat, weights=held.ravel().astype(float), minlength=nlinks)
        spare = np.maximum(capacity - used_elsewhere, 0.0)
        share = np.where(bottlenecked > 0, spare / np.maximum(bottlenecked, 1.0), capacity)
        rate = share[links].min(axis=0)
    # Rounds can overshoot where a flow's rate rose at another link: scale back into capacity.
    load = np.bincount(flat, weights=np.broadcast_to(rate, links.shape).ravel(), minlength=nlinks)
    factor = np.minimum(1.0, capacity / np.maximum(load, 1.0))
    rate = rate * factor[links].min(axis=0)
    result: np.ndarray = np.maximum(rate, 1e-3)
    return result


class Origin:
    """An origin's concurrency cap and FIFO queue; bandwidth is its egress link."""

    def __init__(self, index: int, spec: OriginSpec) -> None:
        self.index, self.spec = index, spec
        self.busy = 0
        self.queue: deque[Callable[[], None]] = deque()
        self.egress_bytes = 0.0

    def up(self, now: float) -> bool:
        return self.spec.down_at_s is None or now < self.spec.down_at_s

    def admit(self, begin: Callable[[], None]) -> None:
        """Run `begin` now if a transfer slot is free, else when one frees up."""
        if self.busy < self.spec.max_concurrent:
            self.busy += 1
            begin()
        else:
            self.queue.append(begin)

    def release(self) -> None:
        if self.queue:
            self.queue.popleft()()
        else:
            self.busy -= 1


def _floats(n: int) -> array[float]:
    """`n` zeros, as doubles."""
    return array("d", bytes(8 * n))


def _flags(n: int) -> array[int]:
    """`n` false flags, a byte each (numpy reads them as bools)."""
    return array("b", bytes(n))
