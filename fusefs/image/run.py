"""`bootseer image run`: mount an image, run a command in it, stop the mount.

`launch` has the image mounted at a scratch mount point, runs the command
under a container runtime with an overlayfs upper on tmpfs over the mount
(`runtime`), stops the mount (which saves the hot-block record, in record
mode) and returns the command's exit status and a timeline.

Who serves the mount (`starter`, the rule `bootseer launch` follows too). Where
the node runs a mount server (BOOTSEER_MOUNT_SERVER names its socket), the server
does (`served`): an `image serve` command line, ended with this process, so this
process imports none of the serving code (aiohttp, the image catalog, the
agent's client), only the command line, the request's client and the runtime.
Without one, or when it does not answer (said on stderr), this process forks its
serving child itself (`forked`), as before the server existed; the child imports
the serving code after the fork. A refusal by the server is the launch's error,
as for `image mount`.

Killed. Everything of a run lives in its scratch directory (the mount point, the
runtime's tmpfs, overlay and bundle); its guard (`leftover`) removes what a
killed run leaves there: its runc container, the runtime's mounts.

What the timeline reports of the serving side (the record saved, the backing
files' account, this mount's bytes from peers and from the registry) is what
the serving wrote at its end (`serve_image`'s summary), read once the mount
has stopped; so the launch never talks to the agent itself.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from fusefs.image.leftover import Guard
from fusefs.image.options import MountOptions, image_ref
from fusefs.image.starter import Mount, MountCommand, MountStarter, served_by
from fusefs.mountinfo import is_mounted
from p2p.process import age_seconds

log = logging.getLogger(__name__)

# What the serving says of the hot-block record when it ends (serve_image).
RECORD_KEYS = ("recording", "recorded_chunks", "record_chunks", "record_runs", "record_error")


def launch(opts: MountOptions, secret: bytes, argv: list[str] | None, runtime: str,
           expected: tuple[type[Exception], ...]) -> tuple[int, dict[str, Any]]:
    """Mount the image (see the module docstring), run `argv` (or the image's own command)
    in it, stop the mount; (exit status, timeline). The image reference (`opts.ref`) is
    parsed where the mount is served: a bad one is the mount's failure (MountError, or
    an `expected` error). Call from a process with no event loop and no threads yet: it
    may fork."""
    started, startup = time.monotonic(), age_seconds()
    scratch = Path(tempfile.mkdtemp(prefix="bootseer-run-"))
    opts = replace(opts, mountpoint=scratch / "rootfs")
    opts.mountpoint.mkdir()
    guard = Guard.start(scratch)
    try:
        mount = _start(opts, secret, scratch / "mount.log", expected)
        status, timeline = asyncio.run(_run(mount, argv, runtime, started, opts, scratch))
        # Before the clock: the interpreter's start, imports and arguments (benchmarks/RESULTS.md).
        return status, {**timeline, "startup_s": None if startup is None else round(startup, 3)}
    finally:
        if not is_mounted(opts.mountpoint):
            shutil.rmtree(scratch, ignore_errors=True)
        guard.done()


def _start(opts: MountOptions, secret: bytes, log_path: Path,
           expected: tuple[type[Exception], ...]) -> Mount:
    async def serve(ready: Any) -> Any:
        from fusefs.image.mount import serve_image

        return await serve_image(opts, secret, image_ref(opts.ref), ready)

    command = MountCommand(lambda summary: replace(opts, summary=summary).argv(), serve)
    return MountStarter(expected).start(command, opts.mountpoint, log_path)


async def _run(mount: Mount, argv: list[str] | None, runtime: str, started: float,
               opts: MountOptions, scratch: Path) -> tuple[int, dict[str, Any]]:
    from fusefs.image.process import image_process
    from fusefs.image.runtime import run_in_rootfs

    try:
        ready = await mount.wait_ready(opts.read_timeout_s + 60.0)
        timeline: dict[str, Any] = {"mounted_s": round(time.monotonic() - started, 3),
                                    "image": ready.get("image"),
                                    "prefetch_chunks": ready.get("prefetch_chunks"),
                                    "mount_phases": ready.get("phases"),
                                    "tree": ready.get("tree"), "server": ready.get("server"),
                                    "served_by": served_by(mount)}
        config = ready.get("config", {}).get("config") or {}
        process = await asyncio.to_thread(image_process, mount.mountpoint, config, argv)
        status = await run_in_rootfs(mount.mountpoint, process, runtime=runtime,
                                     scratch_dir=scratch)
        timeline["command_s"] = round(time.monotonic() - started, 3)
    finally:
        stopped = await mount.stop(timeout_s=30.0)
        if stopped != 0:
            log.warning("the mount exited with %d; its log: %s", stopped, mount.log_path)
    ended = mount.ended
    timeline |= {key: ended.get(key) for key in ("peer_bytes", "origin_bytes")}
    timeline["record"] = {key: ended[key] for key in RECORD_KEYS if key in ended}
    timeline["backing"] = ended.get("backing")  # what passthrough served, if any
    timeline["seconds"] = round(time.monotonic() - started, 3)
    return status, timeline
