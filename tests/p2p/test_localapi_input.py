"""Bad input to the agent's local API is a 400 with one clear line, never a 500 with a
traceback in the agent's log: here a prefetch body nested 100,000 deep (json's decoder
recurses). A real agent, over its real Unix socket."""

from __future__ import annotations

from pathlib import Path

import aiohttp

from p2p.testing.localcluster import LocalCluster, write_random_file
from p2p.units import MiB

DEPTH = 100_000


async def test_a_deeply_nested_prefetch_body_is_a_400(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path / "cluster")
    try:
        await cluster.start_tracker()
        (tmp_path / "origin").mkdir()
        source = tmp_path / "origin" / "blob.bin"
        write_random_file(source, 2 * MiB, 3)
        await cluster.start_origin(tmp_path / "origin")
        manifest = await cluster.publish(source, 1 * MiB)
        agent = await cluster.start_agent(0, "rack0")
        body = '{"chunks": ' + "[" * DEPTH + "]" * DEPTH + "}"
        connector = aiohttp.UnixConnector(path=agent.api_socket)
        async with aiohttp.ClientSession(connector=connector) as http:
            url = f"http://agent/v1/contents/{manifest.content_id}/prefetch"
            async with http.post(url, data=body,
                                 headers={"Content-Type": "application/json"}) as resp:
                status, reply = resp.status, await resp.json()
            async with http.get("http://agent/v1/status") as resp:
                assert resp.status == 200  # still serving
        assert status == 400, reply
        assert "nests too deeply" in reply["error"]
        log = agent.child.stderr_path.read_text(errors="replace")
        assert "Traceback" not in log and "RecursionError" not in log
    finally:
        await cluster.stop()
