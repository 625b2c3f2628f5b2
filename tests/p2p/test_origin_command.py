"""`bootseer origin` as a user runs it: a busy port is one line at once, serving logs nothing."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

BOOTSEER = [sys.executable, "-m", "p2p"]


def test_busy_port_is_one_line_and_a_failure_at_once(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        # Before the fix the bind failed in a task nobody awaited: the command never ended.
        done = subprocess.run([*BOOTSEER, "origin", str(tmp_path), "--port", str(port)],
                              capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip() == (f"bootseer origin: cannot listen on 127.0.0.1:{port}: "
                                   "Address already in use")
    assert done.stdout == ""


def test_serving_ranges_logs_no_traceback(tmp_path: Path) -> None:
    data = os.urandom(3 * 1024 * 1024)
    (tmp_path / "blob").write_bytes(data)
    server = subprocess.Popen([*BOOTSEER, "origin", str(tmp_path), "--port", "0"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        url = json.loads(server.stdout.readline())["url"]
        for start in range(0, len(data), 1024 * 1024):
            end = start + 1024 * 1024 - 1
            request = urllib.request.Request(f"{url}/blob",
                                             headers={"Range": f"bytes={start}-{end}"})
            with urllib.request.urlopen(request, timeout=60) as reply:
                assert reply.status == 206
                assert reply.read() == data[start:end + 1]
        with urllib.request.urlopen(f"{url}/blob", timeout=60) as reply:
            assert reply.status == 200 and reply.read() == data
        with urllib.request.urlopen(f"{url}/stats", timeout=60) as reply:
            assert json.load(reply)["bytes_sent"] == 2 * len(data)
    finally:
        server.send_signal(signal.SIGTERM)
        _, stderr = server.communicate(timeout=60)
    assert server.returncode == 0
    assert stderr == "", stderr
