"""`bootseer sim` end to end: files written, one JSON line, one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from test_sim import BASE

from p2p.cli import main


def test_sim_writes_parquet_summary_and_plots(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    scenario = tmp_path / "s.toml"
    scenario.write_text(BASE)
    out = tmp_path / "out"
    assert main(["sim", str(scenario), "--nodes", "12", "--seed", "5", "--out", str(out),
                 "--json", "--engine", "python"]) == 0
    line = json.loads(capsys.readouterr().out.strip())
    for key in ("nodes", "p50", "p99", "max", "origin_egress_ratio", "cross_rack_bytes",
                "wall_seconds", "peak_rss_mb"):
        assert key in line
    assert line["nodes"] == 12
    assert pq.read_table(out / "nodes.parquet").num_rows == 12
    assert json.loads((out / "summary.json").read_text())["p99"] == line["p99"]
    for png in ("completion_cdf.png", "origin_egress.png", "bytes_by_tier.png"):
        assert (out / png).read_bytes().startswith(b"\x89PNG")


def test_bad_scenario_is_one_line_naming_file_and_key(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    scenario = tmp_path / "bad.toml"
    scenario.write_text(BASE.replace('racks = 3', 'racks = -1'))
    assert main(["sim", str(scenario), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert f"{scenario}: network.racks" in err


def test_a_stalled_run_exits_nonzero_and_says_why(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    scenario = tmp_path / "dead.toml"
    scenario.write_text(BASE.replace('latency = "2ms"', 'latency = "2ms"\ndown_at = "0s"'))
    assert main(["sim", str(scenario), "--out", str(tmp_path / "o"), "--json",
                 "--engine", "python"]) == 1
    assert "cannot finish" in capsys.readouterr().err
