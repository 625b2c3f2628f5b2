"""The event loop on virtual time: a clock and a heap of callbacks.

Theory of operation
-------------------
Everything that happens in a simulation is a callback scheduled at a virtual
time, in seconds. `at(t, fn, arg)` pushes `(t, seq, fn, arg)` on a heap;
`run()` pops the earliest entry, sets `now` to its time and calls `fn(arg)`.
The sequence number breaks ties in the order the callbacks were scheduled, so
a run depends only on its inputs and its seed, never on hash order or on the
wall clock.

The loop knows nothing of networks or swarms. It stops when the heap is
empty, when a callback calls `stop(reason)`, or when virtual time passes
`until`; the caller then reads `stopped` to learn why.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any

Callback = Callable[[Any], None]


class Loop:
    """A virtual clock and its heap of pending callbacks."""

    __slots__ = ("_heap", "_seq", "events", "now", "stopped")

    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Callback, Any]] = []
        self._seq = 0
        self.events = 0  # callbacks run so far
        self.stopped: str | None = None

    def at(self, when: float, fn: Callback, arg: Any = None) -> None:
        """Call `fn(arg)` at virtual time `when` (never before `now`)."""
        self._seq += 1
        heapq.heappush(self._heap, (when if when > self.now else self.now, self._seq, fn, arg))

    def at_many(self, whens: list[float], fn: Callback, args: list[Any]) -> None:
        """`at(when, fn, arg)` for each pair, in order: one call for a whole batch."""
        heap, push, now, seq = self._heap, heapq.heappush, self.now, self._seq
        for when, arg in zip(whens, args, strict=True):
            seq += 1
            push(heap, (when if when > now else now, seq, fn, arg))
        self._seq = seq

    def after(self, delay: float, fn: Callback, arg: Any = None) -> None:
        self.at(self.now + delay, fn, arg)

    def stop(self, reason: str) -> None:
        """End `run` after the current callback; `reason` is kept in `stopped`."""
        if self.stopped is None:
            self.stopped = reason

    def pending(self) -> int:
        return len(self._heap)

    def run(self, until: float = float("inf"),
            every: tuple[int, Callable[[], None]] | None = None) -> None:
        """Run callbacks in time order until the heap is empty, `stop`, or `until`.

        `every=(n, fn)` calls `fn()` after each `n` callbacks: a progress hook.
        """
        heap, pop = self._heap, heapq.heappop
        tick, hook = every if every is not None else (0, None)
        count = 0
        while heap and self.stopped is None:
            when, _, fn, arg = heap[0]
            if when > until:
                self.stop(f"virtual time passed the limit of {until:g} s")
                break
            pop(heap)
            self.now = when
            fn(arg)
            count += 1
            if hook is not None and count % tick == 0:
                hook()
        self.events += count
