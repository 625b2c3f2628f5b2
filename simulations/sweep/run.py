"""`bootseer sim sweep`: the runs of a sweep file as tasks on a Dask cluster.

Each run is one task, `run_point(scenario)`: a pure function of the scenario
(its seed included) that returns the run's summary and per-node table, the
same numbers on whichever worker runs it. With no scheduler address a
LocalCluster of one single-threaded worker process per core (or `--workers`)
runs the tasks, on the allocator of the compiled engine's child (huge pages,
simulations.hugearena); with one, the workers of that cluster do, and all they
need is this installation's packages. The client gathers each result as it comes
and writes it into the output directory (simulations.sweep.data), so a run
is in the directory whole or not at all. A worker that dies takes no run with
it: the scheduler gives its tasks to another worker. A run that raises is
written to failed/ with its parameters and error, and the sweep goes on;
Ctrl-C cancels what is pending and leaves the finished runs, which the same
command then skips.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from simulations import compiled, hugearena, report, scenario
from simulations.scenario import Scenario, ScenarioError
from simulations.simulation import Simulation
from simulations.sweep import data
from simulations.sweep.plan import Point, Sweep, SweepError, apply, check, parse_sweep

CONNECT_TIMEOUT_S = 20.0


@dataclass(frozen=True, slots=True)
class Loaded:
    """A sweep file read and checked: its runs and the scenario each runs."""

    sweep: Sweep
    runs: list[Point]
    scenarios: dict[str, Scenario]
    tasks: dict[str, tuple[dict[str, Any], str, str]]  # run -> what `run_tables` takes


@dataclass(slots=True)
class Outcome:
    planned: int
    skipped: int  # already in the output directory
    finished: list[str] = field(default_factory=list)
    failed: list[tuple[Point, str]] = field(default_factory=list)
    incomplete: list[tuple[Point, str]] = field(default_factory=list)  # ran, did not finish
    interrupted: bool = False


def load(name_or_path: str) -> Loaded:
    """Read a sweep file (a path, or a bundled sweep's name) and check every run."""
    tables, source, path = scenario.read_toml(name_or_path, "sweeps", "sweep", SweepError)
    sweep = parse_sweep(tables, source)
    here = path.parent if path is not None else None
    beside = here / sweep.scenario if here is not None else None
    where = str(beside) if beside is not None and beside.is_file() else sweep.scenario
    try:
        base, scenario_source, name = scenario.read(where)
    except ScenarioError as exc:
        raise SweepError(f"{source}: sweep.scenario: {exc}") from None
    runs = check(sweep, base, lambda tables: scenario.parse(tables, scenario_source, name))
    tasks = {p.name: (apply(base, sweep, p.params, p.seed), scenario_source, name)
             for p in runs}
    scenarios = {run: scenario.parse(*task) for run, task in tasks.items()}
    return Loaded(sweep, runs, scenarios, tasks)


def run_point(s: Scenario) -> tuple[dict[str, Any], dict[str, list[Any]]]:
    """One run: its summary and per-node columns. The summary's `cpu_seconds` is this
    thread's CPU time (a worker runs other work beside it); nothing else in it depends
    on where or when the run ran, except `wall_seconds`."""
    started, cpu = time.perf_counter(), time.thread_time()
    sim = Simulation(s)
    stop = sim.run()
    result = report.collect(sim, stop, time.perf_counter() - started)
    summary = dict(result.summary, cpu_seconds=round(time.thread_time() - cpu, 3),
                   engine="compiled" if compiled.active() else "python",
                   caption=result.caption)
    return summary, result.columns


def run_tables(tables: dict[str, Any], source: str,
               name: str) -> tuple[dict[str, Any], dict[str, list[Any]]]:
    """The task: `run_point` of the scenario these tables make (checked by the client
    already). Tables, not a `Scenario`, travel to the worker: plain values unpickle the
    same into the plain-Python and the compiled build of the simulator."""
    return run_point(scenario.parse(tables, source, name))


# ---- running on Dask -------------------------------------------------------------------------


def _distributed() -> Any:
    """The `distributed` module, imported when a sweep runs (it takes a second), typed
    loosely: its functions carry no annotations."""
    import distributed

    return distributed


@contextlib.contextmanager
def client_for(scheduler: str | None, workers: int | None,
               build: Path | None = None) -> Iterator[Any]:
    """A Dask client: on the cluster at `scheduler` (waiting for `workers` to join), or on a
    LocalCluster of `workers` single-threaded processes (default: one per core), which run
    the compiled `build` of the simulator if one is given (simulations.compiled)."""
    dd = _distributed()
    if scheduler is None:
        count = workers or os.cpu_count() or 1
        arenas = hugearena.built_in(build or compiled.source_root())
        with _first_on_path(build), _worker_environ(arenas), \
                dd.LocalCluster(n_workers=count, threads_per_worker=1, processes=True,
                                dashboard_address=":0", silence_logs=logging.ERROR,
                                preload=["simulations.hugearena"] if arenas else []
                                ) as cluster, \
                dd.Client(cluster) as client:
            yield client
        return
    try:
        client = dd.Client(scheduler, timeout=CONNECT_TIMEOUT_S)
    except (OSError, TimeoutError, ValueError) as exc:
        raise SweepError(f"--scheduler: cannot reach a Dask scheduler at {scheduler}: "
                         f"{exc}") from None
    with client:
        if workers:
            client.wait_for_workers(workers)
        yield client


@contextlib.contextmanager
def _first_on_path(build: Path | None) -> Iterator[None]:
    """`build` first on this process's import path while the cluster lives: a local
    worker is spawned with its parent's path (and restarted with it if it dies), so it
    imports the compiled packages; this process has imported its own already."""
    if build is None:
        yield
        return
    sys.path.insert(0, str(build))
    try:
        yield
    finally:
        sys.path.remove(str(build))


@contextlib.contextmanager
def _worker_environ(arenas: bool) -> Iterator[None]:
    """The allocator of the compiled engine's child (simulations.hugearena) in this
    process's environment while the cluster lives: a local worker is spawned with it
    (and respawned if it dies), and starts on it; the preload of `client_for` then
    installs the `arenas`. Dask's `pre-spawn-environ` would not do: the environment's
    own value of a variable wins over it, so it cannot add to a `GLIBC_TUNABLES`."""
    wanted = hugearena.environ(os.environ, arenas)
    before = {k: os.environ.get(k) for k, v in wanted.items() if os.environ.get(k) != v}
    os.environ.update({k: wanted[k] for k in before})
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def execute(loaded: Loaded, out: Path, client: Any, progress: Progress | None) -> Outcome:
    """Run what `out` lacks of `loaded` on `client`, writing each result as it comes."""
    wait = _distributed().wait
    out.mkdir(parents=True, exist_ok=True)
    data.write_description(out, data.describe(loaded.sweep, loaded.runs))
    have = data.done(out)
    todo = [p for p in loaded.runs if p.name not in have]
    outcome = Outcome(planned=len(loaded.runs), skipped=len(loaded.runs) - len(todo))
    by_key: dict[str, Point] = {}
    pending = set()
    for point in todo:
        future = client.submit(run_tables, *loaded.tasks[point.name], key=f"sim-{point.name}")
        by_key[future.key] = point
        pending.add(future)
    if progress is not None:
        progress.start(len(todo))
    try:
        with _ctrl_c() as stop:
            while pending and not stop.is_set():
                try:
                    done, pending = wait(pending, timeout=WAIT_STEP_S,
                                         return_when="FIRST_COMPLETED")
                except TimeoutError:
                    continue
                for future in done:
                    _collect(future, by_key[future.key], loaded, out, outcome)
                    future.release()
                    if progress is not None:
                        progress.step(len(outcome.failed))
            if pending:
                outcome.interrupted = True
                client.cancel(list(pending))
    finally:  # the bar's line ends, even if a result could not be written
        if progress is not None:
            progress.end()
    return outcome


# How often the wait for runs looks at Ctrl-C.
WAIT_STEP_S = 0.2


@contextlib.contextmanager
def _ctrl_c() -> Iterator[threading.Event]:
    """An event set by Ctrl-C while the block runs. A KeyboardInterrupt raised wherever the
    main thread happened to be could land inside Dask's own code, which may swallow it:
    a sweep then ran to its end after a Ctrl-C (seen in CI). A SIGINT that was ignored
    when the sweep started (a job started with `&` by a script) stays ignored."""
    stop = threading.Event()
    try:
        if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
            yield stop
            return
        previous = signal.signal(signal.SIGINT, lambda signum, frame: stop.set())
    except ValueError:  # not the main thread: Ctrl-C is not this call's to take
        yield stop
        return
    try:
        yield stop
    finally:
        signal.signal(signal.SIGINT, previous)


def _collect(future: Any, point: Point, loaded: Loaded, out: Path, outcome: Outcome) -> None:
    if future.status != "finished":
        exc = future.exception()
        error = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        data.write_failure(out, point, error)
        outcome.failed.append((point, error))
        return
    summary, columns = future.result()
    data.write_run(out, point, loaded.sweep.axes, summary, columns)
    outcome.finished.append(point.name)
    if summary["stop"] != "complete":
        outcome.incomplete.append((point, str(summary["stop"])))


def run_serially(loaded: Loaded, names: Sequence[str] | None = None) -> dict[str, Any]:
    """The summaries of the runs `names` (default all), one after another in this process:
    the baseline a sweep on a cluster is compared with."""
    chosen = loaded.runs if names is None else [p for p in loaded.runs if p.name in names]
    return {p.name: run_point(loaded.scenarios[p.name])[0] for p in chosen}


# ---- progress on a terminal --------------------------------------------------------------------


class Progress:
    """`[#####.....] 5/16 runs  1 failed  ETA 0:31` on stderr, redrawn in place."""

    WIDTH = 30

    def __init__(self, stream: Any = sys.stderr) -> None:
        self.stream = stream
        self.total = self.count = 0
        self.started = 0.0

    def start(self, total: int) -> None:
        self.total, self.count, self.started = total, 0, time.monotonic()
        self._draw(0)

    def step(self, failed: int) -> None:
        self.count += 1
        self._draw(failed)

    def end(self) -> None:
        print(file=self.stream, flush=True)

    def _draw(self, failed: int) -> None:
        filled = self.WIDTH * self.count // max(self.total, 1)
        elapsed = time.monotonic() - self.started
        if self.count:
            left = elapsed / self.count * (self.total - self.count)
            eta = f"ETA {int(left) // 60}:{int(left) % 60:02d}"
        else:
            eta = "ETA --:--"
        extra = f"  {failed} failed" if failed else ""
        print(f"\r[{'#' * filled}{'.' * (self.WIDTH - filled)}] {self.count}/{self.total} "
              f"runs{extra}  {eta} ", end="", file=self.stream, flush=True)
