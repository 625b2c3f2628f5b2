"""Units: one reader for sizes, rates and durations, bits only where a user writes them."""

from __future__ import annotations

import argparse

import pytest

from p2p.units import (
    GiB,
    MiB,
    UnitError,
    parse_bandwidth,
    parse_duration,
    parse_size,
    positive_int,
    size_arg,
)


def test_sizes_in_both_powers_and_any_case() -> None:
    assert parse_size("4GiB") == 4 * GiB
    assert parse_size("500MB") == 500e6
    assert parse_size("256mib") == 256 * MiB
    assert parse_size("1.5 KiB") == 1536


def test_bits_and_bytes_per_second_differ_by_eight() -> None:
    assert parse_bandwidth("8Mbps") == 1e6
    assert parse_bandwidth("1MB/s") == 1e6
    with pytest.raises(UnitError, match="is a size, not a bandwidth"):
        parse_bandwidth("1MB")


def test_durations() -> None:
    assert parse_duration("50ms") == pytest.approx(0.05)
    assert parse_duration("2min") == 120.0
    with pytest.raises(UnitError, match="is a bandwidth, not a duration"):
        parse_duration("3Gbps")


def test_a_bare_number_needs_a_unit_unless_the_caller_gives_one() -> None:
    with pytest.raises(UnitError, match="is not a size"):
        parse_size("1000")
    with pytest.raises(UnitError, match="has no unit"):
        parse_size(1000)
    assert parse_size("1000", bare="B") == 1000


@pytest.mark.parametrize(("text", "message"), [("lots", "is not a size"),
                                                ("0MiB", "must be positive")])
def test_size_arg_refuses_with_a_reason(text: str, message: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=message):
        size_arg(text)


def test_positive_int() -> None:
    assert positive_int("3") == 3
    with pytest.raises(argparse.ArgumentTypeError, match="at least 1"):
        positive_int("0")
