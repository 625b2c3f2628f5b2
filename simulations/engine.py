"""The event loop on virtual time: a clock and a heap of callbacks.

Theory of operation
-------------------
Everything that happens in a simulation is a callback scheduled at a virtual
time, in seconds. `at(t, fn, arg)` pushes an entry `(t, seq, fn, arg)` on a
heap; `run()` pops the earliest entry, sets `now` to its time and calls
`fn(arg)`.
The sequence number breaks ties in the order the callbacks were scheduled, so
a run depends only on its inputs and its seed, never on hash order or on the
wall clock.

Most callbacks of a run come a fixed delay after the one that schedules
them: a have reaches the peers one control latency later, a request its
sender one link latency later. Virtual time never goes back, so the
callbacks of one delay come due in the order they were scheduled: each such
delay gets a *lane* (`lane(delay)`), a FIFO list that `after_lane` appends
to, and `run` takes the earliest of the heap's top and the lanes' heads. The
order is the heap's own, `(time, sequence number)`, so a run is the same with
lanes as without; a push and a pop of a lane cost no comparisons, where the
heap's cost one per level, each on a cold entry of a heap of 10^5.

The heap is this module's own, not `heapq`'s: its entries are `_Entry`
objects that hold their time as a C double once compiled (simulations.compiled),
so a comparison reads two fields of two objects, where heapq's compares two
tuples and the float objects in them through three generic calls. Every
entry's key is unique, so any correct heap pops the same order.

The loop knows nothing of networks or swarms. It stops when the heap is
empty, when a callback calls `stop(reason)`, or when virtual time passes
`until`; the caller then reads `stopped` to learn why.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

Callback = Callable[[Any], None]


class _Entry:
    """A scheduled callback: `fn(arg)` at `when`, the `seq`-th scheduled."""

    __slots__ = ("arg", "fn", "seq", "when")

    def __init__(self, when: float, seq: int, fn: Callback, arg: Any) -> None:
        self.when, self.seq, self.fn, self.arg = when, seq, fn, arg


def _ran(_: Any) -> None:
    raise AssertionError("a lane entry ran twice")


_RAN: Final = _Entry(0.0, 0, _ran, None)  # a lane's slot once its entry has run


def _earlier(a: _Entry, b: _Entry) -> bool:
    """Whether `a` runs before `b`: the earlier time, then the one scheduled first."""
    return a.when < b.when or (a.when == b.when and a.seq < b.seq)


def _push(heap: list[_Entry], entry: _Entry) -> None:
    """Add `entry` to the binary min-heap `heap` (by time, then sequence number)."""
    heap.append(entry)
    _rise(heap, len(heap) - 1, entry)


def _rise(heap: list[_Entry], pos: int, entry: _Entry) -> None:
    """Put `entry` at the hole `pos`, moving the hole up past later parents."""
    while pos > 0:
        up = (pos - 1) >> 1
        parent = heap[up]
        if _earlier(entry, parent):
            heap[pos] = parent
            pos = up
        else:
            break
    heap[pos] = entry


def _pop(heap: list[_Entry]) -> _Entry:
    """Remove and return the heap's earliest entry (the heap is not empty). As heapq's
    pop: the hole at the root goes down to a leaf along the earlier children, and the
    last entry climbs from there."""
    last = heap.pop()
    n = len(heap)
    if n == 0:
        return last
    top = heap[0]
    pos, child = 0, 1
    while child < n:
        right = child + 1
        if right < n and _earlier(heap[right], heap[child]):
            child = right
        heap[pos] = heap[child]
        pos, child = child, 2 * child + 1
    _rise(heap, pos, last)
    return top


class Loop:
    """A virtual clock and its heap of pending callbacks."""

    __slots__ = ("_delays", "_heads", "_heap", "_lanes", "_seq", "events", "now", "stopped")

    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[_Entry] = []
        self._delays: list[float] = []  # each lane's delay
        self._lanes: list[list[_Entry]] = []
        self._heads: list[int] = []  # each lane's first entry not yet run
        self._seq = 0
        self.events = 0  # callbacks run so far
        self.stopped: str | None = None

    def at(self, when: float, fn: Callback, arg: Any = None) -> None:
        """Call `fn(arg)` at virtual time `when` (never before `now`)."""
        self._seq += 1
        _push(self._heap, _Entry(when if when > self.now else self.now, self._seq, fn, arg))

    def at_many(self, whens: list[float], fn: Callback, args: list[Any]) -> None:
        """`at(when, fn, arg)` for each pair, in order: one call for a whole batch."""
        heap, now, seq = self._heap, self.now, self._seq
        for when, arg in zip(whens, args, strict=True):
            seq += 1
            _push(heap, _Entry(when if when > now else now, seq, fn, arg))
        self._seq = seq

    def after(self, delay: float, fn: Callback, arg: Any = None) -> None:
        self.at(self.now + delay, fn, arg)

    def lane(self, delay: float) -> int:
        """The lane of callbacks due `delay` seconds after they are scheduled (module
        docstring), made on first use: the number to give `after_lane`."""
        if not delay >= 0:
            raise ValueError(f"a lane's delay must be 0 or more, not {delay}")
        if delay in self._delays:
            return self._delays.index(delay)
        self._delays.append(delay)
        self._lanes.append([])
        self._heads.append(0)
        return len(self._lanes) - 1

    def after_lane(self, lane: int, fn: Callback, arg: Any = None) -> None:
        """`after(delay, fn, arg)` for the `delay` of `lane`, without the heap."""
        self._seq += 1
        self._lanes[lane].append(_Entry(self.now + self._delays[lane], self._seq, fn, arg))

    def stop(self, reason: str) -> None:
        """End `run` after the current callback; `reason` is kept in `stopped`."""
        if self.stopped is None:
            self.stopped = reason

    def pending(self) -> int:
        return len(self._heap) + sum(len(lane) - head
                                     for lane, head in zip(self._lanes, self._heads, strict=True))

    def run(self, until: float = float("inf"),
            every: tuple[int, Callable[[], None]] | None = None) -> None:
        """Run callbacks in time order until the heap is empty, `stop`, or `until`.

        `every=(n, fn)` calls `fn()` after each `n` callbacks: a progress hook.
        """
        heap, lanes, heads = self._heap, self._lanes, self._heads
        tick, hook = every if every is not None else (0, None)
        count = 0
        while self.stopped is None:
            # The earliest entry, by (time, sequence number): the heap's top or a lane's head.
            found = -1 if heap else -2  # -2: none yet, -1: the heap's top, else the lane
            best = heap[0] if heap else _RAN
            for i in range(len(lanes)):
                lane, head = lanes[i], heads[i]
                if head < len(lane):
                    entry = lane[head]
                    if found == -2 or _earlier(entry, best):
                        best, found = entry, i
            if found == -2:
                break
            if best.when > until:
                self.stop(f"virtual time passed the limit of {until:g} s")
                break
            if found == -1:
                _pop(heap)
            else:
                self._advance(found)
            self.now = best.when
            best.fn(best.arg)
            count += 1
            if hook is not None and count % tick == 0:
                hook()
        self.events += count

    def _advance(self, i: int) -> None:
        """Lane i's head has run: the next one is its head; the list drops its run
        entries once they are half of it."""
        lane, head = self._lanes[i], self._heads[i]
        lane[head] = _RAN  # (what it holds is freed once it has run, as the heap's are)
        head += 1
        if head == len(lane):
            lane.clear()
            head = 0
        elif head >= 1024 and 2 * head >= len(lane):
            del lane[:head]
            head = 0
        self._heads[i] = head
