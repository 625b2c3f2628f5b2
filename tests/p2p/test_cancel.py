"""Cancel on the wire: a peer's withdrawn request is not served (wire protocol 2).

A real agent seeds a content with its upload capped, so that a probe's
requests queue behind one another; the probe (a hand-driven peer) asks for
six chunks and at once cancels two of them. The agent sends the other four,
in order, and never the cancelled ones; its metrics count the two.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from helpers.hostile import RawClient
from helpers.promtext import metric

from p2p.testing.localcluster import LocalCluster, wait_all_complete, write_random_file
from p2p.units import MiB
from p2p.wire import Cancel, Piece, Request

CHUNK = 2 * MiB  # the agent's upload burst (4 MiB) covers the first two pieces only


async def test_cancelled_queued_requests_are_skipped(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path / "cluster")
    try:
        await cluster.start_tracker()
        source = tmp_path / "origin" / "content.bin"
        await asyncio.to_thread(write_random_file, source, 6 * CHUNK, 9)
        await cluster.start_origin(source.parent)
        m = await cluster.publish(source, CHUNK)
        seeder = await cluster.start_agent(0, "rack0", {"upload_mbps": 1.0})
        done = await wait_all_complete([seeder], m.content_id, 60)
        assert all(r.get("complete") for r in done.values()), done

        probe = await RawClient.authenticated(seeder.child.ready["addr"], cluster.secret,
                                              "probe")
        try:
            frames = [Request(m.content_id, chunk, chunk + 1).encode() for chunk in range(6)]
            frames += [Cancel(m.content_id, chunk, chunk + 1).encode() for chunk in (3, 4)]
            await probe.send(b"".join(frames))
            got: list[int] = []
            async with asyncio.timeout(60):
                while 6 not in got:  # the last request: anything before it came already
                    msg = await probe.recv_message()
                    assert isinstance(msg, Piece), msg
                    await probe.recv_exactly(msg.len)
                    got.append(msg.req)
        finally:
            probe.close()
        assert got == [1, 2, 3, 6]
        async with seeder.client(10.0) as client:
            text = await client.metrics()
        assert metric(text, "bootseer_requests_cancelled_total") == 2
    finally:
        await cluster.stop()
