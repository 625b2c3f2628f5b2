"""The store's byte budget, seen from a running agent: complete contents give way."""

from __future__ import annotations

from pathlib import Path

from p2p.testing.localcluster import LocalCluster, write_random_file
from p2p.units import MiB

BUDGET_GB = 100 * MiB / (1 << 30)  # room for one 64 MiB content, not two


async def test_complete_content_is_evicted_for_a_new_one_and_can_come_back(
        tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path / "cluster")
    try:
        origin_dir = tmp_path / "origin"
        write_random_file(origin_dir / "a.bin", 64 * MiB, seed=1)
        write_random_file(origin_dir / "b.bin", 64 * MiB, seed=2)
        await cluster.start_tracker()
        await cluster.start_origin(origin_dir)
        a = await cluster.publish(origin_dir / "a.bin")
        b = await cluster.publish(origin_dir / "b.bin")
        agent = await cluster.start_agent(0, "r1", {"store_budget_gb": BUDGET_GB})
        async with agent.client(120) as client:
            await client.ensure(a.content_id)
            await client.ensure(b.content_id)  # needs A's room
            held = (await client.status())["contents"]
            assert list(held) == [b.content_id]
            assert not (agent.store_dir / a.content_id).exists()
            # A is fetched again on demand, evicting B, and reads back intact.
            await client.ensure(a.content_id)
            got = await client.read(a.content_id, 0, 1 * MiB)
            assert got == (origin_dir / "a.bin").read_bytes()[:MiB]
            assert list((await client.status())["contents"]) == [a.content_id]
    finally:
        await cluster.stop()


async def test_content_larger_than_the_budget_fails_with_a_clear_error(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path / "cluster")
    try:
        origin_dir = tmp_path / "origin"
        write_random_file(origin_dir / "big.bin", 128 * MiB, seed=3)
        await cluster.start_tracker()
        await cluster.start_origin(origin_dir)
        big = await cluster.publish(origin_dir / "big.bin")
        agent = await cluster.start_agent(0, "r1", {"store_budget_gb": BUDGET_GB})
        async with agent.client(120) as client:
            from p2p.agentclient import AgentError

            try:
                await client.ensure(big.content_id)
            except AgentError as exc:
                assert "budget" in str(exc)
            else:
                raise AssertionError("a content over the store budget was reported complete")
    finally:
        await cluster.stop()
