"""Units: the one place sizes, rates and durations are defined and read.

In code every quantity is in bytes, bytes per second or seconds, and a name carries
its unit (`size_bytes`, `egress_Bps`, `latency_s`). Bits appear only where a user
writes them: "25Gbps" is read here and becomes bytes per second at once.

What a user may write:

- a size: "4GiB", "500MB" (KB/MB/GB/TB are powers of 1000, KiB/MiB/GiB/TiB of 1024,
  B is bytes); case does not matter, since no size unit is in bits;
- a bandwidth: "25Gbps" (bits per second: bps, Kbps, Mbps, Gbps, Tbps) or "3GB/s"
  (bytes per second: any size unit and "/s"); case matters: Mbps is not MB/s;
- a duration: "50ms", "2s", "1.5min" (us, ms, s, m, min, h).

The parsers raise `UnitError` (a ValueError) naming what was wrong; `size_arg`,
`bandwidth_arg` and `positive_int` are the argparse types for command lines.
No I/O, stdlib only.
"""

from __future__ import annotations

import argparse
import re

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30
TiB = 1 << 40
KB = 10**3
MB = 10**6
GB = 10**9

SIZE_UNITS = {"B": 1, "KB": KB, "MB": MB, "GB": GB, "TB": 10**12,
              "KiB": KiB, "MiB": MiB, "GiB": GiB, "TiB": TiB}
BIT_RATE_UNITS = {"bps": 1, "Kbps": 10**3, "Mbps": 10**6, "Gbps": 10**9, "Tbps": 10**12}
TIME_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}
_SIZE_BY_LOWER = {name.lower(): factor for name, factor in SIZE_UNITS.items()}
_QUANTITY = re.compile(r"^\s*(-?[0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?)\s*([A-Za-z/]*)\s*$")


class UnitError(ValueError):
    """A quantity that cannot be read; the message says what was expected."""


def parse_size(text: object, bare: str | None = None) -> float:
    """Bytes. A bare number is taken in the unit `bare` (e.g. "B"); with None it is an
    error, so a file cannot leave its unit to chance."""
    value, unit = _split(text, "size", "4GiB", bare)
    factor = _SIZE_BY_LOWER.get(unit.lower())
    if factor is None:
        raise UnitError(f"{text!r} is {_kind_of(unit)}, not a size (e.g. '4GiB', '500MB')")
    return value * factor


def parse_bandwidth(text: object) -> float:
    """Bytes per second."""
    value, unit = _split(text, "bandwidth", "25Gbps", None)
    if unit in BIT_RATE_UNITS:
        return value * BIT_RATE_UNITS[unit] / 8
    if unit.endswith("/s") and unit[:-2] in SIZE_UNITS:
        return value * SIZE_UNITS[unit[:-2]]
    raise UnitError(f"{text!r} is {_kind_of(unit)}, not a bandwidth (e.g. '25Gbps', '3GB/s')")


def parse_duration(text: object) -> float:
    """Seconds."""
    value, unit = _split(text, "duration", "50ms", None)
    if unit not in TIME_UNITS:
        raise UnitError(f"{text!r} is {_kind_of(unit)}, not a duration (e.g. '50ms', '2s')")
    return value * TIME_UNITS[unit]


def split_quantity(text: str) -> tuple[float, str] | None:
    """(number, unit) of a quantity written with its unit ("16MiB" -> (16.0, "MiB")), or
    None if `text` is not one (a bare number included)."""
    m = _QUANTITY.match(text)
    return None if m is None or not m.group(2) else (float(m.group(1)), m.group(2))


def size_arg(text: str) -> int:
    """argparse type: a positive size in bytes ("256MiB", "1GiB"; a bare number is bytes)."""
    try:
        value = int(parse_size(text, bare="B"))
    except UnitError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size like 256MiB or 1GiB") \
            from exc
    if value <= 0:
        raise argparse.ArgumentTypeError(f"size must be positive, got {text!r}")
    return value


def positive_int(text: str) -> int:
    """argparse type: an integer of 1 or more."""
    try:
        value = int(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from exc
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _split(text: object, what: str, example: str, bare: str | None) -> tuple[float, str]:
    if not isinstance(text, str):
        raise UnitError(f"{text!r} has no unit; write it as a string, e.g. {example!r}")
    m = _QUANTITY.match(text)
    if m is None or (not m.group(2) and bare is None):
        raise UnitError(f"{text!r} is not a {what} (e.g. {example!r})")
    return float(m.group(1)), m.group(2) or (bare or "")


def _kind_of(unit: str) -> str:
    if unit.lower() in _SIZE_BY_LOWER:
        return "a size"
    if unit in BIT_RATE_UNITS or (unit.endswith("/s") and unit[:-2] in SIZE_UNITS):
        return "a bandwidth"
    if unit in TIME_UNITS:
        return "a duration"
    return "an unknown unit"
