"""Sweep files: expanding runs (no I/O), and bad files failing before anything runs,
naming the file and the key."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest

from p2p.cli import main
from simulations import scenario
from simulations.sweep.plan import SweepError, check, parse_sweep

HEAD = '[sweep]\nscenario = "small"\nseeds = [1, 2]\n'


def plan(text: str) -> list[Any]:
    sweep = parse_sweep(tomllib.loads(text), "s.toml")
    base, source, name = scenario.read("small")
    return check(sweep, base, lambda t: scenario.parse(t, source, name))


def test_product_zip_ranges_and_seeds_expand_to_named_runs() -> None:
    runs = plan(HEAD + '[vary]\n"network.racks" = [2, 4]\n'
                '"workload.content[0].chunk_size" = {start = "4MiB", stop = "64MiB", '
                'factor = 4}\n')
    assert len(runs) == 2 * 3 * 2
    assert [dict(r.params)["workload.content[0].chunk_size"] for r in runs[::2][:3]] == \
        ["4MiB", "16MiB", "64MiB"]
    assert len({r.name for r in runs}) == len(runs)
    assert runs[0].name.startswith("racks-2_chunk_size-4MiB_seed-1_")
    zipped = plan(HEAD + 'mode = "zip"\n[vary]\n'
                  '"network.racks" = {start = 2, stop = 6, step = 2}\n'
                  '"tracker.origin_fetchers" = [1, 2, 3]\n')
    assert [(dict(r.params)["network.racks"], r.seed) for r in zipped] == \
        [(2, 1), (2, 2), (4, 1), (4, 2), (6, 1), (6, 2)]
    seeds = plan(HEAD.replace("[1, 2]", "{start = 3, stop = 5}") +
                 '[vary]\n"network.racks" = [2]\n')
    assert [r.seed for r in seeds] == [3, 4, 5]


def test_a_run_is_named_by_what_it_runs() -> None:
    one = plan(HEAD + '[vary]\n"network.racks" = [2]\n')
    again = plan(HEAD + '[vary]\n"network.racks" = [2, 4]\n')
    other_base = plan(HEAD + '[set]\n"run.nodes" = 32\n[vary]\n"network.racks" = [2]\n')
    assert one[0].name == again[0].name
    assert one[0].name != other_base[0].name  # same label, another scenario


@pytest.mark.parametrize(("body", "key", "says"), [
    ('[sweep]\nscenario = "small"\nseed = [1]\n[vary]\n"network.racks" = [2]\n',
     "sweep.seed", "unknown key"),
    (HEAD + '[vary]\n"network.rackz" = [2, 4]\n', "vary.network.rackz", "unknown key"),
    (HEAD + '[vary]\n"workload.content[1].size" = ["1GiB"]\n',
     "vary.workload.content[1].size", "1 [[workload.content]]"),
    (HEAD + '[vary]\n"network.racks" = {start = 4, stop = 2, step = 1}\n',
     "vary.network.racks", "empty"),
    (HEAD + '[vary]\n"network.racks" = []\n', "vary.network.racks", "no values"),
    (HEAD + '[vary]\n"workload.content[0].chunk_size" = ["4MiB", "16MB"]\n',
     "vary.workload.content[0].chunk_size", "mixed units"),
    (HEAD + '[vary]\n"network.nic_up" = {start = "10Gbps", stop = "1GB/s", step = "1Gbps"}\n',
     "vary.network.nic_up", "mixed units"),
    (HEAD + '[vary]\n"network.racks" = [2, 100]\n', "vary.network.racks", "every rack"),
    (HEAD + '[set]\n"network.nic_up" = "4MiB"\n[vary]\n"network.racks" = [2]\n',
     "set.network.nic_up", "not a bandwidth"),
    (HEAD + 'mode = "zip"\n[vary]\n"network.racks" = [2, 4]\n"run.nodes" = [8]\n',
     "vary.run.nodes", "zip"),
])
def test_a_bad_sweep_fails_before_running_naming_file_and_key(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], body: str, key: str,
        says: str) -> None:
    sweep = tmp_path / "bad.toml"
    sweep.write_text(body)
    out = tmp_path / "out"
    assert main(["sim", "sweep", str(sweep), "--out", str(out), "--workers", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0, err
    assert f"{sweep}: {key}: " in err, err
    assert says in err, err
    assert not out.exists()  # nothing ran, nothing was written
    with pytest.raises(SweepError):
        plan(body)
