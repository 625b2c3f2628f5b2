"""What a killed `image run` or `launch` leaves behind, and what removes it.

Each works in a scratch directory of its own: the FUSE mount points of the image
(and of a launch's parts), the container runtime's tmpfs and overlay, runc's
bundle. Ending normally, each undoes all of it itself. Killed (SIGKILL, the
OOM killer), it undoes nothing: its FUSE mounts end with it (their serving
children or handles watch it: `fusefs.image.forked`, `fusefs.image.served`),
but the runtime's tmpfs and overlay stay mounted, and a runc container outlives
its `runc run`, which waits on it as an orphan (runc does not end with its
parent; bwrap does, `--die-with-parent`, but its mounts stay too).

`Guard.start(scratch)`, called before the process has an event loop or a
thread, forks a small process that waits for this one to end. Told "done"
(`Guard.done`: everything was undone), it exits. If this process ends without
saying so, the guard sweeps the scratch directory (`sweep`): every runc
container whose bundle is in it is deleted (killed first), every mount under it
is unmounted, deepest first (lazily if busy), and the directory is removed. It
watches a pidfd of this process, opened before the fork, so it names this
process and no later one with its pid; it runs in a session of its own, so a
signal to this process's group (a terminal's Ctrl-C) is not its.

What a guard cannot cover (the guard killed too: a whole cgroup killed at
once) the next launch on the node sweeps (`sweep_abandoned`): a scratch
directory whose owner, "pid start-time" in OWNER_FILE, is no longer alive.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, NoReturn

log = logging.getLogger(__name__)

OWNER_FILE = "owner"  # "pid start-time" of the process a scratch directory belongs to
DONE = b"done"
RUNC_TIMEOUT_S = 30.0


class Guard:
    """The process that sweeps a scratch directory if its owner dies (module docstring)."""

    def __init__(self, pid: int, channel: socket.socket) -> None:
        self.pid = pid
        self._channel = channel

    @classmethod
    def start(cls, scratch: Path) -> Guard:
        """Fork the guard of `scratch` (no event loop or thread may exist yet)."""
        me = os.pidfd_open(os.getpid())
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the guard: never returns
            ours.close()
            _guard(theirs, me, scratch)
        theirs.close()
        os.close(me)
        return cls(pid, ours)

    def done(self) -> None:
        """Everything is undone: the guard exits without sweeping (and is reaped)."""
        with contextlib.suppress(OSError):
            self._channel.send(DONE)
        self._channel.close()
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)


def _guard(channel: socket.socket, owner: int, scratch: Path) -> NoReturn:
    """The guard's life: stdin and stdout on /dev/null, stderr kept (it says what it
    removed), no other descriptor of its owner's; wait, then sweep or not."""
    code = 1
    try:
        os.setsid()
        devnull = os.open(os.devnull, os.O_RDWR)
        for source, target in ((devnull, 0), (devnull, 1), (channel.detach(), 3), (owner, 4)):
            if source != target:
                os.dup2(source, target)
        os.closerange(5, os.sysconf("SC_OPEN_MAX"))
        if _owner_ended(socket.socket(fileno=3), 4):
            for what in sweep(scratch):
                print(f"bootseer: {what}, left by a killed launch in {scratch}",
                      file=sys.stderr, flush=True)
        code = 0
    except BaseException as exc:  # its owner is gone: stderr is all there is to tell
        print(f"bootseer: cannot sweep {scratch}: {exc!r}", file=sys.stderr, flush=True)
    finally:
        os._exit(code)


def _owner_ended(channel: socket.socket, owner: int) -> bool:
    """Whether the owner ended without saying "done" (False once it said so)."""
    watched = [channel.fileno(), owner]
    while True:
        readable, _, _ = select.select(watched, [], [])
        if channel.fileno() in readable:
            if channel.recv(16) == DONE:
                return False
            watched = [owner]  # its end closed without a word: only the pidfd tells now
        if owner in readable:
            return True


def sweep(scratch: Path) -> list[str]:
    """Delete the runc containers whose bundle is in `scratch`, unmount everything under
    it (deepest first), remove it; what was done, in words ([] if nothing was there)."""
    from fusefs.image.mounts import unmount

    done: list[str] = []
    for container in runc_containers():
        if str(container.get("bundle", "")).startswith(f"{scratch}/"):
            subprocess.run(["runc", "delete", "--force", str(container["id"])],
                           capture_output=True, check=False, timeout=RUNC_TIMEOUT_S)
            done.append(f"deleted runc container {container['id']}")
    for point in sorted(mounts_under(scratch), key=len, reverse=True):
        with contextlib.suppress(Exception):
            unmount(Path(point))
            done.append(f"unmounted {point}")
    if scratch.exists():
        shutil.rmtree(scratch, ignore_errors=True)
        done.append("removed the directory")
    return done


def sweep_abandoned(parent: Path, prefix: str) -> list[Path]:
    """`sweep` every `prefix`* directory in `parent` whose owner (OWNER_FILE) is gone;
    those swept."""
    removed: list[Path] = []
    for scratch in sorted(parent.glob(f"{prefix}*")):
        try:
            owner = (scratch / OWNER_FILE).read_text().split()
        except OSError:
            continue  # being made, or not ours
        if len(owner) != 2 or process_identity(int(owner[0])) == " ".join(owner):
            continue  # its owner is alive
        sweep(scratch)
        log.info("removed %s, left by a launch that died", scratch)
        removed.append(scratch)
    return removed


def claim(scratch: Path) -> None:
    """Mark `scratch` as this process's (OWNER_FILE), for `sweep_abandoned`."""
    (scratch / OWNER_FILE).write_text(process_identity(os.getpid()))


def mounts_under(where: Path) -> list[str]:
    """The mount points strictly under `where`, from /proc/self/mountinfo."""
    with open("/proc/self/mountinfo") as f:
        points = [line.split()[4] for line in f]
    return [p for p in points if p.startswith(f"{where}/")]


def runc_containers() -> list[dict[str, Any]]:
    """`runc list` (empty if runc is missing or says nothing useful)."""
    try:
        done = subprocess.run(["runc", "list", "--format", "json"], capture_output=True,
                              text=True, check=False, timeout=RUNC_TIMEOUT_S)
        listed = json.loads(done.stdout or "null")
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return []
    return [c for c in listed or [] if isinstance(c, dict)]


def process_identity(pid: int) -> str:
    """"pid start-time" of a live process ("" if there is none): a pid alone may be reused."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return ""
    return f"{pid} {fields[19]}"
