"""Mount an image, and run a command in it.

`serve_image` is the serving process of one image mount (it must not read its
own mount, so it is always a process of its own): it opens the image (manifest,
config, layer indexes and the merged tree `image index` packed, see `catalog`;
an image indexed before trees were packed has its layers merged here by
`fusefs.tree.build_tree`: whiteouts, opaque directories, hard links), hands
the agent the image's hot-block record as per-layer prefetch lists (lazy: the
agent fetches those chunks in record order, from peers first, and nothing
else), and serves the tree until SIGTERM or an unmount. In record mode it then
merges what this launch touched into the stored record.

`launch` is `bootseer image run`: it forks that process (`forked`), waits for
its mount, runs the command under a container runtime with an overlayfs upper
on tmpfs over the mount (`runtime`), stops the mount (which writes the record)
and returns the command's exit status.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from fusefs.image.backing import ImageBacking
from fusefs.image.catalog import Image, load_record, open_image, save_record
from fusefs.image.forked import ForkedMount
from fusefs.image.record import WINDOW_S, Record, Recorder
from fusefs.image.source import ImageSource
from fusefs.image.toc import LayerError
from fusefs.mount import READ_AHEAD_KB, serve
from fusefs.mountinfo import is_mounted
from fusefs.source import READ_TIMEOUT_S, AgentSource, SourceError
from fusefs.tree import Layer, TreeView, build_tree
from p2p.agentclient import AgentClient
from p2p.origin.oci import RegistryClient, RegistryError
from p2p.origin.oci_ref import ImageRef
from p2p.process import age_seconds
from p2p.progress import totals
from p2p.tracker_client import TrackerClient

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class MountOptions:
    ref: str
    mountpoint: Path
    tracker: str
    api_socket: str
    store_dir: Path
    plain_http: bool = False
    record: bool = False
    window_s: float = WINDOW_S
    prefetch: bool = True
    read_timeout_s: float = READ_TIMEOUT_S
    read_ahead_kb: int = READ_AHEAD_KB
    allow_other: bool = False
    record_missing: bool = False  # record this launch if the image has no record yet
    passthrough: bool = True  # local files read by the kernel (kernelfs; fusefs.image.backing)

    def argv(self) -> list[str]:
        """The `bootseer image serve` command line for these options."""
        args = [sys.executable, "-m", "fusefs.image", "serve", self.ref, str(self.mountpoint),
                "--tracker", self.tracker, "--api-socket", self.api_socket,
                "--store-dir", str(self.store_dir), "--read-timeout", str(self.read_timeout_s),
                "--read-ahead-kb", str(self.read_ahead_kb), "--window", str(self.window_s),
                "--log-level", "INFO"]  # its stderr is the mount's log file
        flags = {"--plain-http": self.plain_http, "--record": self.record,
                 "--no-prefetch": not self.prefetch, "--allow-other": self.allow_other,
                 "--record-missing": self.record_missing,
                 "--no-passthrough": not self.passthrough}
        return args + [flag for flag, on in flags.items() if on]


def _passthrough(opts: MountOptions, image: Image, source: ImageSource,
                 recorder: Recorder | None, hot: list[tuple[str, int]]) -> ImageBacking | None:
    """Backing files for passthrough (`fusefs.image.backing`): plain layers' files once
    their chunks are local, gzip layers' hot files (`hot`: the record's (layer digest,
    chunk)s) decoded. Not while recording: the kernel's reads would not be seen."""
    if not opts.passthrough or recorder is not None:
        return None
    plain = frozenset(la.content_id for la in image.layers if not la.index.compressed)
    gzip = frozenset(la.content_id for la in image.layers if la.index.compressed)
    contents = {la.digest: la.content_id for la in image.layers}
    return ImageBacking(opts.store_dir, source, plain, gzip,
                        frozenset((contents[digest], chunk) for digest, chunk in hot))


def image_tree(image: Image) -> TreeView:
    """The image's merged tree: as `image index` packed it, or (an image indexed before
    trees were packed, or opened from its card) merged here from the layers' members."""
    if image.tree is not None:
        return image.tree
    return build_tree([Layer(layer.digest, layer.index.entries(layer.content_id))
                       for layer in image.layers])


async def serve_image(opts: MountOptions, secret: bytes, ref: ImageRef,
                      on_ready: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """Serve the image until SIGTERM or unmount; what was recorded and prefetched."""
    registry = RegistryClient(plain_http=(ref.registry,) if opts.plain_http else ())
    tracker = TrackerClient(opts.tracker, secret)
    agent = AgentClient(opts.api_socket)
    phases: dict[str, float] = {}
    clock = _Phases(phases)
    try:
        image = await open_image(registry, tracker, agent, ref)
        clock("open_image_s")
        # What the node held of the layers before this mount fetched any of them: a
        # run's bytes from peers and the registry are counted from here (the agent's
        # counts run for as long as it holds the content).
        before = totals(await agent.status(), [la.content_id for la in image.layers])
        wanted = opts.prefetch or opts.record_missing  # else the record is not read at all
        record = await load_record(registry, image) if wanted else None
        if wanted and record is None:
            log.info("no hot-block record for %s yet: everything loads on demand", image.ref)
        recorder = Recorder(image.digest, time.monotonic(), opts.window_s) \
            if opts.record or (opts.record_missing and record is None) else None
        source = ImageSource(AgentSource(opts.store_dir, agent, opts.read_timeout_s), recorder)
        for layer in image.layers:
            source.add_layer(layer.content_id, layer.digest, layer.index)
        hot = await _prefetch(agent, image, record) if opts.prefetch and record else []
        queued = len(hot)
        warming = asyncio.create_task(_warm(source, hot))
        clock("prefetch_queued_s")
        tree = image_tree(image) if image.tree is not None \
            else await asyncio.to_thread(image_tree, image)
        clock("tree_s")

        def ready(info: dict[str, Any]) -> None:
            clock("mount_s")
            on_ready({**info, "image": image.digest, "config": image.config,
                      "layers": [{"digest": la.digest, "content": la.content_id}
                                 for la in image.layers],
                      "prefetch_chunks": queued, "phases": phases, "held_before": before,
                      "tree": "packed" if image.tree is not None else "merged"})
            log.info("serving %s (%d layers, %d nodes) at %s; %d chunks to prefetch; %s",
                     image.ref, len(image.layers), len(tree), info["mountpoint"], queued,
                     phases)

        backing = _passthrough(opts, image, source, recorder, hot)
        try:
            await serve(tree, source, opts.mountpoint, opts.read_ahead_kb, opts.allow_other,
                        ready, whole=backing)
        finally:
            warming.cancel()
        summary: dict[str, Any] = {"image": image.digest, "prefetch_chunks": queued,
                                   "recording": recorder is not None,
                                   "backing": None if backing is None else backing.account()}
        if recorder is not None and len(recorder):
            try:
                merged = await save_record(registry, image, recorder.record())
            except RegistryError as exc:  # a record is a hint: losing one loses no data
                log.warning("the hot-block record of this launch was not saved: %s", exc)
                return summary | {"record_error": str(exc)}
            summary.update(recorded_chunks=len(recorder), record_runs=merged.runs,
                           record_chunks=len(merged.times))
            log.info("recorded %d chunks of %s; the record now has %d from %d launches",
                     len(recorder), image.ref, len(merged.times), merged.runs)
        return summary
    finally:
        await asyncio.gather(registry.close(), tracker.close(), agent.close())


async def _prefetch(agent: AgentClient, image: Image,
                    record: Record) -> list[tuple[str, int]]:
    """Ask the agent for the recorded hot chunks; the record's (layer digest, chunk) list."""
    contents = {layer.digest: layer.content_id for layer in image.layers}
    for digest, chunks in record.by_layer().items():
        if digest in contents:
            await agent.prefetch(contents[digest], chunks)
    return [(digest, chunk) for digest, chunk in record.order() if digest in contents]


async def _warm(source: ImageSource, hot: list[tuple[str, int]]) -> None:
    """Decode the hot spans ahead of the launch; a failure here is only a lost head start
    (the launch's own read of that span reports it)."""
    if not hot:
        return
    try:
        await source.warm(hot)
    except (SourceError, LayerError, TimeoutError) as exc:
        log.warning("stopped decoding ahead of the launch: %s", exc)


# What the serving process says of the hot-block record when it ends (serve_image).
RECORD_KEYS = ("recording", "recorded_chunks", "record_chunks", "record_runs", "record_error")


def launch(opts: MountOptions, secret: bytes, ref: ImageRef, argv: list[str] | None,
           runtime: str, expected: tuple[type[Exception], ...]) -> tuple[int, dict[str, Any]]:
    """`bootseer image run`: mount the image (a forked serving process), run `argv` (or the
    image's own command) in it, stop the mount (which writes the record); (exit status,
    timeline). Call from a process with no event loop and no threads yet: it forks."""
    started, startup = time.monotonic(), age_seconds()
    scratch = Path(tempfile.mkdtemp(prefix="bootseer-run-"))
    opts = replace(opts, mountpoint=scratch / "rootfs")
    opts.mountpoint.mkdir()
    mount = ForkedMount.start(lambda ready: serve_image(opts, secret, ref, ready),
                              opts.mountpoint, scratch / "mount.log", expected)
    try:
        status, timeline = asyncio.run(_run(mount, argv, runtime, started, opts))
        # Before the clock: the interpreter's start, imports and arguments (benchmarks/RESULTS.md).
        return status, {**timeline, "startup_s": None if startup is None else round(startup, 3)}
    finally:
        if not is_mounted(opts.mountpoint):
            shutil.rmtree(scratch, ignore_errors=True)


async def _run(mount: ForkedMount, argv: list[str] | None, runtime: str, started: float,
               opts: MountOptions) -> tuple[int, dict[str, Any]]:
    from fusefs.image.process import image_process
    from fusefs.image.runtime import run_in_rootfs

    try:
        ready = await mount.wait_ready(opts.read_timeout_s + 60.0)
        timeline: dict[str, Any] = {"mounted_s": round(time.monotonic() - started, 3),
                                    "image": ready.get("image"),
                                    "prefetch_chunks": ready.get("prefetch_chunks"),
                                    "mount_phases": ready.get("phases"),
                                    "tree": ready.get("tree"), "server": ready.get("server")}
        config = ready.get("config", {}).get("config") or {}
        process = await asyncio.to_thread(image_process, mount.mountpoint, config, argv)
        status = await run_in_rootfs(mount.mountpoint, process, runtime=runtime)
        timeline["command_s"] = round(time.monotonic() - started, 3)
        async with AgentClient(opts.api_socket, timeout_s=10.0) as agent:
            held = totals(await agent.status(), [la["content"] for la in ready["layers"]])
        before = ready["held_before"]
        timeline |= {key: max(0, held[key] - before[key])  # this run's, not the node's
                     for key in ("peer_bytes", "origin_bytes")}
    finally:
        stopped = await mount.stop(timeout_s=30.0)
        if stopped != 0:
            log.warning("the mount process exited with %d; its log: %s", stopped,
                        mount.log_path)
    timeline["record"] = {key: mount.ended[key] for key in RECORD_KEYS if key in mount.ended}
    timeline["backing"] = mount.ended.get("backing")  # what passthrough served, if any
    timeline["seconds"] = round(time.monotonic() - started, 3)
    return status, timeline


class _Phases:
    """Seconds each phase took, written into `into` under the phase's name."""

    def __init__(self, into: dict[str, float]) -> None:
        self._into = into
        self._last = time.monotonic()

    def __call__(self, name: str) -> None:
        now = time.monotonic()
        self._into[name] = round(now - self._last, 3)
        self._last = now

