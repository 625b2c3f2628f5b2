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
`SERVING_MODULES`; it runs on the server's interpreter. The server forks; the
child starts a session of its own, takes the descriptors as stdout and
stderr (stdin is /dev/null), the request's working directory and
environment, runs MODULE as `__main__` with the rest of `argv`, as
`python -m` would, and ends with `os._exit`. The server answers
`{"pid": N}` (or `{"error": why}`) and forgets the child: SIGCHLD is ignored,
so the kernel reaps it. The process is then what a directly started one is:
it prints its "mounted" line on the stdout it was given, stops on SIGTERM,
and outlives the server.

The parent must stay fit to fork: one thread, no event loop, nothing but
blocking socket calls.

Clients. `fusefs.mount.start_detached` (every `mount` command) asks the
server named by `BOOTSEER_MOUNT_SERVER` when it is set (`fork_serving`);
when that socket does not answer, it says so and starts the process itself.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import logging
import os
import runpy
import signal
import socket
import stat
import struct
import sys
import tempfile
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from p2p.errors import UserError

log = logging.getLogger(__name__)

SERVER_ENV = "BOOTSEER_MOUNT_SERVER"
SERVING_MODULES = ("depsnap", "fusefs", "fusefs.image", "hdfs_stripe")
# What the serving commands import; loaded once, by the server. A module that
# fails to import is left to the children (their error says what is missing).
PRELOAD = ("aiohttp", "pyfuse3", "pyfuse3.asyncio", "zstandard", "blake3",
           "p2p.agentclient", "p2p.tracker_client",
           "fusefs.cli", "fusefs.fs", "fusefs.mount", "fusefs.record", "fusefs.source",
           "depsnap.cli", "depsnap.hot", "depsnap.mount", "depsnap.publish", "depsnap.source",
           "fusefs.image.cli", "fusefs.image.mount", "hdfs_stripe.cli", "hdfs_stripe.mount")
MAX_REQUEST_BYTES = 1 << 20
REQUEST_TIMEOUT_S = 5.0
_PEERCRED = struct.Struct("3i")  # pid, uid, gid


class ServerUnavailable(Exception):
    """Nothing answers at the server's socket (the caller may start the process itself)."""


class ServerRefused(Exception):
    """The server answered with an error; the message is its reason."""


class ServerError(UserError):
    """The server cannot listen where it was asked to; the message says why."""


@dataclass(frozen=True, slots=True)
class Request:
    argv: list[str]
    cwd: str
    env: dict[str, str]

    @property
    def module(self) -> str:
        return self.argv[2]

    @classmethod
    def parse(cls, data: bytes) -> Request:
        """The request in `data`; ServerRefused saying what is wrong with it."""
        try:
            raw = json.loads(data)
        except (ValueError, UnicodeDecodeError):
            raise ServerRefused("the request is not JSON") from None
        if not isinstance(raw, dict):
            raise ServerRefused("the request is not a JSON object")
        argv, cwd, env = raw.get("argv"), raw.get("cwd"), raw.get("env")
        if not (isinstance(argv, list) and all(isinstance(a, str) for a in argv)):
            raise ServerRefused("argv must be a list of strings")
        if not isinstance(cwd, str) or not os.path.isabs(cwd):
            raise ServerRefused("cwd must be an absolute path")
        if not (isinstance(env, dict)
                and all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())):
            raise ServerRefused("env must map strings to strings")
        if len(argv) < 3 or argv[1] != "-m" or argv[2] not in SERVING_MODULES:
            raise ServerRefused(f"not a serving command: {' '.join(argv[:3])!r} (the server "
                                f"runs python -m {'|'.join(SERVING_MODULES)} only)")
        return cls(argv, cwd, env)

    def to_bytes(self) -> bytes:
        return json.dumps({"argv": self.argv, "cwd": self.cwd, "env": self.env}).encode()


# ---- the client --------------------------------------------------------------------------


def fork_serving(server: str, argv: list[str], stdout: int, stderr: int) -> int:
    """Have the mount server at `server` run `argv` with these descriptors as stdout and
    stderr; the new process's pid. ServerUnavailable if nothing answers there,
    ServerRefused if the server will not run it."""
    request = Request(argv, os.getcwd(), dict(os.environ)).to_bytes()
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as sock:
        sock.settimeout(REQUEST_TIMEOUT_S)
        try:
            sock.connect(server)
        except OSError as exc:
            raise ServerUnavailable(f"no mount server answers at {server} "
                                    f"({exc.strerror or exc})") from None
        try:
            socket.send_fds(sock, [request], [stdout, stderr])
            reply = sock.recv(MAX_REQUEST_BYTES)
        except OSError as exc:
            raise ServerUnavailable(f"the mount server at {server} did not answer "
                                    f"({exc.strerror or exc})") from None
    try:
        answer: dict[str, Any] = json.loads(reply)
    except ValueError:
        raise ServerUnavailable(f"the mount server at {server} gave no answer") from None
    if isinstance(answer.get("pid"), int):
        return int(answer["pid"])
    raise ServerRefused(f"the mount server at {server} refused: {answer.get('error')}")


# ---- the server --------------------------------------------------------------------------


def serve_forever(path: Path, on_ready: Callable[[dict[str, Any]], None] | None = None
                  ) -> None:
    """Preload, listen at `path` and fork a serving process per request until SIGTERM or
    SIGINT; the socket is removed at the end. ServerError if it cannot listen there
    (checked first: a request that comes while the server preloads waits for it)."""
    listener = _listen(path)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the children
    signal.signal(signal.SIGTERM, _exit_on_signal)
    try:
        for name in PRELOAD:
            try:
                importlib.import_module(name)
            except ImportError as exc:
                log.warning("not preloading %s (%s): its mounts will load it themselves",
                            name, exc)
        gc.freeze()  # the preloaded heap: children neither scan it nor copy it by scanning
        if on_ready is not None:
            on_ready({"event": "serving", "socket": str(path), "pid": os.getpid()})
        while True:
            conn, _ = listener.accept()
            with conn:
                conn.settimeout(REQUEST_TIMEOUT_S)
                answer = _answer(conn, listener)
                with contextlib.suppress(OSError):
                    conn.send(json.dumps(answer).encode())
    finally:
        listener.close()
        with contextlib.suppress(OSError):
            os.unlink(path)


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


def _answer(conn: socket.socket, listener: socket.socket) -> dict[str, Any]:
    fds: list[int] = []
    try:
        data, fds, _, _ = socket.recv_fds(conn, MAX_REQUEST_BYTES, 2)
        _, uid, _ = _PEERCRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                     _PEERCRED.size))
        if uid != os.getuid():
            raise ServerRefused(f"user {uid} may not use the mount server of user "
                                f"{os.getuid()}")
        if len(fds) != 2:
            raise ServerRefused("a request carries two descriptors: stdout and stderr")
        request = Request.parse(data)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(request, fds, (conn, listener))
        log.info("pid %d serves: %s", pid, " ".join(request.argv[2:4]))
        return {"pid": pid}
    except ServerRefused as exc:
        log.warning("refused a request: %s", exc)
        return {"error": str(exc)}
    except OSError as exc:
        log.warning("a request failed: %s", exc)
        return {"error": f"the request failed: {exc.strerror or exc}"}
    finally:
        for fd in fds:
            os.close(fd)


def _child(request: Request, fds: list[int], sockets: tuple[socket.socket, ...]) -> NoReturn:
    """Become `python -m MODULE ...` (see the module docstring); never returns."""
    code = 1
    try:
        for sock in sockets:
            sock.close()
        os.setsid()
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
