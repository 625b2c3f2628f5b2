"""The mount server's side of its host (`fusefs.mounthost`), and the mounts' handles.

Runs in the server (`fusefs.server`), which must stay fit to fork: blocking
socket calls only, one thread, no event loop. `HostLink` forks the host,
hands it each request with the request's stdout and stderr and one end of a
new socket pair, and, when the host takes the request, forks the mount's
handle with the other end (`run_handle`). A host that does not answer (it
died) is started again, once per request; the request is then retried.

The handle (see `fusefs.mounthost`) is what a caller knows of a hosted mount:
its pid. It holds its socket and the mount's log as stderr, nothing else of
the server's, and blocks on the socket: SIGTERM or SIGINT make it send
"stop"; {"mounted": path} tells it what to unmount should the host die;
{"ended": status} ends it with that status (a negative one as that signal, as
a process killed by it). The end of the socket with no "ended" means the host
is gone: it unmounts the mount point, lazily, and exits 1.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import signal
import socket
import sys
from typing import Any, NoReturn

log = logging.getLogger(__name__)

ANSWER_TIMEOUT_S = 10.0  # the host answers once the command line is set up
STOP_TIMEOUT_S = 30.0  # SIGTERM to the host, then SIGKILL: its mounts unmount meanwhile
MAX_MESSAGE_BYTES = 1 << 16


class HostLink:
    """The server's link to its host: start, forward requests, stop."""

    def __init__(self, listener: socket.socket) -> None:
        self.listener = listener  # not the host's or a handle's business: closed in them
        self.pid: int | None = None
        self.channel: socket.socket | None = None

    def start(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            ours.close()
            self.listener.close()
            _host_child(theirs)
        theirs.close()
        ours.settimeout(ANSWER_TIMEOUT_S)
        self.pid, self.channel = pid, ours
        log.info("mounts that the kernel protocol serves are served by pid %d", pid)

    def sockets(self) -> tuple[socket.socket, ...]:
        """What a forked child must close."""
        return (self.channel,) if self.channel is not None else ()

    def take(self, request: bytes, fds: list[int], conn: socket.socket) -> int | None:
        """Hand the request (its stdout and stderr: `fds`) to the host; the pid of the
        mount's handle if the host serves it, None if it leaves it to a process of its
        own."""
        mine, its = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            answer = self._ask(request, [*fds, its.fileno()])
        finally:
            its.close()
        if not answer.get("ok"):
            mine.close()
            log.info("the host leaves a mount to a process of its own: %s",
                     answer.get("fork"))
            return None
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            for sock in (conn, self.listener, *self.sockets()):
                sock.close()
            run_handle(mine, fds[1])
        mine.close()
        return pid

    def _ask(self, request: bytes, fds: list[int]) -> dict[str, Any]:
        for attempt in (1, 2):
            try:
                assert self.channel is not None
                socket.send_fds(self.channel, [request], fds)
                reply = self.channel.recv(MAX_MESSAGE_BYTES)
                if reply:
                    answer: dict[str, Any] = json.loads(reply)
                    return answer
            except (OSError, ValueError) as exc:
                log.warning("the host (pid %s) did not answer: %s", self.pid, exc)
            if attempt == 1:
                log.warning("the host (pid %s) is gone; starting another", self.pid)
                self.stop()
                self.start()
        return {"fork": "the host does not answer"}

    def stop(self) -> None:
        """SIGTERM to the host (it unmounts its mounts), a bounded wait, SIGKILL."""
        if self.channel is not None:
            self.channel.close()
            self.channel = None
        if self.pid is None:
            return
        pid, self.pid = self.pid, None
        try:
            pidfd = os.pidfd_open(pid)
        except ProcessLookupError:
            return
        try:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            ended, _, _ = select.select([pidfd], [], [], STOP_TIMEOUT_S)
            if not ended:
                log.warning("the host (pid %d) did not end in %g s; killing it", pid,
                            STOP_TIMEOUT_S)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        finally:
            os.close(pidfd)


def _host_child(channel: socket.socket) -> NoReturn:
    """The host's process: stdout to /dev/null (the server's stdout is its own), logs
    on the server's stderr, no other descriptor of the server's (a request's, should
    the host be started again while one is open); never returns."""
    code = 1
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        fd = channel.detach()
        devnull = os.open(os.devnull, os.O_RDWR)
        for source, target in ((devnull, 0), (devnull, 1), (fd, 3)):
            if source != target:
                os.dup2(source, target)
        os.closerange(4, os.sysconf("SC_OPEN_MAX"))
        from fusefs.mounthost import run_host

        code = run_host(socket.socket(fileno=3), logging.getLogger().getEffectiveLevel())
    except BaseException:  # its last words on the server's stderr
        log.exception("the mount host ended with an error")
    finally:
        logging.shutdown()
        os._exit(code)


def run_handle(sock: socket.socket, log_fd: int) -> NoReturn:
    """A hosted mount's handle (see the module docstring); never returns."""
    try:
        os.setsid()
        fd = sock.detach()
        devnull = os.open(os.devnull, os.O_RDWR)
        for source, target in ((devnull, 0), (devnull, 1), (log_fd, 2), (fd, 3)):
            if source != target:
                os.dup2(source, target)
        os.closerange(4, os.sysconf("SC_OPEN_MAX"))
        handle = socket.socket(fileno=3)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: _send(handle, b"stop"))
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        _exit_as(_follow(handle))
    except BaseException:
        os._exit(1)


def _follow(handle: socket.socket) -> int:
    """The mount's status, from the host; 1 if the host went first (the mount point is
    then unmounted here)."""
    from fusefs.kernelmount import unmount

    mountpoint = None
    while data := handle.recv(MAX_MESSAGE_BYTES):
        message = json.loads(data)
        if "ended" in message:
            return int(message["ended"])
        mountpoint = message.get("mounted") or mountpoint
    if mountpoint:
        print(f"bootseer: the mount server's host died; unmounting {mountpoint}",
              file=sys.stderr, flush=True)
        unmount(mountpoint)
    return 1


def _send(handle: socket.socket, message: bytes) -> None:
    with contextlib.suppress(OSError):
        handle.send(message)


def _exit_as(status: int) -> NoReturn:
    if status < 0:
        signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
    os._exit(status)
