"""A containerd of its own for tests and benchmarks (not product code).

Debian's `containerd`, started with its root, state and sockets under one directory (the
CRI plugin off: no kubelet here), so several run side by side on one machine and none
touches the host's. `ctr` drives it; `hosts_dir` writes the `hosts.toml` that makes it
pull a registry's images through a mirror, as operators configure it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from p2p.process import require_tool, stop

START_TIMEOUT_S = 30.0


class CtrError(RuntimeError):
    """A `ctr` command failed; the message has its output."""


@contextlib.asynccontextmanager
async def running_containerd(directory: Path) -> AsyncIterator[str]:
    """A started containerd under `directory`; yields its socket; stopped on exit."""
    binary = require_tool("containerd")
    directory.mkdir(parents=True, exist_ok=True)
    socket = directory / "containerd.sock"
    config = directory / "config.toml"
    config.write_text(f"""version = 2
root = "{directory / 'root'}"
state = "{directory / 'state'}"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "{socket}"
[ttrpc]
  address = "{directory / 'ttrpc.sock'}"
""")
    log_path = directory / "containerd.log"
    with open(log_path, "wb") as log:
        proc = await asyncio.create_subprocess_exec(binary, "--config", str(config),
                                                    stdout=log, stderr=log,
                                                    start_new_session=True)
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + START_TIMEOUT_S
        while not socket.exists():
            if proc.returncode is not None or loop.time() > deadline:
                raise CtrError(f"containerd did not start; its log:\n"
                               f"{log_path.read_text(errors='replace')[-2000:]}")
            await asyncio.sleep(0.05)
        yield str(socket)
    finally:
        await stop(proc)


async def ctr(socket: str, *args: str) -> str:
    """`ctr --address SOCKET ARGS`; its output, or CtrError with it."""
    proc = await asyncio.create_subprocess_exec(
        require_tool("ctr", "containerd"), "--address", socket, *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out, _ = await proc.communicate()
    if proc.returncode != 0:
        raise CtrError(f"ctr {' '.join(args)}:\n{out.decode(errors='replace')[-2000:]}")
    return out.decode(errors="replace")


def hosts_dir(directory: Path, registry: str, mirror: str) -> Path:
    """containerd's hosts directory: pull `registry`'s (HOST:PORT, plain HTTP) images
    through the mirror at `mirror` (HOST:PORT)."""
    (directory / registry).mkdir(parents=True, exist_ok=True)
    (directory / registry / "hosts.toml").write_text(
        f'server = "http://{registry}"\n\n[host."http://{mirror}"]\n'
        '  capabilities = ["pull", "resolve"]\n')
    return directory
