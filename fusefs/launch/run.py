"""`bootseer launch`: image, environment and checkpoint up at once, then the job in the image.

Theory of operation. `launch(plan, places, expected)`:

1. forks the serving processes before this process has an event loop or a thread
   (`fusefs.image.forked`): the image mount (its hot-block record prefetched, or,
   with no record yet, this launch recorded as the first), and whatever mounts
   the other parts serve (`fusefs.launch.part`: a checkpoint mount per URI, the
   snapshot mount when the environment is mounted lazily);
2. brings the parts up concurrently on one event loop, each timed from the
   start: the image is up when its mount serves; every other part when its
   bring-up says so (depsnap.launch: the environment restored, installed or
   mounted; hdfs_stripe.launch: the checkpoint mounted and, with prefetch, local);
3. runs the command in the image (`fusefs.image.runtime`) with every part's binds
   and environment variables (the environment's venv first on PATH, as
   VIRTUAL_ENV; the checkpoint read-only at its path, as BOOTSEER_CKPT);
4. always stops the mounts (the image's writes its record) and removes its
   scratch directory; returns the command's exit status and the timeline: when
   each part was ready, and its bytes from peers and from the origin.

A part that fails stops the launch before the command runs: nothing half-up is
presented as up. Every mount of the launch allows other users (the container's
user may not be root) and is read-only.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from fusefs.image.forked import ForkedMount, Serve
from fusefs.image.process import Bind
from fusefs.launch.part import BringUp, Context, LaunchPart
from fusefs.launch.plan import LaunchPlan
from fusefs.mountinfo import is_mounted
from p2p import process as cpu
from p2p.errors import UserError
from p2p.places import NodePlaces

log = logging.getLogger(__name__)

READY_TIMEOUT_S = 300.0  # a mount that has not served by then has failed
SCRATCH_PREFIX = "bootseer-launch-"
OWNER_FILE = "owner"  # the launch process: "pid start-time", to tell an abandoned scratch


@dataclass
class Launch:
    """One launch's mounts, binds and timeline while it runs."""

    plan: LaunchPlan
    places: NodePlaces
    context: Context
    started: float
    image: ForkedMount
    forked: list[ForkedMount]  # every mount: the image's and the parts'
    bring_ups: dict[str, BringUp] = field(default_factory=dict)  # by part name
    binds: list[Bind] = field(default_factory=list)
    environ: dict[str, str] = field(default_factory=dict)
    contents: dict[str, list[str]] = field(default_factory=dict)  # part -> content ids
    timeline: dict[str, Any] = field(default_factory=dict)

    @property
    def scratch(self) -> Path:
        return self.context.scratch

    def mounts(self) -> list[ForkedMount]:
        return list(self.forked)

    def since(self) -> float:
        return round(time.monotonic() - self.started, 3)


def launch(plan: LaunchPlan, places: NodePlaces, parts: dict[str, LaunchPart],
           args: Any, expected: tuple[type[Exception], ...],
           scratch_parent: Path | None = None) -> tuple[int, dict[str, Any]]:
    """Run the plan (see the module docstring) with `parts` (by name) bringing up the
    plan's parts, which read their settings from `args` (the command line); (exit status,
    timeline). Call from a process with no event loop and no threads yet: it forks."""
    started = time.monotonic()
    parent = scratch_parent or Path(tempfile.gettempdir())
    sweep_abandoned(parent)
    scratch = Path(tempfile.mkdtemp(prefix=SCRATCH_PREFIX, dir=parent))
    (scratch / OWNER_FILE).write_text(_process_identity(os.getpid()))
    forked: list[ForkedMount] = []
    job = None
    try:
        context = Context(args, scratch, contextlib.ExitStack(),
                          lambda: round(time.monotonic() - started, 3))
        job = _fork_mounts(plan, places, parts, context, started, expected, forked)
        return asyncio.run(_run(job))
    finally:
        asyncio.run(_stop(forked))  # a no-op for mounts `_run` stopped
        if job is not None:
            job.context.memory.close()
        if not any(is_mounted(m.mountpoint) for m in forked):
            shutil.rmtree(scratch, ignore_errors=True)


def _fork_mounts(plan: LaunchPlan, places: NodePlaces, parts: dict[str, LaunchPart],
                 context: Context, started: float, expected: tuple[type[Exception], ...],
                 forked: list[ForkedMount]) -> Launch:
    from fusefs.image.mount import serve_image
    from fusefs.image.options import MountOptions as ImageOptions
    from p2p.origin.oci_ref import parse_reference

    scratch = context.scratch

    def fork(name: str, serve: Callable[[Path], Serve]) -> ForkedMount:
        mountpoint = scratch / name
        mountpoint.mkdir()
        mount = ForkedMount.start(serve(mountpoint), mountpoint, scratch / f"{name}.log",
                                  expected)
        forked.append(mount)
        return mount

    p, secret = places, places.secret
    ref = parse_reference(plan.image)
    image = fork("image", lambda at: lambda ready: serve_image(
        ImageOptions(plan.image, at, p.tracker, p.api_socket, _store(p),
                     plan.plain_http, record_missing=True), secret, ref, ready))
    job = Launch(plan, places, context, started, image, forked)
    for name, part_plan in plan.parts.items():
        job.bring_ups[name] = parts[name].fork(part_plan, context, fork)
    return job


def _store(places: NodePlaces) -> Path:
    assert places.store_dir is not None
    return places.store_dir


async def _run(job: Launch) -> tuple[int, dict[str, Any]]:
    from fusefs.image.process import image_process
    from fusefs.image.runtime import run_in_rootfs

    try:
        try:
            async with asyncio.TaskGroup() as parts:
                ready = parts.create_task(_image(job))
                for name in job.bring_ups:
                    parts.create_task(_part(job, name))
        except ExceptionGroup as group:  # not except*: before 3.11.4 an exception raised
            raise _first(group) from None  # there came out wrapped in a new group
        config = ready.result().get("config", {}).get("config") or {}
        process = await asyncio.to_thread(image_process, job.image.mountpoint, config,
                                          list(job.plan.command) if job.plan.command else None)
        process = replace(process, env=with_environ(process.env, job.environ))
        job.timeline["command_started_s"] = job.since()
        # what bringing the parts up cost this node: us, finished children, mount servers
        job.timeline["cpu_ready_s"] = round(sum(cpu.own_and_children())
                                            + cpu.cpu_seconds_of(m.pid for m in job.mounts()), 2)
        log.info("all parts up in %.3f s; running %s", job.since(), " ".join(process.argv))
        status = await run_in_rootfs(job.image.mountpoint, process, runtime=job.plan.runtime,
                                     scratch_dir=job.scratch, binds=job.binds)
        job.timeline["command_s"] = round(job.since() - job.timeline["command_started_s"], 3)
        await _bytes(job)
    finally:
        await _stop(job.mounts())
    job.timeline["seconds"] = job.since()
    job.timeline["cpu_s"] = _cpu()
    return status, {"exit_status": status, **job.timeline}


# ---- the three parts ------------------------------------------------------------------------


async def _image(job: Launch) -> dict[str, Any]:
    ready = await job.image.wait_ready(READY_TIMEOUT_S)
    job.contents["image"] = [layer["content"] for layer in ready["layers"]]
    job.timeline["image"] = {"ready_s": job.since(), "digest": ready.get("image"),
                             "prefetch_chunks": ready.get("prefetch_chunks"),
                             "mount_phases": ready.get("phases")}
    log.info("image %s mounted in %.3f s (%s chunks prefetched)", job.plan.image,
             job.since(), ready.get("prefetch_chunks"))
    return ready


async def _part(job: Launch, name: str) -> None:
    up = await job.bring_ups[name](job.context)
    job.binds += up.binds
    for variable, value in up.environ.items():
        job.environ[variable] = (f"{value}:{job.environ[variable]}"
                                 if variable == "PATH" and variable in job.environ else value)
    job.contents[name] = up.contents
    job.timeline[name] = up.timeline


# ---- helpers --------------------------------------------------------------------------------


class LaunchError(UserError):
    """A part of the launch could not be brought up; the message says which and why."""


def _first(group: ExceptionGroup[Exception]) -> Exception:
    """The error to show for a failed launch: the first leaf of the group."""
    error: BaseException = group
    while isinstance(error, BaseExceptionGroup):
        error = error.exceptions[0]
    assert isinstance(error, Exception)
    return error


def with_environ(env: tuple[str, ...], extra: dict[str, str]) -> tuple[str, ...]:
    """The image's environment with the launch's: PATH gets ours in front of the image's."""
    current = dict(item.partition("=")[::2] for item in env)
    for name, value in extra.items():
        current[name] = f"{value}:{current[name]}" if name == "PATH" and current.get(name) \
            else value
    return tuple(f"{name}={value}" for name, value in current.items())


async def _bytes(job: Launch) -> None:
    """Each part's bytes from peers and from the origin, as the agent counted them."""
    from p2p.agentclient import AgentClient
    from p2p.progress import totals

    async with AgentClient(job.places.api_socket, timeout_s=10.0) as agent:
        status = await agent.status()
    for part, contents in job.contents.items():
        held = totals(status, contents)
        job.timeline[part] |= {"peer_bytes": held["peer_bytes"],
                               "origin_bytes": held["origin_bytes"]}


def sweep_abandoned(parent: Path) -> list[Path]:
    """Remove the scratch directories of launches that died without cleaning up (SIGKILL,
    a node that went down): a runc container whose bundle is in one is killed and deleted
    (runc does not end with its parent; bwrap does), everything still mounted under one is
    unmounted lazily, then it is deleted. Their mount servers have ended with them
    (`fusefs.image.forked`). What was removed."""
    from fusefs.image.mounts import unmount

    removed: list[Path] = []
    containers: list[dict[str, Any]] | None = None
    for scratch in sorted(parent.glob(f"{SCRATCH_PREFIX}*")):
        try:
            owner = (scratch / OWNER_FILE).read_text().split()
        except OSError:
            continue  # being made, or not ours
        if len(owner) != 2 or _process_identity(int(owner[0])) == " ".join(owner):
            continue  # its launch is alive
        if containers is None:
            containers = _runc_containers()
        for c in containers:
            if str(c.get("bundle", "")).startswith(f"{scratch}/"):
                subprocess.run(["runc", "delete", "--force", str(c["id"])],
                               capture_output=True, check=False, timeout=30)
        with open("/proc/self/mountinfo") as f:
            points = [line.split()[4] for line in f]
        for point in sorted((p for p in points if p.startswith(f"{scratch}/")),
                            key=len, reverse=True):
            with contextlib.suppress(Exception):
                unmount(Path(point))
        shutil.rmtree(scratch, ignore_errors=True)
        log.info("removed %s, left by a launch that died", scratch)
        removed.append(scratch)
    return removed


def _runc_containers() -> list[dict[str, Any]]:
    """`runc list` (empty if runc is missing or says nothing useful)."""
    try:
        done = subprocess.run(["runc", "list", "--format", "json"], capture_output=True,
                              text=True, check=False, timeout=30)
        listed = json.loads(done.stdout or "null")
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return []
    return [c for c in listed or [] if isinstance(c, dict)]


def _process_identity(pid: int) -> str:
    """"pid start-time" of a live process ("" if there is none): a pid alone may be reused."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return ""
    return f"{pid} {fields[19]}"


def _cpu() -> dict[str, float]:
    """CPU seconds of this process, and of its children (the mounts, the runtime, the job,
    the environment's extractors)."""
    own, children = cpu.own_and_children()
    return {"launch": round(own, 2), "children": round(children, 2)}


async def _stop(mounts: list[ForkedMount]) -> None:
    """Stop every mount not stopped yet. One that ended otherwise than by our SIGTERM or
    its own reported error (exit 2, already the launch's error) has its log's tail logged:
    the log goes with the scratch directory."""
    for mount in mounts:
        if mount.stopped:
            continue
        with contextlib.suppress(Exception):
            status = await mount.stop(timeout_s=30.0)
            if status not in (0, 2, -signal.SIGTERM):
                tail = mount.log_path.read_text(errors="replace").strip()[-2000:]
                log.warning("the mount at %s exited with %d; its log ends:\n%s",
                            mount.mountpoint, status, tail)
