"""Serve an image mount: `bootseer image serve`, the serving behind `image mount` and
`image run`.

`serve_image` is the serving of one image mount (a process must not read a
mount it serves, so it runs in a process of its own or in the node's mount
server, never in the launch's): it opens the image (manifest, config, layer
indexes and the merged tree `image index` packed, see `catalog`; an image
indexed before trees were packed has its layers merged here by
`fusefs.tree.build_tree`: whiteouts, opaque directories, hard links), hands
the agent the image's hot-block record as per-layer prefetch lists (lazy: the
agent fetches those chunks in record order, from peers first, and nothing
else), and serves the tree until it is stopped or unmounted. It then asks the
agent what this mount's layers received from peers and from the registry since
it began, and in record mode merges what this launch touched into the stored
record; what it returns says both (`fusefs.image.run` reads it).

`MountOptions` (`options`) is what is asked for; `bootseer image run` is
`fusefs.image.run`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from fusefs.image.backing import ImageBacking
from fusefs.image.catalog import Image, load_record, open_image, save_record
from fusefs.image.options import MountOptions
from fusefs.image.record import Record, Recorder
from fusefs.image.source import ImageSource
from fusefs.image.toc import LayerError
from fusefs.mount import serve
from fusefs.source import AgentSource, SourceError
from fusefs.tree import Layer, TreeView, build_tree
from p2p.agentclient import AgentClient, AgentError
from p2p.origin.oci import RegistryClient, RegistryError
from p2p.origin.oci_ref import ImageRef
from p2p.progress import totals
from p2p.tracker_client import TrackerClient

log = logging.getLogger(__name__)


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
                                   "backing": None if backing is None else backing.account(),
                                   **await _fetched(opts.api_socket, image, before)}
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


async def _fetched(api_socket: str, image: Image, before: dict[str, int]
                   ) -> dict[str, int]:
    """What the image's layers received from peers and from the registry since `before`
    (this mount's, not the node's); {} if the agent cannot say. (A client of its own: the
    mount's closed with its source.)"""
    try:
        async with AgentClient(api_socket, timeout_s=10.0) as agent:
            held = totals(await agent.status(), [la.content_id for la in image.layers])
    except AgentError as exc:
        log.warning("the agent did not say what this mount fetched: %s", exc)
        return {}
    return {key: max(0, held[key] - before[key]) for key in ("peer_bytes", "origin_bytes")}


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


class _Phases:
    """Seconds each phase took, written into `into` under the phase's name."""

    def __init__(self, into: dict[str, float]) -> None:
        self._into = into
        self._last = time.monotonic()

    def __call__(self, name: str) -> None:
        now = time.monotonic()
        self._into[name] = round(now - self._last, 3)
        self._last = now

