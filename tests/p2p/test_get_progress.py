"""`bootseer get` shows progress: a bar on a terminal (a real pseudo-terminal here), plain
periodic lines in a log, from a real tracker, a rate-capped origin and an agent."""

from __future__ import annotations

import asyncio
import fcntl
import os
import pty
import struct
import subprocess
import termios
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from p2p.content import MiB
from p2p.testing.localcluster import AgentHandle, LocalCluster, bootseer_command, write_random_file

SIZE = 12 * MiB
ORIGIN_MBPS = 4.0  # about 3 s a content: several refreshes of the progress


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[tuple[LocalCluster, AgentHandle]]:
    cluster = LocalCluster(tmp_path / "cluster")
    (tmp_path / "files").mkdir()
    try:
        await cluster.start_tracker()
        await cluster.start_origin(tmp_path / "files", rate_mbps=ORIGIN_MBPS)
        yield cluster, await cluster.start_agent(0, "rack0")
    finally:
        await cluster.stop()


async def publish(cluster: LocalCluster, tmp_path: Path, name: str) -> str:
    path = tmp_path / "files" / name
    write_random_file(path, SIZE, seed=len(name))
    return str((await cluster.publish(path)).content_id)


def get_on_a_terminal(cluster: LocalCluster, agent: AgentHandle, content: str) -> str:
    """Run `bootseer get` with stderr on a pseudo-terminal; all it drew there."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))  # as a window
    proc = subprocess.Popen([*bootseer_command(), "get", content, "--api-socket",
                             agent.api_socket], env=cluster.env, stdout=subprocess.PIPE,
                            stderr=slave)
    os.close(slave)
    drawn = bytearray()
    while True:
        try:
            piece = os.read(master, 65536)
        except OSError:  # EIO: the last holder of the terminal closed it
            break
        if not piece:
            break
        drawn += piece
    os.close(master)
    assert proc.wait(timeout=120) == 0
    return drawn.decode(errors="replace")


async def test_a_terminal_gets_a_bar(cluster: tuple[LocalCluster, AgentHandle],
                                     tmp_path: Path) -> None:
    local, agent = cluster
    content = await publish(local, tmp_path, "for-a-terminal.bin")
    drawn = await asyncio.to_thread(get_on_a_terminal, local, agent, content)
    assert f"get {content[:15]}" in drawn
    assert "100%" in drawn and "12.6M/12.6M" in drawn, drawn
    assert "\r" in drawn  # redrawn in place


async def test_a_log_gets_plain_lines(cluster: tuple[LocalCluster, AgentHandle],
                                      tmp_path: Path) -> None:
    local, agent = cluster
    content = await publish(local, tmp_path, "for-a-log.bin")
    done = subprocess.run([*bootseer_command(), "get", content, "--api-socket",
                           agent.api_socket], env={**local.env, "BOOTSEER_PROGRESS_EVERY_S": "0.5"},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert lines, "no progress in the log"
    for line in lines:
        assert line.startswith(f"get {content[:15]}: ") and " of 12.6 MB (from peers " in line
    assert "\r" not in done.stderr and "\x1b" not in done.stderr
