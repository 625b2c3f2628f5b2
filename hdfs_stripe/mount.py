"""Checkpoints through the swarm: resolve HDFS paths to contents, read them with
read-ahead, and serve them read-only over FUSE.

`open_files` walks an `hdfs://` URI (a file, or a directory recursively), and
resolves every file to a content (`index.resolve`: found by name, or indexed by
this node as the first reader). `ckpt_tree` turns the result into a
`fusefs.tree.Tree`: one file per HDFS file, read-only, with the HDFS mtime, its
bytes one extent of its content.

`StripeSource` is the bytes side, shared by the mount and `hdfs_stripe.open`:
`fusefs.source.AgentSource` (verified stripes straight from the agent's store
files; missing ones through the agent, which gets them from peers or HDFS) plus
read-ahead: a sequential reader's next stripes are handed to the agent as a
prefetch list (`stripe.ReadAhead` decides how many), so they are on their way,
from peers or from several DataNodes at once, before they are read.

A file whose stripes are all in the store is read by FUSE passthrough where the
node allows it (`fusefs.kernelfs`: the kernel reads a whole-file copy written from
verified stripes, no READ reaches this process); the others through the handler,
with read-ahead, until their content is whole.

`serve_ckpt` is the serving process of `bootseer ckpt mount` (a process of its
own: a pyfuse3 process must not read its own mount); `bootseer ckpt mount` starts
it detached (`fusefs.mount.start_detached`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fusefs.backing import WholeFiles
from fusefs.mount import READ_AHEAD_KB, serve
from fusefs.readbound import READ_TIMEOUT_S
from fusefs.source import AgentSource, Buffer
from fusefs.tree import Entry, Extent, Kind, Layer, Tree, build_tree
from hdfs_stripe.index import Attach, Resolved, resolve
from hdfs_stripe.naming import HdfsUri, parse_uri
from hdfs_stripe.origin import webhdfs_for
from hdfs_stripe.reader import StripeReader
from hdfs_stripe.stripe import ReadAhead
from hdfs_stripe.webhdfs import FileStatus
from p2p.agentclient import AgentClient, AgentError
from p2p.chunkfile import CHUNK_SUFFIX
from p2p.content import ContentId
from p2p.tracker_client import TrackerClient

log = logging.getLogger(__name__)
READY_SLACK_S = 600.0  # indexing a file no node has read yet happens before it serves
READ_AHEAD_STRIPES = 16  # 128 MiB at 8 MiB stripes


@dataclass(frozen=True, slots=True)
class CkptFile:
    path: str  # relative to the mount's root
    status: FileStatus
    resolved: Resolved | None  # None for an empty file (no content)


async def walk(reader: StripeReader, uri: HdfsUri) -> list[tuple[str, FileStatus]]:
    """Files under `uri` as (path relative to it, status); a file is its own name."""
    top = await reader.hdfs.status(uri.path)
    if top.type == "FILE":
        return [(uri.path.rstrip("/").rsplit("/", 1)[-1], top)]
    out: list[tuple[str, FileStatus]] = []
    pending = [""]
    while pending:
        rel = pending.pop()
        for status in await reader.hdfs.listdir(f"{uri.path.rstrip('/')}/{rel}".rstrip("/")):
            name = f"{rel}/{status.path.rsplit('/', 1)[-1]}".lstrip("/")
            if status.type == "DIRECTORY":
                pending.append(name)
            else:
                out.append((name, status))
    return sorted(out, key=lambda item: item[0])


async def open_files(reader: StripeReader, tracker: TrackerClient, uri: HdfsUri,
                     store_dir: Path | None, agent: AgentClient | None) -> list[CkptFile]:
    """Every file under `uri`, resolved; a file this node indexes is attached to `agent`
    (which then serves its stripes to the other readers)."""
    attach = attached_by(agent) if agent is not None else None
    files = []
    for rel, status in await walk(reader, uri):
        target = uri if status.path == uri.path else uri.child(status.path)
        resolved = await resolve(reader, tracker, target, store_dir, attach=attach) \
            if status.length else None
        files.append(CkptFile(rel, status, resolved))
    return files


def attached_by(agent: AgentClient) -> Attach:
    """Attach a content to the agent (lazily: its stripes in the store are verified and
    announced, nothing is fetched)."""
    async def attach(content: ContentId) -> None:
        await agent.prefetch(content, [])
    return attach


def ckpt_tree(files: list[CkptFile]) -> Tree:
    entries = []
    for f in files:
        extents = (Extent(f.resolved.content_id, 0, f.status.length),) if f.resolved else ()
        entries.append(Entry(f.path, Kind.FILE, mode=0o444,
                             mtime_ns=f.status.modification_time_ms * 1_000_000,
                             size=f.status.length, extents=extents))
    return build_tree([Layer("hdfs", entries)])


class StripeSource:
    """`AgentSource` plus read-ahead for sequential readers (see the module docstring)."""

    def __init__(self, inner: AgentSource, max_stripes: int = READ_AHEAD_STRIPES) -> None:
        self.inner = inner
        self.max_stripes = max_stripes
        self._ahead: dict[str, ReadAhead] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    async def read(self, content: str, offset: int, length: int) -> Buffer:
        manifest = await self.inner.manifest(content)
        ahead = self._ahead.get(content)
        if ahead is None:
            ahead = self._ahead[content] = ReadAhead(manifest.chunks,
                                                     max_stripes=self.max_stripes)
        # Each stripe is handed over once (ReadAhead remembers), and only if its file is not
        # in the store yet: otherwise a reader of stripes the agent holds made a local-API
        # call per stripe (128 per GiB), work for two processes on the reader's cores.
        wanted = [i for i in ahead.on_read(offset, length, manifest.chunk_size)
                  if not self._held(content, i)]
        if wanted:
            task = asyncio.create_task(self._prefetch(content, wanted))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return await self.inner.read(content, offset, length)

    def _held(self, content: str, index: int) -> bool:
        return (self.inner.store_dir / content / f"{index}{CHUNK_SUFFIX}").exists()

    async def _prefetch(self, content: str, chunks: list[int]) -> None:
        try:
            await self.inner.client.prefetch(content, chunks)
        except AgentError as exc:  # a hint only: the read itself reports real failures
            log.warning("read-ahead of %s failed: %s", content, exc)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.inner.close()


@dataclass(frozen=True, slots=True)
class MountOptions:
    uri: str
    mountpoint: Path
    tracker: str
    api_socket: str
    store_dir: Path
    read_timeout_s: float = READ_TIMEOUT_S
    read_ahead_kb: int = READ_AHEAD_KB
    allow_other: bool = False
    passthrough: bool = True  # whole, verified files read by the kernel (fusefs.kernelfs)
    summary: Path | None = None  # where the serving writes what it reports at its end

    def argv(self) -> list[str]:
        """The `bootseer ckpt serve` command line for these options."""
        args = [sys.executable, "-m", "hdfs_stripe", "serve", self.uri, str(self.mountpoint),
                "--tracker", self.tracker, "--api-socket", self.api_socket,
                "--store-dir", str(self.store_dir), "--read-timeout", str(self.read_timeout_s),
                "--read-ahead-kb", str(self.read_ahead_kb)]
        return args + (["--allow-other"] if self.allow_other else []) + \
            ([] if self.passthrough else ["--no-passthrough"]) + \
            (["--summary", str(self.summary)] if self.summary else [])


async def serve_ckpt(opts: MountOptions, secret: bytes,
                     on_ready: Callable[[dict[str, Any]], None],
                     env: Mapping[str, str] = os.environ) -> dict[str, Any]:
    """Resolve the URI's files, then serve them until stopped or unmounted; the URI and its
    files' count. `env`: the mount command's environment (the HDFS user and token), where
    a mount server serves it in a process of its own."""
    uri = parse_uri(opts.uri)
    reader = StripeReader(webhdfs_for(uri, env=env))
    agent = AgentClient(opts.api_socket)
    try:
        async with TrackerClient(opts.tracker, secret) as tracker:
            files = await open_files(reader, tracker, uri, opts.store_dir, agent)
    except BaseException:
        await agent.close()
        raise
    finally:
        await reader.close()
    tree = await asyncio.to_thread(ckpt_tree, files)
    source = StripeSource(AgentSource(opts.store_dir, agent, opts.read_timeout_s))

    def ready(info: dict[str, Any]) -> None:
        on_ready({**info, "files": [
            {"path": f.path, "size": f.status.length,
             "content": f.resolved.content_id if f.resolved else None,
             "indexed": bool(f.resolved and f.resolved.indexed)} for f in files]})

    whole = WholeFiles(opts.store_dir) if opts.passthrough else None
    await serve(tree, source, opts.mountpoint, opts.read_ahead_kb, opts.allow_other, ready,
                whole=whole)
    return {"uri": opts.uri, "files": len(files)}

