"""`bootseer launch`: image, environment and checkpoint up at once, then the job in the image.

Theory of operation. `launch(plan, places, expected)`:

1. starts every mount before this process has an event loop or a thread
   (`fusefs.image.starter`): the image mount (its hot-block record prefetched,
   or, with no record yet, this launch recorded as the first), and whatever
   mounts the other parts serve (`fusefs.launch.part`: a checkpoint mount per
   URI, the snapshot mount when the environment is mounted lazily). Where the
   node runs a mount server (BOOTSEER_MOUNT_SERVER), it serves them all, each
   ended with this process; else (or if it does not answer, said once) each is
   a child forked here. The timeline says which served each mount (`served_by`);
2. forks the guard of its scratch directory (`fusefs.image.leftover`): should
   this process be killed, the guard deletes its runc container and unmounts the
   runtime's tmpfs and overlay (the mounts themselves end with this process);
3. brings the parts up concurrently on one event loop, each timed from the
   start: the image is up when its mount serves; every other part when its
   bring-up says so (depsnap.launch: the environment restored, installed or
   mounted; hdfs_stripe.launch: the checkpoint mounted and, with prefetch, local);
4. runs the command in the image (`fusefs.image.runtime`) with every part's binds
   and environment variables (the environment's venv first on PATH, as
   VIRTUAL_ENV; the checkpoint read-only at its path, as BOOTSEER_CKPT);
5. always stops the mounts (the image's writes its record) and removes its
   scratch directory; returns the command's exit status and the timeline: when
   each part was ready, who served its mount, and its bytes from peers and from
   the origin; `startup_s`, the seconds before the launch's clock (the
   interpreter's start, imports, arguments), and `mounts_started_s`, when every
   mount had been asked for or forked.

A part that fails stops the launch before the command runs: nothing half-up is
presented as up. Every mount of the launch allows other users (the container's
user may not be root) and is read-only.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import shutil
import signal
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from fusefs.image.forked import ForkedMount
from fusefs.image.leftover import Guard, claim, sweep_abandoned
from fusefs.image.options import MountOptions as ImageOptions
from fusefs.image.options import image_ref
from fusefs.image.process import Bind
from fusefs.image.starter import Mount, MountCommand, MountStarter, served_by
from fusefs.launch.part import BringUp, Context, LaunchPart
from fusefs.launch.plan import LaunchPlan
from fusefs.mountinfo import is_mounted
from p2p import process as cpu
from p2p.errors import UserError
from p2p.places import NodePlaces

log = logging.getLogger(__name__)

READY_TIMEOUT_S = 300.0  # a mount that has not served by then has failed
SCRATCH_PREFIX = "bootseer-launch-"


@dataclass
class Launch:
    """One launch's mounts, binds and timeline while it runs."""

    plan: LaunchPlan
    places: NodePlaces
    context: Context
    started: float
    image: Mount
    started_mounts: list[Mount]  # every mount: the image's and the parts'
    bring_ups: dict[str, BringUp] = field(default_factory=dict)  # by part name
    binds: list[Bind] = field(default_factory=list)
    environ: dict[str, str] = field(default_factory=dict)
    contents: dict[str, list[str]] = field(default_factory=dict)  # part -> content ids
    timeline: dict[str, Any] = field(default_factory=dict)

    @property
    def scratch(self) -> Path:
        return self.context.scratch

    def mounts(self) -> list[Mount]:
        return list(self.started_mounts)

    def since(self) -> float:
        return round(time.monotonic() - self.started, 3)


def launch(plan: LaunchPlan, places: NodePlaces, parts: dict[str, LaunchPart],
           args: Any, expected: tuple[type[Exception], ...],
           scratch_parent: Path | None = None) -> tuple[int, dict[str, Any]]:
    """Run the plan (see the module docstring) with `parts` (by name) bringing up the
    plan's parts, which read their settings from `args` (the command line); (exit status,
    timeline). Call from a process with no event loop and no threads yet: it forks."""
    started, startup = time.monotonic(), cpu.age_seconds()
    parent = scratch_parent or Path(tempfile.gettempdir())
    sweep_abandoned(parent, SCRATCH_PREFIX)
    scratch = Path(tempfile.mkdtemp(prefix=SCRATCH_PREFIX, dir=parent))
    claim(scratch)
    guard = Guard.start(scratch)
    mounts: list[Mount] = []
    job = None
    try:
        context = Context(args, scratch, contextlib.ExitStack(),
                          lambda: round(time.monotonic() - started, 3))
        job = _start_mounts(plan, places, parts, context, started, expected, mounts)
        status, timeline = asyncio.run(_run(job))
        return status, {**timeline,
                        "startup_s": None if startup is None else round(startup, 3)}
    finally:
        asyncio.run(_stop(mounts))  # a no-op for mounts `_run` stopped
        if job is not None:
            job.context.memory.close()
        if not any(is_mounted(m.mountpoint) for m in mounts):
            shutil.rmtree(scratch, ignore_errors=True)
        guard.done()


def _start_mounts(plan: LaunchPlan, places: NodePlaces, parts: dict[str, LaunchPart],
                  context: Context, started: float, expected: tuple[type[Exception], ...],
                  mounts: list[Mount]) -> Launch:
    scratch, starter = context.scratch, MountStarter(expected)

    def start(name: str, command: Callable[[Path], MountCommand]) -> Mount:
        mountpoint = scratch / name
        mountpoint.mkdir()
        mount = starter.start(command(mountpoint), mountpoint, scratch / f"{name}.log")
        mounts.append(mount)
        return mount

    p, secret = places, places.secret

    def image(at: Path) -> MountCommand:
        opts = ImageOptions(plan.image, at, p.tracker, p.api_socket, _store(p),
                            plan.plain_http, record_missing=True)

        async def serve(ready: Any) -> Any:
            from fusefs.image.mount import serve_image

            return await serve_image(opts, secret, image_ref(opts.ref), ready)

        # Forked, the image's serving code is imported once, here, before the forks.
        return MountCommand(lambda summary: replace(opts, summary=summary).argv(), serve,
                            preload=("fusefs.image.mount", "p2p.origin.oci_ref"))

    job = Launch(plan, places, context, started, start("image", image), mounts)
    for name, part_plan in plan.parts.items():
        job.bring_ups[name] = parts[name].fork(part_plan, context, start)
    return job


def _store(places: NodePlaces) -> Path:
    assert places.store_dir is not None
    return places.store_dir


async def _run(job: Launch) -> tuple[int, dict[str, Any]]:
    from fusefs.image.process import image_process
    from fusefs.image.runtime import run_in_rootfs

    job.timeline["mounts_started_s"] = job.since()  # this process's own work before them
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
        # what bringing the parts up cost this node: us, finished children, forked mounts
        # (a mount server's host serves other mounts too: its CPU is not counted here)
        job.timeline["cpu_ready_s"] = round(sum(cpu.own_and_children()) + cpu.cpu_seconds_of(
            m.pid for m in job.mounts() if isinstance(m, ForkedMount)), 2)
        log.info("all parts up in %.3f s; running %s", job.since(), " ".join(process.argv))
        # The agent's client (aiohttp), which `_bytes` needs, is imported while the command
        # runs: a launch whose mounts the server serves has not imported it yet.
        importing = asyncio.ensure_future(asyncio.to_thread(importlib.import_module,
                                                            "p2p.agentclient"))
        try:
            status = await run_in_rootfs(job.image.mountpoint, process,
                                         runtime=job.plan.runtime, scratch_dir=job.scratch,
                                         binds=job.binds)
        finally:
            await importing
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
    job.timeline["image"] = {"ready_s": job.since(), "served_by": served_by(job.image),
                             "digest": ready.get("image"),
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


def _cpu() -> dict[str, float]:
    """CPU seconds of this process, and of its children (the mounts, the runtime, the job,
    the environment's extractors)."""
    own, children = cpu.own_and_children()
    return {"launch": round(own, 2), "children": round(children, 2)}


async def _stop(mounts: list[Mount]) -> None:
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
