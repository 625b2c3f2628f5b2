"""The mount server's side of its host (`fusefs.mounthost`), and the mounts' handles.

Runs in the server (`fusefs.server`), which must stay fit to fork: blocking
socket calls only, one thread, no event loop. `HostLink` forks the host,
hands it each request with the request's stdout and stderr and one end of a
new socket pair, and, when the host takes the request, forks the mount's
handle with the other end (`run_handle`). It keeps, per hosted mount, what a
new host needs to serve it again (`_Kept`: the request, the log, the host's
end of the handle's socket, and the device the host hands over once INIT is
answered, `fusefs.kept`). The end of the host's channel means the host died:
`replace` starts another and sends it every kept mount to serve again. A
request the host does not answer is sent again to the new one, once.

The handle (see `fusefs.mounthost`) is what a caller knows of a hosted mount:
its pid. It holds its socket and the mount's log as stderr, nothing else of
the server's, and blocks on the socket: SIGTERM or SIGINT make it send
"stop"; {"mounted": path} tells it what to unmount should the host die;
{"ended": status} ends it with that status (a negative one as that signal, as
a process killed by it). A handle given a client's pidfd (`fusefs.request`,
`end_with_client`) watches it too, and sends "stop" once the client has
exited. The server keeps a copy of the host's end of the
socket, so the host's death alone does not end it; the end of the socket with
no "ended" means the server and its host are both gone: it unmounts the mount
point, lazily, and exits 1.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import select
import signal
import socket
import sys
from dataclasses import dataclass
from typing import Any, NoReturn

from fusefs.kernelmount import unmount
from p2p.process import end_by_pidfd

log = logging.getLogger(__name__)

ANSWER_TIMEOUT_S = 10.0  # the host answers once the command line is set up
STOP_TIMEOUT_S = 30.0  # SIGTERM to the host, then SIGKILL: its mounts unmount meanwhile
MAX_MESSAGE_BYTES = 1 << 16


@dataclass
class _Kept:
    """What the server keeps of a hosted mount to have it served again: the request, the
    mount's log, the host's end of the handle's socket, and once INIT is answered, the
    device, its journal and what INIT settled (`fusefs.kept`)."""

    request: dict[str, Any]
    log_fd: int
    handle_fd: int
    device: tuple[int, int] | None = None
    state: dict[str, Any] | None = None

    def close(self) -> None:
        for fd in (self.log_fd, self.handle_fd, *(self.device or ())):
            os.close(fd)


class HostLink:
    """The server's link to its host: start, forward requests, keep the hosted mounts'
    devices, serve them again from a new host if the host dies, stop."""

    def __init__(self, listener: socket.socket) -> None:
        self.listener = listener  # not the host's or a handle's business: closed in them
        self.pid: int | None = None
        self.channel: socket.socket | None = None
        self.kept: dict[int, _Kept] = {}
        self._next_id = 0

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
        """What a forked child must close (and the kept descriptors: `kept_fds`)."""
        return (self.channel,) if self.channel is not None else ()

    def kept_fds(self) -> list[int]:
        return [fd for k in self.kept.values()
                for fd in (k.log_fd, k.handle_fd, *(k.device or ()))]

    def take(self, request: bytes, fds: list[int], conn: socket.socket,
             client: int = -1) -> int | None:
        """Hand the request (its stdout and stderr: `fds`) to the host; the pid of the
        mount's handle if the host serves it, None if it leaves it to a process of its
        own. `client`: a pidfd the handle watches (the mount stops once it is readable),
        or -1."""
        mine, its = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._next_id += 1
        ident = self._next_id
        kept = _Kept(json.loads(request), os.dup(fds[1]), os.dup(its.fileno()))
        try:
            answer = self._ask({"id": ident, "request": kept.request}, [*fds, its.fileno()])
        finally:
            its.close()
        if not answer.get("ok"):
            mine.close()
            kept.close()
            log.info("the host leaves a mount to a process of its own: %s",
                     answer.get("fork"))
            return None
        self.kept[ident] = kept
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            for sock in (conn, self.listener, *self.sockets()):
                sock.close()
            run_handle(mine, fds[1], client)
        mine.close()
        return pid

    def _ask(self, message: dict[str, Any], fds: list[int]) -> dict[str, Any]:
        """Send a request and wait for its answer; a host that does not answer is
        replaced, and the request sent again, once."""
        answer = self._ask_once(message, fds)
        if not answer:
            self.replace()
            answer = self._ask_once(message, fds)
        return answer or {"fork": "the host does not answer"}

    def readable(self) -> None:
        """The host has said something (the server's loop saw its channel readable)."""
        try:
            if self._receive() is None:
                self.replace()
        except (OSError, ValueError) as exc:
            log.warning("the host (pid %s) failed: %s", self.pid, exc)
            self.replace()

    def _receive(self) -> dict[str, Any] | None:
        """One message from the host, "keep" and "gone" taken care of; None at its end."""
        assert self.channel is not None
        data, fds, _, _ = socket.recv_fds(self.channel, MAX_MESSAGE_BYTES, 2)
        if not data:
            return None
        message: dict[str, Any] = json.loads(data)
        kept = self.kept.get(message.get("keep", message.get("gone", -1)))
        if "keep" in message and kept is not None and len(fds) == 2:
            kept.device, kept.state = (fds[0], fds[1]), dict(message["state"])
            fds = []
        elif "gone" in message and kept is not None:
            self.kept.pop(message["gone"]).close()
        for fd in fds:
            os.close(fd)
        return message

    def replace(self) -> None:
        """The host died: start another, and have it serve again every mount whose device
        is kept (readers of those mounts waited meanwhile); the others are gone."""
        log.warning("the host (pid %s) is gone; starting another", self.pid)
        self.stop(keep=True)
        self.start()
        for ident, kept in list(self.kept.items()):
            answer: dict[str, Any] = {}
            if kept.device is not None:
                message = {"id": ident, "request": kept.request, "resume": kept.state}
                answer = self._ask_once(message, [kept.log_fd, kept.handle_fd, *kept.device])
            if not answer.get("ok"):
                log.warning("mount %d is not served again: %s", ident,
                            answer.get("fork", "its host died before it served"))
                if kept.state is not None:
                    unmount(str(kept.state.get("mountpoint", "")))
                self.kept.pop(ident).close()

    def _ask_once(self, message: dict[str, Any], fds: list[int]) -> dict[str, Any]:
        """The host's answer to the request, its other messages taken on the way ({}: the
        host did not answer)."""
        try:
            assert self.channel is not None
            socket.send_fds(self.channel, [json.dumps(message).encode()], fds)
            while (got := self._receive()) is not None:
                if "answer" in got:
                    return dict(got["answer"])
        except (OSError, ValueError) as exc:
            log.warning("the host (pid %s) did not answer: %s", self.pid, exc)
        return {}

    def stop(self, keep: bool = False) -> None:
        """SIGTERM to the host (it unmounts its mounts), a bounded wait, SIGKILL; then,
        unless `keep`, the kept descriptors are closed."""
        if self.channel is not None:
            self.channel.close()
            self.channel = None
        if self.pid is not None:
            _end(self.pid)
            self.pid = None
        if not keep:
            for kept in self.kept.values():
                kept.close()
            self.kept.clear()


def _end(pid: int) -> None:
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        if not end_by_pidfd(pidfd, STOP_TIMEOUT_S):
            log.warning("the host (pid %d) did not end in %g s; killed it", pid,
                        STOP_TIMEOUT_S)
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


def run_handle(sock: socket.socket, log_fd: int, client: int = -1) -> NoReturn:
    """A hosted mount's handle (see the module docstring); never returns. `client`: a
    pidfd of the process the mount ends with (`fusefs.request`), or -1."""
    try:
        os.setsid()
        fd = sock.detach()
        devnull = os.open(os.devnull, os.O_RDWR)
        moves = [(devnull, 0), (devnull, 1), (log_fd, 2), (fd, 3)]
        if client >= 0:
            moves.append((fcntl.fcntl(client, fcntl.F_DUPFD, 5), 4))  # above what moves
        for source, target in moves:
            if source != target:
                os.dup2(source, target)
        os.closerange(5 if client >= 0 else 4, os.sysconf("SC_OPEN_MAX"))
        handle = socket.socket(fileno=3)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: _send(handle, b"stop"))
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        _exit_as(_follow(handle, 4 if client >= 0 else -1))
    except BaseException:
        os._exit(1)


def _follow(handle: socket.socket, client: int = -1) -> int:
    """The mount's status, from the host; 1 if the server and its host went first (the
    mount point is then unmounted here). Once `client` (a pidfd) is readable, the
    process the mount ends with has exited: "stop", once."""
    mountpoint = None
    while True:
        if client >= 0:
            readable, _, _ = select.select([handle.fileno(), client], [], [])
            if client in readable:
                _send(handle, b"stop")
                os.close(client)
                client = -1
            if handle.fileno() not in readable:
                continue
        if not (data := handle.recv(MAX_MESSAGE_BYTES)):
            break
        message = json.loads(data)
        if "ended" in message:
            return int(message["ended"])
        mountpoint = message.get("mounted") or mountpoint
    if mountpoint:
        print(f"bootseer: the mount server is gone; unmounting {mountpoint}",
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
