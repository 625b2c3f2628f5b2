"""Reads by FUSE passthrough, through a real mount served by a child process.

The mount (`python -m fusefs mount`, as in production) serves a store whose
chunks are all local; this process reads it (a process must not read a mount it
serves). The serving process logs, at unmount, how many opens went to
passthrough and how many READs its handler answered: a file read with zero
handler READs on a fresh mount was read by the kernel from the backing file.
What is proved:

- a content whose whole, verified file is in the store reads back byte for byte
  with no READ reaching the handler;
- a file that is one range of a content (a member of a plain tar layer) is
  served by the handler until its own backing file is built from the verified
  chunks under it, then by passthrough;
- a content with only chunk files is served by the handler first, its whole file
  is built from the verified chunks meanwhile, and the next open is passthrough;
  a large one's first open waits for that build instead, and is passthrough;
- a whole file damaged on disk is never handed to the kernel: the reader gets
  the right bytes (from the chunks, through the handler) and the bad file is
  dropped;
- `--no-passthrough` serves every read by pyfuse3 (the path kept for kernels
  and nodes without passthrough).

The codec (`fusefs.protocol`) is tested without a device: INIT negotiation and
directory entry packing.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from pathlib import Path

import pytest
from helpers.waiting import until

from fusefs import protocol as P
from fusefs.backing import BUILD_AT_OPEN_BYTES, WHOLE_NAME, WholeFiles
from fusefs.mount import Mount
from fusefs.tree import Entry, Extent, Kind, Layer, build_tree
from p2p.content import Manifest, ManifestBuilder
from p2p.store import ChunkStore
from p2p.units import MiB

SIZE = 9 * MiB + 12345  # three 4 MiB chunks, the last one short
PART = (5 * MiB + 7, 100_000)  # an extent inside the content: never passthrough

pytestmark = pytest.mark.usefixtures("fuse_ready")


def make_store(store_dir: Path, size: int = SIZE) -> tuple[Manifest, bytes]:
    data = os.urandom(size)
    builder = ManifestBuilder(4 * MiB)
    builder.feed(data)
    manifest = builder.finish("blob", "file:///nowhere")
    store = ChunkStore(store_dir, 1 << 30)
    store.attach(manifest)
    for index in range(manifest.chunks):
        start = manifest.chunk_offset(index)
        store.put(manifest.content_id, index, data[start:start + manifest.chunk_length(index)])
    return manifest, data


async def mounted(tmp_path: Path, manifest: Manifest, *extra: str) -> Mount:
    whole = (Extent(manifest.content_id, 0, manifest.size),)
    part = (Extent(manifest.content_id, *PART),)
    tree = build_tree([Layer("t", [Entry("whole", Kind.FILE, size=manifest.size, extents=whole),
                                   Entry("again", Kind.FILE, size=manifest.size, extents=whole),
                                   Entry("part", Kind.FILE, size=PART[1], extents=part)])])
    (tmp_path / "tree.json").write_bytes(tree.to_json())
    (tmp_path / "mnt").mkdir(exist_ok=True)
    return await Mount.start(tmp_path / "tree.json", tmp_path / "mnt",
                             str(tmp_path / "no-agent.sock"), tmp_path / "store",
                             tmp_path / "mount.log", *extra)


def read(path: Path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def served(log: Path) -> dict[str, int]:
    """The serving process's own account, logged at unmount."""
    found = re.findall(r"unmounted .*: (\d+) passthrough opens, (\d+) handler opens, (\d+) "
                       r"handler reads of (\d+) bytes", log.read_text())
    assert found, f"no passthrough account in the mount's log:\n{log.read_text()[-1500:]}"
    keys = ("passthrough_opens", "handler_opens", "handler_reads", "handler_bytes")
    return dict(zip(keys, map(int, found[-1]), strict=True))


async def test_a_whole_verified_content_is_read_by_the_kernel_not_the_handler(
        tmp_path: Path) -> None:
    manifest, data = make_store(tmp_path / "store")
    assert WholeFiles(tmp_path / "store").build(manifest)
    async with await mounted(tmp_path, manifest) as mount:
        assert mount.ready["server"] == "kernel" and mount.ready["passthrough"] is True
        assert read(mount.mountpoint / "whole") == data
        assert read(mount.mountpoint / "again") == data
    account = served(tmp_path / "mount.log")
    assert account["passthrough_opens"] == 2 and account["handler_reads"] == 0, account

    async with await mounted(tmp_path, manifest) as mount:
        assert read(mount.mountpoint / "part") == data[PART[0]:PART[0] + PART[1]]
    account = served(tmp_path / "mount.log")
    assert account["handler_opens"] == 1 and account["handler_reads"] > 0, account


async def test_chunks_only_are_served_by_the_handler_until_the_whole_file_is_built(
        tmp_path: Path) -> None:
    manifest, data = make_store(tmp_path / "store")
    whole_file = tmp_path / "store" / manifest.content_id / WHOLE_NAME
    async with await mounted(tmp_path, manifest) as mount:
        assert read(mount.mountpoint / "whole") == data

        async def built() -> bool:
            return whole_file.exists()
        await until(built, "the whole file is built from the verified chunks")
        assert read(mount.mountpoint / "again") == data
    account = served(tmp_path / "mount.log")
    assert account["handler_opens"] == 1 and account["passthrough_opens"] == 1, account
    assert account["handler_bytes"] >= SIZE  # the first reader's bytes, and only those
    assert whole_file.read_bytes() == data


async def test_a_large_file_with_its_chunks_local_waits_for_its_build_at_its_first_open(
        tmp_path: Path) -> None:
    """The first read after a prefetch: every chunk local, no whole file yet. A file of
    BUILD_AT_OPEN_BYTES or more is built and checked while its first open waits, so
    even that first read is the kernel's; one build serves concurrent opens."""
    manifest, data = make_store(tmp_path / "store", BUILD_AT_OPEN_BYTES + 12345)
    whole_file = tmp_path / "store" / manifest.content_id / WHOLE_NAME
    async with await mounted(tmp_path, manifest) as mount:
        both = await asyncio.gather(asyncio.to_thread(read, mount.mountpoint / "whole"),
                                    asyncio.to_thread(read, mount.mountpoint / "again"))
        assert both == [data, data]
    account = served(tmp_path / "mount.log")
    assert account["passthrough_opens"] == 2 and account["handler_reads"] == 0, account
    assert "1 whole files built" in (tmp_path / "mount.log").read_text()
    assert whole_file.read_bytes() == data


async def test_a_range_of_a_content_gets_a_backing_file_of_its_own(tmp_path: Path) -> None:
    manifest, data = make_store(tmp_path / "store")
    expected = data[PART[0]:PART[0] + PART[1]]
    backing = WholeFiles(tmp_path / "store").path(manifest.content_id, *PART)
    async with await mounted(tmp_path, manifest) as mount:
        assert read(mount.mountpoint / "part") == expected

        async def built() -> bool:
            return backing.exists()
        await until(built, "the range's backing file is built from the verified chunks")
    assert backing.read_bytes() == expected
    async with await mounted(tmp_path, manifest) as mount:  # a new process checks it first
        assert read(mount.mountpoint / "part") == expected
    account = served(tmp_path / "mount.log")
    assert account["passthrough_opens"] == 1 and account["handler_reads"] == 0, account


async def test_a_damaged_whole_file_is_never_handed_to_the_kernel(tmp_path: Path) -> None:
    manifest, data = make_store(tmp_path / "store")
    assert WholeFiles(tmp_path / "store").build(manifest)
    whole_file = tmp_path / "store" / manifest.content_id / WHOLE_NAME
    whole_file.chmod(0o644)
    with open(whole_file, "r+b") as f:  # the disk lies: same size, other bytes
        f.seek(4 * MiB + 99)
        f.write(b"\0" * 16)
    async with await mounted(tmp_path, manifest) as mount:
        assert read(mount.mountpoint / "whole") == data
    account = served(tmp_path / "mount.log")
    assert account["passthrough_opens"] == 0 and account["handler_reads"] > 0, account
    assert "fails its check" in (tmp_path / "mount.log").read_text()


def requests(log: Path) -> dict[str, int]:
    """Requests by opcode, from the kernel-protocol server's account at unmount."""
    found = re.findall(r"requests (\{.*\})", log.read_text())
    assert found, f"no request account in the mount's log:\n{log.read_text()[-1500:]}"
    return {op: n for op, (n, _) in json.loads(found[-1]).items()}


async def test_no_open_reads_every_file_with_no_open_or_release_round_trip(
        tmp_path: Path) -> None:
    manifest, data = make_store(tmp_path / "store")
    async with await mounted(tmp_path, manifest, "--no-open") as mount:
        assert mount.ready["server"] == "kernel" and mount.ready["no_open"] is True
        assert sorted(os.listdir(mount.mountpoint)) == ["again", "part", "whole"]
        assert sorted(os.listdir(mount.mountpoint)) == ["again", "part", "whole"]
        for _ in range(3):
            assert read(mount.mountpoint / "whole") == data
            assert read(mount.mountpoint / "part") == data[PART[0]:PART[0] + PART[1]]
        with pytest.raises(OSError):
            os.close(os.open(mount.mountpoint / "whole", os.O_RDWR))
    got = requests(tmp_path / "mount.log")
    # The first open is answered ENOSYS; the kernel opens every later file, and every
    # directory, by itself, and asks for no FLUSH after the first close. The listing
    # (READDIRPLUS) gave the kernel every entry: no name was looked up after it.
    assert got.get("OPEN") == 1 and got.get("OPENDIR") == 1, got
    assert "RELEASE" not in got and "RELEASEDIR" not in got and got.get("FLUSH", 0) <= 1, got
    assert got["READDIRPLUS"] >= 1 and "LOOKUP" not in got, got
    assert got["READ"] > 0, got


async def test_no_passthrough_serves_every_read_by_pyfuse3(tmp_path: Path) -> None:
    manifest, data = make_store(tmp_path / "store")
    assert WholeFiles(tmp_path / "store").build(manifest)
    async with await mounted(tmp_path, manifest, "--no-passthrough") as mount:
        assert mount.ready["server"] == "pyfuse3" and mount.ready["passthrough"] is False
        assert read(mount.mountpoint / "whole") == data


# ---- the codec, no device -------------------------------------------------------------


def offer(flags: int, minor: int = 41) -> P.InitIn:
    return P.InitIn(7, minor, 128 * 1024, flags)


def test_no_open_is_asked_for_only_without_passthrough_and_when_offered() -> None:
    both = P.NO_OPEN_SUPPORT | P.NO_OPENDIR_SUPPORT
    assert P.negotiate(offer(both | P.PASSTHROUGH), False, want_no_open=True).no_open
    assert not P.negotiate(offer(both), False).no_open
    assert not P.negotiate(offer(both | P.PASSTHROUGH), True, want_no_open=True).no_open
    assert not P.negotiate(offer(P.NO_OPEN_SUPPORT), False, want_no_open=True).no_open


def test_passthrough_is_taken_only_when_offered_and_wanted() -> None:
    everything = (1 << 64) - 1
    on = P.negotiate(offer(everything), want_passthrough=True)
    assert on.passthrough and on.flags & P.PASSTHROUGH and on.minor == P.OUR_MINOR
    assert not P.negotiate(offer(everything), want_passthrough=False).passthrough
    old = P.negotiate(offer(everything & ~P.PASSTHROUGH, minor=38), want_passthrough=True)
    assert not old.passthrough and old.minor == 38
    reply = P.init_out(on)
    assert len(reply) == 64 and int.from_bytes(reply[36:40], "little") == 1  # stack depth
    assert int.from_bytes(reply[32:36], "little") == P.PASSTHROUGH >> 32
    with pytest.raises(P.ProtocolError):
        P.negotiate(offer(everything, minor=20), want_passthrough=True)


def test_dirents_stop_before_the_callers_buffer_overflows() -> None:
    entries = [(b"a" * n, n, 0o100644, n) for n in range(1, 30)]
    packed = P.dirents(entries, 100)
    assert len(packed) <= 100 and len(packed) % 8 == 0
    ino, next_off, namelen, kind = P.DIRENT_HEAD.unpack_from(packed)
    assert (ino, next_off, namelen, kind) == (1, 1, 1, 8)


def test_a_backing_file_is_not_built_from_a_damaged_chunk(tmp_path: Path) -> None:
    manifest, _ = make_store(tmp_path / "store")
    chunk = tmp_path / "store" / manifest.content_id / "1.chunk"
    with open(chunk, "r+b") as f:
        f.seek(77)
        f.write(b"\xff" * 8)
    whole = WholeFiles(tmp_path / "store")
    assert not whole.build(manifest)
    assert not whole.build(manifest, *PART)  # the range lies in chunk 1
    assert whole.build(manifest, 0, 4 * MiB)  # chunk 0 alone is fine
    leftovers = {p.name for p in (tmp_path / "store" / manifest.content_id).iterdir()}
    assert not {n for n in leftovers if n.endswith(".tmp")} and WHOLE_NAME not in leftovers
    fd = whole.open_verified(manifest, 0, 4 * MiB)
    assert fd is not None
    os.close(fd)


def test_a_kernel_before_6_9_is_told_apart_before_anything_is_mounted() -> None:
    from fusefs.kernelmount import kernel_supports_passthrough

    assert "6.9" in (kernel_supports_passthrough("6.1.0-28-amd64") or "")
    assert kernel_supports_passthrough("6.18.44-fc-v669") is None  # root here
