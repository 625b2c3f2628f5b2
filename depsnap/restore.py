"""Materialise a snapshot at its prefix, from the swarm, atomically.

The tree is built in a temporary directory next to the prefix (same
filesystem, so the final `rename` is atomic) and renamed onto the prefix only
when every file, link, mode and mtime is in place: nobody ever sees half a
tree at the prefix. On any failure the temporary tree is removed; a full
disk (ENOSPC, EDQUOT) says so, with the bytes the snapshot needs.

Bytes. Every pack is read in full through the local agent (`read_to`), all
packs at once (`PARALLEL_PACKS`), so the agent fetches their chunks from
peers in parallel and verifies each one. The stream is cut into one object
per file digest, and each object is checked against its BLAKE3 digest while
it is written. Files then take their objects: the first path of a
(digest, mode, mtime) takes it by rename, the others become hard links to it
(an identical file with other metadata is a copy: a hard link shares them).

Local cache. With a `cache_dir` on the prefix's filesystem, every file
restored is also linked there under (digest, mode, mtime), and a later
restore links files from there instead of fetching them; a pack all of whose
files are in the cache is not read at all. The cache holds hard links to
restored files: a tool that rewrites a restored file in place (rather than
replacing it, as pip and uv do) would change the cached copy too, so a cached
object is used only while its size still matches.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import shutil
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import blake3

from depsnap.snapshot import Entry, Pack, Snapshot
from p2p.localapi import AgentClient, AgentError

PARALLEL_PACKS = 8
OBJECTS = ".depsnap-objects"


class RestoreError(Exception):
    """The snapshot cannot be restored; the message says why and what to do."""


@dataclass(frozen=True, slots=True)
class RestoreStats:
    files: int
    bytes: int  # file bytes in the tree
    fetched_packs: int
    fetched_bytes: int  # pack bytes read through the agent
    cached_files: int  # files linked from the local cache


async def restore(agent: AgentClient, snapshot: Snapshot, prefix: Path,
                  cache_dir: Path | None = None) -> RestoreStats:
    """Build `snapshot` at `prefix`, which must not exist or be an empty directory."""
    prefix = prefix.absolute()
    if prefix.exists() and (not prefix.is_dir() or any(prefix.iterdir())):
        raise RestoreError(f"{prefix} exists and is not an empty directory; remove it or "
                           "restore elsewhere")
    prefix.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{prefix.name}.depsnap-", dir=prefix.parent))
    try:
        stats = await _build(agent, snapshot, tmp, cache_dir)
        os.chmod(tmp, _root_mode(snapshot))
        os.rename(tmp, prefix)
        return stats
    except OSError as exc:
        _remove(tmp)
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise RestoreError(f"no space left on the device of {prefix.parent} while "
                               f"restoring ({snapshot.file_bytes} bytes in files needed); "
                               "the partial tree was removed") from None
        if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
            raise RestoreError(f"{prefix} appeared while restoring; left it as it is") \
                from None
        raise RestoreError(f"cannot restore at {prefix}: {exc}") from None
    except BaseException:
        _remove(tmp)
        raise


def _remove(tmp: Path) -> None:
    with contextlib.suppress(OSError):
        for path, dirs, _ in os.walk(tmp):  # a 0555 directory would stop rmtree
            for name in dirs:
                os.chmod(os.path.join(path, name), 0o700)
        shutil.rmtree(tmp)


def _root_mode(snapshot: Snapshot) -> int:
    return 0o755  # the prefix itself is not an entry: it keeps the usual mode


async def _build(agent: AgentClient, snapshot: Snapshot, root: Path,
                 cache_dir: Path | None) -> RestoreStats:
    files = [e for e in snapshot.entries if e.kind == "file"]
    for e in snapshot.entries:
        if e.kind == "dir":
            os.mkdir(root / e.path, 0o700)
    needed = {e.digest for e in files if _cached(cache_dir, e) is None}
    objects = root / OBJECTS
    os.mkdir(objects)
    packs = [p for p in snapshot.packs if any(m.digest in needed for m in p.members)]
    slots = asyncio.Semaphore(PARALLEL_PACKS)
    written: set[str] = set()

    async def fetch(pack: Pack) -> None:
        async with slots:
            writer = _PackWriter(pack, objects, needed, written)
            try:
                await agent.read_to(pack.content, 0, pack.size, writer.write)
            except AgentError as exc:
                raise RestoreError(f"cannot fetch pack {pack.name} ({pack.content}): "
                                   f"{exc}") from None
            finally:
                writer.close()
            writer.check_done()

    tasks = [asyncio.create_task(fetch(p)) for p in packs]
    try:
        await asyncio.gather(*tasks)
    finally:  # one failed: stop the others before the caller removes the tree
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    linked = _place_files(files, root, objects, cache_dir)
    for e in snapshot.entries:
        if e.kind == "symlink":
            os.symlink(e.target, root / e.path)
            os.utime(root / e.path, ns=(e.mtime_ns, e.mtime_ns), follow_symlinks=False)
    shutil.rmtree(objects)  # empty unless a pack repeated a digest
    for e in sorted((e for e in snapshot.entries if e.kind == "dir"),
                    key=lambda e: e.path.count("/"), reverse=True):
        os.chmod(root / e.path, e.mode)
        os.utime(root / e.path, ns=(e.mtime_ns, e.mtime_ns))
    return RestoreStats(len(files), snapshot.file_bytes, len(packs),
                        sum(p.size for p in packs), linked)


def _place_files(files: Iterable[Entry], root: Path, objects: Path,
                 cache_dir: Path | None) -> int:
    """Give every file its bytes, mode and mtime; how many came from the cache."""
    first: dict[tuple[str, int, int], Path] = {}
    taken: dict[str, Path] = {}  # digest -> the path its object was renamed to
    cached_keys: set[tuple[str, int, int]] = set()
    from_cache = 0
    for e in files:
        key, path = (e.digest, e.mode, e.mtime_ns), root / e.path
        if key in first:
            os.link(first[key], path)
            from_cache += key in cached_keys
            continue
        cached = _cached(cache_dir, e)
        if cached is not None:
            os.link(cached, path)
            cached_keys.add(key)
            from_cache += 1
        elif e.digest in taken:
            shutil.copyfile(taken[e.digest], path)
        else:
            os.rename(objects / e.digest, path)
            taken[e.digest] = path
        if cached is None:
            os.chmod(path, e.mode)
            os.utime(path, ns=(e.mtime_ns, e.mtime_ns))
            _add_to_cache(cache_dir, e, path)
        first[key] = path
    return from_cache


def _cache_path(cache_dir: Path, e: Entry) -> Path:
    return cache_dir / e.digest[:2] / f"{e.digest}-{e.mode:o}-{e.mtime_ns}"


def _cached(cache_dir: Path | None, e: Entry) -> Path | None:
    if cache_dir is None:
        return None
    path = _cache_path(cache_dir, e)
    try:
        return path if os.stat(path).st_size == e.size else None
    except OSError:
        return None


def _add_to_cache(cache_dir: Path | None, e: Entry, path: Path) -> None:
    if cache_dir is None:
        return
    target = _cache_path(cache_dir, e)
    with contextlib.suppress(OSError):  # another filesystem, or there already: no cache
        target.parent.mkdir(parents=True, exist_ok=True)
        os.link(path, target)


class _PackWriter:
    """Cuts a pack's byte stream into one checked object file per wanted digest."""

    def __init__(self, pack: Pack, objects: Path, wanted: set[str], written: set[str]) -> None:
        self.pack = pack
        self.objects = objects
        self.members = pack.members  # sorted and disjoint: Snapshot checks that
        self.wanted = wanted
        self.written = written
        self.index = 0
        self.pos = 0
        self.out: IO[bytes] | None = None
        self.hash = blake3.blake3()
        self._advance()

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            if self.index >= len(self.members):
                self.pos += len(view)
                return
            m = self.members[self.index]
            if self.pos < m.offset:
                n = min(len(view), m.offset - self.pos)
            else:
                n = min(len(view), m.offset + m.size - self.pos)
                if self.out is not None:
                    self.out.write(view[:n])
                    self.hash.update(view[:n])
            view = view[n:]
            self.pos += n
            self._advance()

    def _advance(self) -> None:
        """Finish the members the stream has passed; open the next wanted one."""
        while self.index < len(self.members):
            m = self.members[self.index]
            if self.out is None and self.pos <= m.offset and m.digest in self.wanted \
                    and m.digest not in self.written:
                self.written.add(m.digest)
                self.out = open(self.objects / m.digest, "wb")  # noqa: SIM115 (closed below)
                self.hash = blake3.blake3()
            if self.pos < m.offset + m.size:
                return
            if self.out is not None:
                self.out.close()
                self.out = None
                if self.hash.hexdigest() != m.digest:
                    raise RestoreError(f"pack {self.pack.name} ({self.pack.content}): the "
                                       f"bytes at {m.offset} do not match digest {m.digest}")
            self.index += 1

    def close(self) -> None:
        if self.out is not None:
            self.out.close()
            self.out = None

    def check_done(self) -> None:
        if self.index < len(self.members):
            raise RestoreError(f"pack {self.pack.name} ended at byte {self.pos}, before its "
                               f"member at {self.members[self.index].offset}")
