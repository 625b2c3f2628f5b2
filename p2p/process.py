"""Child processes, one way: a tool found on PATH (or the Debian package named that has
it), a free port to give a child, a child's CPU seconds and age, and stopping a child in bounded
time. Every command, test fixture and benchmark that starts or measures a process uses
these, so a missing tool reads the same everywhere and no stop can hang.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import select
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path

from p2p.errors import UserError

STOP_TIMEOUT_S = 10.0  # after SIGTERM, the wait before SIGKILL


class ToolMissing(UserError):
    """A program this needs is not installed; the message names its Debian package."""


def require_tool(name: str, package: str | None = None) -> str:
    """The path of `name` on PATH, or ToolMissing naming the Debian package that has it
    (`package`, by default the tool's own name)."""
    path = shutil.which(name)
    if path is None:
        package = package or name
        raise ToolMissing(f"{name} is not installed: install the Debian package {package} "
                          f"(apt-get install {package}; `make setup` does)")
    return path


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on `host` right now (the kernel's choice)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds the live process `pid` has used, all its threads (0.0 once
    it is gone)."""
    return sum(cpu_split(pid))


def cpu_split(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds the live process `pid` has used, all its threads
    ((0.0, 0.0) once it is gone)."""
    with contextlib.suppress(OSError, IndexError, ValueError):
        # Fields 14 and 15 of /proc/PID/stat, counted after the ")" that ends the name.
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        tick = os.sysconf("SC_CLK_TCK")
        return int(fields[11]) / tick, int(fields[12]) / tick
    return 0.0, 0.0


def age_seconds(pid: int | None = None) -> float | None:
    """Seconds since the process `pid` (this one by default) started, to the kernel's tick
    (10 ms); None where /proc cannot say."""
    with contextlib.suppress(OSError, IndexError, ValueError):
        # Field 22 of /proc/PID/stat: the start, in ticks after boot (CLOCK_BOOTTIME).
        stat = Path(f"/proc/{pid or os.getpid()}/stat").read_text()
        started = int(stat.rpartition(")")[2].split()[19]) / os.sysconf("SC_CLK_TCK")
        return max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) - started)
    return None


def cpu_seconds_of(pids: Iterable[int]) -> float:
    """The CPU seconds of the live processes `pids`, summed."""
    return sum(cpu_seconds(pid) for pid in pids)


def own_and_children() -> tuple[float, float]:
    """User + system seconds of this process, and of its finished (reaped) children."""
    own, done = (resource.getrusage(who) for who in (resource.RUSAGE_SELF,
                                                     resource.RUSAGE_CHILDREN))
    return own.ru_utime + own.ru_stime, done.ru_utime + done.ru_stime


async def stop(proc: asyncio.subprocess.Process, sig: int = signal.SIGTERM,
               timeout_s: float = STOP_TIMEOUT_S) -> int:
    """Send `sig`, wait up to `timeout_s`, then SIGKILL; the exit status (-1 if unknown)."""
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(sig)
        try:
            await asyncio.wait_for(proc.wait(), timeout_s)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
    return proc.returncode if proc.returncode is not None else -1


def end_by_pidfd(pidfd: int, timeout_s: float = STOP_TIMEOUT_S) -> bool:
    """SIGTERM to the process `pidfd` names, a wait of `timeout_s` for it to end, then
    SIGKILL and the same wait; whether SIGTERM was enough. For a process that is not our
    child (no waitpid): the pidfd names it, never a later process given its pid."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(pidfd, sig)
        ended, _, _ = select.select([pidfd], [], [], timeout_s)
        if ended:
            return sig == signal.SIGTERM
    return False


def stop_popen(proc: subprocess.Popen[bytes], timeout_s: float = STOP_TIMEOUT_S) -> int:
    """`stop` for a `subprocess.Popen` child."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode
