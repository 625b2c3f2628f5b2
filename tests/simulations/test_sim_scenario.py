"""Scenario files: bundled ones load; bad ones are rejected naming the file and the key."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_sim import BASE

from simulations.scenario import (
    ScenarioError,
    bundled,
    load,
    override,
    parse_bandwidth,
    parse_duration,
    parse_size,
)
from simulations.strategy import get_strategy


@pytest.mark.parametrize("name", bundled())
def test_bundled_scenarios_load(name: str) -> None:
    assert load(name).nodes >= 1


def test_units() -> None:
    assert parse_size("4GiB") == 4 * 2**30
    assert parse_size("1.5GB") == 1.5e9
    assert parse_bandwidth("25Gbps") == 25e9 / 8
    assert parse_bandwidth("300MB/s") == 300e6
    assert parse_duration("50ms") == pytest.approx(0.05)
    assert parse_duration("2m") == 120.0


@pytest.mark.parametrize(
    ("old", "new", "key", "words"),
    [
        ('racks = 3', 'racks = 3\nspeed = "fast"', "network", "unknown key(s): speed"),
        ('nic_up = "10Gbps"', 'nic_up = "10GB"', "network.nic_up", "a size, not a bandwidth"),
        ('nic_up = "10Gbps"', 'nic_up = 10', "network.nic_up", "has no unit"),
        ('nic_up = "10Gbps"', 'nic_up = "-10Gbps"', "network.nic_up", "impossible"),
        ('racks = 3', 'racks = 0', "network.racks", "impossible"),
        ('size = "256MiB"', 'size = "256ms"', "workload.content[0].size", "not a size"),
        ('origin = "registry"', 'origin = "hdfs"', "workload.content[0].origin", "hdfs"),
        ('max_concurrent = 8', 'max_concurrent = 8\nspeed = 1', "origin[0]", "speed"),
        ('nodes = 24', 'nodes = 2', "network.racks", "3 racks for 2 nodes"),
        ('strategy = "rack_aware"', 'strategy = "fastest"', "run.strategy", "fastest"),
        ('hot_fraction = 0.25', 'hot_fraction = 1.5', "workload.content[0].hot_fraction",
         "at most 1"),
        ('[tracker]', '[swarm]\nmax_peers = 0\n[tracker]', "swarm", "at least 1"),
        ('[tracker]', '[swarm]\nrelay_fetching = 1\n[tracker]', "swarm.relay_fetching",
         "true or false"),
        ('[tracker]', '[agent]\nupload_slots = 0\n[tracker]', "agent.upload_slots",
         "at least 1"),
        ('[tracker]', '[agent]\ndownload_cap = "5GB"\n[tracker]', "agent.download_cap",
         "a size, not a bandwidth"),
        ('[tracker]', '[agent]\nupload_cap = "0Gbps"\n[tracker]', "agent.upload_cap",
         "impossible"),
    ],
)
def test_bad_scenario_names_key_and_file(tmp_path: Path, old: str, new: str, key: str,
                                         words: str) -> None:
    assert old in BASE
    path = tmp_path / "bad.toml"
    path.write_text(BASE.replace(old, new, 1))
    with pytest.raises(ScenarioError) as caught:
        load(str(path))
    message = str(caught.value)
    assert message.startswith(f"{path}: {key}")
    assert words in message


def test_override_is_checked_again() -> None:
    with pytest.raises(ScenarioError, match=r"network\.racks"):
        override(load("small"), nodes=2)


def test_missing_scenario_lists_bundled_ones() -> None:
    with pytest.raises(ScenarioError, match=r"bundled: .*small"):
        load("no-such-scenario")


def test_patience_and_settle_take_durations_and_reach_the_swarm(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text(BASE.replace("[tracker]", '[swarm]\norigin_patience = "2s"\n'
                                 'appointed_patience = "1m"\nsettle = "250ms"\n'
                                 'relay_fetching = false\n[tracker]'))
    scenario = load(str(path))
    assert scenario.swarm_overrides == {"origin_patience_s": 2.0, "appointed_patience_s": 60.0,
                                        "settle_s": 0.25, "relay_fetching": False}
    config = get_strategy("rack_aware", scenario.swarm_overrides).swarm
    assert (config.origin_patience_s, config.appointed_patience_s, config.settle_s) == (
        2.0, 60.0, 0.25)


@pytest.mark.parametrize(("value", "words"), [("20", "has no unit"), ('"20GB"', "a size"),
                                              ('"-1s"', "impossible")])
def test_bad_appointed_patience_names_the_key(tmp_path: Path, value: str, words: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(BASE.replace("[tracker]", f"[swarm]\nappointed_patience = {value}\n[tracker]"))
    with pytest.raises(ScenarioError) as caught:
        load(str(path))
    assert str(caught.value).startswith(f"{path}: swarm.appointed_patience")
    assert words in str(caught.value)
