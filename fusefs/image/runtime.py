"""Run one command in a read-only rootfs (an image mounted over FUSE) under runc or bubblewrap.

Theory of operation. `run_in_rootfs(rootfs, process, runtime=...)`:

1. makes a private scratch directory and mounts a tmpfs on it, then an
   overlayfs whose lower is the rootfs and whose upper and work dirs are on
   that tmpfs: the container may write anywhere, its writes land in memory
   and vanish with it, and the rootfs (the FUSE mount) is never written;
2. checks, in the merged tree, that the command exists (a clear error rather
   than the runtime's 127) and creates the working directory if missing (as
   Docker does for a WorkingDir), and the targets of the binds (host
   directories made visible in the container: `bootseer launch` binds the
   environment and the checkpoint this way);
3. runs the process with stdin, stdout and stderr passed through and returns
   its exit status (128+N when it died of signal N):
   - runc: a generated OCI runtime spec (`fusefs.image.runc_spec`) in a
     bundle on the tmpfs, `runc run --bundle DIR ID`, and always
     `runc delete -f ID` afterwards;
   - bwrap: `bwrap --bind MERGED / --proc /proc --dev /dev ...`;
4. always unmounts the overlay and the tmpfs and removes the scratch dir,
   also when the caller is cancelled or an exception escapes.

SIGTERM and SIGINT sent to the caller while a container runs are forwarded
to the container (runc forwards what it receives to the container's init;
for bwrap we signal the sandboxed process, whose pid bwrap reports on
`--info-fd`). The command is PID 1 of its own pid namespace under both
runtimes, so, as in Docker, it ignores those signals unless it handles
them: if it is still running `STOP_GRACE_S` after a forwarded signal or a
cancellation, it is killed. Handlers are installed only when the caller runs
in the main thread; the previous handlers are restored afterwards.

Isolation. Both runtimes give the command its own mount, pid, ipc and uts
namespaces and share the host's network namespace on purpose: a training job
must reach its peers and the agent with the host's addresses, and DNS works
through the host's /etc/resolv.conf and /etc/hosts, bound read-only. Neither
sets cgroup limits. runc runs the command as the image's uid:gid with
Docker's default capability set, masked /proc paths and a read-only /sys.
bwrap, run as root without a user namespace, drops no capabilities of a root
command; for a non-root uid it adds `--unshare-user --uid U --gid G`, so the
process sees that uid while owning nothing outside (a user namespace maps U
to the invoking root only). runc is the runtime for anything untrusted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import tempfile
import threading
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from fusefs.image import mounts
from fusefs.image.process import Bind, ContainerError, Process, resolve_in_root
from fusefs.image.runc_spec import runc_spec
from fusefs.image.tool import require, tail

RUNTIMES = ("runc", "bwrap")
STOP_GRACE_S = 10.0
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT)
HOST_FILES = ("/etc/resolv.conf", "/etc/hosts")


@dataclass(frozen=True, slots=True)
class Scratch:
    """The per-run directories: all on one tmpfs mounted at `root`."""

    root: Path
    merged: Path  # the overlay: the container's /
    bundle: Path  # runc's bundle (config.json)


async def run_in_rootfs(rootfs: Path, process: Process, *, runtime: str = "runc",
                        scratch_dir: Path | None = None, binds: Sequence[Bind] = ()) -> int:
    """Run `process` with `rootfs` as a writable-in-memory root, with `binds` mounted into
    it; its exit status.

    `scratch_dir` is where the private scratch directory is made (default: the
    system temp dir). Raises ContainerError for anything that stops the run
    before the command starts; the command's own failure is its exit status.
    """
    if runtime not in RUNTIMES:
        raise ContainerError(f"unknown runtime {runtime!r}; one of {', '.join(RUNTIMES)}")
    binary = require(runtime, ContainerError)
    if not rootfs.is_dir():
        raise ContainerError(f"rootfs {rootfs} is not a directory (is the image mounted?)")
    async with _scratch(rootfs, scratch_dir) as scratch:
        # bwrap maps a non-root uid onto the invoking root: a root-owned dir is "theirs".
        owner = (process.uid, process.gid) if runtime == "runc" else (0, 0)
        _prepare(scratch.merged, process, owner, binds)
        if runtime == "runc":
            return await _run_runc(binary, scratch, process, binds)
        return await _run_bwrap(binary, scratch, process, binds)


@contextlib.asynccontextmanager
async def _scratch(rootfs: Path, parent: Path | None) -> AsyncIterator[Scratch]:
    root = Path(tempfile.mkdtemp(prefix="bootseer-run-", dir=parent))
    try:
        with mounts.mounted_tmpfs(root), mounts.mounted_overlay(rootfs, root) as merged:
            bundle = root / "bundle"
            bundle.mkdir()
            yield Scratch(root, merged, bundle)
    finally:
        root.rmdir()


def _prepare(merged: Path, process: Process, owner: tuple[int, int],
             binds: Sequence[Bind] = ()) -> None:
    """Check the command exists in the image (or in a bound directory); create the bind
    targets, and the working directory, if missing."""
    for bind in binds:
        _make_dir(merged, bind.target, (0, 0), "bind target")
    env = dict(item.partition("=")[::2] for item in process.env)
    if find_command(merged, process.argv[0], env.get("PATH", ""), process.cwd,
                    binds) is None:
        raise ContainerError(f"command {process.argv[0]!r} not found in the image "
                             f"(PATH={env.get('PATH', '')}); it would exit with 127")
    _make_dir(merged, process.cwd, owner, "working directory")


def _make_dir(merged: Path, path: str, owner: tuple[int, int], what: str) -> None:
    where = resolve_in_root(merged, path)
    if not where.is_dir():
        try:
            where.mkdir(parents=True)
        except OSError as e:
            raise ContainerError(f"cannot create {what} {path} in the image: "
                                 f"{e.strerror}") from e
        os.chown(where, *owner)


def find_command(root: Path, command: str, path: str, cwd: str = "/",
                 binds: Sequence[Bind] = ()) -> Path | None:
    """Where `command` resolves in `root` (a path, or a name searched on PATH), if anywhere.

    Relative paths (a command with a slash, or a relative PATH entry) start at `cwd`. A
    path under a bind's target is looked up in the bind's source (a venv's `bin/python`
    is a symlink into the image: that it exists is all this checks there).
    """
    candidates = [command] if "/" in command else [f"{d}/{command}" for d in path.split(":") if d]
    for candidate in candidates:
        absolute = os.path.normpath(candidate if candidate.startswith("/")
                                    else f"{cwd}/{candidate}")
        for bind in binds:
            inside = os.path.relpath(absolute, bind.target)
            if not inside.startswith("..") and os.path.lexists(bind.source / inside):
                return bind.source / inside
        found = resolve_in_root(root, absolute)
        if found.is_file() and os.access(found, os.X_OK):
            return found
    return None


# -- runc ------------------------------------------------------------------------------------

async def _run_runc(runc: str, scratch: Scratch, process: Process,
                    binds: Sequence[Bind]) -> int:
    spec = runc_spec(process, scratch.merged, [f for f in HOST_FILES if Path(f).is_file()],
                     binds)
    (scratch.bundle / "config.json").write_text(json.dumps(spec, indent=1))
    container = f"bootseer-{uuid.uuid4().hex[:16]}"

    def forward(sig: int) -> None:
        if child.returncode is None:
            child.send_signal(sig)  # runc relays it to the container's init

    async def kill() -> None:
        await _quiet(runc, "kill", container, "KILL")

    try:
        child = await asyncio.create_subprocess_exec(
            runc, "run", "--bundle", str(scratch.bundle), container)
        status = await _supervise(child, forward, kill)
    except BaseException:
        await _quiet(runc, "delete", "--force", container)  # best effort: the first error wins
        raise
    failure = await _quiet(runc, "delete", "--force", container)
    if failure:
        raise ContainerError(f"runc delete --force {container} failed: {tail(failure)}")
    return status


async def _quiet(*args: str) -> bytes:
    """Run a runtime housekeeping command; its stderr if it failed, else b''."""
    child = await asyncio.create_subprocess_exec(*args, stdin=asyncio.subprocess.DEVNULL,
                                                 stdout=asyncio.subprocess.DEVNULL,
                                                 stderr=asyncio.subprocess.PIPE)
    _, err = await child.communicate()
    return err if child.returncode else b""


# -- bwrap -----------------------------------------------------------------------------------

def bwrap_args(merged: Path, process: Process, host_files: list[str],
               binds: Sequence[Bind] = ()) -> list[str]:
    """bwrap's arguments (after the binary) for `process` with `merged` as its root."""
    args = ["--bind", str(merged), "/", "--proc", "/proc", "--dev", "/dev",
            "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--as-pid-1",
            "--die-with-parent", "--chdir", process.cwd, "--clearenv"]
    for path in host_files:
        args += ["--ro-bind", path, path]
    for bind in binds:
        args += ["--ro-bind" if bind.read_only else "--bind", str(bind.source), bind.target]
    for item in process.env:
        name, _, value = item.partition("=")
        args += ["--setenv", name, value]
    if (process.uid, process.gid) != (0, 0):
        args += ["--unshare-user", "--uid", str(process.uid), "--gid", str(process.gid)]
    return [*args, "--", *process.argv]


async def _run_bwrap(bwrap: str, scratch: Scratch, process: Process,
                     binds: Sequence[Bind]) -> int:
    host_files = [f for f in HOST_FILES if Path(f).is_file()]
    info_read, info_write = os.pipe()
    try:
        child = await asyncio.create_subprocess_exec(
            bwrap, "--info-fd", str(info_write), *bwrap_args(scratch.merged, process, host_files,
                                                     binds),
            pass_fds=(info_write,))
    except BaseException:
        os.close(info_read)
        raise
    finally:
        os.close(info_write)
    pid = _ChildPid(info_read)

    def forward(sig: int) -> None:
        target = pid.value
        with contextlib.suppress(ProcessLookupError):
            if target is not None:
                os.kill(target, sig)
            elif child.returncode is None:
                child.send_signal(sig)

    async def kill() -> None:
        forward(signal.SIGKILL)  # PID 1 of its namespace: the kernel kills the rest
        with contextlib.suppress(ProcessLookupError):
            child.kill()

    try:
        return await _supervise(child, forward, kill)
    finally:
        pid.close()


class _ChildPid:
    """The sandboxed process's pid, from the JSON bwrap writes on --info-fd."""

    def __init__(self, fd: int) -> None:
        self.value: int | None = None
        self._file = os.fdopen(fd, "rb")
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            decoder, text = json.JSONDecoder(), ""
            while chunk := os.read(self._file.fileno(), 4096):
                text += chunk.decode()
                with contextlib.suppress(ValueError):
                    self.value = int(decoder.raw_decode(text.strip())[0]["child-pid"])
                    return

    def close(self) -> None:
        self._thread.join()  # bwrap has exited: the pipe is at EOF
        self._file.close()


# -- supervision -----------------------------------------------------------------------------

Forward = Callable[[int], None]
Kill = Callable[[], Awaitable[None]]


async def _supervise(child: asyncio.subprocess.Process, forward: Forward, kill: Kill) -> int:
    """Wait for `child`, forwarding SIGTERM/SIGINT; kill it on cancellation or after grace."""
    stopping = asyncio.Event()

    def on_signal(sig: int) -> None:
        forward(sig)
        stopping.set()

    with _signals_forwarded(asyncio.get_running_loop(), on_signal):
        try:
            async with asyncio.TaskGroup() as tasks:
                watchdog = tasks.create_task(_watchdog(child, stopping, kill))
                status = await child.wait()
                watchdog.cancel()
        except asyncio.CancelledError:
            forward(signal.SIGTERM)
            await _stop(child, kill)
            raise
    return 128 - status if status < 0 else status


async def _watchdog(child: asyncio.subprocess.Process, stopping: asyncio.Event,
                    kill: Kill) -> None:
    await stopping.wait()
    await _stop(child, kill)


async def _stop(child: asyncio.subprocess.Process, kill: Kill) -> None:
    """Give a signalled child STOP_GRACE_S to exit, then kill it; wait for it either way."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.shield(child.wait()), STOP_GRACE_S)
    if child.returncode is None:
        await kill()
        await child.wait()


@contextlib.contextmanager
def _signals_forwarded(loop: asyncio.AbstractEventLoop, handler: Forward) -> Iterator[None]:
    """Route SIGTERM/SIGINT to `handler` while the container runs (main thread only)."""
    installed = []
    if threading.current_thread() is threading.main_thread():
        for sig in FORWARDED_SIGNALS:
            installed.append((sig, signal.getsignal(sig)))
            loop.add_signal_handler(sig, handler, sig)
    try:
        yield
    finally:
        for sig, previous in installed:
            loop.remove_signal_handler(sig)
            signal.signal(sig, previous)
