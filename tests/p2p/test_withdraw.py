"""Withdraw on the wire: a fetcher whose origin fetches fail takes its pending marks back.

Two real agents; the content's origin URL names a file the origin does not
have, so every origin fetch fails (404). The first agent to announce is the
origin fetcher: each try it tells its peers the chunk is pending, then, when
the fetch fails, withdraws it (and retries after a back-off). The second
agent hears the withdrawals, and no chunk is ever held by either.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from helpers.promtext import metric
from helpers.waiting import until

from p2p.testing.localcluster import LocalCluster, write_random_file
from p2p.units import MiB


async def test_failed_origin_fetches_are_withdrawn_to_peers(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path / "cluster")
    try:
        await cluster.start_tracker()
        source = tmp_path / "origin" / "content.bin"
        await asyncio.to_thread(write_random_file, source, 4 * MiB, 2)
        await cluster.start_origin(source.parent)
        m = await cluster.publish(source, 1 * MiB, origin=f"{cluster.origin_url}/missing.bin")
        agents = [await cluster.start_agent(i, "rack0") for i in range(2)]
        fetches = [asyncio.create_task(_ensure(a, m.content_id)) for a in agents]

        async def heard() -> bool:
            texts = [await _metrics(a) for a in agents]
            return sum(metric(t, "bootseer_withdrawals_heard_total") for t in texts) >= 1

        await until(heard, timeout_s=60.0, what="a peer heard a failed origin fetch withdrawn")
        for task in fetches:
            task.cancel()
        await asyncio.gather(*fetches, return_exceptions=True)
        for agent in agents:
            text = await _metrics(agent)
            assert metric(text, "bootseer_chunks_verified_total") == 0  # nothing was had
    finally:
        await cluster.stop()


async def _ensure(agent: object, content: str) -> None:
    async with agent.client(None) as client:  # type: ignore[attr-defined]
        await client.ensure(content)


async def _metrics(agent: object) -> str:
    async with agent.client(10.0) as client:  # type: ignore[attr-defined]
        return str(await client.metrics())
