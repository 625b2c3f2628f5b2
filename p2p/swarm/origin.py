"""Which chunks a node reads from the origin, and in what order. No I/O.

The tracker appoints `slots` origin fetchers per content; fetcher `slot` owns
the chunks `c % slots == slot`. The modulus is the configured fetcher count
and never changes, so fetchers appointed at the same moment never claim the
same chunk; while only `filled` slots have a fetcher, vacant slot `v` falls to
fetcher `v % filled` as well. (It used to fall to fetcher 0 alone. With eight
slots and four agents that made fetcher 0 read and upload 10 of every 16
chunks: 4 agents, 64 MiB, 20 MB/s caps, 1.34x the bound in the simulator
against 1.06x shared; real agents took 5.3-5.5 s where they had taken 3.4 s
with four slots.)

Each fetcher reads upwards from its own region of the content (`slot * n /
slots`), after reader demand and the prefetch list: a region reaches peers in
order, and fetchers that briefly disagree about the fetcher set start apart.
Nodes that start together are appointed a moment apart (the first is fetcher 0
of one, the next fetcher 1 of two, ...), and fetcher 0 learns of the others
only at its next announce, so for a moment it covers chunks that their owners
fetch too. Three rules keep it off them: it leaves the vacant slots' chunks
alone for `vacant_grace_s` after it first covers and wants them (the swarm's
rule: by then it has heard the newcomers' pending marks, or the tracker's new
count), unless they are on the prefetch list, and a peer joining it during the
grace puts the end off to a grace after the join (at most twice the grace from
the start: the joiner's marks follow its Join); when the grace ends, it asks
the tracker again and covers only the slots still vacant (newcomers wait up to
`settle_s` before their first fetch, longer than the grace, so their marks may
not have come yet); and it takes them last, from the end of the content down,
while the newcomers take theirs from their regions up. Measured, 8 agents
ensuring nine contents of 1-7 chunks at once, the origin served 1.0-1.27x the
bytes (9 runs) with neither of the first and last rules, 1.0-1.10x (6 runs)
with the order alone, and with both 1.0x in 5 of 6 runs (1.012x in the sixth)
at a 0.25 s grace, 1.0x in 6 of 6 at 0.5 s. The price is paid by a node
alone: its contents of two chunks or more finish up to the grace later (64 MiB
from a loopback origin: 0.36 s before, 0.55 s after), so the grace is the
shorter one. Two nodes launching together (`bench launch`, a lazily attached
checkpoint of 2 stripes ensured a moment later) made HDFS serve it 1.5x in 3
of 6 runs while the grace counted from the appointment alone, and in 1 of 13
once it counted from the want (the joiner's mark came 0.13 s after the grace);
with a join putting it off, 1.0x in 19 of 19. Asking the tracker again: 32
agents starting together read one chunk twice in 4 of 6 runs without it, in 0
of 4 with it.
"""

from __future__ import annotations

from p2p.swarm import bits


def owned_chunks(chunks: int, slot: int | None, slots: int, filled: int | None) -> int:
    """The chunks fetcher `slot` owns, as a bit mask (0 if it is not a fetcher)."""
    if slot is None:
        return 0
    slots = max(1, slots)
    return bits.every_kth(chunks, slots, slot % slots) | \
        vacant_chunks(chunks, slot, slots, filled)


def vacant_chunks(chunks: int, slot: int | None, slots: int, filled: int | None) -> int:
    """The chunks of vacant slots that fetcher `slot` covers: vacant slot `v` is covered
    by fetcher `v % filled`."""
    slots = max(1, slots)
    filled = slots if filled is None else max(1, filled)
    if slot is None or slot % slots >= filled:
        return 0
    vacant = 0
    for residue in range(filled + slot % slots, slots, filled):
        vacant |= bits.every_kth(chunks, slots, residue)
    return vacant


def region_start(chunks: int, slot: int, slots: int) -> int:
    slots = max(1, slots)
    return slot % slots * chunks // slots


def origin_order(todo: int, first: list[int], start: int, limit: int,
                 vacant: int = 0) -> list[int]:
    """Up to `limit` chunks of `todo`: those listed in `first`, then upwards from `start`,
    then those in `vacant` from the last one down."""
    head: list[int] = []
    for chunk in first:
        if len(head) == limit:
            break
        if todo >> chunk & 1:
            head.append(chunk)
            todo &= ~(1 << chunk)
    last = todo & vacant
    todo &= ~vacant
    upper = todo >> start << start
    rest = [*bits.indices(upper), *bits.indices(todo & ~upper)]
    if len(head) + len(rest) < limit:
        rest += list(bits.indices(last))[::-1]
    return head + rest[:limit - len(head)]
