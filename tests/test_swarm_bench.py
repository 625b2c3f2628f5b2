"""`bootseer bench swarm` end to end: real agents, tracker and origin on loopback."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


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
    assert result["baseline_seconds"] is not None and result["speedup"] is not None
