"""`bootseer bench swarm` end to end: real agents, tracker and origin on loopback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_bench_swarm_reports_the_round_and_the_agents_cpu() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "p2p", "bench", "swarm", "--nodes", "3", "--size", "12MiB",
         "--chunk-size-mb", "1", "--node-cap", "40", "--origin-cap", "40", "--json"],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["verified"] and not result["failures"]
    assert result["origin_egress_ratio"] <= 1.05  # the swarm, not the origin, fed the rest
    assert len(result["node_seconds"]) == 3
    # The agents did work over the round (verifying 36 MiB of chunks alone takes CPU), and
    # the cores they kept busy are that CPU over the round's time.
    assert result["agent_cpu_seconds"] > 0
    assert result["agent_cores"] == pytest.approx(
        result["agent_cpu_seconds"] / result["seconds"], abs=0.02)  # (both were rounded)
    assert result["host_cpus"] == os.cpu_count()
    assert result["agent_cpu_s_per_gib"] == pytest.approx(
        result["agent_cpu_seconds"] / (3 * 12 / 1024), rel=0.02)
    assert 0 < result["agent_user_cpu_s_per_gib"] <= result["agent_cpu_s_per_gib"]
    assert result["write_floor_cpu_s_per_gib"] > 0
    assert result["baseline_seconds"] is not None and result["speedup"] is not None
    # Each agent said when it first asked for a chunk: after the round began, before its end.
    offsets = result["start_offsets_s"]
    assert len(offsets) == 3 and all(0 <= x <= result["seconds"] for x in offsets)


def test_bench_swarm_one_pair_is_a_receiver_fed_by_a_seed() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "p2p", "bench", "swarm", "--nodes", "1", "--size", "12MiB",
         "--chunk-size-mb", "1", "--no-baseline", "--json",
         # A number reaches the agents' config as a number (the config checks types).
         "--agent-option", "swarm.per_peer_inflight=2"],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["verified"] and not result["failures"] and result["nodes"] == 1
    # The seed fetched the content before the round: the receiver took every byte from it.
    assert result["origin_egress_ratio"] == 0
    assert len(result["node_seconds"]) == 1
    assert result["agent_cpu_s_per_gib"] > 0


def test_trace_round_times_every_origin_chunk_from_the_agents_logs() -> None:
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "trace_round.py"), "--nodes", "3",
         "--size", "8MiB", "--chunk-mb", "1", "--node-cap", "40", "--origin-cap", "40"],
        capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert not result["failures"] and len(result["node_seconds"]) == 3
    # Every one of the 8 chunks came from the origin to someone first, and the logs say when
    # each read was decided, began and ended, in that order, within the round.
    chunks = result["origin_chunks"]
    assert {c["chunk"] for c in chunks} == set(range(8))
    for c in chunks:
        assert 0 <= c["fetch_s"] <= c["read_s"] <= c["stored_s"] <= result["seconds"]


@pytest.mark.parametrize("value", ["-0.5", "soon", "nan"])
def test_calibrate_refuses_a_start_jitter_that_is_not_seconds(value: str) -> None:
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "calibrate.py"), "--start-jitter", value],
        capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 2  # argparse's usage error, before any bench runs
    assert "--start-jitter" in proc.stderr and "Traceback" not in proc.stderr
