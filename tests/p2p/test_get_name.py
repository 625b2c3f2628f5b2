"""`bootseer get NAME` and `bootseer status NAME`: a name given with `publish --name` works
wherever an id does."""

from __future__ import annotations

import json
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

        def status(*what: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([*bootseer_command(), "status", *what, "--tracker",
                                   cluster.tracker_url, "--api-socket", agent.api_socket],
                                  env=cluster.env, capture_output=True, text=True, timeout=60)

        one = status("test/big:v1")
        assert one.returncode == 0, one.stderr
        shown = json.loads(one.stdout)
        assert (shown["content"], shown["name"], shown["complete"]) == (
            manifest.content_id, "test/big:v1", True)
        assert json.loads(status(manifest.content_id).stdout)["content"] == manifest.content_id
        whole = json.loads(status().stdout)
        assert whole["contents"][manifest.content_id]["complete"] is True
        other = "c1-" + "0" * 64
        absent = status(other)
        assert absent.returncode == 2 and f"holds nothing of {other}" in absent.stderr
    finally:
        await cluster.stop()
