"""Mount lifecycle: serve a tree in this process, or run a mount in a child process.

`serve` mounts, raises the kernel's read size, serves until SIGTERM or
SIGINT, and unmounts cleanly. It must run in a process of its own: a
process that reads a pyfuse3 mount it serves deadlocks (its one event loop
is busy waiting for the kernel, which waits for that loop). For the same
reason the serving process never touches its own mount point once mounted:
the path is resolved before the mount, and the mount's device is found in
/proc/self/mountinfo, not by stat().

Read size. A FUSE mount's BDI starts at a 128 KiB read-ahead, so the kernel
sends 128 KiB reads; raising `/sys/class/bdi/<major:minor>/read_ahead_kb`
to 1024 or more makes it send 1 MiB reads (libfuse3's max_pages), about
twice the throughput here. pyfuse3 cannot pass `max_read` (libfuse aborts the
mount), and there is nothing else to set.

`Mount` runs `python -m fusefs mount ...` as a child, waits for its one JSON
"mounted" line, and stops it with SIGTERM; if the child dies without
unmounting, `fusermount3 -u` (lazy as a last resort) clears the mount point.

Serving commands. `fs mount`, `ckpt serve`, `depsnap serve` and `image serve`
each turn their command line into a `Serving` (`args.serving(args)`): the
coroutine that serves, and whether it asks for the kernel-protocol server.
Run by `run_serving`, it is a process of its own, stopped by SIGTERM or SIGINT.
Run by a mount server (`fusefs.mounthost`), it is one task among the server's
mounts: `fusefs.mountstop.mount_server` is set in its context, and
`stopped_by` then hands the mount's stop to the server instead of taking the
process's signals; `serve`
never falls back to pyfuse3 there (one pyfuse3 mount per process): without
passthrough, the kernel-protocol server answers every read itself.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import json
import logging
import os
import select
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fusefs.mountinfo import is_mounted, set_read_ahead
from fusefs.mountstop import mount_server, stopped_by
from p2p.errors import UserError

log = logging.getLogger(__name__)

READ_AHEAD_KB = 4096
MOUNT_OPTIONS = ("ro", "default_permissions", "fsname=bootseer", "subtype=bootseer")
READY_TIMEOUT_S = 30.0
FUSE_DEVICE = "/dev/fuse"
FUSERMOUNT = "fusermount3"


class MountError(UserError):
    """The mount cannot be made or served; the message says why and what to do."""


OnReady = Callable[[dict[str, Any]], None]
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


@dataclass(frozen=True)
class Serving:
    """A serving command, its command line checked (see the module docstring).
    `serve(on_ready)` mounts, calls `on_ready(info)` once the mount works, serves until
    stopped or unmounted, and returns what `finish` reports at the end (logged); its
    expected failures are UserErrors. `kernel`: the command asks for the kernel-protocol
    server (passthrough or no-open), so a mount server may serve it in its own process;
    pyfuse3 mounts get a process each."""

    serve: Callable[[OnReady], Coroutine[Any, Any, Any]]
    kernel: bool
    finish: Callable[[Any], None] = lambda result: None


def run_serving(args: argparse.Namespace) -> int:
    """A serving command as a process of its own: log to stderr at --log-level, serve
    (`args.serving`) until SIGTERM, SIGINT or unmount, print the "mounted" line on
    stdout once it serves."""
    logging.basicConfig(level=args.log_level, stream=sys.stderr, format=LOG_FORMAT)
    serving: Serving = args.serving(args)
    serving.finish(asyncio.run(serving.serve(ready_line)))
    return 0


def check_fuse() -> None:
    """MountError naming the Debian package if FUSE cannot work on this node."""
    if not os.path.exists(FUSE_DEVICE):
        raise MountError(f"{FUSE_DEVICE} is missing: install the Debian package fuse3 and "
                         "load the fuse module (modprobe fuse)")
    if shutil.which(FUSERMOUNT) is None:
        raise MountError(f"{FUSERMOUNT} is not on PATH: install the Debian package fuse3")


# ---- serving, in this process -----------------------------------------------------------


async def serve(tree: Any, source: Any, mountpoint: Path, read_ahead_kb: int = READ_AHEAD_KB,
                allow_other: bool = False,
                on_ready: Callable[[dict[str, Any]], None] | None = None,
                whole: Any = None, kernel: bool = False) -> None:
    """Mount `tree` at `mountpoint`, serve until SIGTERM/SIGINT, then unmount and close
    `source`. `on_ready` gets {"mountpoint", "read_ahead_kb", "server", "passthrough"}
    once the mount works.

    With `whole` (a `fusefs.backing.WholeFiles` of the source's store, or any
    `fusefs.kernelfs.Backing`) files with a verified backing file are read by FUSE
    passthrough (`fusefs.kernelfs`), where the kernel and our privilege allow it;
    elsewhere, and without `whole`, the pyfuse3 shell serves every read. With `kernel`
    and no `whole`, the kernel-protocol server serves where it can, with no-open
    (`fusefs.kernelserve.serve_kernel`): many small files opened once each cost two round
    trips fewer per file than through pyfuse3."""
    keep_reply_buffers_on_the_heap()
    path = os.path.realpath(mountpoint)  # before the mount: never stat our own mount
    in_server = mount_server.get() is not None
    if whole is not None or kernel or in_server:
        from fusefs.backing import WholeBacking, WholeFiles
        from fusefs.kernelmount import PassthroughUnavailable, kernel_supports_passthrough
        from fusefs.kernelserve import serve_kernel

        why = kernel_supports_passthrough()
        backing = WholeBacking(whole) if isinstance(whole, WholeFiles) else whole
        # In a mount server, a mount refused passthrough is served by the handler of the
        # same server: pyfuse3 would need a process of its own.
        for offered in (backing, None) if in_server and backing is not None else (backing,):
            try:
                if why is None:
                    await serve_kernel(tree, source, offered, path, read_ahead_kb,
                                       allow_other, on_ready)
                    drop_private_log()  # a clean unmount: the log has nothing to tell
                    return
            except PassthroughUnavailable as exc:
                why = str(exc)
        if in_server:
            await source.close()
            raise MountError(f"the mount server cannot serve {path}: {why}")
        log.info("no FUSE passthrough at %s (%s): every read goes through the handler",
                 path, why)
    await _serve_pyfuse3(tree, source, path, read_ahead_kb, allow_other, on_ready)
    drop_private_log()


async def _serve_pyfuse3(tree: Any, source: Any, path: str, read_ahead_kb: int,
                         allow_other: bool,
                         on_ready: Callable[[dict[str, Any]], None] | None) -> None:
    import pyfuse3

    from fusefs.fs import ContentFS

    enable_asyncio()
    options = set(MOUNT_OPTIONS) | ({"allow_other"} if allow_other else set())
    loop = asyncio.get_running_loop()
    initialised = asyncio.Event()
    # The kernel sets the BDI's read-ahead from our INIT reply, so ours comes after it:
    # `init` runs while the reply is being made; call_soon runs once it is written.
    ops = ContentFS(tree, source, on_init=lambda: loop.call_soon(initialised.set))
    try:
        pyfuse3.init(ops, path, options)
    except RuntimeError as exc:
        raise MountError(f"cannot mount on {path}: {exc}") from None

    async def tune() -> None:
        await initialised.wait()
        ra = set_read_ahead(path, read_ahead_kb)
        if on_ready is not None:
            on_ready({"mountpoint": path, "read_ahead_kb": ra, "server": "pyfuse3",
                      "passthrough": False})

    try:
        with stopped_by(pyfuse3.terminate):
            async with asyncio.TaskGroup() as tasks:
                tasks.create_task(pyfuse3.main())
                tasks.create_task(tune())
    finally:
        pyfuse3.close(unmount=True)
        await source.close()
    log.info("unmounted %s: %d reads of %d bytes on average, %d failed", path, ops.reads,
             ops.read_bytes // max(ops.reads, 1), ops.failed_reads)


def enable_asyncio() -> None:
    """Run pyfuse3 on asyncio, with our `wait_readable` and `notify_closing`.

    pyfuse3's own (pyfuse3.asyncio, 3.5) race at unmount. A worker waits for the
    FUSE device on a future that a reader callback completes; `pyfuse3.terminate`
    (our SIGTERM handler) fails it. Whichever of the two comes second found the
    future done and raised InvalidStateError: out of `terminate` when the device
    had just become readable, or out of the reader callback when it was already
    queued. Either way a traceback in the mount's log at an orderly unmount. Ours
    complete a wait only if it is still pending; the rest is the same."""
    import pyfuse3.asyncio

    pyfuse3.asyncio.enable()
    pyfuse3.asyncio.wait_readable = wait_readable
    pyfuse3.asyncio.notify_closing = notify_closing


_readable_waits: dict[int, set[asyncio.Future[None]]] = {}


async def wait_readable(fd: int) -> None:
    """Until `fd` is readable; pyfuse3's ClosedResourceError if `notify_closing` came first.
    pyfuse3 has one worker at a time waiting (its read lock), as asyncio's one reader per fd
    requires."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[None] = loop.create_future()
    waits = _readable_waits.setdefault(fd, set())
    waits.add(future)
    loop.add_reader(fd, _complete, future)
    try:
        await future
    finally:
        loop.remove_reader(fd)
        waits.discard(future)
        if not waits:
            del _readable_waits[fd]


def notify_closing(fd: int) -> None:
    """Fail the waits for `fd` that are still pending (`enable_asyncio`)."""
    from pyfuse3.asyncio import ClosedResourceError

    for future in _readable_waits.get(fd, ()):
        if not future.done():
            future.set_exception(ClosedResourceError())


def _complete(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters
HEAP_REPLY_BYTES = 64 << 20


def keep_reply_buffers_on_the_heap() -> None:
    """Serve reads from heap memory that is reused, not from fresh mappings. glibc maps
    every allocation over 128 KiB afresh and unmaps it when freed, so each 1 MiB reply
    buffer cost a mapping, 256 page faults and an unmapping: a 1 GiB read through the
    mount spent more time there than in everything else (medians of 3 here, 1 MiB
    chunks: 0.56 -> 1.33 GB/s for replies that span two chunks, as a tar member's do,
    2.0 -> 2.6 GB/s for aligned ones; server CPU per GiB 1.9 -> 0.8 and 0.5 -> 0.4 s).
    Not glibc: nothing to do."""
    try:
        libc = ctypes.CDLL(None)
        libc.mallopt(M_MMAP_THRESHOLD, HEAP_REPLY_BYTES)
        libc.mallopt(M_TRIM_THRESHOLD, 4 * HEAP_REPLY_BYTES)
    except (OSError, AttributeError):
        log.info("no glibc mallopt here; reply buffers stay where the allocator puts them")


# ---- a mount in a child process -----------------------------------------------------------




def force_unmount(path: Path | str) -> None:
    """Clear a mount left by a child that died: `fusermount3 -u`, then lazily (`-uz`)."""
    for args in (["-u"], ["-u", "-z"]):
        if not is_mounted(path):
            return
        result = subprocess.run([FUSERMOUNT, *args, str(path)], capture_output=True, text=True,
                                check=False, timeout=30)
        if result.returncode != 0:
            log.warning("%s %s %s: %s", FUSERMOUNT, " ".join(args), path, result.stderr.strip())


def write_summary(path: Path | None, summary: Any) -> None:
    """Write what a serving command reports at its end to `path` (--summary), as JSON, a
    new file, never through a link: a client that is not the mount's parent (the mount
    server's) reads it as the mount's success (`fusefs.image.served`)."""
    if path is None:
        return
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        with os.fdopen(os.open(path, flags, 0o600), "w") as out:
            out.write(json.dumps(summary))
    except OSError as exc:
        log.warning("cannot write the mount's summary to %s: %s", path, exc.strerror)


def ready_line(info: dict[str, Any]) -> None:
    """The one JSON line a serving command prints on stdout once its mount serves (what
    `start_detached` and `Mount.spawn` wait for)."""
    print(json.dumps({"event": "mounted", **info}), flush=True)


LOG_DIR_ENV = "BOOTSEER_LOG_DIR"
MOUNT_LOG_ENV = "BOOTSEER_MOUNT_LOG"  # set by start_detached for a log in a private dir


def mount_log(kind: str) -> Path:
    """A new log file's path for a detached `kind` mount: in BOOTSEER_LOG_DIR if set, else
    in a fresh private directory (mode 0700) under the temp dir. Never a fixed name in a
    shared directory: another user could plant a symlink there that the mount would
    follow and write through (the file is also opened with O_EXCL | O_NOFOLLOW)."""
    import tempfile

    shared = os.environ.get(LOG_DIR_ENV)
    where = Path(shared) if shared else Path(tempfile.mkdtemp(prefix=f"bootseer-{kind}-"))
    return where / f"bootseer-{kind}-{os.getpid()}-{os.urandom(4).hex()}.log"


def drop_private_log(env: Mapping[str, str] = os.environ) -> None:
    """After a clean unmount, remove the log `start_detached` made in a private directory
    (`mount_log`, named in `env`: the serving command's environment), and the directory:
    nothing is left behind in the temp dir. A log in BOOTSEER_LOG_DIR is the operator's
    and stays, as does any log of a mount that failed (its process never gets here)."""
    path = env.get(MOUNT_LOG_ENV)
    if not path:
        return
    with contextlib.suppress(OSError):
        os.unlink(path)
        os.rmdir(os.path.dirname(path))


def _open_new_log(log_path: Path) -> int:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_APPEND | os.O_CLOEXEC
    try:
        return os.open(log_path, flags, 0o600)
    except OSError as exc:
        raise MountError(f"cannot create the mount's log {log_path}: {exc.strerror} (it "
                         "must be a new file, not a link)") from None


def start_detached(argv: list[str], log_path: Path, timeout_s: float) -> dict[str, Any]:
    """Start `argv`, a serving command, in a session of its own (stderr to `log_path`),
    wait for its JSON "mounted" line and leave it running: the `mount` commands return
    while their mount serves on. (An asyncio child would die with the caller's loop.)
    The process comes from the mount server named by BOOTSEER_MOUNT_SERVER if it is set
    (`fusefs.server`: a mount its host serves has a handle process instead, and its line
    names the host, "server_pid"), else it is started here. The line, plus the process's
    "pid"; MountError with the log's end if it does not come."""
    log_fd = _open_new_log(log_path)
    private = not os.environ.get(LOG_DIR_ENV)
    read_fd, write_fd = os.pipe()
    with open(read_fd, "rb") as out:
        with open(log_fd, "ab") as log_file:
            if private:  # the child inherits it (a mount server's too: it sends os.environ)
                os.environ[MOUNT_LOG_ENV] = str(log_path)
            try:
                started = _start(argv, write_fd, log_file.fileno())
            finally:
                os.environ.pop(MOUNT_LOG_ENV, None)
                os.close(write_fd)
        ready_now, _, _ = select.select([out], [], [], timeout_s)
        line = out.readline() if ready_now else b""
    try:
        return {**json.loads(line), "pid": started.pid}
    except json.JSONDecodeError:
        started.kill()
        tail = log_path.read_text(errors="replace").strip().splitlines()[-3:]
        raise MountError(f"the mount did not start; {log_path} ends with: "
                         f"{' / '.join(tail) or 'nothing'}") from None


@dataclass(frozen=True, slots=True)
class _Started:
    pid: int
    proc: subprocess.Popen[bytes] | None  # None: the mount server's child, not ours

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait()


def _start(argv: list[str], stdout: int, stderr: int) -> _Started:
    from fusefs.request import SERVER_ENV, ServerRefused, ServerUnavailable, fork_serving

    server = os.environ.get(SERVER_ENV)
    if server:
        try:
            return _Started(fork_serving(server, argv, stdout, stderr), None)
        except ServerRefused as exc:
            raise MountError(str(exc)) from None
        except ServerUnavailable as exc:
            print(f"bootseer: {exc} ({SERVER_ENV}); starting the mount process here",
                  file=sys.stderr)
    proc = subprocess.Popen(argv, stdout=stdout, stderr=stderr, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    return _Started(proc.pid, proc)


@dataclass
class Mount:
    """A mount served by a child process (`python -m fusefs mount`)."""

    proc: asyncio.subprocess.Process
    mountpoint: Path
    read_ahead_kb: int | None
    log_path: Path

    ready: dict[str, Any]

    @classmethod
    async def start(cls, tree_file: Path, mountpoint: Path, api_socket: str, store_dir: Path,
                    log_path: Path, *extra: str, env: dict[str, str] | None = None) -> Mount:
        """Start `python -m fusefs mount` and wait until it serves (see `spawn`)."""
        argv = [sys.executable, "-m", "fusefs", "mount", str(tree_file), str(mountpoint),
                "--api-socket", api_socket, "--store-dir", str(store_dir), *extra]
        return await cls.spawn(argv, mountpoint, log_path, env=env)

    @classmethod
    async def spawn(cls, argv: list[str], mountpoint: Path, log_path: Path,
                    env: dict[str, str] | None = None,
                    ready_timeout_s: float = READY_TIMEOUT_S) -> Mount:
        """Run `argv`, a command that serves a mount at `mountpoint` and then prints one
        JSON line with at least "mountpoint"; wait for that line. MountError with the
        child's log (stderr, in `log_path`) if it does not come."""
        check_fuse()
        with open(log_path, "ab") as err:
            proc = await asyncio.create_subprocess_exec(
                *argv, stdout=asyncio.subprocess.PIPE, stderr=err, env=env,
                start_new_session=True)
        assert proc.stdout is not None
        try:
            line = await asyncio.wait_for(proc.stdout.readline(), ready_timeout_s)
            ready = json.loads(line)
        except (TimeoutError, json.JSONDecodeError) as exc:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            force_unmount(mountpoint)
            tail = log_path.read_text(errors="replace")[-2000:]
            why = "it exited" if proc.returncode is not None and not isinstance(
                exc, TimeoutError) else type(exc).__name__
            raise MountError(f"the mount at {mountpoint} did not start ({why}); its log:\n"
                             f"{tail}") from None
        return cls(proc, Path(ready["mountpoint"]), ready.get("read_ahead_kb"), log_path, ready)

    async def stop(self, timeout_s: float = 10.0) -> int:
        """SIGTERM, wait, and make sure nothing stays mounted; the child's exit status."""
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), timeout_s)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    self.proc.kill()
                await self.proc.wait()
        await asyncio.to_thread(force_unmount, self.mountpoint)
        return self.proc.returncode if self.proc.returncode is not None else -1

    async def __aenter__(self) -> Mount:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
