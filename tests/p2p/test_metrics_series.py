"""Metrics carry one series per counter (no `_created` twin), and the series an operator
needs on a node (issue 36, item 8)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest
from helpers.promtext import metric
from helpers.waiting import until

from p2p.agentclient import AgentError
from p2p.testing.localcluster import LocalCluster, write_random_file
from p2p.units import MiB


async def test_agent_and_tracker_export_no_created_series(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path)
    try:
        await cluster.start_tracker()
        agent = await cluster.start_agent(0, "rack0")
        async with agent.client(timeout_s=30) as client:
            agent_text = await client.metrics()
        async with aiohttp.ClientSession() as http, \
                http.get(f"{cluster.tracker_url}/metrics") as reply:
            tracker_text = await reply.text()
    finally:
        await cluster.stop()
    for text, counter in ((agent_text, "bootseer_origin_bytes_total"),
                          (tracker_text, "_total")):
        assert counter in text
        assert "_created" not in text


async def test_agent_metrics_show_the_store_origin_errors_and_the_tracker(tmp_path: Path) -> None:
    """What an operator needs to see on a node (issue 36, item 8): the store's usage
    against its budget, origin reads that failed and how, and whether the tracker answers."""
    cluster = LocalCluster(tmp_path)
    try:
        tracker = await cluster.start_tracker()
        source = tmp_path / "files" / "good.bin"
        await asyncio.to_thread(write_random_file, source, 3 * MiB, 5)
        await cluster.start_origin(source.parent)
        good = await cluster.publish(source, MiB)
        missing = tmp_path / "elsewhere" / "gone.bin"  # published, never served: a 404
        await asyncio.to_thread(write_random_file, missing, MiB, 6)
        gone = await cluster.publish(missing, MiB, origin=f"{cluster.origin_url}/gone.bin")
        agent = await cluster.start_agent(0, "rack0", {"store_budget_gb": 1.0})
        async with agent.client(timeout_s=60) as client:
            await client.ensure(good.content_id)
            with pytest.raises(AgentError):
                await client.ensure(gone.content_id)
            text = await client.metrics()
            assert metric(text, "bootseer_store_budget_bytes") == 1 << 30
            assert metric(text, "bootseer_store_used_bytes") >= 3 * MiB
            assert metric(text, "bootseer_origin_errors_total", kind="definite") >= 1
            assert metric(text, "bootseer_tracker_reachable") == 1

            await tracker.stop()  # the agent still seeds `good`: its announces now fail

            async def unreachable() -> bool:
                text = await client.metrics()
                return (metric(text, "bootseer_tracker_reachable") == 0
                        and metric(text, "bootseer_announce_failures_total") >= 1)

            await until(unreachable, "the agent's metrics say the tracker is unreachable")
    finally:
        await cluster.stop()
