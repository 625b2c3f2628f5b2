"""What a run produced: per-node Parquet, a JSON summary, PNG plots.

The summary's times are per node, from the node's own start to the moment it
is ready (it holds everything, or with prefetch the hot set of its image):
`p50`, `p90`, `p99`, `p999`, `max`, in seconds, over the live nodes that
became ready. `makespan_s` is when the last one did, from time zero.
`floor_seconds` is the scenario's fluid lower bound (`simulations.floor`,
`floor_by` names the bound that sets it), and `p50_over_floor`,
`p99_over_floor` say how far the run is from it; the completion plot marks
the floor and, for the `kraken` scenario, Kraken's published percentiles.

The plots explain themselves: each title names the contents' size and the
links' caps (`Result.caption`); the floor is labelled as what it bounds (the
time by which the last node can be ready, not each node's); when the CDF ends
below 1 (nodes that failed) or before the makespan (nodes started at
different times), a note under it says so; a series that does not change is
drawn from zero, not on an axis of ±4% around its value.
`origin_egress_ratio` is the bytes that left the origins divided by the
bytes of the distinct contents the nodes need: 1.0 means every byte left the
origin once. `wall_seconds` is the run's wall time, `cpu_seconds` the CPU
time of the whole process (setup and writing included), `peak_rss_mb` its
peak resident set.
"""

from __future__ import annotations

import json
import math
import resource
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from simulations.floor import Floor, NeededContent, floor
from simulations.simulation import Simulation

# Kraken's published benchmark (2,600 hosts, 3 GB): quantile -> seconds.
KRAKEN_PUBLISHED = {0.50: 10.0, 0.99: 18.0, 0.999: 22.0}


def quantile(values: Sequence[float], q: float) -> float:
    """The `q` quantile by the nearest-rank rule (an observed value, no interpolation)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def cpu_seconds() -> float:
    """User + system CPU time of this process so far: on a shared machine, wall time
    says how busy the machine was; CPU time says what the simulation cost."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@dataclass(frozen=True, slots=True)
class Result:
    summary: dict[str, Any]
    columns: dict[str, list[Any]]
    egress_curve: list[tuple[int, float]]  # (nodes ready, origin egress in copies)
    caption: str = ""  # the contents' size and the links' caps, for the plots' titles


def collect(sim: Simulation, stop: str, wall_s: float) -> Result:
    nodes = sim.nodes
    cols: dict[str, list[Any]] = {k: [] for k in (
        "node", "rack", "start_s", "ready_s", "complete_s", "fail_s", "startup_s",
        "down_same_rack", "down_cross_rack", "down_origin", "up", "wasted_down", "requests",
        "origin_fetches", "failed_requests", "reports", "aborts")}
    for node in nodes:
        c = node.counters
        startup = None if node.ready_s is None else node.ready_s - node.start_s
        for key, value in (("node", node.index), ("rack", node.rack), ("start_s", node.start_s),
                           ("ready_s", node.ready_s), ("complete_s", node.complete_s),
                           ("fail_s", node.fail_s), ("startup_s", startup),
                           ("down_same_rack", c.down_same_rack),
                           ("down_cross_rack", c.down_cross_rack), ("down_origin", c.down_origin),
                           ("up", c.up), ("wasted_down", c.wasted_down),
                           ("requests", c.requests), ("origin_fetches", c.origin_fetches),
                           ("failed_requests", c.failed_requests), ("reports", c.reports),
                           ("aborts", c.aborts)):
            cols[key].append(value)
    times = [t for t in cols["startup_s"] if t is not None]
    unique = sum(content.size for content in sim.contents)
    bound = run_floor(sim)
    egress = sum(o.egress_bytes for o in sim.origins)
    # A node that died after it completed was ready: its launch did not fail.
    failed = sum(1 for node in nodes if not node.alive and node.complete_s is None)
    summary: dict[str, Any] = {
        "scenario": sim.scenario.name, "strategy": sim.strategy.name, "seed": sim.scenario.seed,
        "nodes": len(nodes), "failed_nodes": failed, "ready_nodes": len(times),
        "stop": stop,
        "p50": quantile(times, 0.50), "p90": quantile(times, 0.90),
        "p99": quantile(times, 0.99), "p999": quantile(times, 0.999),
        "max": max(times) if times else math.nan,
        "floor_seconds": bound.seconds, "floor_by": bound.by,
        "p50_over_floor": quantile(times, 0.50) / bound.seconds if bound.seconds else math.nan,
        "p99_over_floor": quantile(times, 0.99) / bound.seconds if bound.seconds else math.nan,
        "makespan_s": max((n.ready_s for n in nodes if n.ready_s is not None), default=math.nan),
        "virtual_s": sim.loop.now,
        "origin_egress_bytes": egress, "unique_bytes": unique,
        "origin_egress_ratio": egress / unique if unique else math.nan,
        "same_rack_bytes": sum(cols["down_same_rack"]),
        "cross_rack_bytes": sum(cols["down_cross_rack"]),
        "origin_bytes": sum(cols["down_origin"]),
        "uploaded_bytes": sum(cols["up"]),
        "wasted_bytes": sum(cols["wasted_down"]),
        "events": sim.loop.events, "swarm_calls": sim.events_delivered,
        "rate_refreshes": sim.flows.refreshes,
        "wall_seconds": round(wall_s, 3), "cpu_seconds": round(cpu_seconds(), 3),
        "peak_rss_mb": round(peak_rss_mb(), 1),
    }
    curve = [(count, bytes_ / unique) for count, bytes_ in sim.egress_curve]
    return Result(summary, cols, curve, caption(sim))


def caption(sim: Simulation) -> str:
    """What a plot of `sim` needs said: how much each node fetches, over which links."""
    spec = sim.scenario.network
    origins = sum(o.egress_Bps for o in spec.origins)
    return (f"{_size(sum(c.size for c in sim.contents))} in {len(sim.contents)} content(s); "
            f"NIC {_rate(spec.nic_down_Bps)} down, {_rate(spec.nic_up_Bps)} up; "
            f"origin {_rate(origins)}")


def _size(n: float) -> str:
    return f"{n / 2**30:.3g} GiB" if n >= 2**30 else f"{n / 2**20:.3g} MiB"


def _rate(bytes_per_s: float) -> str:
    return f"{bytes_per_s * 8 / 1e9:.3g} Gbit/s"  # as scenarios write link speeds


def run_floor(sim: Simulation) -> Floor:
    """The floor of `sim`'s scenario, by its own readiness rule (nodes that fail left out)."""
    spec, agent = sim.scenario.network, sim.scenario.agent
    prefetch = sim.strategy.prefetch
    contents = []
    for c in sim.contents:
        hot = set(c.hot) if prefetch and c.hot else None  # None: every chunk counts
        contents.append(NeededContent(tuple(c.chunk_bytes(i) if hot is None or i in hot else 0
                                            for i in range(c.chunks)), c.origins))
    live = [n for n in sim.nodes if n.fail_s is None]
    return floor(contents, [n.needs for n in live], [n.rack_index for n in live],
                 min(spec.nic_down_Bps, agent.download_cap_Bps or math.inf),
                 min(spec.nic_up_Bps, agent.upload_cap_Bps or math.inf),
                 [o.egress_Bps for o in spec.origins], spec.oversubscription)


def json_line(summary: dict[str, Any]) -> str:
    def clean(v: Any) -> Any:
        if isinstance(v, float):
            return None if math.isnan(v) else round(v, 4)
        return v
    return json.dumps({k: clean(v) for k, v in summary.items()})


def write(result: Result, out: Path) -> list[Path]:
    """Write nodes.parquet, summary.json and the plots into `out`; return the paths."""
    out.mkdir(parents=True, exist_ok=True)
    table = pa.table(result.columns)
    paths = [out / "nodes.parquet", out / "summary.json"]
    pq.write_table(table, paths[0])
    paths[1].write_text(json_line(result.summary) + "\n")
    paths += plot(result, out)
    return paths


def plot(result: Result, out: Path) -> list[Path]:
    from matplotlib import pyplot as plt

    paths = []
    for name, fig in figures(result).items():
        paths.append(out / f"{name}.png")
        fig.savefig(paths[-1], dpi=110, bbox_inches="tight")
        plt.close(fig)
    return paths


def figures(result: Result) -> dict[str, Any]:
    """The run's plots as matplotlib figures, by file name."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    s = result.summary
    title = f"{s['scenario']} · {s['strategy']} · {s['nodes']} nodes\n{result.caption}"
    figs: dict[str, Any] = {}

    times = sorted(t for t in result.columns["startup_s"] if t is not None)
    fig, ax = plt.subplots(figsize=(6, 4.4))
    if times:
        ax.step(times, [(i + 1) / s["nodes"] for i in range(len(times))], where="post",
                label="this run (each node from its own start)")  # of all nodes
    if s.get("floor_seconds"):
        ax.axvline(s["floor_seconds"], color="grey", linestyle="--",
                   label=f"floor ({s['floor_by']}): the last node, no sooner")
    if s["scenario"] == "kraken":
        ax.plot(list(KRAKEN_PUBLISHED.values()), list(KRAKEN_PUBLISHED), "rx",
                label="Kraken, published")
    ax.set(xlabel="node startup time (s)", ylabel="fraction of nodes ready", title=title,
           ylim=(0, 1.05))
    ax.legend(loc="lower right", fontsize="small")
    ax.grid(alpha=0.3)
    notes = _cdf_notes(s, times)
    if notes:
        fig.text(0.01, -0.02, "\n".join(notes), fontsize="small", va="top")
    figs["completion_cdf"] = fig

    fig, ax = plt.subplots(figsize=(6, 4.4))
    if result.egress_curve:
        xs, ys = zip(*result.egress_curve, strict=True)
        ax.plot(xs, ys)
        ax.set_ylim(0, max(max(ys) * 1.15, 1.0))  # from zero: a flat 1.0 reads as flat
    ax.ticklabel_format(axis="y", useOffset=False)
    ax.set(xlabel="nodes ready", ylabel="origin egress (copies of the content)", title=title)
    ax.grid(alpha=0.3)
    figs["origin_egress"] = fig

    tiers = {"same rack": s["same_rack_bytes"], "cross rack": s["cross_rack_bytes"],
             "origin": s["origin_bytes"], "wasted": s["wasted_bytes"]}
    fig, ax = plt.subplots(figsize=(6, 4.4))
    ax.bar(list(tiers), [v / 2**30 for v in tiers.values()])
    ax.set(ylabel="GiB received, all nodes", title=title)
    figs["bytes_by_tier"] = fig
    return figs


def _cdf_notes(s: dict[str, Any], times: list[float]) -> list[str]:
    """Why the completion CDF ends where it does, when that is not plain."""
    notes = []
    if s["ready_nodes"] < s["nodes"]:
        notes.append(f"It ends at {s['ready_nodes'] / s['nodes']:.1%}: "
                     f"{s['nodes'] - s['ready_nodes']} node(s) never became ready "
                     f"({s['failed_nodes']} failed).")
    if times and s["makespan_s"] > times[-1] * 1.01:
        notes.append(f"The makespan ({s['makespan_s']:.3g} s) counts from the first node's "
                     f"start; nodes started at different times, so the slowest node's own "
                     f"time is {times[-1]:.3g} s.")
    return notes
