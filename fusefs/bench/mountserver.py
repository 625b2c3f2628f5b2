"""A mount server for the read benches: `bootseer fs server`, and mounts made through it.

The benches compare a read through a mount the server's host serves with the
same read through a mount of a process of its own. `MountServer.start` runs
the server (its log in a file), `mount` makes a mount through it as every
`mount` command does (`fusefs.mount.start_detached` with BOOTSEER_MOUNT_SERVER
set), and `unmount` stops one by SIGTERM to its handle and waits for the
handle to end (the mount's account is in its log by then). The host's pid is
in each "mounted" line ("server_pid"): its CPU is what the mounts cost.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from fusefs.mount import start_detached
from fusefs.request import SERVER_ENV

BOUND_S = 60.0
POLL_S = 0.05


class MountServer:
    def __init__(self, proc: asyncio.subprocess.Process, socket_path: Path) -> None:
        self.proc, self.socket = proc, socket_path

    @classmethod
    async def start(cls, socket_path: Path, log: Path, env: dict[str, str]) -> MountServer:
        with open(log, "ab") as err:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "fusefs", "server", "--socket", str(socket_path),
                stdout=asyncio.subprocess.PIPE, stderr=err, env=env)
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), BOUND_S)
        if not line or json.loads(line).get("event") != "serving":
            raise RuntimeError(f"the mount server did not start; see {log}")
        return cls(proc, socket_path)

    async def mount(self, argv: list[str], log: Path, env: dict[str, str]) -> dict[str, Any]:
        """Run the serving command `argv` through this server, with `env` as the
        environment it is sent; its "mounted" line (with "pid", the handle's)."""
        return await asyncio.to_thread(self._mount, argv, log, env)

    def _mount(self, argv: list[str], log: Path, env: dict[str, str]) -> dict[str, Any]:
        saved = dict(os.environ)
        os.environ.update({**env, SERVER_ENV: str(self.socket)})
        try:
            return start_detached(argv, log, BOUND_S)
        finally:
            os.environ.clear()
            os.environ.update(saved)

    async def unmount(self, ready: dict[str, Any]) -> None:
        """SIGTERM to the mount's handle; until it has ended (the mount with it)."""
        pid = int(ready["pid"])
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        async with asyncio.timeout(BOUND_S):
            while Path(f"/proc/{pid}").exists():
                await asyncio.sleep(POLL_S)

    async def stop(self) -> None:
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(self.proc.wait(), BOUND_S)
