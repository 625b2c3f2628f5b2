"""A sweep's output directory: the runs as one Parquet dataset, the plots drawn from it.

    DIR/sweep.json                  the sweep: its keys (unit, values), metrics, runs
    DIR/runs/<run>.parquet          one row per run: parameters, seed, summary
    DIR/nodes/run=<run>/*.parquet   the run's per-node table (hive-partitioned by run)
    DIR/failed/<run>.json           a run that raised: its parameters and the error
    DIR/plots/<metric>-by-<key>.png

A run is in DIR once its row is: the per-node table is written first, each
file under a dot-name that readers skip and then renamed into place, so a
sweep stopped at any moment leaves whole runs or none, and the same command
run again skips exactly the runs that have a row. `read_runs` reads the rows
of the runs the current sweep file names (an older sweep's runs may share the
directory).
"""

from __future__ import annotations

import json
import math
import os
import re
import statistics
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from simulations.sweep.plan import TIME_METRICS, Axis, Point, Sweep, Value

# A summary field that does not describe the run: the peak RSS of the worker process.
NOT_RESULTS = ("peak_rss_mb",)


def describe(sweep: Sweep, runs: Sequence[Point]) -> dict[str, Any]:
    return {"source": sweep.source, "scenario": sweep.scenario, "mode": sweep.mode,
            "seeds": list(sweep.seeds), "metrics": list(sweep.metrics),
            "fixed": dict(sweep.fixed),
            "axes": [{"key": a.key, "unit": a.unit, "values": list(a.values)}
                     for a in sweep.axes],
            "runs": [p.name for p in runs]}


def write_description(out: Path, description: Mapping[str, Any]) -> None:
    with _atomic(out / "sweep.json") as tmp:
        tmp.write_text(json.dumps(description, indent=1) + "\n")


def read_description(out: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((out / "sweep.json").read_text())
    return data


def axes_of(description: Mapping[str, Any]) -> list[Axis]:
    return [Axis(a["key"], tuple(a["values"]), a["unit"]) for a in description["axes"]]


def done(out: Path) -> set[str]:
    """Names of the runs whose row is in `out`."""
    folder = out / "runs"
    return {p.stem for p in folder.glob("*.parquet")} if folder.is_dir() else set()


def row(point: Point, axes: Sequence[Axis], summary: Mapping[str, Any]) -> dict[str, Any]:
    """The run's row: its name, seed, each swept key (a number in the key's unit, or the
    value as text), the values as written, then the summary."""
    out: dict[str, Any] = {"run": point.name, "seed": point.seed}
    values = dict(point.params)
    for axis in axes:
        value = values[axis.key]
        number = axis.number(value)
        out[axis.key] = str(value) if number is None else number
    out["params"] = json.dumps(values)
    out.update({k: v for k, v in summary.items() if k not in NOT_RESULTS})
    return out


def write_run(out: Path, point: Point, axes: Sequence[Axis], summary: Mapping[str, Any],
              columns: Mapping[str, list[Any]]) -> None:
    """The run's per-node table, then its row (whose presence marks the run done)."""
    nodes = out / "nodes" / f"run={point.name}"
    nodes.mkdir(parents=True, exist_ok=True)
    with _atomic(nodes / "part-0.parquet") as tmp:
        pq.write_table(pa.table(dict(columns)), tmp)
    (out / "runs").mkdir(parents=True, exist_ok=True)
    with _atomic(out / "runs" / f"{point.name}.parquet") as tmp:
        pq.write_table(pa.Table.from_pylist([row(point, axes, summary)]), tmp)
    (out / "failed" / f"{point.name}.json").unlink(missing_ok=True)


def write_failure(out: Path, point: Point, error: str) -> None:
    (out / "failed").mkdir(parents=True, exist_ok=True)
    with _atomic(out / "failed" / f"{point.name}.json") as tmp:
        tmp.write_text(json.dumps({"run": point.name, "params": dict(point.params),
                                   "seed": point.seed, "error": error}) + "\n")


@contextmanager
def _atomic(path: Path) -> Iterator[Path]:
    """A dot-named file next to `path` to write, renamed onto `path` once written."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def read_runs(out: Path, names: Sequence[str] | None = None) -> pa.Table:
    """The rows of the runs `names` (default: those sweep.json lists) that are done."""
    if names is None:
        names = read_description(out)["runs"]
    have = done(out)
    tables = [pq.read_table(out / "runs" / f"{n}.parquet") for n in names if n in have]
    if not tables:
        return pa.table({})
    return pa.concat_tables(tables, promote_options="default")


def read_nodes(out: Path, name: str) -> pa.Table:
    return pq.read_table(out / "nodes" / f"run={name}")


# ---- plots -----------------------------------------------------------------------------------


# The floor bounds when the last node can be ready, not each node: a p50 may sit below it.
FLOOR_LABEL = "floor (the last node, no sooner)"


def plot(out: Path) -> list[Path]:
    """One plot per metric and swept key: the metric against the key, its median over
    the seeds (and over keys not drawn) with the min-max band, one line per value of the
    next swept key, and the floor dashed for metrics in seconds. Returns the files."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    description = read_description(out)
    axes = axes_of(description)
    rows = read_runs(out).to_pylist()
    folder = out / "plots"
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, x in enumerate(axes):
        other = axes[(i + 1) % len(axes)] if len(axes) > 1 else None
        for metric in description["metrics"]:
            fig, ax = plt.subplots(figsize=(6, 4))
            _draw(ax, rows, x, other, metric)
            ax.set(xlabel=x.label, ylabel=_metric_label(metric),
                   title=title(description, rows, metric, x))
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
            path = folder / f"{metric}-by-{re.sub(r'[^A-Za-z0-9._-]', '_', x.key)}.png"
            with _atomic(path) as tmp:
                fig.savefig(tmp, dpi=110, bbox_inches="tight", format="png")
            plt.close(fig)
            paths.append(path)
    return paths


def title(description: Mapping[str, Any], rows: Sequence[Mapping[str, Any]], metric: str,
          x: Axis) -> str:
    """What is drawn, then what was run: the contents' size and the links' caps, as a
    run's own plot says them (`report.caption`). Runs kept before captions have none."""
    said = f"{description['scenario']}: {metric} by {x.key.split('.')[-1]} " \
           f"({len(description['seeds'])} seeds)"
    captions = sorted({str(r["caption"]) for r in rows if r.get("caption")})
    if not captions:
        return said
    more = ", ... (varies by run)" if len(captions) > 1 else ""
    return f"{said}\n{captions[0]}{more}"


def _draw(ax: Any, rows: Sequence[Mapping[str, Any]], x: Axis, other: Axis | None,
          metric: str) -> None:
    numeric = x.unit is not None
    positions = {v: i for i, v in enumerate(x.values)}
    series: Sequence[Value | None] = other.values if other is not None else [None]
    for colour, value in enumerate(series):
        mine = [r for r in rows if other is None or json.loads(r["params"])[other.key] == value]
        xs, mid, lo, hi, floor = [], [], [], [], []
        for point in x.values:
            at = [r for r in mine if json.loads(r["params"])[x.key] == point]
            ys = [r[metric] for r in at if _finite(r.get(metric))]
            if not ys:
                continue
            xs.append(x.number(point) if numeric else positions[point])
            mid.append(statistics.median(ys))
            lo.append(min(ys))
            hi.append(max(ys))
            floor.append(statistics.median(r["floor_seconds"] for r in at))
        if not xs:
            continue
        name = f"{other.key.split('.')[-1]} = {value}" if other is not None else "median"
        line = ax.plot(xs, mid, marker="o", color=f"C{colour}", label=name)[0]
        ax.fill_between(xs, lo, hi, color=line.get_color(), alpha=0.2)
        if metric in TIME_METRICS:
            ax.plot(xs, floor, linestyle="--", color=line.get_color(), alpha=0.7,
                    label=FLOOR_LABEL if colour == 0 else None)
    if metric.endswith("_over_floor"):
        ax.axhline(1.0, color="grey", linestyle="--", label=FLOOR_LABEL)
    ax.set_ylim(bottom=0)  # every metric is >= 0: a flat series then reads as flat
    ax.ticklabel_format(axis="y", useOffset=False)
    if not numeric:
        ax.set_xticks(range(len(x.values)), [str(v) for v in x.values])
        return
    numbers = [n for n in map(x.number, x.values) if n is not None]
    if min(numbers) > 0 and max(numbers) / min(numbers) >= 8:  # a wide range: ratios matter
        ax.set_xscale("log", base=2)
        ax.set_xticks(numbers, [f"{n:g}" for n in numbers])


def _finite(value: object) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


def _metric_label(metric: str) -> str:
    if metric in TIME_METRICS:
        return f"{metric} startup (s)" if metric != "makespan_s" else "last node ready (s)"
    if metric.endswith("_bytes"):
        return f"{metric} (bytes)"
    return metric
