"""Which chunks a node reads from the origin, and in what order. No I/O.

The tracker appoints `slots` origin fetchers per content; fetcher `slot` owns
the chunks `c % slots == slot`. The modulus is the configured fetcher count
and never changes, so fetchers appointed at the same moment never claim the
same chunk; while only `filled` slots have a fetcher, fetcher 0 also owns the
vacant ones.

Each fetcher reads upwards from its own region of the content (`slot * n /
slots`), after reader demand and the prefetch list: a region reaches peers in
order, and fetchers that briefly disagree about the fetcher set start apart.
"""

from __future__ import annotations

from collections.abc import Sequence

from p2p.swarm import bits


def owned_chunks(chunks: int, slot: int | None, slots: int, filled: int | None) -> int:
    """The chunks fetcher `slot` owns, as a bit mask (0 if it is not a fetcher)."""
    if slot is None:
        return 0
    slots = max(1, slots)
    filled = slots if filled is None else max(1, filled)
    residues = [slot % slots] + (list(range(filled, slots)) if slot % slots == 0 else [])
    owned = 0
    for residue in residues:
        owned |= bits.every_kth(chunks, slots, residue)
    return owned


def region_start(chunks: int, slot: int, slots: int) -> int:
    slots = max(1, slots)
    return slot % slots * chunks // slots


def origin_order(todo: int, first: Sequence[int], start: int, limit: int) -> list[int]:
    """Up to `limit` chunks of `todo`: those listed in `first`, then upwards from `start`."""
    head: list[int] = []
    for chunk in first:
        if len(head) == limit:
            break
        if todo >> chunk & 1:
            head.append(chunk)
            todo &= ~(1 << chunk)
    upper = todo >> start << start
    rest = [*bits.indices(upper), *bits.indices(todo & ~upper)]
    return head + rest[:limit - len(head)]
