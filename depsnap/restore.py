"""Materialise a snapshot at its prefix, from the swarm, atomically.

The tree is built in a temporary directory next to the prefix (same
filesystem, so the final `rename` is atomic) and renamed onto the prefix only
when every file, link, mode and mtime is in place: nobody ever sees half a
tree at the prefix. On any failure the temporary tree is removed; a full
disk (ENOSPC, EDQUOT) says so, with the bytes the snapshot needs. A restore
that is killed cannot remove its tree, and does not need to for correctness
(the prefix never appeared); to keep it from filling the disk, the builder
holds an flock on a file in the tree while it builds it, and the next
restore at that prefix removes every such tree whose lock is free.

Bytes come out of the packs through the local agent (`depsnap.unpack`: from
its store files when `store_dir` is given, else through its API), each
digest written once, straight to the first path that wants it, and checked
against its BLAKE3 digest as it is written. The other paths of the same
(digest, mode, mtime) become hard links to it; an identical file with
another mode or mtime is a copy (a hard link would share them).

Local cache. With a `cache_dir` on the prefix's filesystem (on another, it is
not used), every file
restored is also linked there under (digest, mode, mtime), and a later
restore links files from there instead of fetching them; a pack all of whose
files are in the cache is not read at all. The cache holds hard links to
restored files: a tool that rewrites a restored file in place (rather than
replacing it, as pip and uv do) would change the cached copy too, so a cached
object is used only while its size still matches.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import glob
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from depsnap.relocate import relocate
from depsnap.snapshot import RESTORE_LOCK_NAME, Entry, Snapshot
from depsnap.unpack import UnpackError, unpack
from p2p.agentclient import AgentClient
from p2p.errors import UserError
from p2p.progress import while_fetching

log = logging.getLogger(__name__)
ROOT_MODE = 0o755  # the prefix itself is not an entry of the tree: it gets the usual mode
LOCK_NAME = RESTORE_LOCK_NAME  # in a tree being built; gone before it is renamed


class RestoreError(UserError):
    """The snapshot cannot be restored; the message says why and what to do."""


@dataclass(frozen=True, slots=True)
class RestoreStats:
    files: int
    bytes: int  # file bytes in the tree
    fetched_packs: int
    fetched_bytes: int  # pack bytes read through the agent
    cached_files: int  # files linked from the local cache
    fetch_seconds: float  # until every object was out of its pack
    place_seconds: float  # files, links, modes and mtimes after that


async def restore(agent: AgentClient, snapshot: Snapshot, prefix: Path,
                  cache_dir: Path | None = None, store_dir: Path | None = None
                  ) -> RestoreStats:
    """Build `snapshot` at `prefix`, which must not exist or be an empty directory."""
    prefix = prefix.absolute()
    if prefix.exists() and (not prefix.is_dir() or any(prefix.iterdir())):
        raise RestoreError(f"{prefix} exists and is not an empty directory; remove it or "
                           "restore elsewhere")
    prefix.parent.mkdir(parents=True, exist_ok=True)
    _remove_abandoned(prefix)
    tmp = Path(tempfile.mkdtemp(prefix=_tmp_prefix(prefix), dir=prefix.parent))
    try:
        with _building(tmp):
            stats = await _build(agent, snapshot, str(tmp), cache_dir, store_dir)
            moved = relocate(tmp, snapshot.prefix, str(prefix))
            if moved:
                log.info("restored at %s, made at %s: rewrote %d entry points (%s)",
                         prefix, snapshot.prefix, len(moved), ", ".join(moved[:5]))
            os.chmod(tmp, ROOT_MODE)
            os.unlink(tmp / LOCK_NAME)  # still locked through its descriptor
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
    except UnpackError as exc:
        _remove(tmp)
        raise RestoreError(str(exc)) from None
    except BaseException:
        _remove(tmp)
        raise


def _tmp_prefix(prefix: Path) -> str:
    return f".{prefix.name}.depsnap-"


@contextlib.contextmanager
def _building(tmp: Path) -> Iterator[None]:
    """Hold a lock on `tmp` while it is built: a tree whose lock is free was abandoned."""
    lock = os.open(tmp / LOCK_NAME, os.O_CREAT | os.O_RDWR, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield
    finally:
        os.close(lock)


def _remove_abandoned(prefix: Path) -> None:
    """Remove the partial trees of restores at `prefix` whose process died (killed,
    power lost): nobody holds their lock. A tree still being built keeps its lock, and
    one without a lock file is too young to judge (or an unknown directory): both stay."""
    for path in prefix.parent.glob(glob.escape(_tmp_prefix(prefix)) + "*"):
        try:
            lock = os.open(path / LOCK_NAME, os.O_RDWR | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue  # another restore is building it
        finally:
            os.close(lock)
        log.warning("removing %s, left by a restore that did not finish", path)
        _remove(path)


def _remove(tmp: Path) -> None:
    with contextlib.suppress(OSError):
        for path, dirs, _ in os.walk(tmp):  # a 0555 directory would stop rmtree
            for name in dirs:
                os.chmod(os.path.join(path, name), 0o700)
        shutil.rmtree(tmp)


async def _build(agent: AgentClient, snapshot: Snapshot, root: str, cache_dir: Path | None,
                 store_dir: Path | None) -> RestoreStats:
    files = [e for e in snapshot.entries if e.kind == "file"]
    cache_dir = _usable_cache(cache_dir, root)
    for e in snapshot.entries:
        if e.kind == "dir":
            os.mkdir(os.path.join(root, e.path), 0o700)
    targets: dict[str, str] = {}  # digest -> the path its bytes are written to
    for e in files:
        if _cached(cache_dir, e) is None:
            targets.setdefault(e.digest, os.path.join(root, e.path))
    packs = [p for p in snapshot.packs if any(m.digest in targets for m in p.members)]
    started = time.monotonic()
    await while_fetching(agent, f"restore {snapshot.key[:12]}", [p.content for p in packs],
                         unpack(agent, packs, targets, store_dir),
                         total=sum(p.stored_size for p in packs))
    fetched = time.monotonic()
    linked = _place_files(files, root, targets, cache_dir)
    for e in snapshot.entries:
        if e.kind == "symlink":
            path = os.path.join(root, e.path)
            os.symlink(e.target, path)
            os.utime(path, ns=(e.mtime_ns, e.mtime_ns), follow_symlinks=False)
    for e in sorted((e for e in snapshot.entries if e.kind == "dir"),
                    key=lambda e: e.path.count("/"), reverse=True):
        path = os.path.join(root, e.path)
        os.chmod(path, e.mode)
        os.utime(path, ns=(e.mtime_ns, e.mtime_ns))
    return RestoreStats(len(files), snapshot.file_bytes, len(packs),
                        sum(p.stored_size for p in packs), linked, round(fetched - started, 3),
                        round(time.monotonic() - fetched, 3))


def _place_files(files: Iterable[Entry], root: str, targets: dict[str, str],
                 cache_dir: Path | None) -> int:
    """Give every file its bytes, mode and mtime; how many came from the cache."""
    first: dict[tuple[str, int, int], str] = {}
    cached_keys: set[tuple[str, int, int]] = set()
    from_cache = 0
    for e in files:
        key, path = (e.digest, e.mode, e.mtime_ns), os.path.join(root, e.path)
        if key in first:
            os.link(first[key], path)
            from_cache += key in cached_keys
            continue
        cached = _cached(cache_dir, e)
        if cached is not None:
            os.link(cached, path)
            cached_keys.add(key)
            from_cache += 1
        else:
            if targets[e.digest] != path:  # the same bytes with another mode or mtime
                shutil.copyfile(targets[e.digest], path)
            os.chmod(path, e.mode)
            os.utime(path, ns=(e.mtime_ns, e.mtime_ns))
            _add_to_cache(cache_dir, e, path)
        first[key] = path
    return from_cache


def _usable_cache(cache_dir: Path | None, root: str) -> Path | None:
    """`cache_dir` if files can be hard-linked between it and `root`, else None."""
    if cache_dir is None:
        return None
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        return cache_dir if os.stat(cache_dir).st_dev == os.stat(root).st_dev else None
    except OSError:
        return None


def _cache_path(cache_dir: Path, e: Entry) -> str:
    return os.path.join(cache_dir, e.digest[:2], f"{e.digest}-{e.mode:o}-{e.mtime_ns}")


def _cached(cache_dir: Path | None, e: Entry) -> str | None:
    if cache_dir is None:
        return None
    path = _cache_path(cache_dir, e)
    try:
        return path if os.stat(path).st_size == e.size else None
    except OSError:
        return None


def _add_to_cache(cache_dir: Path | None, e: Entry, path: str) -> None:
    if cache_dir is None:
        return
    target = _cache_path(cache_dir, e)
    with contextlib.suppress(OSError):  # another filesystem, or there already: no cache
        os.makedirs(os.path.dirname(target), exist_ok=True)
        os.link(path, target)
