"""A mount of `bootseer image run` or `bootseer launch`, served by the node's mount server
(which of them serves it: `fusefs.image.starter`).

Why. `image run` forked its serving process from itself (`forked`), so every
launch first imported what serving needs (aiohttp, the image catalog,
rapidgzip...): 0.4 CPU-s before its clock. A node that runs `bootseer fs
server` beside its agent has all of that imported once, and serves
kernel-protocol mounts in its host (`fusefs.mounthost`); `image run` then
asks it for an `image serve` command line and imports none of it.

How. `ServedMount.start` sends the command line (`fusefs.request.fork_serving`)
with a pipe as its stdout and a new log file as its stderr, and asks that the
mount end with this process (`end_with_client`: the server opens a pidfd of
us, the mount's handle watches it, and stops the mount once we have exited,
SIGKILL included; a forked serving process does the same with a thread). The
answer is the pid of the mount's handle (or of its own serving process), of
which we open a pidfd at once. `wait_ready` reads the "mounted" line (bounded);
a mount that fails instead ends, and its log's last line says why. `stop`
sends SIGTERM through the pidfd, waits (bounded) for the handle to end, which
it does once the mount is unmounted and its serving has returned, and reads
what the serving wrote at its end (`image serve --summary`: the record saved,
the backing files' account, the bytes fetched) into `ended`; a mount still
there after that is unmounted here. The handle is not our child, so its exit
status is not ours to read: the summary's presence is the mount's success.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from fusefs.image.forked import read_summary, ready_message
from fusefs.mount import MountError, force_unmount
from fusefs.mountinfo import is_mounted
from fusefs.request import fork_serving
from p2p.process import end_by_pidfd


class ServedMount:
    """A mount the node's mount server serves for this process (module docstring)."""

    def __init__(self, pidfd: int, ready_fd: int, mountpoint: Path, log_path: Path) -> None:
        self.mountpoint = mountpoint
        self.log_path = log_path
        self.ready: dict[str, Any] = {}
        self.ended: dict[str, Any] = {}  # what the serving reported at its end, once stopped
        self._pidfd = pidfd  # -1: it had ended before we could open one
        self._ready_fd = ready_fd
        self._status: int | None = None

    @classmethod
    def start(cls, server: str, argv: list[str], mountpoint: Path,
              log_path: Path) -> ServedMount:
        """Ask the server at `server` to serve `argv` (an `image serve` command line whose
        --summary is `summary_path(log_path)`). ServerUnavailable if nothing answers there,
        ServerRefused if it will not (`fusefs.request`)."""
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_APPEND | os.O_CLOEXEC
        log_fd = os.open(log_path, flags, 0o600)
        read_fd, write_fd = os.pipe()
        try:
            pid = fork_serving(server, argv, write_fd, log_fd, end_with_client=True)
        except BaseException:
            os.close(read_fd)
            raise
        finally:
            os.close(write_fd)
            os.close(log_fd)
        try:
            pidfd = os.pidfd_open(pid)
        except ProcessLookupError:  # it ended already (a mount that failed at once)
            pidfd = -1
        return cls(pidfd, read_fd, mountpoint, log_path)

    async def wait_ready(self, timeout_s: float) -> dict[str, Any]:
        """The "mounted" line; MountError with the log's word if it does not come."""
        message = await ready_message(self._ready_fd, timeout_s)
        if message.get("event") == "mounted":
            self.ready = message
            return message
        await self.stop()
        raise MountError(self._why())

    def _why(self) -> str:
        """The mount's own error (its command's one line), or the end of its log."""
        lines = self.log_path.read_text(errors="replace").strip().splitlines()
        said = [line for line in lines if line.startswith("bootseer")]
        if said:
            return said[-1].partition(": ")[2] or said[-1]  # "bootseer image: why"
        return (f"the mount at {self.mountpoint} did not start; its log ({self.log_path}):\n"
                + "\n".join(lines[-20:]))

    @property
    def stopped(self) -> bool:
        return self._status is not None

    async def stop(self, timeout_s: float = 30.0) -> int:
        """SIGTERM to the mount's handle, a bounded wait for its end, SIGKILL if need be
        (its host then stops the mount); nothing stays mounted. 0 if the serving
        reported its end, else 1."""
        if self._status is None:
            if self._pidfd >= 0:
                await asyncio.to_thread(end_by_pidfd, self._pidfd, timeout_s)
                os.close(self._pidfd)
            self.ended = read_summary(self.log_path)
            self._status = 0 if self.ended else 1
        if is_mounted(self.mountpoint):
            await asyncio.to_thread(force_unmount, self.mountpoint)
        return self._status


