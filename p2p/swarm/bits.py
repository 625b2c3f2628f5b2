"""Chunk sets as Python ints: bit `i` set means chunk `i` is in the set.

Set algebra over a whole content (what I lack, what any free peer holds,
what is not yet requested) is then a handful of machine-word operations, and
iterating a set yields indices in ascending order, so runs are reproducible.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final


def from_bools(flags: Sequence[bool]) -> int:
    # One parse of a digit string made by C loops (the flags as bytes, reversed, each
    # turned into a digit), not an int built bit by bit: a Join carries a flag per
    # chunk, and a mask past 62 bits is a new object at every step.
    if not flags:
        return 0
    return int(bytes(flags)[::-1].translate(_DIGITS), 2)


# Byte `b` -> the digit of a flag of that value: "0" for 0, "1" for anything else.
_DIGITS: Final = bytes.maketrans(bytes(range(256)), b"0" + b"1" * 255)


def to_bools(mask: int, n: int) -> tuple[bool, ...]:
    """The first `n` chunks' flags: flag `i` says whether chunk `i` is in the set."""
    text = format(mask, f"0{n}b")[::-1] if n else ""
    return tuple([flag == "1" for flag in text[:n]])


def from_indices(indices: Iterable[int]) -> int:
    mask = 0
    for i in indices:
        mask |= 1 << i
    return mask


# Below this a mask is a machine word where the core is compiled (mypyc's tagged ints);
# above it every operation on it makes a new int object.
_WORD_BITS: Final = 62
_WORD: Final = 1 << _WORD_BITS
_LOW_WORD: Final = _WORD - 1


def indices(mask: int) -> list[int]:
    """Set bits in ascending order (a list, not a generator: most callers walk a
    whole mask, and a generator is an object and a call per step). A wide mask is
    walked a machine word at a time: two int objects made per 62 chunks."""
    found: list[int] = []
    base = 0
    while mask:
        if mask < _WORD:
            word, mask = mask, 0
        else:
            word, mask = mask & _LOW_WORD, mask >> _WORD_BITS
        while word:
            low = word & -word
            found.append(base + low.bit_length() - 1)
            word ^= low
        base += _WORD_BITS
    return found


def count(mask: int) -> int:
    return mask.bit_count()


def every_kth(n: int, k: int, start: int) -> int:
    """Chunks `start, start + k, start + 2k, ...` below `n`."""
    return from_indices(range(start, n, k))
