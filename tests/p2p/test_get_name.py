"""`bootseer get NAME`: a name given with `publish --name` works wherever an id does."""

from __future__ import annotations

import subprocess
from pathlib import Path

from p2p.testing.localcluster import LocalCluster, bootseer_command, write_random_file
from p2p.tracker_client import TrackerClient


async def test_get_by_name_and_unknown_names(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path / "cluster")
    files = tmp_path / "files"
    files.mkdir()
    write_random_file(files / "big.bin", 3 * 1024 * 1024)
    try:
        await cluster.start_tracker()
        await cluster.start_origin(files)
        agent = await cluster.start_agent(0, "rack0")
        manifest = await cluster.publish(files / "big.bin")
        async with TrackerClient(cluster.tracker_url, cluster.secret) as tracker:
            await tracker.put_name("test/big:v1", manifest.content_id)

        def get(what: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([*bootseer_command(), "get", what, "--tracker",
                                   cluster.tracker_url, "--api-socket", agent.api_socket,
                                   "--out", str(tmp_path / "copy")], env=cluster.env,
                                  capture_output=True, text=True, timeout=120)

        done = get("test/big:v1")
        assert done.returncode == 0, done.stderr
        assert (tmp_path / "copy").read_bytes() == (files / "big.bin").read_bytes()
        assert f'"content": "{manifest.content_id}"' in done.stdout
        missing = get("test/none:v1")
        assert (missing.returncode, missing.stderr) == (
            2, f"bootseer get: no content is named 'test/none:v1' at {cluster.tracker_url}\n")
    finally:
        await cluster.stop()
