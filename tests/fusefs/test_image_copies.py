"""Hot files of gzip image layers read by FUSE passthrough, from decoded copies.

A real registry, two agents, a recorded launch on the first; the second mounts
the image (`bootseer image serve`, a child process), prefetches the record's
chunks from the first and decodes the hot spans ahead. What is proved:

- a hot file of a gzip layer is opened in passthrough against a decoded copy
  in the store, its bytes are the layer's, and no READ reaches the handler;
- a copy damaged on disk between two mounts is never handed to the kernel: the
  next mount reads the layer's bytes, and (opened before the warm-up is waited
  for: a file the record holds whole is decoded at its open) by passthrough
  from the copy written again.
"""

from __future__ import annotations

import asyncio
import random
import re
from pathlib import Path

from helpers.registry import RunningRegistry
from helpers.waiting import until
from test_image import (
    TEST_BOUND_S,
    agent_flags,
    base_layer,
    bootseer,
    cluster_of,
    data_layer,
    index,
    make_image,
    mounted,
    push,
    tree_layer,
)

from fusefs.bench.readpath import account
from fusefs.mount import Mount

NOISE = random.Random(7).randbytes(300_000)  # /srv/noise.bin of `tree_layer`, a gzip layer


async def warmed(mount: Mount) -> None:
    async def decoded() -> bool:
        return re.search(r"decoded [1-9]\d* spans", mount.log_path.read_text()) is not None

    await until(decoded, "the mount decoded the hot spans ahead of the launch")


async def test_a_hot_file_of_a_gzip_layer_is_read_by_passthrough_from_a_checked_copy(
        fuse_ready: None, registry: RunningRegistry, tmp_path: Path) -> None:
    ref = await push(registry, "test/copies",
                     make_image([base_layer(), tree_layer()], plain=(data_layer(),)))
    async with asyncio.timeout(TEST_BOUND_S), cluster_of(tmp_path, 2) as (cluster, agents):
        tree_content = (await index(cluster, ref, agents[0]))[1]["content"]
        await bootseer(cluster, "image", "run", *agent_flags(cluster, agents[0]), "--record",
                       ref, "--", "sh", "-c", "cat /srv/noise.bin > /dev/null")
        layer_dir = agents[1].store_dir / str(tree_content)
        async with mounted(cluster, agents[1], ref, tmp_path / "mnt") as mount:
            assert mount.ready["server"] == "kernel", mount.ready
            await warmed(mount)
            got = await asyncio.to_thread((mount.mountpoint / "srv/noise.bin").read_bytes)
            assert got == NOISE
        [copy] = layer_dir.glob("tar-*.whole")
        assert copy.read_bytes() == NOISE
        first = account(mount.log_path)
        assert first is not None and first["passthrough_opens"] == 1, first
        assert first["handler_reads"] == 0, first

        with open(copy, "r+b") as f:  # root writes a read-only file: a disk that lies
            f.write(b"\0" * 4096)
        damaged = copy.stat()
        async with mounted(cluster, agents[1], ref, tmp_path / "mnt2") as mount:
            # Not waiting for the warm-up: a file the record holds whole gets its copy at
            # its open, which decodes it then.
            got = await asyncio.to_thread((mount.mountpoint / "srv/noise.bin").read_bytes)
            assert got == NOISE
        assert copy.read_bytes() == NOISE and copy.stat().st_ino != damaged.st_ino
        second = account(mount.log_path)
        assert second is not None and second["passthrough_opens"] == 1, second
