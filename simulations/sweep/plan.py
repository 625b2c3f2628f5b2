"""A sweep file's tables in, the runs of the sweep out. No I/O.

Theory of operation
-------------------
A sweep is one base scenario (simulations.scenario), changed the same way for
every run by `[set]`, and in one way per run by `[vary]`, each run with every
seed of `seeds`:

    [sweep]
    scenario = "small"          # a bundled scenario, or a file next to the sweep file
    mode = "product"            # every combination; "zip": the i-th values go together
    seeds = [1, 2, 3]           # or {start = 1, stop = 3}
    metrics = ["p50", "p99"]    # summary fields drawn against each swept key

    [set]                       # the same change for every run
    "run.nodes" = 32

    [vary]                      # scenario keys, dotted as in its TOML, and their values
                                # (none: the base scenario over the seeds)
    "network.racks" = [2, 4, 8]
    "network.oversubscription" = {start = 1.0, stop = 4.0, step = 1.0}
    "workload.content[0].chunk_size" = {start = "4MiB", stop = "64MiB", factor = 2}

A run is the base scenario's tables with its changes written in (`apply`), so
the scenario's own reader checks every run by its own rules; `check` does
that for each key alone and then for each run, before anything runs, and
turns the first failure into a `SweepError` naming the sweep file and the key.
The values of a key carry one unit, as scenario quantities do ("16MiB",
"25Gbps"), or none; a key whose values mix units is an error, since its
runs could not be drawn on one axis. A run's name says its values and seed
and ends with a digest of the scenario it runs, so a run already in an output
directory is the same run even if the sweep file around it changed.

How time enters: it does not; what runs where is the shell's business
(simulations.sweep.run).
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from p2p.units import split_quantity

Value = int | float | str | bool
MODES = ("product", "zip")
# Summary fields a sweep can draw; the first six are seconds, drawn with the floor.
TIME_METRICS = ("p50", "p90", "p99", "p999", "max", "makespan_s")
METRICS = (*TIME_METRICS, "p50_over_floor", "p99_over_floor", "origin_egress_ratio",
           "origin_egress_bytes", "same_rack_bytes", "cross_rack_bytes", "origin_bytes",
           "wasted_bytes", "wall_seconds")
MAX_RUNS = 100_000  # a range written wrong should fail, not fill the disk
_SEGMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)(?:\[([0-9]+)\])?$")
_RANGE_KEYS = {"start", "stop", "step", "factor"}


class SweepError(ValueError):
    """A sweep file is wrong; the message names the file and the key."""


@dataclass(frozen=True, slots=True)
class Axis:
    """One swept key and its values, all in `unit` ("" for plain numbers, None for
    values that are not quantities, such as strategy names)."""

    key: str
    values: tuple[Value, ...]
    unit: str | None

    @property
    def label(self) -> str:
        return f"{self.key} ({self.unit})" if self.unit else self.key

    def number(self, value: Value) -> float | None:
        """`value` as a number in the axis' unit (16 for "16MiB"); None if not a quantity."""
        if self.unit is None or isinstance(value, bool):
            return None
        if isinstance(value, int | float):
            return float(value)
        parts = split_quantity(value)
        return None if parts is None else parts[0]


@dataclass(frozen=True, slots=True)
class Sweep:
    source: str  # the sweep file, for messages
    scenario: str  # a bundled scenario's name or a path, as the shell resolved it
    mode: str
    seeds: tuple[int, ...]
    metrics: tuple[str, ...]
    fixed: tuple[tuple[str, Value], ...]
    axes: tuple[Axis, ...]


@dataclass(frozen=True, slots=True)
class Point:
    """One run: the swept keys' values, the seed, and the run's name."""

    params: tuple[tuple[str, Value], ...]
    seed: int
    name: str


# ---- reading the sweep file -------------------------------------------------------------


def parse_sweep(data: Mapping[str, Any], source: str) -> Sweep:
    """The sweep in `data` (a TOML document's tables); raises SweepError."""
    def error(key: str, message: str) -> SweepError:
        return SweepError(f"{source}: {key}: {message}")

    for key in sorted(set(data) - {"sweep", "set", "vary"}):
        raise error(key, "unknown key (a sweep file has [sweep], [set] and [vary])")
    head = _table(data.get("sweep"), "sweep", source)
    for key in sorted(set(head) - {"scenario", "mode", "seeds", "metrics"}):
        raise error(f"sweep.{key}", "unknown key (scenario, mode, seeds, metrics)")
    scenario = head.get("scenario")
    if not isinstance(scenario, str) or not scenario:
        raise error("sweep.scenario", "is required: a bundled scenario's name or a file")
    mode = head.get("mode", "product")
    if mode not in MODES:
        raise error("sweep.mode", f"{mode!r} is not one of {list(MODES)}")
    metrics = head.get("metrics", ["p50", "p99"])
    if not isinstance(metrics, list) or not metrics:
        raise error("sweep.metrics", f"must be a non-empty list of {list(METRICS)}")
    for metric in metrics:
        if metric not in METRICS:
            raise error("sweep.metrics", f"unknown metric {metric!r}; choose from "
                                         f"{list(METRICS)}")
    fixed = tuple(_flatten(_table(data.get("set"), "set", source), "set", source))
    axes = tuple(_axis(key, raw, source)
                 for key, raw in _flatten(_table(data.get("vary"), "vary", source), "vary",
                                          source, ranges=True))
    for key, _ in (*fixed, *((a.key, None) for a in axes)):
        if key == "run.seed":
            raise error(key, "the seeds of a sweep are [sweep] seeds")
    if mode == "zip" and len({len(a.values) for a in axes}) > 1:
        first = axes[0]
        other = next(a for a in axes if len(a.values) != len(first.values))
        raise error(f"vary.{other.key}", f"has {len(other.values)} values and "
                                         f"{first.key} {len(first.values)}; zip needs as many")
    return Sweep(source, scenario, str(mode), _seeds(head.get("seeds", [1]), source),
                 tuple(str(m) for m in metrics), fixed, axes)


def _table(raw: object, key: str, source: str) -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise SweepError(f"{source}: {key}: must be a table, not {type(raw).__name__}")
    return raw


def _is_range(raw: object) -> bool:
    return isinstance(raw, dict) and bool(raw) and set(raw) <= _RANGE_KEYS


def _flatten(table: Mapping[str, Any], prefix: str, source: str,
             ranges: bool = False) -> list[tuple[str, Any]]:
    """Dotted keys and their values, whether written quoted ("network.racks") or as
    nested tables; with `ranges`, a table of start/stop/step/factor is one value."""
    out: list[tuple[str, Any]] = []
    for key, raw in table.items():
        if isinstance(raw, dict) and not (ranges and _is_range(raw)):
            out += [(f"{key}.{k}", v) for k, v in _flatten(raw, prefix, source, ranges)]
        else:
            out.append((key, raw))
    for key, _ in out:
        if not all(_SEGMENT.match(part) for part in key.split(".")):
            raise SweepError(f"{source}: {prefix}.{key}: is not a scenario key "
                             "(e.g. network.racks, workload.content[0].chunk_size)")
    return out


def _seeds(raw: object, source: str) -> tuple[int, ...]:
    if _is_range(raw) and isinstance(raw, dict):
        start, stop = raw.get("start"), raw.get("stop")
        if not (_is_int(start) and _is_int(stop)) or set(raw) != {"start", "stop"}:
            raise SweepError(f"{source}: sweep.seeds: a range of seeds is "
                             "{start = FIRST, stop = LAST}, integers")
        raw = list(range(int(start), int(stop) + 1))  # type: ignore[arg-type]
    if not isinstance(raw, list) or not raw or not all(_is_int(s) for s in raw):
        raise SweepError(f"{source}: sweep.seeds: must be a non-empty list of integers "
                         "or {start, stop}")
    if len(set(raw)) != len(raw):
        raise SweepError(f"{source}: sweep.seeds: seeds repeat: {raw}")
    return tuple(int(s) for s in raw)


def _is_int(raw: object) -> bool:
    return isinstance(raw, int) and not isinstance(raw, bool)


# ---- one swept key ----------------------------------------------------------------------------


def _axis(key: str, raw: object, source: str) -> Axis:
    def error(message: str) -> SweepError:
        return SweepError(f"{source}: vary.{key}: {message}")

    if isinstance(raw, dict):
        values = _range(raw, error)
    elif isinstance(raw, list):
        values = list(raw)
    else:
        raise error("must be a list of values or a range {start, stop, step or factor}")
    if not values:
        raise error("has no values (an empty list)")
    for value in values:
        if not isinstance(value, int | float | str | bool):
            raise error(f"{value!r} is not a value a scenario key takes")
    if len(set(map(repr, values))) != len(values):
        raise error(f"values repeat: {values}")
    units = [_unit(v) for v in values]
    if len(set(units)) > 1:
        shown = ", ".join(sorted({u or "a bare number" for u in units if u is not None}
                                 | ({"text"} if None in units else set())))
        raise error(f"mixed units ({shown}); write every value of a key in one unit")
    return Axis(key, tuple(values), units[0])


def _unit(value: Value) -> str | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return ""
    parts = split_quantity(value)
    return None if parts is None else parts[1]


def _range(raw: Mapping[str, Any], error: Callable[[str], SweepError]) -> list[Value]:
    if not _is_range(raw) or "start" not in raw or "stop" not in raw \
            or len({"step", "factor"} & set(raw)) != 1:
        raise error("a range is {start, stop, step} or {start, stop, factor}")
    ends = [_number_in(raw[k], k, error) for k in ("start", "stop")]
    units = {ends[0][1], ends[1][1]}
    by = "step" if "step" in raw else "factor"
    amount, unit = _number_in(raw[by], by, error)
    if by == "step":
        units.add(unit)
    if len(units) > 1:
        raise error(f"mixed units ({', '.join(sorted(u or 'a bare number' for u in units))})"
                    "; write start, stop and step in one unit")
    (start, unit), (stop, _) = ends
    if stop < start:
        raise error(f"the range is empty: stop {raw['stop']!r} is below start "
                    f"{raw['start']!r}")
    if (by == "step" and amount <= 0) or (by == "factor" and amount <= 1):
        raise error(f"{by} {raw[by]!r} never reaches stop; it must be more than "
                    f"{0 if by == 'step' else 1}")
    numbers: list[float] = []
    value = start
    while value <= stop * (1 + 1e-9) and len(numbers) <= MAX_RUNS:
        numbers.append(value)
        value = start + len(numbers) * amount if by == "step" else value * amount
    if len(numbers) > MAX_RUNS:
        raise error(f"more than {MAX_RUNS} values")
    whole = (all(_is_int(raw[k]) for k in ("start", by)) and by == "step") or \
        (by == "factor" and _is_int(raw["start"]) and float(amount).is_integer())
    return [_written(v, unit, whole) for v in numbers]


def _number_in(raw: object, key: str, error: Callable[[str], SweepError]) -> tuple[float, str]:
    if isinstance(raw, int | float) and not isinstance(raw, bool):
        return float(raw), ""
    parts = split_quantity(raw) if isinstance(raw, str) else None
    if parts is None:
        raise error(f"{key} {raw!r} is not a number or a quantity with its unit ('4MiB')")
    return parts


def _written(value: float, unit: str, whole: bool) -> Value:
    """A range's value as the scenario file would write it."""
    rounded = round(value, 9)
    number: int | float = int(rounded) if whole or (unit and rounded.is_integer()) \
        else rounded
    return f"{number}{unit}" if unit else number


# ---- runs ------------------------------------------------------------------------------------


def points(sweep: Sweep, base: Mapping[str, Any]) -> list[Point]:
    """Every run of `sweep` over the scenario tables `base`, seeds innermost."""
    columns = [[(a.key, v) for v in a.values] for a in sweep.axes]
    combos = zip(*columns, strict=True) if sweep.mode == "zip" else itertools.product(*columns)
    runs: list[Point] = []
    for combo in combos:
        for seed in sweep.seeds:
            tables = apply(base, sweep, combo, seed)
            runs.append(Point(tuple(combo), seed, run_name(combo, seed, tables)))
            if len(runs) > MAX_RUNS:
                raise SweepError(f"{sweep.source}: vary: more than {MAX_RUNS} runs")
    names = [p.name for p in runs]
    if len(set(names)) != len(names):
        twice = next(n for n in names if names.count(n) > 1)
        raise SweepError(f"{sweep.source}: vary: run {twice} comes twice")
    return runs


def apply(base: Mapping[str, Any], sweep: Sweep, params: Sequence[tuple[str, Value]],
          seed: int) -> dict[str, Any]:
    """A copy of the scenario tables `base` with `[set]`, `params` and `seed` written in."""
    tables = copy.deepcopy(dict(base))
    for key, value in (*sweep.fixed, *params, ("run.seed", seed)):
        _put(tables, key, value)
    return tables


def _put(tables: dict[str, Any], key: str, value: Value) -> None:
    """Write `value` at the dotted `key`, making the tables on the way; a list entry
    (`content[0]`) must already be in the scenario."""
    node: Any = tables
    parts = key.split(".")
    for depth, part in enumerate(parts):
        match = _SEGMENT.match(part)
        assert match is not None  # _flatten checked every key
        name, index = match.group(1), match.group(2)
        where = ".".join(parts[:depth + 1])
        last = depth == len(parts) - 1
        if index is not None:
            items = node.get(name)
            if not isinstance(items, list) or int(index) >= len(items):
                count = len(items) if isinstance(items, list) else 0
                tables_at = ".".join([*parts[:depth], name])
                raise KeyError(f"the scenario has {count} [[{tables_at}]] tables, no {where}")
            if last:
                items[int(index)] = value
                return
            node = items[int(index)]
        elif last:
            if isinstance(node.get(name), dict | list):
                raise KeyError(f"{where} is a table in the scenario, not a value")
            node[name] = value
        else:
            node = node.setdefault(name, {})
            if not isinstance(node, dict):
                raise KeyError(f"{where} is a value in the scenario, not a table")


def check(sweep: Sweep, base: Mapping[str, Any],
          parse: Callable[[dict[str, Any]], object]) -> list[Point]:
    """Every run of `sweep`, each checked by `parse` (the scenario reader, which raises
    ValueError naming the scenario key): each value of each changed key alone first, so
    that an error names the key, then every run (for rules that tie keys together).
    Raises SweepError naming the sweep file and the key."""
    first = sweep.seeds[0]
    for table, key, value in (*(("set", k, v) for k, v in sweep.fixed),
                              *(("vary", a.key, v) for a in sweep.axes for v in a.values)):
        alone = Sweep(sweep.source, sweep.scenario, sweep.mode, sweep.seeds, sweep.metrics,
                      (), ())
        try:
            parse(apply(base, alone, [(key, value)], first))
        except KeyError as exc:
            raise SweepError(f"{sweep.source}: {table}.{key}: {exc.args[0]}") from None
        except ValueError as exc:
            raise SweepError(f"{sweep.source}: {table}.{key}: {exc}") from None
    runs = points(sweep, base)
    for run in runs:
        try:
            parse(apply(base, sweep, run.params, run.seed))
        except ValueError as exc:
            raise SweepError(f"{sweep.source}: vary: run {run.name}: {exc}") from None
    return runs


def run_name(params: Sequence[tuple[str, Value]], seed: int,
             tables: Mapping[str, Any]) -> str:
    """`racks-4_oversubscription-2.0_seed-1_<digest>`: readable, safe as a file name and
    a partition value, and tied by the digest to the very scenario the run runs."""
    words = [f"{key.split('.')[-1]}-{_slug(value)}" for key, value in params]
    digest = hashlib.sha256(json.dumps(tables, sort_keys=True, default=str).encode())
    readable = "_".join([*words, f"seed-{seed}"])[:120]
    return f"{readable}_{digest.hexdigest()[:10]}"


def _slug(value: Value) -> str:
    return re.sub(r"[^A-Za-z0-9.+]", "_", str(value).lower() if isinstance(value, bool)
                  else str(value))
