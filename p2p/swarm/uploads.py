"""Which waiting upload goes out next: a node's upload slots. No I/O.

Theory of operation. A node sends at most `slots` pieces at once, over all
its links (a new chunk then reaches its first requesters at a large share of
the node's upload, and they relay it sooner than if every requester got a
thin share). Each link serves its peer's requests one at a time; the
request at the head of a link asks for a slot (`ask`), and waits if none is
free. When a piece is sent (`done`) the slot goes to one of the waiters,
chosen by the named order:

- `earliest_due` (the default): the one whose requester is furthest behind
  its own line rate. Each request carries its node's *due*
  (`p2p.swarm.node.Node.due`): the time at which the node would hold what
  it holds now, had it received at its line rate since it began wanting its
  unfinished contents. The earliest due goes first, ties to the one that
  asked first. A node that started long ago and is still short is served
  before one that just started; a node that has been served well (holding
  more than its age at line rate would give) waits.
- `neediest_first`: the one whose requester holds the fewest chunks of the
  content it asks for (its `rank`, as the sender knows it from the peer's
  haves), ties to the one that asked first. A late starter gets its pieces
  before nodes that are nearly done, however long those have waited.
- `fifo`: the one that asked first.

Measured in the simulator (simulations/RESULTS.md, "Upload order"), on the
same seeds: when nodes start over several seconds, neediest first keeps
serving each new arrival ahead of the nodes that started first, and the
first starters finish last (`launch`, 1,000 nodes, 10 s of start jitter:
p50 / p99 6.82 / 12.01 s neediest first, 2.54 / 5.86 s earliest due;
`scale`, 10,000 nodes: 5.10 / 7.40 s against 3.45 / 4.13 s). When they all
start within a second and every link is capped (`kraken`), neediest first
spreads new chunks a little faster: p50 10.75 s against 11.33 s, p99
11.35 s against 11.93 s (a node behind its due cannot catch up there, and
serving it first starves the newest arrivals, which hold nothing to serve
yet).

The rank a waiter is queued with is fixed when it asks; a due is a point in
time (on the sender's clock: a request carries it relative to its sending),
so a request that waits long keeps its place rather than being passed by
later ones.

The agent's links (p2p.link) and the simulator's model of them
(simulations.node.Uploads) drive the same `UploadSlots`: the caller passes
keys of its own (a waiter's id, a simulated transfer) and the ranks.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)

UPLOAD_ORDERS = ("earliest_due", "neediest_first", "fifo")
# The agent's defaults (p2p.config.AgentConfig), which the simulator models (AgentSpec).
UPLOAD_SLOTS = 4  # pieces sent at once, over all peers
UPLOAD_ORDER = "earliest_due"


def request_rank(order: str, held: int, due_ms: int) -> int:
    """A request's rank for `UploadSlots` in the named order: its requester's due (ms,
    on the sender's clock) for `earliest_due`, else the chunks the sender knows it holds
    of the content (`fifo` ignores ranks)."""
    return due_ms if order == "earliest_due" else held


class UploadSlots(Generic[K]):
    """At most `slots` uploads at once; the waiters in the named order (module docstring)."""

    def __init__(self, slots: int, order: str = UPLOAD_ORDER) -> None:
        if slots < 1:
            raise ValueError("upload slots must be >= 1")
        if order not in UPLOAD_ORDERS:
            raise ValueError(f"unknown upload order {order!r} (known: "
                             f"{', '.join(UPLOAD_ORDERS)})")
        self.slots = slots
        self.order = order
        self.busy = 0
        self._rank: Callable[[int], int] = (lambda rank: 0) if order == "fifo" else int
        self._heap: list[tuple[int, int, K]] = []  # (rank, arrival, key)
        self._waiting: dict[K, int] = {}  # key -> arrival, while it waits
        self._arrivals = itertools.count()

    def __len__(self) -> int:
        """Waiters."""
        return len(self._waiting)

    def ask(self, key: K, rank: int) -> bool:
        """`key` wants to send; True if it may now, else it waits until `done` names it."""
        if self.busy < self.slots and not self._waiting:
            self.busy += 1
            return True
        arrival = next(self._arrivals)
        self._waiting[key] = arrival
        heapq.heappush(self._heap, (self._rank(rank), arrival, key))
        return False

    def done(self) -> K | None:
        """A piece went out (or failed): the waiter that may send now, if any."""
        self.busy -= 1
        while self._heap:
            _, arrival, key = heapq.heappop(self._heap)
            if self._waiting.get(key) == arrival:
                del self._waiting[key]
                self.busy += 1
                return key
        return None

    def withdraw(self, key: K) -> None:
        """`key` stops waiting (its link closed, its request was cancelled)."""
        self._waiting.pop(key, None)  # its heap entry is skipped when it comes up
