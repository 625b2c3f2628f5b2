"""Hot-frame records: a mount records the frames it reads, later mounts prefetch them.

The integration tests run the real thing (`test_depsnap`'s swarm: tracker, HTTP
origin, agents, `depsnap serve` over FUSE, real numpy wheels): the first mount
of a key writes `hot/<key>.json` into the origin directory; a mount of the same
key on a fresh agent has that agent fetch exactly the recorded chunks before
anything is read from it; a corrupt, foreign or hostile record is ignored with
a warning in the mount's log, the mount works, and it records a good one in its
place. The unit tests check the record's plan, its checks and its storage.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from helpers.waiting import until
from test_depsnap import Node, add_node, depsnap, install_args, pack_bytes_held, swarm

from depsnap.capture import PACK_CHUNK_BYTES
from depsnap.hot import (
    MAX_HOT_BYTES,
    HotRecord,
    chunk_plan,
    frames_of,
    hot_path,
    load_hot,
    save_hot,
)
from depsnap.mount import MountOptions
from depsnap.snapshot import Member, Pack, Snapshot
from fusefs.mount import Mount
from fusefs.record import RecordError

KEY = "a" * 64
IMPORT = "import numpy; print(numpy.ones(3).sum())"


# ---- the record, its plan and its storage (no mounts) -------------------------------------


def pack(content: str, frames: tuple[int, ...]) -> Pack:
    size = (len(frames) - 1) * 1024 + 10
    return Pack("unit", content, size, (Member("d", 0, size),), 1024, frames)


P1, P2 = pack("c1-" + "1" * 64, (300, 300, 300, 300)), pack("c1-" + "2" * 64, (700, 700))


def test_the_plan_lists_each_chunk_under_the_frames_once_in_their_order() -> None:
    # With 512-byte chunks: P1's frames (300 stored bytes each) 2, 0, 1 lie in chunks
    # 1, 0, 0-1; P2's (700 each) 1, 0 in chunks 1-2, 0-1.
    frames = [(P2, 1), (P1, 2), (P1, 0), (P1, 1), (P2, 0)]
    plan = chunk_plan(frames, {P1.content: 512, P2.content: 512})
    assert list(plan) == [P2.content, P1.content]  # packs by their first frame
    assert plan == {P2.content: [1, 2, 0], P1.content: [1, 0]}


def test_a_record_naming_what_the_snapshot_does_not_have_is_refused() -> None:
    snapshot = _snapshot_stub(KEY, (P1, P2))
    good = HotRecord(KEY, 1, {(P1.content, 3): (0.1,), (P2.content, 0): (0.0,)})
    assert frames_of(good, snapshot) == [(P2, 0), (P1, 3)]  # by first access
    for bad in (HotRecord(KEY, 1, {(P1.content, 4): (0.0,)}),  # past the last frame
                HotRecord(KEY, 1, {("c1-" + "3" * 64, 0): (0.0,)}),  # not its pack
                HotRecord("b" * 64, 1, {(P1.content, 0): (0.0,)})):  # another key's
        with pytest.raises(RecordError):
            frames_of(bad, snapshot)


def _snapshot_stub(key: str, packs: tuple[Pack, ...]) -> Snapshot:
    """A Snapshot without its checks: `frames_of` reads only `key` and `packs`."""
    stub = object.__new__(Snapshot)
    object.__setattr__(stub, "key", key)
    object.__setattr__(stub, "packs", packs)
    return stub


def test_saved_records_merge_and_a_broken_one_is_replaced(tmp_path: Path) -> None:
    snapshot = _snapshot_stub(KEY, (P1, P2))
    first = HotRecord(KEY, 1, {(P1.content, 0): (0.5,)})
    assert save_hot(tmp_path, first, snapshot) == first
    merged = save_hot(tmp_path, HotRecord(KEY, 1, {(P1.content, 1): (0.1,)}), snapshot)
    assert merged.runs == 2 and merged.order() == [(P1.content, 1), (P1.content, 0)]
    for broken in (b"{broken", HotRecord(KEY, 1, {(P1.content, 9): (0.0,)}).to_bytes()):
        (tmp_path / hot_path(KEY)).write_bytes(broken)
        assert save_hot(tmp_path, first, snapshot) == first
        assert HotRecord.from_bytes((tmp_path / hot_path(KEY)).read_bytes()) == first
    assert not [p for p in (tmp_path / "hot").iterdir() if p.name.startswith(".")]


async def test_loading_ignores_missing_foreign_broken_and_oversized_records(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    url = f"file://{tmp_path}"
    assert await load_hot(url, KEY) is None  # none there: no warning
    assert not caplog.records
    record = HotRecord(KEY, 1, {(P1.content, 0): (0.0,)})
    (tmp_path / "hot").mkdir()
    where = tmp_path / hot_path(KEY)
    where.write_bytes(record.to_bytes())
    assert await load_hot(url, KEY) == record
    for bad, why in ((HotRecord("b" * 64, 1, {}).to_bytes(), "not " + KEY),
                     (b"\x00" * 10, "not JSON"),
                     (b" " * (MAX_HOT_BYTES + 1), "larger than")):
        where.write_bytes(bad)
        caplog.clear()
        assert await load_hot(url, KEY) is None
        assert any("ignoring the hot-frame record" in r.getMessage() and why in r.getMessage()
                   for r in caplog.records), caplog.text


# ---- mounts on real agents ------------------------------------------------------------------


async def test_a_recorded_mount_makes_the_next_mount_prefetch_its_chunks(
        tmp_path: Path, wheels: Path) -> None:
    async with swarm(tmp_path, 3) as (_, (a, b, c)):
        status, created, err = await depsnap(
            a, *install_args(tmp_path / "venv", wheels, "numpy==2.2.6"), cwd=tmp_path)
        assert status == 0, err
        key, origin = created["key"], tmp_path / "snapshots"
        snapshot = Snapshot.from_json((origin / "trees" / created["tree"]).read_bytes())

        # The first mount records for 5 s and saves its record then, still mounted.
        async def saved() -> bool:
            return (origin / hot_path(key)).exists()

        ready = await mount_and_import(b, key, tmp_path / "first", window_s=5.0, then=saved)
        assert (ready["recording"], ready["hot_frames"], ready["prefetch_chunks"]) == (
            True, 0, 0)
        record = HotRecord.from_bytes((origin / hot_path(key)).read_bytes())
        frames = frames_of(record, snapshot)
        assert record.runs == 1 and frames
        plan = chunk_plan(frames, {p.content: PACK_CHUNK_BYTES for p in snapshot.packs})

        # A fresh agent: the mount hands it the recorded chunks before anything is read.
        mountpoint = tmp_path / "second"
        mountpoint.mkdir()
        async with await Mount.spawn(_options(c, key, mountpoint, passthrough=True).argv(),
                                     mountpoint, tmp_path / "second.log", env=c.env) as mount:
            assert not mount.ready["recording"] and mount.ready["tree_kind"] == "packed"
            # The mount serves without waiting for the prefetch's round trips: its count is
            # in the "mounted" line if it had asked by then, else in its last words.
            assert mount.ready["prefetch_chunks"] in (None, sum(map(len, plan.values())))

            async def fetched() -> bool:
                return await _chunks_held(c, list(plan)) == {k: len(v) for k, v in plan.items()}

            await until(fetched, "the recorded chunks reach the second mount's agent")
            packs = [p.content for p in snapshot.packs]
            assert await _chunks_wanted(c, packs) == {k: len(v) for k, v in plan.items()}
            await _import(mountpoint)
        said = re.findall(r"'prefetch_chunks': (\d+)", (tmp_path / "second.log").read_text())
        assert said and int(said[-1]) == sum(map(len, plan.values())), said


async def test_a_recorded_key_mounts_with_its_big_files_read_by_the_kernel(
        tmp_path: Path, wheels: Path) -> None:
    """With --passthrough, after a recorded mount, a mount on a fresh agent writes decoded,
    checked copies of the files the record holds whole (numpy's shared libraries) and the
    kernel reads them by passthrough; a copy the disk changed is never handed to the
    kernel: the reader gets the snapshot's bytes from the handler, and the copy is written
    again."""
    from fusefs.bench.readpath import account

    async with swarm(tmp_path, 3) as (_, (a, b, c)):
        status, created, err = await depsnap(
            a, *install_args(tmp_path / "venv", wheels, "numpy==2.2.6"), cwd=tmp_path)
        assert status == 0, err
        key, origin = created["key"], tmp_path / "snapshots"
        snapshot = Snapshot.from_json((origin / "trees" / created["tree"]).read_bytes())

        async def saved() -> bool:
            return (origin / hot_path(key)).exists()

        await mount_and_import(b, key, tmp_path / "first", window_s=5.0, then=saved)

        def copies() -> list[Path]:
            return sorted(c.agent.store_dir.glob("*/member-*.whole"))

        async def copied() -> bool:
            return len(copies()) >= 3

        mountpoint = tmp_path / "second"
        mountpoint.mkdir()
        async with await Mount.spawn(_options(c, key, mountpoint, passthrough=True).argv(),
                                     mountpoint, tmp_path / "second.log", env=c.env) as mount:
            assert (mount.ready["server"], mount.ready["passthrough"]) == ("kernel", True)
            await _import(mountpoint)
            await until(copied, "decoded copies of the recorded big files are written")
        biggest = max(copies(), key=lambda p: p.stat().st_size)
        offset = int(biggest.name.split("-")[1])
        member = next(m for p in snapshot.packs for m in p.members
                      if p.content == biggest.parent.name and m.offset == offset)
        rel = next(e.path for e in snapshot.entries if e.kind == "file"
                   and e.digest == member.digest)
        original = (tmp_path / "venv" / rel).read_bytes()
        assert biggest.read_bytes() == original and len(original) > 1 << 20

        biggest.chmod(0o644)
        with open(biggest, "r+b") as f:  # the disk lies: same size, other bytes
            f.write(b"\0" * 4096)
        log = tmp_path / "third.log"
        mountpoint = tmp_path / "third"
        mountpoint.mkdir()
        async with await Mount.spawn(_options(c, key, mountpoint, passthrough=True).argv(),
                                     mountpoint, log, env=c.env):
            assert await asyncio.to_thread((mountpoint / rel).read_bytes) == original
            await _import(mountpoint)

            async def rewritten() -> bool:
                return biggest.exists() and biggest.read_bytes() == original

            await until(rewritten, "the damaged copy is written again from verified bytes")
            assert await asyncio.to_thread((mountpoint / rel).read_bytes) == original
        got = account(log)
        assert got is not None and got["passthrough_opens"] > 0, log.read_text()[-2000:]
        assert "fails its check" in log.read_text()


async def test_a_bad_record_is_ignored_with_a_warning_and_replaced(
        tmp_path: Path, wheels: Path) -> None:
    origin = tmp_path / "snapshots"
    origin.mkdir()
    async with swarm(tmp_path, 1, origin) as (cluster, (a,)):
        status, created, err = await depsnap(
            a, *install_args(tmp_path / "venv", wheels, "numpy==2.2.6"), cwd=tmp_path)
        assert status == 0, err
        key = created["key"]
        snapshot = Snapshot.from_json((origin / "trees" / created["tree"]).read_bytes())
        big = max(snapshot.packs, key=lambda p: len(p.frames))
        hostile = {
            "corrupt": b'{"version": 1, "key": "' + key.encode() + b'", "frames": [[',
            "foreign": HotRecord("0" * 64, 1, {(big.content, 0): (0.0,)}).to_bytes(),
            "out of range": HotRecord(key, 1, {(big.content, len(big.frames)): (0.0,)}
                                      ).to_bytes(),
        }
        (origin / "hot").mkdir()
        for i, (name, data) in enumerate(hostile.items(), start=1):
            (origin / hot_path(key)).write_bytes(data)
            node = await add_node(cluster, tmp_path, origin, i)
            log = tmp_path / f"{i}.log"
            ready = await mount_and_import(node, key, tmp_path / f"m{i}", log)
            assert (ready["hot_frames"], ready["prefetch_chunks"]) == (0, 0), name
            assert "ignoring the hot-frame record" in log.read_text(), name
            # with no usable record this mount recorded one, which replaced the bad one
            record = HotRecord.from_bytes((origin / hot_path(key)).read_bytes())
            assert frames_of(record, snapshot) and record.runs == 1, name


def _options(node: Node, key: str, mountpoint: Path, window_s: float = 60.0,
             passthrough: bool = False) -> MountOptions:
    return MountOptions(key, mountpoint, node.env["BOOTSEER_TRACKER"], node.agent.api_socket,
                        node.agent.store_dir,
                        origin_dir=Path(node.env["BOOTSEER_DEPSNAP_ORIGIN_DIR"]),
                        record_window_s=window_s, passthrough=passthrough)


async def mount_and_import(node: Node, key: str, mountpoint: Path, log: Path | None = None,
                           window_s: float = 60.0,
                           then: Callable[[], Awaitable[bool]] | None = None
                           ) -> dict[str, Any]:
    """Mount on `node`, check that listing fetched nothing, import numpy, wait until
    `then` holds (if given), unmount (which saves a recording not saved yet); the
    mount's ready line."""
    mountpoint.mkdir()
    async with await Mount.spawn(_options(node, key, mountpoint, window_s).argv(), mountpoint,
                                 log or mountpoint.parent / f"{mountpoint.name}.log",
                                 env=node.env) as mount:
        names = await asyncio.to_thread(lambda: [p.name for p in mountpoint.rglob("*")])
        assert "numpy" in names
        assert await pack_bytes_held(node, mount.ready["packs"]) == 0
        await _import(mountpoint)
        if then is not None:
            await until(then, "the recording is saved when its window ends")
    return mount.ready


async def _import(mountpoint: Path) -> None:
    check = await asyncio.create_subprocess_exec(
        str(mountpoint / "bin" / "python"), "-c", IMPORT,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await check.communicate()
    assert (check.returncode, out.strip()) == (0, b"3.0"), err


async def _contents(node: Node) -> dict[str, dict[str, Any]]:
    async with node.agent.client(30) as client:
        contents: dict[str, dict[str, Any]] = (await client.status())["contents"]
    return contents


async def _chunks_held(node: Node, packs: list[str]) -> dict[str, int]:
    contents = await _contents(node)
    return {p: contents[p]["have"] for p in packs if p in contents}


async def _chunks_wanted(node: Node, packs: list[str]) -> dict[str, int]:
    contents = await _contents(node)
    return {p: contents[p]["wanted"] for p in packs if contents.get(p, {}).get("wanted")}


def test_the_record_file_is_json_with_the_key_and_frames() -> None:
    doc = json.loads(HotRecord(KEY, 1, {(P1.content, 2): (0.25,)}).to_bytes())
    assert doc == {"version": 1, "key": KEY, "runs": 1, "frames": [[P1.content, 2, [0.25]]]}
