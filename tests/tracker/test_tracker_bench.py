"""`bootseer bench tracker` end to end: a real tracker, real wrk, a small swarm."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tracker.bench.loadgen import Swarm, build_pool

SECRET = b"bench-test-secret-0123456789abcdef"


@pytest.mark.parametrize("protocol, extra", [("single", []),
                                             ("batched", ["--compare-nodes", "20"])])
def test_bench_prints_one_json_line_with_the_swarm_fully_announced(
        protocol: str, extra: list[str]) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "tracker.bench.announces", "tracker", "--nodes", "60",
         "--contents", "2",
         "--seconds", "1", "--max-rate", "40000", "--protocol", protocol, "--json",
         *extra],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode in (0, 1), proc.stderr
    result = json.loads(proc.stdout)
    assert result["nodes"] == 60 and result["contents"] == 2 and result["replicas"] == 1
    assert result["errors"] == 0
    assert result["swarm_peers"] == [60, 60]
    assert result["announces_per_second"] > 0
    assert result["content_announces_per_second"] == pytest.approx(
        result["announces_per_second"] * 2, abs=2)
    assert result["requests"] > 0
    assert (proc.returncode == 0) == (result["limited_by"] == "tracker")
    if extra:
        assert result["compare"]["nodes"] == 20
        assert result["rate_ratio"] > 0 and result["cpu_rate_ratio"] > 0


def test_pool_requests_are_distinct_and_signed_once_each() -> None:
    pool = build_pool(Swarm(5, 3, batched=False), SECRET, "127.0.0.1:1", 40, seed=1)
    assert len(set(pool)) == 40
    assert all(raw.startswith(b"POST /v1/announce HTTP/1.1\r\n") for raw in pool)


def test_bench_with_replicas_drives_both_and_they_share_one_swarm() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "tracker.bench.announces", "tracker", "--replicas", "2",
         "--nodes", "60",
         "--contents", "2", "--seconds", "1", "--max-rate", "40000", "--json"],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode in (0, 1), proc.stderr
    result = json.loads(proc.stdout)
    assert result["replicas"] == 2 and result["errors"] == 0 and result["requests"] > 0
    # The warm-up announced every node at the first replica; the second one counts them.
    assert result["swarm_peers"] == [60, 60]
    assert result["redis_cpu"] >= 0
    assert (proc.returncode == 0) == (result["limited_by"] in ("tracker", "machine"))
