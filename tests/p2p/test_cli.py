"""The agent's command line and configuration: bad input gives one clear line, no traceback."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from p2p.config import load_agent_config
from p2p.configfile import ConfigError
from p2p.testing.localcluster import LocalCluster, bootseer_command

SECRET = "s" * 32


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*bootseer_command(), *args], capture_output=True, text=True,
                          timeout=60, env=env or {**os.environ, "BOOTSEER_SECRET": SECRET})


def test_toml_with_unknown_key_names_key_and_file(tmp_path: Path) -> None:
    cfg = tmp_path / "agent.toml"
    cfg.write_text('rack = "r1"\nbogus = 1\n')
    with pytest.raises(ConfigError, match=rf"'bogus'.*{cfg}"):
        load_agent_config(str(cfg), env={})


def test_nested_swarm_table_and_precedence(tmp_path: Path) -> None:
    cfg = tmp_path / "agent.toml"
    cfg.write_text('rack = "from-file"\nport = 1\n[swarm]\nmax_peers = 7\n')
    config = load_agent_config(str(cfg), env={"BOOTSEER_RACK": "from-env"},
                               overrides={"port": 0})
    assert (config.rack, config.port, config.swarm.max_peers) == ("from-env", 0, 7)


def test_unknown_swarm_policy_is_a_config_error(tmp_path: Path) -> None:
    cfg = tmp_path / "agent.toml"
    cfg.write_text('[swarm]\nchunk_picker = "fastest"\n')
    with pytest.raises(ConfigError, match="unknown chunk picker 'fastest'"):
        load_agent_config(str(cfg), env={})


def test_wrong_type_names_the_key(tmp_path: Path) -> None:
    cfg = tmp_path / "agent.toml"
    cfg.write_text('upload_mbps = "fast"\n')
    with pytest.raises(ConfigError, match="upload_mbps"):
        load_agent_config(str(cfg), env={})


def test_agent_without_secret_says_what_to_set(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BOOTSEER_")}
    result = run("agent", "--port", "0", "--store-dir", str(tmp_path / "s"),
                 "--api-socket", str(tmp_path / "a.sock"), env=env)
    assert result.returncode == 2
    assert "BOOTSEER_SECRET" in result.stderr and "Traceback" not in result.stderr


def test_agent_with_bad_config_file_exits_cleanly(tmp_path: Path) -> None:
    result = run("agent", "--config", str(tmp_path / "missing.toml"))
    assert result.returncode == 2
    assert "missing.toml" in result.stderr and "Traceback" not in result.stderr


def test_get_without_agent_explains(tmp_path: Path) -> None:
    result = run("get", "x3-nothing", "--api-socket", str(tmp_path / "none.sock"))
    assert result.returncode == 2
    assert "no agent is listening" in result.stderr and "Traceback" not in result.stderr


def test_agent_with_a_file_for_a_store_or_an_unknown_api_group(tmp_path: Path) -> None:
    (tmp_path / "s").write_text("not a directory")
    result = run("agent", "--port", "0", "--store-dir", str(tmp_path / "s"),
                 "--api-socket", str(tmp_path / "api" / "a.sock"))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"{tmp_path / 's'}" in result.stderr and "File exists" in result.stderr
    result = run("agent", "--port", "0", "--store-dir", str(tmp_path / "s2"),
                 "--api-socket", str(tmp_path / "api" / "a.sock"), "--api-group", "no-such-gr")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "'no-such-gr' is not a group" in result.stderr


def test_demo_rejects_bad_size() -> None:
    result = run("demo", "--size", "lots")
    assert result.returncode == 2 and "not a size" in result.stderr


def test_agent_port_in_use(tmp_path: Path) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run("agent", "--port", str(port), "--store-dir", str(tmp_path / "s"),
                     "--api-socket", str(tmp_path / "a.sock"))
    assert result.returncode == 2
    assert f"127.0.0.1:{port}" in result.stderr and "Traceback" not in result.stderr


async def test_agent_serves_metrics_over_tcp_and_stops_on_sigterm(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path)
    try:
        await cluster.start_tracker()
        agent = await cluster.start_agent(0, "r1", {"metrics_port": 0})
        url = agent.child.ready["metrics"]
        async with aiohttp.ClientSession() as http, http.get(url) as resp:
            text = await resp.text()
        assert "bootseer_peers_connected" in text
        assert await agent.child.stop() == 0
        assert not Path(agent.api_socket).exists()
    finally:
        await cluster.stop()


def test_help_lists_every_role() -> None:
    result = run("--help")
    for command in ("agent", "tracker", "demo", "bench", "sim", "origin", "publish", "get"):
        assert command in result.stdout


def test_every_command_has_an_entry_point_of_its_name() -> None:
    """Else `bootseer CMD` would import every package to find CMD."""
    from importlib.metadata import entry_points

    from p2p.cli import build_parser

    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert set(commands.choices) == {ep.name for ep in entry_points(group="bootseer.commands")}


def test_the_agent_command_imports_no_other_package() -> None:
    code = ("import sys; from p2p.cli import build_parser; build_parser('agent'); "
            "print(' '.join(sorted({m.split('.')[0] for m in sys.modules})))")
    loaded = set(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                check=True).stdout.split())
    assert "p2p" in loaded
    assert not loaded & {"tracker", "simulations", "depsnap", "fusefs", "hdfs_stripe", "numpy",
                         "pyarrow", "redis"}


if __name__ == "__main__":
    sys.exit(pytest.main([__file__]))
