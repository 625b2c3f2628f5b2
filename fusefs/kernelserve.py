"""A kernel-protocol mount's life: mount, serve (`fusefs.kernelfs.KernelFS`), unmount.

`serve_kernel` opens the device and mounts (or, in a mount server's host that
kept the device of a mount whose host died, serves that device again:
`fusefs.kept`), says when the mount is ready, and at the end unmounts, closes
the device and the source, and logs the mount's account: the opens that went
to passthrough and to the handler, the READs the handler answered, the
requests by opcode. The benches read that line (`fusefs.bench.readpath`).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from typing import Any

from fusefs.kept import KeptDevice, OpenJournal
from fusefs.kernelfs import Backing, KernelFS
from fusefs.kernelmount import PassthroughUnavailable, mount_device, unmount
from fusefs.mountstop import mount_server, stopped_by
from fusefs.source import Source
from fusefs.tree import TreeView

log = logging.getLogger(__name__)


async def serve_kernel(tree: TreeView, source: Source, backing: Backing | None, path: str,
                       read_ahead_kb: int, allow_other: bool,
                       on_ready: Callable[[dict[str, Any]], None] | None) -> None:
    """Mount at `path`, serve until stopped (`fusefs.mountstop.stopped_by`: SIGTERM/SIGINT, or
    the mount server's stop of this mount) or unmounted, then unmount and close
    `source`. With a `backing`, files it has are read by passthrough; without one, the
    mount asks for no-open (every read through the handler, no OPEN or RELEASE round
    trips). PassthroughUnavailable, with nothing mounted and `source` still open, if
    this node cannot (no privilege, or, with a backing, the kernel did not take
    passthrough at INIT): the caller serves another way."""
    from fusefs.mountinfo import set_read_ahead

    server = mount_server.get()
    kept = server.kept() if server is not None else None
    journal: OpenJournal | None
    if kept is not None:  # served before, by a host that died: the same device
        fd, journal = kept.fd, kept.journal
    else:
        fd = mount_device(path, allow_other)
        journal = OpenJournal.create() if server is not None else None
    fs = KernelFS(tree, source, backing, fd, path, journal=journal)
    if kept is not None:
        fs.adopt(kept.state)
    refused: list[str] = []

    def initialised() -> None:
        if kept is None and backing is not None and not fs.passthrough:
            refused.append("the kernel did not take FUSE passthrough at INIT")
            fs.stop()
            return
        if server is not None and kept is None and journal is not None:
            server.keep(KeptDevice(fd, journal, {**fs.negotiated(), "mountpoint": path}))
        if on_ready is not None:
            on_ready({"mountpoint": path, "read_ahead_kb": set_read_ahead(path, read_ahead_kb),
                      "server": "kernel", "passthrough": fs.passthrough,
                      "no_open": fs.no_open, "resumed": kept is not None})

    try:
        with stopped_by(fs.stop):
            await fs.serve(initialised, resumed=kept is not None)
    finally:
        unmount(path)
        os.close(fd)
        if journal is not None:
            journal.close()
        if not refused:
            await source.close()
    if refused:
        raise PassthroughUnavailable(refused[0])
    log.info("unmounted %s: %d passthrough opens, %d handler opens, %d handler reads of %d "
             "bytes, %d failed, %d whole files built, %d backing files checked; requests %s",
             path, fs.passthrough_opens, fs.handler_opens, fs.reads, fs.read_bytes,
             fs.failed_reads, 0 if backing is None else backing.built,
             0 if backing is None else backing.checked, json.dumps(fs.account()))
