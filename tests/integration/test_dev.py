"""`bootseer dev registry|image|hdfs`: a launch's prerequisites, each one command, for real."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from p2p.process import free_port

BOOTSEER = [sys.executable, "-m", "p2p"]
MANIFEST_TYPES = "application/vnd.oci.image.manifest.v1+json"


@contextmanager
def server(*args: str) -> Iterator[dict[str, Any]]:
    """A `bootseer dev` server: its listening line; stopped with SIGTERM, which must end it
    with status 0."""
    proc = subprocess.Popen([*BOOTSEER, "dev", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line, proc.communicate(timeout=60)[1]
        yield json.loads(line)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err




def manifest_digest(registry: str, repository: str, tag: str) -> str:
    request = urllib.request.Request(f"http://{registry}/v2/{repository}/manifests/{tag}",
                                     headers={"Accept": MANIFEST_TYPES})
    with urllib.request.urlopen(request, timeout=60) as reply:
        return str(reply.headers["Docker-Content-Digest"])


def dev(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*BOOTSEER, "dev", *args], capture_output=True, text=True,
                          timeout=1800)


def test_registry_and_images_pushed_to_it(tmp_path: Path) -> None:
    port = free_port()
    with server("registry", "--port", str(port), "--dir", str(tmp_path / "registry")) as up:
        assert up["registry"] == f"127.0.0.1:{port}"
        busy = dev("registry", "--port", str(port), "--dir", str(tmp_path / "second"))
        assert busy.returncode == 2
        assert busy.stderr == (f"bootseer dev: cannot listen on 127.0.0.1:{port}: "
                               "Address already in use\n")
        for name, flags in (("busybox", ["--busybox"]), ("python", [])):
            done = dev("image", f"127.0.0.1:{port}/dev/{name}:v1", *flags)
            assert done.returncode == 0, done.stderr
            pushed = json.loads(done.stdout)
            assert manifest_digest(up["registry"], f"dev/{name}", "v1") == pushed["digest"]


def test_hdfs_with_a_file_put_in(tmp_path: Path) -> None:
    data = os.urandom(3 * 1024 * 1024 + 5)
    (tmp_path / "model.bin").write_bytes(data)
    with server("hdfs", "--datanodes", "1", "--dir", str(tmp_path / "hdfs"),
                "--put", f"{tmp_path / 'model.bin'}=/ckpt/step-1/model.bin") as up:
        assert up["files"] == [f"{up['uri'].rstrip('/')}/ckpt/step-1/model.bin"]
        url = f"{up['webhdfs']}/webhdfs/v1/ckpt/step-1/model.bin?op=OPEN&user.name=root"
        with urllib.request.urlopen(url, timeout=120) as reply:
            assert reply.read() == data


def test_bad_put_is_one_line(tmp_path: Path) -> None:
    done = dev("hdfs", "--put", "no-equals-sign")
    assert done.returncode == 2
    assert done.stderr == "bootseer dev: --put no-equals-sign: give FILE=/HDFS/PATH\n"
