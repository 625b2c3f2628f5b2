"""Chunk sets as Python ints: bit `i` set means chunk `i` is in the set.

Set algebra over a whole content (what I lack, what any free peer holds,
what is not yet requested) is then a handful of machine-word operations, and
iterating a set yields indices in ascending order, so runs are reproducible.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence


def from_bools(flags: Sequence[bool]) -> int:
    mask = 0
    for i, flag in enumerate(flags):
        if flag:
            mask |= 1 << i
    return mask


def to_bools(mask: int, n: int) -> tuple[bool, ...]:
    """The first `n` chunks' flags: flag `i` says whether chunk `i` is in the set."""
    text = format(mask, f"0{n}b")[::-1] if n else ""
    return tuple([flag == "1" for flag in text[:n]])


def from_indices(indices: Iterable[int]) -> int:
    mask = 0
    for i in indices:
        mask |= 1 << i
    return mask


def indices(mask: int) -> Iterator[int]:
    """Set bits in ascending order."""
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


def count(mask: int) -> int:
    return mask.bit_count()


def every_kth(n: int, k: int, start: int) -> int:
    """Chunks `start, start + k, start + 2k, ...` below `n`."""
    return from_indices(range(start, n, k))
