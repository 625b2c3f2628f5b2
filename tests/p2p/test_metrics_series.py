"""Metrics carry one series per counter: no `_created` twin (issue 36, item 8)."""

from __future__ import annotations

from pathlib import Path

import aiohttp

from p2p.testing.localcluster import LocalCluster


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
