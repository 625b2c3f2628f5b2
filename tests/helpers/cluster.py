"""A local cluster distributing one 64 MiB content in 1 MiB chunks, and the helpers the
fault tests use around it: start the tracker, origin and agents, wait until a transfer is
under way, read an agent's status and metrics, run a round checked byte for byte."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Coroutine
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from helpers.waiting import until
from p2p.content import ContentId, Manifest, PeerId
from p2p.peer import PeerInfo, Timeouts
from p2p.testing.demo import Round, distribute
from p2p.testing.localcluster import (
    AgentHandle,
    LocalCluster,
    wait_all_complete,
    write_random_file,
)
from p2p.units import MiB

SIZE = 64 * MiB
CHUNK = 1 * MiB
CHUNKS = SIZE // CHUNK
CAPPED: dict[str, Any] = {"download_mbps": 20.0, "upload_mbps": 40.0}
ROUND_TIMEOUT_S = 120.0
PROBE = PeerInfo(PeerId("probe"), "", "rack0")
TIMEOUTS = Timeouts(handshake_s=5.0, idle_s=30.0, frame_s=10.0)


class Background:
    """Tasks a test runs beside its main line; whatever is left is cancelled at the end."""

    def __init__(self) -> None:
        self._tasks: list[asyncio.Task[Any]] = []

    def start(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        self._tasks.append(task)
        return task

    async def cancel_all(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


@pytest.fixture
async def background() -> AsyncIterator[Background]:
    tasks = Background()
    try:
        yield tasks
    finally:
        await tasks.cancel_all()


async def start_cluster(cluster: LocalCluster, tmp_path: Path,
                        origin_mbps: float | None = None) -> tuple[Path, Manifest]:
    """Tracker, origin (capped at `origin_mbps` in all), and a published content."""
    source = tmp_path / "origin" / "content.bin"
    await asyncio.to_thread(write_random_file, source, SIZE, 11)
    await cluster.start_tracker()
    await cluster.start_origin(source.parent, origin_mbps)
    return source, await cluster.publish(source, CHUNK)


async def start_agents(cluster: LocalCluster, indices: range,
                       config: dict[str, Any] | None = None) -> list[AgentHandle]:
    return list(await asyncio.gather(*(cluster.start_agent(i, f"rack{i % 2}", config)
                                       for i in indices)))


async def transfer_under_way(agents: list[AgentHandle], content: ContentId,
                             background: Background) -> asyncio.Task[Any]:
    """Every agent fetches `content` in the background; returns once each holds 2 chunks."""
    done = background.start(wait_all_complete(agents, content, ROUND_TIMEOUT_S))

    async def under_way() -> bool:
        return all([(await info(a, content)).get("have", 0) >= 2 for a in agents])

    await until(under_way, "every agent holds 2 chunks")
    return done


async def info(agent: AgentHandle, content: ContentId) -> dict[str, Any]:
    """The agent's status entry for `content` ({} if it has none)."""
    async with agent.client(10.0) as client:
        return dict((await client.status())["contents"].get(content, {}))


def chunk_files(agent: AgentHandle, content: ContentId) -> list[Path]:
    """The verified chunks on the agent's disk (temp files are not chunks)."""
    directory = agent.store_dir / content
    if not directory.is_dir():
        return []
    return [p for p in directory.iterdir()
            if p.name.endswith(".chunk") and not p.name.startswith(".")]


async def agent_metrics(agent: AgentHandle) -> str:
    async with agent.client(10.0) as client:
        return await client.metrics()


async def tracker_metrics(cluster: LocalCluster) -> str:
    async with aiohttp.ClientSession() as http, \
            http.get(f"{cluster.tracker_url}/metrics",
                     timeout=aiohttp.ClientTimeout(total=10)) as resp:
        return await resp.text()


async def round_of(cluster: LocalCluster, agents: list[AgentHandle], source: Path,
                   content: ContentId) -> Round:
    """Every agent completes `content`, and every copy matches the original."""
    async with asyncio.timeout(ROUND_TIMEOUT_S):
        result = await distribute(cluster, agents, source, content, SIZE, progress=False,
                                  verify=True)
    assert result.failures == [], result.failures
    assert result.verified
    return result
