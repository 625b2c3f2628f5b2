"""The mount server's host: many kernel-protocol mounts served by one process.

Why. A fork server (`fusefs.server`) spares each mount an interpreter start,
but every mount still had a process of its own, and each process learned
afresh which backing files it may hand the kernel: a new serving process
hashed a 1 GiB checkpoint file at its first open, so a read through a fresh
mount ran at a third of a direct read. Served by one process, mounts share
what it knows (`fusefs.backing.checked_in`: a file checked for one mount is
trusted by the next while its stat holds) and one event loop.

How. `bootseer fs server` forks the host once, after its imports, where the
node can serve the kernel protocol (Linux 6.9+ as root). For each request the
server sends the host, over a socket pair, the request (argv, cwd, env) and
three descriptors: the command's stdout and stderr, and the host's end of the
mount's handle (below). The host parses the command line as the command
would (`p2p.cli`), under the request's environment and working directory, and
asks it for its `fusefs.mount.Serving`. It answers {"ok": true} and serves the
mount in a task of its own, or {"fork": why} when the command is not one it
serves here (not a serving command, one asking for pyfuse3, a command line
the command itself will refuse): the server then forks a process for it, as
before. A serving command's own checks failing ("no such mount point") is the
mount's failure, reported on its stderr with status 2, as from a process.

One mount, one task. Its log records go to its own stderr (`_MountLogs` routes
records by the task's context; tasks and worker threads it starts inherit
it), its "mounted" line to its stdout, with "server_pid" (this process: whose
CPU the mount costs). The request's environment applies while the command
line is parsed and set up (its secret, its defaults); serving runs in the
host's.

The handle. Callers stop a mount by SIGTERM to the pid `start_detached`
returned, and wait for that pid to end; so each mount here keeps a process:
its handle (`fusefs.hostlink.run_handle`), forked by the server, which holds
one end of a socket pair and nothing else. SIGTERM or SIGINT to the handle
sends "stop", and the host stops that mount only (`fusefs.mountstop.stopped_by`:
unmount, the task ends); the host says "ended" with the mount's status when
its task ends, however it ends, and the handle exits with that status. A
handle that dies (SIGKILL) stops its mount too.

Its death. Once a new mount's INIT is answered, the host hands the server a
copy of its /dev/fuse descriptor and of its open-files journal to keep
(`fusefs.kept`); the server also keeps the mount's log and the host's end of
the handle's socket. If the host dies, the mounts stay (the server holds
their descriptors), their readers wait, and the server starts a new host and
sends it each kept mount as a resumed request: the same command line, with
the log, the handle's socket, the device and the journal. The new host builds
the same tree and serves it on that device (no "mounted" line: its caller is
gone). A mount that cannot be served again is unmounted.

SIGTERM to the host stops every mount and ends it once they are unmounted;
so does the end of its socket to the server, once its mounts are stopped.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import contextvars
import io
import json
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TextIO

from fusefs.kept import KeptDevice, OpenJournal
from fusefs.kernelmount import unmount
from fusefs.mount import LOG_FORMAT, Serving, drop_private_log
from fusefs.mountstop import mount_server
from fusefs.request import Request, ServerRefused
from p2p.errors import UserError

log = logging.getLogger(__name__)

# `python -m MODULE` is `bootseer COMMAND`.
COMMANDS = {"fusefs": "fs", "hdfs_stripe": "ckpt", "depsnap": "depsnap",
            "fusefs.image": "image"}
MAX_MESSAGE_BYTES = 1 << 20
STOPPED_BEFORE_SERVING = -signal.SIGTERM  # a mount stopped before it served: as a process


class NotHere(Exception):
    """The host does not serve this request; the server forks a process for it."""


@dataclass(eq=False)
class Hosted:
    """One mount served by the host: its descriptors, its stop, its task, its device
    (`fusefs.mountstop.MountServer`)."""

    ident: int  # the server's name for it
    command: str
    serving: Serving
    env: dict[str, str]
    level: int
    stdout: int  # -1: none (served again after its host died: its caller is gone)
    log_file: TextIO
    handle: socket.socket
    keeper: Callable[[Hosted, KeptDevice], None]
    device: KeptDevice | None = None  # kept from a host that died, until `kept`
    task: asyncio.Task[None] | None = None
    stop_requested: bool = False
    _stops: list[Callable[[], None]] = field(default_factory=list)

    @contextlib.contextmanager
    def stopping(self, stop: Callable[[], None]) -> Iterator[None]:
        """`fusefs.mountstop.MountServer`: `stop` ends this mount while it serves."""
        self._stops.append(stop)
        try:
            if self.stop_requested:
                stop()
            yield
        finally:
            self._stops.remove(stop)

    def kept(self) -> KeptDevice | None:
        device, self.device = self.device, None
        return device

    def keep(self, device: KeptDevice) -> None:
        self.keeper(self, device)

    def stop(self) -> None:
        """Stop serving: unmount if it serves, else cancel what is on its way there."""
        if self.stop_requested:
            return
        self.stop_requested = True
        if self._stops:
            for stop in list(self._stops):
                stop()
        elif self.task is not None:
            self.task.cancel()

    def ready(self, info: dict[str, Any]) -> None:
        """The mount point to the handle (which unmounts it should this process die), then
        the "mounted" line on the command's stdout (then closed): in that order, so that a
        caller that kills this process as soon as it has the line leaves no mount."""
        self._tell({"mounted": info.get("mountpoint")})
        line = json.dumps({"event": "mounted", **info, "server_pid": os.getpid()}) + "\n"
        if self.stdout >= 0:
            with contextlib.suppress(OSError):
                os.write(self.stdout, line.encode())
            self._close_stdout()

    def end(self, status: int) -> None:
        if self.device is not None:  # kept, but not served again: nothing will serve it
            unmount(str(self.device.state.get("mountpoint", "")))
            os.close(self.device.fd)
            self.device.journal.close()
            self.device = None
        self._tell({"ended": status})
        self._close_stdout()
        with contextlib.suppress(OSError):
            self.log_file.close()
        self.handle.close()

    def _tell(self, message: dict[str, Any]) -> None:
        with contextlib.suppress(OSError):
            self.handle.send(json.dumps(message).encode())

    def _close_stdout(self) -> None:
        if self.stdout >= 0:
            os.close(self.stdout)
            self.stdout = -1


_current: contextvars.ContextVar[Hosted | None] = contextvars.ContextVar(
    "hosted_mount", default=None)


class _MountLogs(logging.Handler):
    """Routes each record to the log of the mount whose task (or worker thread) made it,
    at that mount's level; records of no mount go to the host's own stderr, at its level
    (the root logger lets through what the most talkative of them asks for)."""

    def __init__(self, level: int) -> None:
        super().__init__()
        self.level_of_host = level
        self.setFormatter(logging.Formatter(LOG_FORMAT))

    def emit(self, record: logging.LogRecord) -> None:
        mount = _current.get()
        if mount is None:
            if record.levelno < self.level_of_host:
                return
            stream: TextIO = sys.stderr
        elif record.levelno >= mount.level and not mount.log_file.closed:
            stream = mount.log_file
        else:
            return
        try:
            stream.write(self.format(record) + "\n")
            stream.flush()
        except (OSError, ValueError):
            self.handleError(record)


class Host:
    """Serves the requests the server sends on `channel` (see the module docstring)."""

    def __init__(self, channel: socket.socket, level: int) -> None:
        self.channel = channel
        self.level = level
        self.mounts: set[Hosted] = set()
        self._closing = False
        self._idle: asyncio.Event | None = None

    async def run(self) -> None:
        """Until SIGTERM, or the server's end of the channel closes; then every mount is
        stopped and this returns once all have ended."""
        loop = asyncio.get_running_loop()
        self._idle = asyncio.Event()
        self.channel.setblocking(False)
        loop.add_reader(self.channel.fileno(), self._receive)
        loop.add_signal_handler(signal.SIGTERM, self.close)
        loop.add_signal_handler(signal.SIGINT, self.close)
        try:
            while not (self._closing and not self.mounts):
                self._idle.clear()
                await self._idle.wait()
        finally:
            loop.remove_reader(self.channel.fileno())
            self.channel.close()

    def close(self) -> None:
        """Stop every mount; `run` returns once they have ended."""
        self._closing = True
        for mount in list(self.mounts):
            mount.stop()
        self._wake()

    def _wake(self) -> None:
        if self._idle is not None:
            self._idle.set()

    def _receive(self) -> None:
        try:
            data, fds, _, _ = socket.recv_fds(self.channel, MAX_MESSAGE_BYTES, 4)
        except BlockingIOError:
            return
        except OSError as exc:
            log.warning("the server's channel failed: %s", exc)
            data, fds = b"", []
        if not data:  # the server is gone: no more mounts will come
            asyncio.get_running_loop().remove_reader(self.channel.fileno())
            self.close()
            return
        try:
            answer = self._take(data, fds)
        except NotHere as exc:
            for fd in fds:
                os.close(fd)
            answer = {"fork": str(exc)}
        self._tell_server({"answer": answer})

    def _tell_server(self, message: dict[str, Any], fds: tuple[int, ...] = ()) -> None:
        with contextlib.suppress(OSError):
            socket.send_fds(self.channel, [json.dumps(message).encode()], list(fds))

    def _take(self, data: bytes, fds: list[int]) -> dict[str, Any]:
        """Serve the request in `data`: {"id", "request"} with the command's stdout and
        stderr and the handle's socket, or {"id", "request", "resume": state} with the
        log, the handle's socket, the device and its journal (`fusefs.kept`)."""
        try:
            message = json.loads(data)
            request = Request.parse(json.dumps(message["request"]).encode())
            ident, resume = int(message["id"]), message.get("resume")
        except (ValueError, KeyError, TypeError, ServerRefused) as exc:
            raise NotHere(f"a malformed request for the host: {exc}") from None
        if len(fds) != (4 if resume is not None else 3):
            raise NotHere("a request for the host without its descriptors")
        if self._closing:
            raise NotHere("the host is stopping")
        command = COMMANDS.get(request.module)
        if command is None:
            raise NotHere(f"{request.module} has no serving command")
        args = _parse(command, request)
        failure = None
        try:
            with _as_requested(request):
                serving: Serving = args.serving(args)
            if not serving.kernel:
                raise NotHere("the command asks for pyfuse3: a process of its own")
        except UserError as exc:  # the mount's own failure, as its process would say it
            serving, failure = _NOTHING, f"bootseer {command}: {exc}"
        # From here on the descriptors are the mount's.
        device = None
        if resume is not None:
            stdout, (stderr, handle, fd, journal) = -1, fds
            device = KeptDevice(fd, OpenJournal(journal), dict(resume))
        else:
            stdout, stderr, handle = fds
        hosted = Hosted(ident, command, serving, request.env,
                        logging.getLevelName(getattr(args, "log_level", "WARNING")), stdout,
                        open(stderr, "a", encoding="utf-8", errors="replace"),  # noqa: SIM115
                        socket.socket(fileno=handle), self._keep, device)
        if failure is not None:
            print(failure, file=hosted.log_file, flush=True)
            hosted.end(2)
        else:
            self._start(hosted)
        return {"ok": True}

    def _keep(self, hosted: Hosted, device: KeptDevice) -> None:
        """Hand the server the mount's device and journal to keep (`fusefs.kept`)."""
        self._tell_server({"keep": hosted.ident, "state": device.state},
                          (device.fd, device.journal.fd))

    def _start(self, hosted: Hosted) -> None:
        loop = asyncio.get_running_loop()
        context = contextvars.copy_context()
        context.run(_current.set, hosted)
        context.run(mount_server.set, hosted)
        self.mounts.add(hosted)
        self._set_level()
        hosted.task = loop.create_task(self._serve(hosted), context=context)
        hosted.handle.setblocking(False)
        loop.add_reader(hosted.handle.fileno(), self._handle_spoke, hosted)

    def _handle_spoke(self, hosted: Hosted) -> None:
        """"stop", or the handle's end (it died): either way this mount stops."""
        with contextlib.suppress(BlockingIOError):
            try:
                data = hosted.handle.recv(64)
            except OSError:
                data = b""
            if not data:
                asyncio.get_running_loop().remove_reader(hosted.handle.fileno())
            hosted.stop()

    async def _serve(self, hosted: Hosted) -> None:
        status = 1
        if hosted.device is not None:
            log.warning("serving %s again, on the device its dead host served (pid %d now)",
                        hosted.device.state.get("mountpoint"), os.getpid())
        try:
            result = await hosted.serving.serve(hosted.ready)
            hosted.serving.finish(result)
            status = 0
        except UserError as exc:
            print(f"bootseer {hosted.command}: {exc}", file=hosted.log_file, flush=True)
            status = 2
        except asyncio.CancelledError:
            status = STOPPED_BEFORE_SERVING
        except Exception:  # a bug in one mount: its traceback in its log, the rest serve on
            log.exception("the mount ended with an error")
        finally:
            self._tell_server({"gone": hosted.ident})
            if status == 0:
                drop_private_log(hosted.env)
            with contextlib.suppress(ValueError, OSError):
                asyncio.get_running_loop().remove_reader(hosted.handle.fileno())
            hosted.end(status)
            self.mounts.discard(hosted)
            self._set_level()
            self._wake()

    def _set_level(self) -> None:
        """The root logger lets through what the most talkative mount (or the host) logs."""
        levels = [self.level, *(m.level for m in self.mounts)]
        logging.getLogger().setLevel(min(levels))


async def _nothing(on_ready: Any) -> None:
    """The serving of a mount whose command refused its command line: never run."""


_NOTHING = Serving(_nothing, kernel=True)


def _parse(command: str, request: Any) -> argparse.Namespace:
    """The request's command line, parsed as `bootseer COMMAND ...` would; NotHere if it
    names no serving command or does not parse (the forked process then says why)."""
    from p2p.cli import build_parser

    words = [command, *request.argv[3:]]
    with _as_requested(request), contextlib.redirect_stderr(io.StringIO()), \
            contextlib.redirect_stdout(io.StringIO()):
        try:
            args = build_parser(command).parse_args(words)
        except SystemExit:
            raise NotHere("the command line does not parse") from None
    if getattr(args, "serving", None) is None:
        raise NotHere(f"{' '.join(words[:2])} is not a serving command")
    return args


@contextlib.contextmanager
def _as_requested(request: Any) -> Iterator[None]:
    """The request's environment and working directory, for the time of a synchronous
    call on the event loop's thread."""
    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    os.environ.clear()
    os.environ.update(request.env)
    try:
        os.chdir(request.cwd)
    except OSError as exc:
        os.environ.clear()
        os.environ.update(saved_env)
        raise NotHere(f"cannot enter {request.cwd}: {exc.strerror}") from None
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        os.chdir(saved_cwd)


def run_host(channel: socket.socket, level: int) -> int:
    """The host's life, in the process the server forked for it: its exit status."""
    root = logging.getLogger()
    for handler in root.handlers[:]:
        root.removeHandler(handler)
    root.addHandler(_MountLogs(level))
    root.setLevel(level)
    asyncio.run(Host(channel, level).run())
    return 0
