"""`p2p.draws.below` is `random.Random.randrange(n)`: the same values, the same state after.

The simulator's results depend on every draw; if a Python's `randrange` ever draws
differently, this fails, and the reason is plain, instead of a study's numbers moving.
"""

from __future__ import annotations

import random

import pytest

from p2p.draws import below

SIZES = [1, 2, 3, 5, 7, 8, 9, 63, 64, 65, 100, 127, 128, 1000, 2**31 - 1, 2**62 + 3, 10**30]


@pytest.mark.parametrize("seed", [0, 1, 7, 20261129])
def test_the_same_draws_as_randrange(seed: int) -> None:
    ours, theirs = random.Random(seed), random.Random(seed)
    for round_ in range(200):
        for n in SIZES:
            assert below(ours, n) == theirs.randrange(n), (round_, n)
    assert ours.getstate() == theirs.getstate()


def test_every_value_below_n_comes_up() -> None:
    rng = random.Random(3)
    assert {below(rng, 5) for _ in range(500)} == {0, 1, 2, 3, 4}


@pytest.mark.parametrize("n", [0, -1])
def test_an_empty_range_is_refused(n: int) -> None:
    with pytest.raises(ValueError, match="empty range"):
        below(random.Random(1), n)
