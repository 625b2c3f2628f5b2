"""The serving process of `bootseer image run`, forked rather than started anew.

`image run` needs the mount served by another process (a process must not read
a pyfuse3 mount it serves). Starting `python -m fusefs.image serve` costs an
interpreter start and the imports of aiohttp, pyfuse3 and rapidgzip again:
about half a second here, on every launch. `ForkedMount.start` forks instead,
before this process has an event loop or a thread: the child moves to a session
of its own, sends its stderr to a log file, runs `serve_image` on a fresh event
loop, and writes its one JSON "mounted" line to a pipe; it ends (unmounting) when
the parent dies, however it dies. The parent reads that line (`wait_ready`,
bounded) and later stops the child with SIGTERM, a bounded wait, SIGKILL if it
must, and a forced unmount if the child left one. What `serve` returns (what
was recorded and prefetched) the child writes beside its log, and `stop` reads
it into `ended`. The child never returns into the parent's code: it ends with
`os._exit`.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from fusefs.mount import MountError, force_unmount
from fusefs.mountinfo import is_mounted

log = logging.getLogger(__name__)

POLL_S = 0.05
PR_SET_PDEATHSIG = 1  # prctl(2)

Serve = Callable[[Callable[[dict[str, Any]], None]], Coroutine[Any, Any, Any]]


class ForkedMount:
    """A mount served by a forked child (see the module docstring)."""

    def __init__(self, pid: int, ready_fd: int, mountpoint: Path, log_path: Path) -> None:
        self.pid = pid
        self.mountpoint = mountpoint
        self.log_path = log_path
        self.ready: dict[str, Any] = {}
        self.ended: dict[str, Any] = {}  # what serve returned, once stopped
        self._ready_fd = ready_fd
        self._status: int | None = None

    @classmethod
    def start(cls, serve: Serve, mountpoint: Path, log_path: Path,
              expected: tuple[type[Exception], ...]) -> ForkedMount:
        """Fork a child that runs `serve(ready)` (a coroutine that calls `ready(info)` once
        it serves). An `expected` error in the child reaches the parent as its message
        (`wait_ready` raises MountError with it); anything else, with its log. Call before
        any event loop or thread exists in this process."""
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: never returns
            os.close(read_fd)
            _child(write_fd, log_path, serve, expected)
        os.close(write_fd)
        return cls(pid, read_fd, mountpoint, log_path)

    async def wait_ready(self, timeout_s: float) -> dict[str, Any]:
        """The child's "mounted" line; MountError with its log if it does not come."""
        message = await ready_message(self._ready_fd, timeout_s)
        if message.get("event") == "mounted":
            self.ready = message
            return message
        await self.stop()
        if "error" in message:
            raise MountError(str(message["error"]))
        tail = self.log_path.read_text(errors="replace").strip()[-2000:]
        raise MountError(f"the mount at {self.mountpoint} did not start; its log "
                         f"({self.log_path}):\n{tail}")

    @property
    def stopped(self) -> bool:
        return self._status is not None

    async def stop(self, timeout_s: float = 30.0) -> int:
        """SIGTERM, a bounded wait, SIGKILL if need be; nothing stays mounted. The child's
        exit status."""
        if self._status is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout_s
            while (status := _reaped(self.pid)) is None and time.monotonic() < deadline:
                await asyncio.sleep(POLL_S)
            if status is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, signal.SIGKILL)
                status = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])
            self._status = status
            self.ended = read_summary(self.log_path)
        if is_mounted(self.mountpoint):
            await asyncio.to_thread(force_unmount, self.mountpoint)
        return self._status


def _child(write_fd: int, log_path: Path, serve: Serve,
           expected: tuple[type[Exception], ...]) -> None:
    code = 1
    pipe = os.fdopen(write_fd, "w")

    def say(message: dict[str, Any]) -> None:
        if not pipe.closed:
            pipe.write(json.dumps(message) + "\n")
            pipe.close()

    try:
        parent = os.getppid()
        os.setsid()
        _end_with_parent(parent)
        with open(log_path, "ab") as log_file:
            os.dup2(log_file.fileno(), sys.stderr.fileno())
        devnull = os.open(os.devnull, os.O_RDWR)
        os.dup2(devnull, sys.stdin.fileno())
        os.dup2(devnull, sys.stdout.fileno())
        summary = asyncio.run(serve(lambda info: say({"event": "mounted", **info})))
        if isinstance(summary, dict):
            summary_path(log_path).write_text(json.dumps(summary))
        code = 0
    except expected as exc:
        log.error("%s", exc)
        say({"event": "failed", "error": str(exc)})
        code = 2
    except BaseException:  # the child's last word, then os._exit: its log says what
        log.exception("the mount ended with an error")
    finally:
        logging.shutdown()
        os._exit(code)


def _end_with_parent(parent: int) -> None:
    """Have the kernel send us SIGTERM (which unmounts) when the process that forked us
    dies, even by SIGKILL: a mount nobody will stop must not outlive its launch."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        log.warning("cannot ask to end with the parent: %s", os.strerror(ctypes.get_errno()))
    if os.getppid() != parent:  # it died before the request was in place
        os.kill(os.getpid(), signal.SIGTERM)


def summary_path(log_path: Path) -> Path:
    """Where a mount logging to `log_path` writes what its serving returned, at its end."""
    return log_path.with_name(log_path.name + ".ended.json")


def read_summary(log_path: Path) -> dict[str, Any]:
    """What `summary_path` holds; {} if nothing was written (a mount that failed)."""
    try:
        summary = json.loads(summary_path(log_path).read_text())
    except (OSError, ValueError):  # a child killed before it wrote one
        return {}
    return summary if isinstance(summary, dict) else {}


async def ready_message(fd: int, timeout_s: float) -> dict[str, Any]:
    """The JSON line a serving process writes to `fd` once it serves (or its error), read
    within `timeout_s`; {} if none came. Closes `fd`."""
    try:
        line = await asyncio.wait_for(asyncio.to_thread(read_line, fd), timeout_s)
        return dict(json.loads(line))
    except (TimeoutError, json.JSONDecodeError, TypeError, ValueError):
        return {}
    finally:
        os.close(fd)


def read_line(fd: int) -> bytes:
    """One line from `fd` (blocking), or what came before its end."""
    data = bytearray()
    while not data.endswith(b"\n") and (piece := os.read(fd, 65536)):
        data += piece
    return bytes(data)


def _reaped(pid: int) -> int | None:
    try:
        done, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return -1
    return os.waitstatus_to_exitcode(status) if done else None
