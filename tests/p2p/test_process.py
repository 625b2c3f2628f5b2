"""p2p.process: what /proc says of a process, read the way the benchmarks use it."""

from __future__ import annotations

import os

from p2p.process import age_seconds, cpu_split


def test_age_orders_a_process_after_its_parent() -> None:
    own, parent = age_seconds(), age_seconds(os.getppid())
    assert own is not None and parent is not None
    assert 0.0 < own <= parent  # the parent was started first


def test_age_grows_as_this_process_works() -> None:
    before = age_seconds()
    spent = sum(cpu_split(os.getpid()))
    while sum(cpu_split(os.getpid())) - spent < 0.05:  # two ticks of CPU, at least
        sum(range(10_000))
    after = age_seconds()
    assert before is not None and after is not None and after > before


def test_age_of_no_process_is_none() -> None:
    assert age_seconds(2**22 + 1) is None  # above the kernel's largest pid
