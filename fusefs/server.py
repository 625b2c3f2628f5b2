"""The mount server: serving processes forked from one that has already started.

Why. Every `mount` command (`depsnap mount`, `image mount`, `ckpt mount`)
starts a serving process, `python -m MODULE serve ...`. Before that process
does anything for its mount, its interpreter starts and imports aiohttp,
pyfuse3 (and trio), zstandard and our own modules: 0.35-0.4 s of CPU here, a
fifth of a lazy mount's time until `import pandas` works from it. A node
runs `bootseer fs server` once, beside its agent; the server imports all of
that once and forks a serving process per mount.

How. The server listens on a unix socket (SOCK_SEQPACKET, mode 0600, and a
peer must be the server's own user: SO_PEERCRED). A request is one message,
JSON `{"argv", "cwd", "env"}`, with two file descriptors attached
(SCM_RIGHTS): the serving process's stdout and stderr. `argv` must be a
serving command, `[python, "-m", MODULE, ...]` with MODULE one of
`SERVING_MODULES` (`fusefs.request`); it runs on the server's interpreter. The server forks; the
child starts a session of its own, takes the descriptors as stdout and
stderr (stdin is /dev/null), the request's working directory and
environment, runs MODULE as `__main__` with the rest of `argv`, as
`python -m` would, and ends with `os._exit`. The server answers
`{"pid": N}` (or `{"error": why}`) and forgets the child: SIGCHLD is ignored,
so the kernel reaps it. The process is then what a directly started one is:
it prints its "mounted" line on the stdout it was given, stops on SIGTERM,
and outlives the server.

Many mounts in one process. Where the node can serve the kernel protocol
(Linux 6.9+ as root), the server also forks, once, a host for mounts
(`fusefs.mounthost`): a request it takes (a serving command that asks for the
kernel-protocol server: passthrough or no-open) is served there, in a task,
not by a process of its own, and its mounts share what the host has checked
(a checkpoint's backing file is hashed once, not once per mount). The server
answers such a request with the pid of the mount's handle, a process forked
from the server that stands for the mount: SIGTERM to it stops that mount
only, and it exits with the mount's status once unmounted. Requests the host
does not take (pyfuse3 mounts) are forked as above. SIGTERM to the server
stops the host, which unmounts every mount it serves; forked mounts outlive
the server. The server keeps each hosted mount's /dev/fuse descriptor
(`fusefs.hostlink`, `fusefs.kept`): if the host dies, the server starts
another, which serves the same mounts on the same descriptors; their readers
wait meanwhile, and get their bytes.

The parent must stay fit to fork: one thread, no event loop, nothing but
blocking socket calls.

Clients. `fusefs.mount.start_detached` (every `mount` command) asks the
server named by `BOOTSEER_MOUNT_SERVER` when it is set
(`fusefs.request.fork_serving`); when that socket does not answer, it says
so and starts the process itself. `bootseer image run` and `bootseer launch`
(`fusefs.image.starter`, `fusefs.image.served`) ask too, for each of their
mounts, and each request ends with its client (`fusefs.request`): the mount's
handle, or a forked serving process, stops the mount once the client has exited.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import logging
import os
import runpy
import select
import signal
import socket
import stat
import struct
import sys
import tempfile
import threading
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from fusefs.request import (
    MAX_REQUEST_BYTES,
    REQUEST_TIMEOUT_S,
    Request,
    ServerRefused,
)
from p2p.errors import UserError

log = logging.getLogger(__name__)

# What the serving commands import; loaded once, by the server. A module that
# fails to import is left to the children (their error says what is missing).
PRELOAD = ("aiohttp", "pyfuse3", "pyfuse3.asyncio", "zstandard", "blake3",
           "p2p.agentclient", "p2p.tracker_client",
           "fusefs.cli", "fusefs.fs", "fusefs.mount", "fusefs.record", "fusefs.source",
           "depsnap.cli", "depsnap.hot", "depsnap.mount", "depsnap.publish", "depsnap.source",
           "fusefs.image.cli", "fusefs.image.mount", "hdfs_stripe.cli", "hdfs_stripe.mount",
           "fusefs.kernelserve", "fusefs.backing", "fusefs.mounthost", "p2p.cli")
_PEERCRED = struct.Struct("3i")  # pid, uid, gid


class ServerError(UserError):
    """The server cannot listen where it was asked to; the message says why."""


# ---- the server --------------------------------------------------------------------------


def serve_forever(path: Path, on_ready: Callable[[dict[str, Any]], None] | None = None
                  ) -> None:
    """Preload, listen at `path` and fork a serving process per request until SIGTERM or
    SIGINT; the socket is removed at the end. ServerError if it cannot listen there
    (checked first: a request that comes while the server preloads waits for it)."""
    from fusefs.hostlink import HostLink
    from fusefs.kernelmount import kernel_supports_passthrough

    listener = _listen(path)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the children
    signal.signal(signal.SIGTERM, _exit_on_signal)
    host: HostLink | None = None
    try:
        for name in PRELOAD:
            try:
                importlib.import_module(name)
            except ImportError as exc:
                log.warning("not preloading %s (%s): its mounts will load it themselves",
                            name, exc)
        gc.freeze()  # the preloaded heap: children neither scan it nor copy it by scanning
        why = kernel_supports_passthrough()
        if why is None:
            host = HostLink(listener)
            host.start()
        else:
            log.info("every mount gets a process of its own: %s", why)
        if on_ready is not None:
            on_ready({"event": "serving", "socket": str(path), "pid": os.getpid(),
                      "host_pid": host.pid if host is not None else None})
        while True:
            watched = [listener, *(host.sockets() if host is not None else ())]
            readable, _, _ = select.select(watched, [], [])
            if host is not None and host.channel in readable:
                host.readable()  # a device to keep, a mount gone, or the host's death
            if listener not in readable:
                continue
            conn, _ = listener.accept()
            with conn:
                conn.settimeout(REQUEST_TIMEOUT_S)
                answer = _answer(conn, listener, host)
                with contextlib.suppress(OSError):
                    conn.send(json.dumps(answer).encode())
    finally:
        listener.close()
        with contextlib.suppress(OSError):
            os.unlink(path)
        if host is not None:
            host.stop()


def _end_with(client: int) -> None:
    """In a forked serving process: once the client's pidfd is readable (it has exited),
    SIGTERM to this process (its serving command unmounts on it)."""
    select.select([client], [], [])
    os.kill(os.getpid(), signal.SIGTERM)


def _exit_on_signal(signum: int, frame: Any) -> None:
    raise SystemExit(0)


def _listen(path: Path) -> socket.socket:
    """A listening socket at `path` only this user can connect to. A socket file left by
    a server that died is replaced; one a live server answers on is not."""
    if path.is_socket():
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as probe:
                probe.connect(str(path))
            raise ServerError(f"a mount server already answers at {path}")
        except ConnectionRefusedError:
            path.unlink()
    elif path.exists():
        raise ServerError(f"{path} exists and is not a socket; remove it or choose "
                         "another --socket")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    old = os.umask(0o177)
    try:
        listener.bind(str(path))
    except OSError as exc:
        listener.close()
        raise ServerError(f"cannot listen at {path}: {exc.strerror}") from None
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    listener.listen(64)
    return listener


def _answer(conn: socket.socket, listener: socket.socket, host: Any) -> dict[str, Any]:
    fds: list[int] = []
    client = -1  # a pidfd of the client, for a request that ends with it
    try:
        data, fds, _, _ = socket.recv_fds(conn, MAX_REQUEST_BYTES, 2)
        peer, uid, _ = _PEERCRED.unpack(conn.getsockopt(socket.SOL_SOCKET,
                                                        socket.SO_PEERCRED, _PEERCRED.size))
        if uid != os.getuid():
            raise ServerRefused(f"user {uid} may not use the mount server of user "
                                f"{os.getuid()}")
        if len(fds) != 2:
            raise ServerRefused("a request carries two descriptors: stdout and stderr")
        request = Request.parse(data)
        if request.end_with_client:  # it waits for our answer: alive, so the pidfd is its
            try:
                client = os.pidfd_open(peer)
            except ProcessLookupError:
                raise ServerRefused("the client is gone") from None
        handle = host.take(data, fds, conn, client) if host is not None else None
        if handle is not None:
            log.info("the host serves (handle %d): %s", handle, " ".join(request.argv[2:4]))
            return {"pid": handle}
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(request, fds, (conn, listener, *(host.sockets() if host else ())),
                   host.kept_fds() if host else [], client)
        log.info("pid %d serves: %s", pid, " ".join(request.argv[2:4]))
        return {"pid": pid}
    except ServerRefused as exc:
        log.warning("refused a request: %s", exc)
        return {"error": str(exc)}
    except OSError as exc:
        log.warning("a request failed: %s", exc)
        return {"error": f"the request failed: {exc.strerror or exc}"}
    finally:
        for fd in (*fds, client):
            if fd >= 0:
                os.close(fd)


def _child(request: Request, fds: list[int], sockets: tuple[socket.socket, ...],
           kept: list[int], client: int) -> NoReturn:
    """Become `python -m MODULE ...` (see the module docstring); never returns. `sockets`
    and `kept` (the hosted mounts' descriptors) are the server's, closed here. `client`
    (a pidfd, or -1): SIGTERM to this process, which stops its mount, once that ends."""
    code = 1
    try:
        for sock in sockets:
            sock.close()
        for fd in kept:
            os.close(fd)
        os.setsid()
        if client >= 0:
            threading.Thread(target=_end_with, args=(client,), daemon=True).start()
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd, target in ((devnull, 0), (fds[0], 1), (fds[1], 2)):
            os.dup2(fd, target)
        for fd in (devnull, *fds):
            if fd > 2:
                os.close(fd)
        os.chdir(request.cwd)
        os.environ.clear()
        os.environ.update(request.env)
        tempfile.tempdir = None  # found again, from the request's environment
        for handler in logging.root.handlers[:]:  # the command sets up its own
            logging.root.removeHandler(handler)
        logging.root.setLevel(logging.WARNING)
        sys.argv = [request.argv[0], *request.argv[3:]]
        runpy.run_module(request.module, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)
