"""Random draws the swarm core and the tracker make, in code the simulator compiles.

`random.Random.randrange` is written in Python (the standard library's random.py).
Where the core and the tracker run compiled (simulations.compiled), each call of it
is an interpreted frame: a `launch-10k` handout draws a rack window start per rack
it visits, about 30 per content per announce. `below` makes the same draw from the
same generator state in the caller's own code.
"""

from __future__ import annotations

import random


def below(rng: random.Random, n: int) -> int:
    """`rng.randrange(n)` for `n > 0`: the same value, and the same state after it.

    CPython's `randrange(n)` is `_randbelow_with_getrandbits(n)`: draw `n.bit_length()`
    bits until the value is below `n`. tests/test_draws.py holds the two equal, so a
    Python that draws otherwise fails there, not in a study's numbers."""
    if n <= 0:
        raise ValueError("empty range for below()")
    bits = n.bit_length()
    r = rng.getrandbits(bits)
    while r >= n:
        r = rng.getrandbits(bits)
    return r
