"""`bootseer status` and `get` find the node's agent when not told where its socket is."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

BOOTSEER = [sys.executable, "-m", "p2p"]


def environment(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BOOTSEER_")}
    env["BOOTSEER_SECRET"] = base64.b64encode(os.urandom(32)).decode()
    env["BOOTSEER_RUN_DIR"] = str(tmp_path / "run")
    return env


@contextmanager
def agent(tmp_path: Path, env: dict[str, str], name: str) -> Iterator[dict[str, str]]:
    """A real agent with its socket somewhere no command looks by default."""
    proc = subprocess.Popen(
        [*BOOTSEER, "agent", "--port", "0", "--store-dir", str(tmp_path / name),
         "--api-socket", str(tmp_path / f"{name}.sock"), "--tracker", "http://127.0.0.1:9"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line, proc.communicate(timeout=60)[1]
        yield json.loads(line)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)


def status(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*BOOTSEER, "status"], env=env, capture_output=True, text=True,
                          timeout=120)


def test_status_finds_the_one_agent_and_asks_which_of_two(tmp_path: Path) -> None:
    env = environment(tmp_path)
    with agent(tmp_path, env, "a1") as first:
        done = status(env)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["peer"] == first["peer"]
        with agent(tmp_path, env, "a2"):
            done = status(env)
            assert done.returncode == 2
            assert done.stderr.startswith("bootseer status: 2 agents run on this node; "
                                          "say which with --api-socket: ")
            assert str(tmp_path / "a1.sock") in done.stderr
    assert list((tmp_path / "run" / "agents").iterdir()) == []  # stopped agents unregister


def test_a_dead_agents_link_is_ignored(tmp_path: Path) -> None:
    env = environment(tmp_path)
    links = tmp_path / "run" / "agents"
    links.mkdir(parents=True)
    (links / "999999999").symlink_to(tmp_path / "gone.sock")  # beyond any pid_max
    with agent(tmp_path, env, "a1") as only:
        done = status(env)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["peer"] == only["peer"]
