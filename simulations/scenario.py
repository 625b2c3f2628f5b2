"""Scenario files: TOML in, a checked `Scenario` out.

Every quantity with a unit is written with it ("25Gbps", "300MB/s", "4GiB",
"50ms"); a bare number, a size where a bandwidth belongs, an unknown key or
an impossible value (negative bandwidth, zero racks) is rejected with a
`ScenarioError` that names the file and the key. Sizes: B, KB, MB, GB, TB
(powers of 1000) and KiB, MiB, GiB, TiB (powers of 1024). Bandwidths: bps,
Kbps, Mbps, Gbps, Tbps (bits) or a size per second ("3GB/s"). Durations: us,
ms, s, m (or min), h.

Layout (see simulations/scenarios/*.toml for complete examples):

    [run]      nodes, seed, strategy, max_time, stall_after
    [network]  racks, nic_up, nic_down, oversubscription,
               same_rack_latency, cross_rack_latency, rate_update
    [[origin]] name, egress, max_concurrent, latency, down_at
    [tracker]  handout_limit, announce_interval, peer_ttl, origin_fetchers
    [agent]    upload_slots, upload_order, upload_cap, download_cap, burst: the agent's
               settings of those names (caps are bandwidths; absent = no cap);
               cancel_on_wire = false models wire protocol 1 (see AgentSpec); a
               node's line rate, which its requests' due assumes, is its
               download cap, else its NIC (the agent's line_mbps)
    [swarm]    overrides of p2p.swarm.SwarmConfig fields; "_s" fields drop
               the suffix and take a duration (request_timeout = "15s"):
               origin_patience, appointed_patience and settle among them
    [workload] start_jitter, fail_fraction, fail_window_start, fail_window_end
    [[workload.content]] name, size, chunk_size, origin (name or list),
               hot_fraction, shards, cpu, cpu_origin_only (CPU-seconds per
               node once the bytes are there; see simulations.cpu)
    [cpu]      cores (per node, or in all with shared = true)
"""

from __future__ import annotations

import dataclasses
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from p2p.ratelimit import BURST_BYTES
from p2p.swarm import SwarmConfig
from p2p.swarm.uploads import UPLOAD_ORDER, UPLOAD_ORDERS, UPLOAD_SLOTS
from p2p.units import parse_bandwidth, parse_duration, parse_size
from simulations.cpu import CpuSpec
from simulations.network import NetworkSpec, OriginSpec
from simulations.node import AgentSpec
from simulations.strategy import STRATEGIES
from simulations.tracker import TrackerSpec
from simulations.workload import ContentKind, Workload

MAX_CHUNKS = 1 << 20  # per content: the swarm keeps chunk sets as int bit masks


class ScenarioError(ValueError):
    """A scenario file is malformed; the message names the file and the key."""


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    source: str  # the file it came from, for messages
    nodes: int
    seed: int
    strategy: str
    network: NetworkSpec
    tracker: TrackerSpec
    workload: Workload
    swarm_overrides: dict[str, Any] = field(default_factory=dict)
    max_time_s: float = 6 * 3600.0
    stall_after_s: float = 120.0
    agent: AgentSpec = field(default_factory=AgentSpec)
    cpu: CpuSpec = field(default_factory=CpuSpec)


# ---- checked tables -------------------------------------------------------------


class _Table:
    """One TOML table being read: every read names its key, leftovers are errors."""

    def __init__(self, data: object, key: str, source: str) -> None:
        self.key, self.source = key, source
        if not isinstance(data, dict):
            raise self.error(f"must be a table, not {type(data).__name__}")
        self.data = dict(data)

    def error(self, message: str, key: str | None = None) -> ScenarioError:
        where = f"{self.key}.{key}" if key and self.key else (key or self.key or "(top level)")
        return ScenarioError(f"{self.source}: {where}: {message}")

    def get(self, key: str, parse: Callable[[object], Any], default: Any = None, *,
            minimum: float | None = None, above: float | None = None,
            maximum: float | None = None) -> Any:
        if key not in self.data:
            if default is None:
                raise self.error("is required", key)
            return default
        raw = self.data.pop(key)
        try:
            value = parse(raw)
        except (ValueError, TypeError) as exc:
            raise self.error(str(exc), key) from None
        if isinstance(value, int | float) and not isinstance(value, bool):
            if minimum is not None and value < minimum:
                raise self.error(f"{raw!r} is impossible: must be at least {minimum:g}", key)
            if above is not None and value <= above:
                raise self.error(f"{raw!r} is impossible: must be more than {above:g}", key)
            if maximum is not None and value > maximum:
                raise self.error(f"{raw!r} is impossible: must be at most {maximum:g}", key)
        return value

    def table(self, key: str) -> _Table:
        sub = self.data.pop(key, {})
        return _Table(sub, f"{self.key}.{key}" if self.key else key, self.source)

    def tables(self, key: str) -> list[_Table]:
        items = self.data.pop(key, [])
        if not isinstance(items, list):
            raise self.error("must be an array of tables ([[...]])", key)
        prefix = f"{self.key}.{key}" if self.key else key
        return [_Table(item, f"{prefix}[{i}]", self.source) for i, item in enumerate(items)]

    def done(self) -> None:
        if self.data:
            unknown = ", ".join(sorted(self.data))
            raise self.error(f"unknown key(s): {unknown}")


def _int(raw: object) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise ValueError(f"{raw!r} is not an integer")
    return raw


def _bool(raw: object) -> bool:
    if not isinstance(raw, bool):
        raise ValueError(f"{raw!r} is not true or false")
    return raw


def _number(raw: object) -> float:
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        raise ValueError(f"{raw!r} is not a number")
    return float(raw)


def _text(raw: object) -> str:
    if not isinstance(raw, str) or not raw:
        raise ValueError(f"{raw!r} is not a non-empty string")
    return raw


def _names(raw: object) -> tuple[str, ...]:
    if isinstance(raw, str):
        return (_text(raw),)
    if isinstance(raw, list) and raw:
        return tuple(_text(x) for x in raw)
    raise ValueError(f"{raw!r} is not an origin name or a list of them")


def _strategy(raw: object) -> str:
    name = _text(raw)
    if name not in STRATEGIES:
        raise ValueError(f"unknown strategy {name!r}; choose from {sorted(STRATEGIES)}")
    return name


def _upload_order(raw: object) -> str:
    name = _text(raw)
    if name not in UPLOAD_ORDERS:
        raise ValueError(f"unknown upload order {name!r}; choose from {list(UPLOAD_ORDERS)}")
    return name


# ---- sections ----------------------------------------------------------------------


def _network(top: _Table) -> NetworkSpec:
    t = top.table("network")
    origins = []
    for o in top.tables("origin"):
        down = o.get("down_at", parse_duration, -1.0)
        origins.append(OriginSpec(
            name=o.get("name", _text), egress_Bps=o.get("egress", parse_bandwidth, above=0),
            max_concurrent=o.get("max_concurrent", _int, minimum=1),
            latency_s=o.get("latency", parse_duration, 0.0, minimum=0),
            down_at_s=None if down < 0 else down))
        o.done()
    if not origins:
        raise top.error("at least one [[origin]] is required", "origin")
    names = [o.name for o in origins]
    if len(set(names)) != len(names):
        raise top.error(f"origin names repeat: {names}", "origin")
    spec = NetworkSpec(
        racks=t.get("racks", _int, minimum=1),
        nic_up_Bps=t.get("nic_up", parse_bandwidth, above=0),
        nic_down_Bps=t.get("nic_down", parse_bandwidth, above=0),
        oversubscription=t.get("oversubscription", _number, 1.0, above=0),
        same_rack_latency_s=t.get("same_rack_latency", parse_duration, 50e-6, minimum=0),
        cross_rack_latency_s=t.get("cross_rack_latency", parse_duration, 200e-6, minimum=0),
        rate_update_s=t.get("rate_update", parse_duration, 0.02, above=0),
        origins=tuple(origins))
    t.done()
    return spec


def _tracker(top: _Table) -> TrackerSpec:
    t = top.table("tracker")
    d = TrackerSpec()
    spec = TrackerSpec(
        handout_limit=t.get("handout_limit", _int, d.handout_limit, minimum=1),
        announce_interval_s=t.get("announce_interval", parse_duration, d.announce_interval_s,
                                  above=0),
        peer_ttl_s=t.get("peer_ttl", parse_duration, d.peer_ttl_s, above=0),
        origin_fetchers=t.get("origin_fetchers", _int, d.origin_fetchers, minimum=1))
    t.done()
    return spec


def _swarm(top: _Table) -> dict[str, Any]:
    t = top.table("swarm")
    fixed = {"use_peers", "chunk_picker", "peer_chooser"}  # the strategy decides these
    overrides: dict[str, Any] = {}
    for f in dataclasses.fields(SwarmConfig):
        if f.name in fixed:
            continue
        if f.name.endswith("_s"):
            key = f.name[:-2]
            if key in t.data:
                overrides[f.name] = t.get(key, parse_duration, minimum=0)
        elif f.name in t.data and isinstance(f.default, bool):
            overrides[f.name] = t.get(f.name, _bool)
        elif f.name in t.data:
            kind = _number if isinstance(f.default, float) else _int
            overrides[f.name] = t.get(f.name, kind, minimum=0)
    t.done()
    try:
        dataclasses.replace(SwarmConfig(), **overrides)
    except ValueError as exc:
        raise t.error(str(exc)) from None
    return overrides


def _agent(top: _Table) -> AgentSpec:
    t = top.table("agent")
    none = -1.0  # absent: no cap
    up = t.get("upload_cap", parse_bandwidth, none, above=0)
    down = t.get("download_cap", parse_bandwidth, none, above=0)
    spec = AgentSpec(
        upload_slots=t.get("upload_slots", _int, UPLOAD_SLOTS, minimum=1),
        upload_order=t.get("upload_order", _upload_order, UPLOAD_ORDER),
        upload_cap_Bps=None if up == none else up,
        download_cap_Bps=None if down == none else down,
        burst_bytes=int(t.get("burst", parse_size, float(BURST_BYTES), minimum=0)),
        cancel_on_wire=t.get("cancel_on_wire", _bool, True))
    t.done()
    return spec


def _cpu(top: _Table) -> CpuSpec:
    t = top.table("cpu")
    spec = CpuSpec(cores=t.get("cores", _number, 1.0, above=0),
                   shared=t.get("shared", _bool, False))
    t.done()
    return spec


def _workload(top: _Table, origin_names: set[str]) -> Workload:
    t = top.table("workload")
    kinds = []
    for c in t.tables("content"):
        size = c.get("size", parse_size, above=0)
        chunk = c.get("chunk_size", parse_size, above=0)
        if size / chunk > MAX_CHUNKS:
            raise c.error(f"{size / chunk:.0f} chunks; at most {MAX_CHUNKS} per content",
                          "chunk_size")
        origins = c.get("origin", _names)
        for name in origins:
            if name not in origin_names:
                raise c.error(f"no [[origin]] is named {name!r}", "origin")
        kinds.append(ContentKind(
            name=c.get("name", _text), size=int(size), chunk_size=int(chunk), origins=origins,
            hot_fraction=c.get("hot_fraction", _number, 0.0, minimum=0, maximum=1),
            shards=c.get("shards", _int, 1, minimum=1),
            cpu_s=c.get("cpu", parse_duration, 0.0, minimum=0),
            cpu_origin_only_s=c.get("cpu_origin_only", parse_duration, minimum=0)
            if "cpu_origin_only" in c.data else None))
        c.done()
    if not kinds:
        raise t.error("at least one [[workload.content]] is required", "content")
    lo = t.get("fail_window_start", parse_duration, 0.0, minimum=0)
    hi = t.get("fail_window_end", parse_duration, lo, minimum=0)
    if hi < lo:
        raise t.error("is before fail_window_start", "fail_window_end")
    spec = Workload(
        kinds=tuple(kinds),
        start_jitter_s=t.get("start_jitter", parse_duration, 0.0, minimum=0),
        fail_fraction=t.get("fail_fraction", _number, 0.0, minimum=0, maximum=1),
        fail_window_s=(lo, hi))
    t.done()
    return spec


def parse(data: dict[str, Any], source: str, name: str) -> Scenario:
    top = _Table(data, "", source)
    run = top.table("run")
    network = _network(top)
    scenario = Scenario(
        name=name, source=source,
        nodes=run.get("nodes", _int, minimum=1),
        seed=run.get("seed", _int, 1),
        strategy=run.get("strategy", _strategy, "rack_aware_prefetch"),
        network=network,
        tracker=_tracker(top),
        workload=_workload(top, {o.name for o in network.origins}),
        swarm_overrides=_swarm(top),
        max_time_s=run.get("max_time", parse_duration, 6 * 3600.0, above=0),
        stall_after_s=run.get("stall_after", parse_duration, 120.0, above=0),
        agent=_agent(top),
        cpu=_cpu(top))
    run.done()
    top.done()
    check(scenario)
    return scenario


def check(scenario: Scenario) -> None:
    """Cross-field rules, rechecked after command-line overrides."""
    if scenario.network.racks > scenario.nodes:
        raise ScenarioError(f"{scenario.source}: network.racks: {scenario.network.racks} racks "
                            f"for {scenario.nodes} nodes; every rack needs a node")


def bundled(folder: str = "scenarios") -> list[str]:
    """Names of the TOML files shipped in simulations/`folder`/ (scenarios, sweeps)."""
    files = resources.files("simulations") / folder
    return sorted(p.name[:-5] for p in files.iterdir() if p.name.endswith(".toml"))


def load(name_or_path: str) -> Scenario:
    """A scenario file by path, or a bundled one by name ("small", "scale")."""
    return parse(*read(name_or_path))


def read(name_or_path: str) -> tuple[dict[str, Any], str, str]:
    """The TOML tables of a scenario file by path or bundled name, unchecked, with the
    source its messages name and the scenario's name: what `parse` takes. A sweep
    (simulations.sweep) changes keys in these tables and parses the result, so every
    run of it is checked by this module's rules and no other."""
    data, source, path = read_toml(name_or_path, "scenarios", "scenario", ScenarioError)
    return data, source, path.stem if path is not None else name_or_path


def read_toml(name_or_path: str, folder: str, what: str,
              error: type[Exception]) -> tuple[dict[str, Any], str, Path | None]:
    """The tables of a TOML file named by path, or bundled in simulations/`folder`/ by
    name: with the source its messages name, and its path (None if bundled). `error`
    says what is wrong: no such file or bundled `what`, or not valid TOML."""
    given = Path(name_or_path)
    path = given if given.is_file() else None
    if path is not None:
        text, source = path.read_text(), str(path)
    else:
        resource = resources.files("simulations") / folder / f"{name_or_path}.toml"
        if not resource.is_file():
            raise error(f"{name_or_path}: no such file, and no bundled {what} of that name "
                        f"(bundled: {', '.join(bundled(folder))})")
        text, source = resource.read_text(), f"{folder}/{name_or_path}.toml"
    try:
        return tomllib.loads(text), source, path
    except tomllib.TOMLDecodeError as exc:
        raise error(f"{source}: not valid TOML: {exc}") from None


def override(scenario: Scenario, **changes: Any) -> Scenario:
    """The scenario with command-line values applied, checked again."""
    given = {k: v for k, v in changes.items() if v is not None}
    if "strategy" in given:
        try:
            _strategy(given["strategy"])
        except ValueError as exc:
            raise ScenarioError(f"--strategy: {exc}") from None
    updated = dataclasses.replace(scenario, **given)
    check(updated)
    return updated
