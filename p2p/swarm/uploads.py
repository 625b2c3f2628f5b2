"""Which waiting upload goes out next: a node's upload slots. No I/O.

Theory of operation. A node sends at most `slots` pieces at once, over all
its links (a new chunk then reaches its first requesters at a large share of
the node's upload, and they relay it sooner than if every requester got a
thin share). Each link serves its peer's requests one at a time; the
request at the head of a link asks for a slot (`ask`), and waits if none is
free. When a piece is sent (`done`) the slot goes to one of the waiters,
chosen by the named order:

- `fifo`: the one that asked first.
- `neediest_first`: the one whose requester holds the fewest chunks of the
  content it asks for (its `rank`, as the sender knows it from the peer's
  haves), ties to the one that asked first. A node that is behind, a late
  starter or one whose links were slow, gets its pieces before nodes that are
  nearly done; in the simulated Kraken run this took the slowest node from
  15.4 s to 11.0 s with a floor of 10 s, without slowing the median.

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

UPLOAD_ORDERS = ("neediest_first", "fifo")
# The agent's defaults (p2p.config.AgentConfig), which the simulator models (AgentSpec).
UPLOAD_SLOTS = 4  # pieces sent at once, over all peers
UPLOAD_ORDER = "neediest_first"


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
