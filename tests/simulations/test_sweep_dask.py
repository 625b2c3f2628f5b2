"""`bootseer sim sweep` on a real Dask cluster: a scheduler and two workers started here
as separate processes (`dask scheduler`, `dask worker`) on 127.0.0.1, and on the
embedded LocalCluster."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from p2p.cli import main
from simulations import report
from simulations.sweep import data
from simulations.sweep.run import load, run_point, run_serially

WAIT_S = 120.0
# What a summary says about the machine that ran it, not about the run.
MACHINE = {"wall_seconds", "cpu_seconds", "peak_rss_mb", "engine"}


@dataclass
class DaskCluster:
    address: str
    workers: dict[str, subprocess.Popen[bytes]]


def _dask() -> Path:
    command = Path(sys.executable).with_name("dask")
    if not command.exists():
        pytest.fail(f"{command} is missing: install the simulator's extra "
                    "(pip install 'bootseer[sim]', which brings dask[distributed])")
    return command


@pytest.fixture
def dask_cluster(tmp_path: Path) -> Iterator[DaskCluster]:
    """A Dask scheduler and two single-threaded workers (no nanny: killing one kills the
    worker), each its own process on 127.0.0.1."""
    from distributed import Client

    dask, file = _dask(), tmp_path / "scheduler.json"
    procs: list[subprocess.Popen[bytes]] = []
    log = (tmp_path / "dask.log").open("wb")

    def start(*argv: str) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen([str(dask), *argv], stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        procs.append(proc)
        return proc

    try:
        scheduler = start("scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
                          "--scheduler-file", str(file))
        deadline = time.monotonic() + WAIT_S
        while not file.exists():
            if scheduler.poll() is not None or time.monotonic() > deadline:
                pytest.fail("`dask scheduler` did not start: "
                            + (tmp_path / "dask.log").read_text()[-2000:])
            time.sleep(0.05)
        workers = {name: start("worker", "--scheduler-file", str(file), "--nthreads", "1",
                               "--no-nanny", "--no-dashboard", "--host", "127.0.0.1",
                               "--name", name, "--death-timeout", "60")
                   for name in ("w1", "w2")}
        address = json.loads(file.read_text())["address"]
        with Client(address, timeout=WAIT_S) as client:
            try:
                client.wait_for_workers(2, timeout=WAIT_S)
            except TimeoutError:
                pytest.fail("two `dask worker`s did not join the scheduler: "
                            + (tmp_path / "dask.log").read_text()[-2000:])
        yield DaskCluster(address, workers)
    finally:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        log.close()


def _sweep(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "sweep.toml"
    path.write_text('[sweep]\nscenario = "small"\n' + body)
    return path


def _sweep_line(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    assert main(["sim", "sweep", *argv, "--json"]) == 0
    line: dict[str, Any] = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    return line


def _rounded(summary: dict[str, Any]) -> dict[str, Any]:
    """The summary as `bootseer sim --json` prints it, without the machine's figures."""
    line: dict[str, Any] = json.loads(report.json_line(summary))
    return {k: v for k, v in line.items() if k not in MACHINE}


def test_a_sweep_on_a_cluster_gives_the_runs_of_bootseer_sim_one_by_one(
        dask_cluster: DaskCluster, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    sweep = _sweep(tmp_path, 'seeds = [1, 2]\n[vary]\n"run.nodes" = [12, 20]\n'
                             '"run.strategy" = ["rack_aware", "random_peers"]\n')
    out = tmp_path / "out"
    line = _sweep_line(capsys, str(sweep), "--out", str(out), "--scheduler",
                       dask_cluster.address, "--workers", "2")
    assert (line["planned"], line["ran"], line["failed"]) == (8, 8, 0)
    rows = {r["run"]: r for r in data.read_runs(out).to_pylist()}
    assert len(rows) == 8
    for point in load(str(sweep)).runs:
        params = dict(point.params)
        single = tmp_path / f"single-{point.name}"
        assert main(["sim", "small", "--nodes", str(params["run.nodes"]), "--seed",
                     str(point.seed), "--strategy", str(params["run.strategy"]), "--engine",
                     "python", "--json", "--out", str(single)]) == 0
        alone = json.loads(capsys.readouterr().out.strip())
        row = rows[point.name]
        assert _rounded({k: row[k] for k in alone if k not in MACHINE}) == _rounded(alone), \
            point.name
        assert data.read_nodes(out, point.name).to_pylist() == \
            pq.read_table(single / "nodes.parquet").to_pylist()


def test_a_worker_killed_mid_sweep_loses_no_run(
        dask_cluster: DaskCluster, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    from distributed import Client

    sweep = _sweep(tmp_path, 'seeds = [1, 2, 3]\n[vary]\n"run.nodes" = [40, 48]\n')
    out = tmp_path / "out"
    result: dict[str, int] = {}
    runner = threading.Thread(target=lambda: result.update(status=main(
        ["sim", "sweep", str(sweep), "--out", str(out), "--scheduler", dask_cluster.address,
         "--workers", "2", "--json"])))
    victim = dask_cluster.workers["w2"]
    with Client(dask_cluster.address, timeout=WAIT_S) as client:
        address = next(a for a, w in client.scheduler_info()["workers"].items()
                       if w["name"] == "w2")
        runner.start()
        lost: list[str] = []
        while runner.is_alive() and not lost:
            lost = [str(k) for k in client.processing().get(address, ())
                    if str(k).startswith("sim-")]
            time.sleep(0.02)
        assert lost, "the sweep ended before w2 was given a run"
        os.killpg(victim.pid, signal.SIGKILL)
        victim.wait()
    runner.join(timeout=600)
    assert not runner.is_alive()
    assert result["status"] == 0
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (line["ran"], line["failed"]) == (6, 0)
    rows = {r["run"]: r for r in data.read_runs(out).to_pylist()}
    assert len(rows) == 6
    loaded = load(str(sweep))
    for key in lost:  # the runs w2 held when it died came back whole, from w1
        name = key.removeprefix("sim-")
        summary, columns = run_point(loaded.scenarios[name])
        assert _rounded({k: rows[name][k] for k in summary if k not in MACHINE}) == \
            _rounded(summary)
        assert data.read_nodes(out, name).to_pydict() == columns


def test_the_same_command_resumes_and_report_redraws(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """On the embedded LocalCluster, whose workers run the compiled build by default."""
    sweep = _sweep(tmp_path, 'seeds = [1, 2, 3]\nmetrics = ["p99"]\n'
                             '[vary]\n"run.nodes" = [12]\n')
    out = tmp_path / "out"
    argv = (str(sweep), "--out", str(out), "--workers", "1")
    assert _sweep_line(capsys, *argv)["ran"] == 3
    rows = {r["run"]: r for r in data.read_runs(out).to_pylist()}
    assert {r["engine"] for r in rows.values()} == {"compiled"}
    for name, summary in run_serially(load(str(sweep))).items():  # plain Python, here
        assert summary["engine"] == "python"
        assert _rounded({k: rows[name][k] for k in summary if k not in MACHINE}) == \
            _rounded(summary)
    runs = sorted((out / "runs").glob("*.parquet"))
    kept = {p: p.stat().st_mtime_ns for p in runs[1:]}
    runs[0].unlink()
    line = _sweep_line(capsys, *argv)
    assert (line["skipped"], line["ran"]) == (2, 1)
    assert runs[0].exists()
    assert {p: p.stat().st_mtime_ns for p in runs[1:]} == kept
    assert _sweep_line(capsys, *argv)["ran"] == 0

    plot = out / "plots" / "p99-by-run.nodes.png"
    plot.unlink()
    assert main(["sim", "report", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["runs"] == 3
    assert plot.read_bytes().startswith(b"\x89PNG")


def test_ctrl_c_stops_the_sweep_leaving_whole_runs_that_the_same_command_completes(
        tmp_path: Path) -> None:
    # Runs of about a second each (96 nodes): the interrupt must find runs still to do.
    # At 32 nodes a quiet machine finished all eight before the signal came (CI, stop 40).
    sweep = _sweep(tmp_path, 'seeds = {start = 1, stop = 8}\n[vary]\n"run.nodes" = [96]\n')
    out = tmp_path / "out"
    bootseer = Path(sys.executable).with_name("bootseer")
    argv = [str(bootseer), "sim", "sweep", str(sweep), "--out", str(out), "--workers", "2",
            "--json"]
    # As from a terminal: a test run started in the background by a non-interactive shell
    # (`.ci/run &`) has SIGINT ignored, and its children would inherit that.
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 300
    while not data.done(out) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert proc.poll() is None, "the sweep ended before it could be interrupted"
    proc.send_signal(signal.SIGINT)  # what Ctrl-C sends the foreground process
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, (stdout[-2000:], stderr[-2000:])
    assert "Traceback" not in stderr
    assert "the same command runs the rest" in stderr
    line = json.loads(stdout.strip().splitlines()[-1])
    assert line["interrupted"] is True
    kept = data.done(out)
    assert 0 < len(kept) < 8
    for name in kept:  # every run there is whole
        assert data.read_nodes(out, name).num_rows == 96
    again = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr
    resumed = json.loads(again.stdout.strip().splitlines()[-1])
    assert (resumed["skipped"], resumed["ran"]) == (len(kept), 8 - len(kept))


def test_a_run_that_raises_is_written_with_its_parameters_and_error(tmp_path: Path) -> None:
    """A worker that cannot run a task (here: tables that its scenario reader rejects,
    as a worker on other code might) fails that run alone, recorded in failed/."""
    from simulations.sweep.run import client_for, execute

    sweep = _sweep(tmp_path, 'seeds = [1, 2]\n[vary]\n"run.nodes" = [12]\n')
    loaded = load(str(sweep))
    broken = loaded.runs[1]
    tables, source, name = loaded.tasks[broken.name]
    loaded.tasks[broken.name] = ({**tables, "network": {**tables["network"], "racks": 0}},
                                 source, name)
    out = tmp_path / "out"
    with client_for(None, 1, None) as client:
        outcome = execute(loaded, out, client, None)
    assert outcome.finished == [loaded.runs[0].name]
    [(point, error)] = outcome.failed
    assert point == broken
    assert "network.racks" in error
    failure = json.loads((out / "failed" / f"{broken.name}.json").read_text())
    assert failure["params"] == {"run.nodes": 12}
    assert failure["seed"] == broken.seed
    assert "network.racks" in failure["error"]
    assert data.done(out) == {loaded.runs[0].name}


def _worker_allocator() -> tuple[bool, str | None, str | None]:
    from simulations import hugearena

    found = hugearena.stats()
    return (bool(found and found["installed"]), os.environ.get("PYTHONMALLOC"),
            os.environ.get("GLIBC_TUNABLES"))


def test_local_workers_run_on_the_allocator_of_the_compiled_child() -> None:
    """pymalloc's arenas on huge pages (simulations.hugearena), installed by the preload;
    the client's own environment is left as it was."""
    from simulations.sweep.run import client_for

    before = dict(os.environ)
    with client_for(None, 1, None) as client:
        installed, pymalloc, tunables = client.submit(_worker_allocator, pure=False).result()
    assert installed and pymalloc is None
    assert tunables is not None and "glibc.malloc.hugetlb=1" in tunables
    assert {k: os.environ.get(k) for k in ("PYTHONMALLOC", "GLIBC_TUNABLES")} == \
           {k: before.get(k) for k in ("PYTHONMALLOC", "GLIBC_TUNABLES")}
