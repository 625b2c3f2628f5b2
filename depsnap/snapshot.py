"""The snapshot model: a tree manifest and the packs that hold its file bytes.

Theory of operation
-------------------
A snapshot is one *tree manifest* (this module's JSON, itself a swarm
content) plus a few *pack* contents. The tree lists every path under the
prefix (relative, `/`-separated) with its kind (dir, file, symlink), mode
bits, mtime (kept: a `.pyc` is valid only while its source keeps the mtime it
was compiled against), and for a file its size and BLAKE3 digest, for a
symlink its target. A pack is the concatenation of whole files, each stored
once by digest; the tree finds a file's bytes through the pack member table.

Packing (`layout_packs`) is what makes sharing between snapshots work with a
few contents per snapshot: files are grouped by their *unit*, the top-level
entry under `site-packages` they belong to (`numpy`, `numpy.libs`, ...), with
byte-code (`__pycache__`) as a unit of its own (a `.pyc` names its source's
absolute path, so it changes with the prefix while the sources do not). A
unit of at least `MIN_PACK_BYTES` becomes a pack of its own; smaller units,
`*.dist-info` (their RECORD names the prefix's scripts) and everything outside
`site-packages` (bin/, pyvenv.cfg) share one `misc` pack. Members are laid
out in path order, each digest once per pack (not once per snapshot: a pack
must not depend on what else the environment holds), and a unit larger than
`MAX_PACK_BYTES` is cut at file boundaries into several packs (`pyarrow`,
`pyarrow#2`, ...), so a big distribution is several swarms fetched side by
side. So two environments with the same numpy wheel have
byte-identical `numpy` packs, hence the same content id and the same chunks:
the swarm moves them once and every node's store keeps them once.

Compression. A pack's content may hold its raw bytes as a run of zstd frames,
each of `frame_bytes` raw bytes (`depsnap.frames`); the tree lists each
frame's stored length. Members keep their offsets in the raw bytes, so a byte
range of a file is a byte range of the raw pack, which is a run of whole
frames of the content: a lazy mount reads a file by fetching and decoding
only the frames under it, and a restore decodes each pack as it streams.

Trust. `Snapshot.from_json` is a trust boundary (a tree comes through the
swarm; its id pins its bytes, but whoever published it chose them): every
path must be relative, without `.`, `..`, empty or NUL components, listed
once, under a directory listed before it; every symlink target, resolved
lexically from the link's directory, must stay inside the prefix, except an
absolute target equal to the snapshot's `interpreter` (a venv's bin/python
points at its base interpreter); every file must be covered by a pack member
of its size and digest, and members must lie within their pack. Anything
else is a `SnapshotError` naming the path.

This module does no I/O and reads no clock.
"""

from __future__ import annotations

import json
import posixpath
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fusefs.tree import gc_paused
from p2p.errors import UserError

FORMAT_VERSION = 1
KIND = "depsnap-tree"  # manifest kind of a tree content
PACK_KIND = "depsnap-pack"
MIN_PACK_BYTES = 1 << 20
MAX_PACK_BYTES = 32 << 20  # bigger units are cut: one pack is one swarm, fetched in parallel
MISC_PACK = "misc"
MAX_FRAME_BYTES = 16 << 20  # a compressed pack's frames (depsnap.frames) decode to at most this
FRAME_OVERHEAD = 1 << 10  # with frame_bytes / 128: more than an incompressible frame grows
MAX_ENTRIES = 2_000_000
PERMISSION_BITS = 0o7777
KINDS = ("dir", "file", "symlink")
_DIGEST = re.compile(r"[0-9a-f]{64}")
RESTORE_LOCK_NAME = ".depsnap-restoring"  # a restore's lock, at the top of the tree it builds


class SnapshotError(UserError, ValueError):
    """A tree manifest is malformed or unsafe; the message names the path."""


@dataclass(frozen=True, slots=True)
class Entry:
    """One path under the prefix."""

    path: str
    kind: str  # one of KINDS
    mode: int  # permission bits only
    mtime_ns: int
    size: int = 0
    digest: str = ""  # BLAKE3 of a file's bytes, hex
    target: str = ""  # a symlink's target, as read


@dataclass(frozen=True, slots=True)
class Member:
    digest: str
    offset: int
    size: int


@dataclass(frozen=True, slots=True)
class Pack:
    """Members lie in the pack's *raw* bytes (`size` of them). With `frames`, the
    content holds those bytes as zstd frames of `frame_bytes` raw bytes each (the last
    one shorter), `frames` giving each frame's stored length; without, the content is
    the raw bytes."""

    name: str  # the unit, e.g. "site-packages/numpy"; for people and the bench
    content: str  # swarm content id
    size: int
    members: tuple[Member, ...]
    frame_bytes: int = 0
    frames: tuple[int, ...] = ()

    @property
    def stored_size(self) -> int:
        """The content's size: what moves between peers and lies in stores."""
        return sum(self.frames) if self.frames else self.size


@dataclass(frozen=True, slots=True)
class PackLayout:
    """A pack before its bytes are written: its unit and its members in order."""

    name: str
    members: tuple[Member, ...]

    @property
    def size(self) -> int:
        return sum(m.size for m in self.members)


@dataclass(frozen=True, slots=True)
class Snapshot:
    key: str
    prefix: str
    interpreter: str  # the one absolute symlink target allowed outside the prefix
    entries: tuple[Entry, ...]
    packs: tuple[Pack, ...]
    inputs: dict[str, Any] = field(default_factory=dict)  # KeyInputs.describe()
    resolved: tuple[str, ...] = ()  # what the installer reports after the install
    # The content id of this snapshot's mount tree, packed (`fusefs.packedtree`) at
    # capture; "" for snapshots made before there was one (a mount then builds it).
    packed_tree: str = ""

    def __post_init__(self) -> None:
        check_entries(self.entries, self.interpreter)
        check_packs(self.entries, self.packs)

    @property
    def file_bytes(self) -> int:
        return sum(e.size for e in self.entries if e.kind == "file")

    def locations(self) -> dict[str, tuple[Pack, Member]]:
        """Where each digest's bytes are: its first pack member."""
        out: dict[str, tuple[Pack, Member]] = {}
        for pack in self.packs:
            for member in pack.members:
                out.setdefault(member.digest, (pack, member))
        return out

    def to_json(self) -> bytes:
        return json.dumps({
            "version": FORMAT_VERSION, "key": self.key, "prefix": self.prefix,
            "interpreter": self.interpreter, "inputs": self.inputs,
            "resolved": list(self.resolved),
            "entries": [_entry_row(e) for e in self.entries],
            "packs": [_pack_dict(p) for p in self.packs],
            **({"packed_tree": self.packed_tree} if self.packed_tree else {}),
        }, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes) -> Snapshot:
        """A tree manifest as published; SnapshotError if it is malformed or unsafe."""
        try:
            with gc_paused():  # thousands of entries, all kept: nothing for it to free
                raw = json.loads(data)
                if not isinstance(raw, dict) or raw.get("version") != FORMAT_VERSION:
                    raise SnapshotError(f"not a version {FORMAT_VERSION} snapshot tree")
                rows = _typed(raw["entries"], list)
                if len(rows) > MAX_ENTRIES:
                    raise SnapshotError(f"{len(rows)} entries; at most {MAX_ENTRIES}")
                return cls(_typed(raw["key"], str), _typed(raw["prefix"], str),
                           _typed(raw["interpreter"], str),
                           tuple(_entry_from_row(r) for r in rows),
                           tuple(_pack_from_dict(p) for p in _typed(raw["packs"], list)),
                           _typed(raw.get("inputs", {}), dict),
                           tuple(_typed(s, str) for s in _typed(raw.get("resolved", []),
                                                                 list)),
                           _typed(raw.get("packed_tree", ""), str))
        except (KeyError, TypeError, ValueError, UnicodeDecodeError) as exc:
            if isinstance(exc, SnapshotError):
                raise
            raise SnapshotError(f"malformed snapshot tree: {exc!r}") from None


# ---- checks ---------------------------------------------------------------------------


def check_path(path: str) -> list[str]:
    """The components of a relative path; SnapshotError if it could leave the prefix, or
    if it is the name a restore keeps its lock under (`RESTORE_LOCK_NAME`)."""
    if not path or path.startswith("/"):
        raise SnapshotError(f"{path!r}: paths must be relative to the prefix")
    parts = path.split("/")
    for part in parts:
        if part in ("", ".", "..") or "\0" in part:
            raise SnapshotError(f"{path!r}: no empty, '.', '..' or NUL components allowed")
    if path == RESTORE_LOCK_NAME:
        raise SnapshotError(f"{path!r}: a restore keeps its lock under that name at the "
                            "top of the prefix; rename or remove the file")
    return parts


def check_entries(entries: Sequence[Entry], interpreter: str) -> None:
    dirs = {""}
    seen: set[str] = set()
    for e in entries:
        parts = check_path(e.path)
        if e.path in seen:
            raise SnapshotError(f"{e.path!r}: listed twice")
        seen.add(e.path)
        if "/".join(parts[:-1]) not in dirs:
            raise SnapshotError(f"{e.path!r}: its directory is not listed before it")
        if e.kind not in KINDS:
            raise SnapshotError(f"{e.path!r}: unknown kind {e.kind!r}")
        if not 0 <= e.mode <= PERMISSION_BITS or e.size < 0:
            raise SnapshotError(f"{e.path!r}: bad mode {e.mode:o} or size {e.size}")
        if e.kind == "dir":
            dirs.add(e.path)
        elif e.kind == "file" and not _DIGEST.fullmatch(e.digest):
            raise SnapshotError(f"{e.path!r}: a file needs a 64-hex-digit digest")
        elif e.kind == "symlink":
            check_link(e.path, e.target, interpreter)
    links = {e.path: e.target for e in entries if e.kind == "symlink"}
    for path in links:
        resolve_link(path, links, interpreter)


def check_link(path: str, target: str, interpreter: str) -> None:
    """A symlink must resolve, lexically, inside the prefix (or be the interpreter)."""
    if not target or "\0" in target:
        raise SnapshotError(f"{path!r}: empty or NUL symlink target")
    if target.startswith("/"):
        if target == interpreter:
            return
        raise SnapshotError(f"{path!r}: symlink to the absolute path {target!r} leaves the "
                            "prefix")
    resolved = posixpath.normpath(posixpath.join(posixpath.dirname(path), target))
    if resolved == ".." or resolved.startswith("../"):
        raise SnapshotError(f"{path!r}: symlink target {target!r} escapes the prefix")


MAX_LINK_HOPS = 40  # symlinks followed in one resolution, as Linux's ELOOP limit


def resolve_link(path: str, links: Mapping[str, str], interpreter: str) -> list[str]:
    """The components, under the prefix, that the symlink at `path` resolves to, following
    the tree's other symlinks as the kernel would; SnapshotError if it leaves the prefix.
    A link may end at the interpreter (a venv's `bin/python3 -> python -> /usr/bin/...`),
    as `[interpreter]`, but never go on from it.

    Read as text, `c1 -> x/..` stays inside when `x -> .`; resolved, it is the prefix's
    parent, and a chain of such links reaches any host file. So every component that is
    itself a link of the tree is replaced by what that link resolves to before the next
    component (a `..`) is applied. Names not in the tree are taken as plain names: a
    restore creates only the tree's entries."""
    hops = [0]
    try:
        return _follow(posixpath.dirname(path).split("/") if "/" in path else [],
                       links[path], links, interpreter, hops)
    except _Escapes as exc:
        raise SnapshotError(f"{path!r}: symlink target {links[path]!r} leaves the prefix "
                            f"once the tree's links are followed ({exc})") from None


class _Escapes(Exception):
    pass


def _follow(base: list[str], target: str, links: Mapping[str, str], interpreter: str,
            hops: list[int]) -> list[str]:
    if target == interpreter:
        return [interpreter]
    if target.startswith("/"):
        raise _Escapes(f"through the absolute link {target!r}")
    where = list(base)
    parts = [p for p in target.split("/") if p not in ("", ".")]
    for part in parts:
        if where == [interpreter]:
            raise _Escapes(f"on past the interpreter {interpreter!r}")
        if part == "..":
            if not where:
                raise _Escapes("'..' above the prefix")
            where.pop()
            continue
        where.append(part)
        linked = links.get("/".join(where))
        if linked is not None:
            hops[0] += 1
            if hops[0] > MAX_LINK_HOPS:
                raise _Escapes(f"more than {MAX_LINK_HOPS} links in a chain")
            where = _follow(where[:-1], linked, links, interpreter, hops)
    return where


def check_packs(entries: Sequence[Entry], packs: Sequence[Pack]) -> None:
    sizes: dict[str, int] = {}
    for pack in packs:
        check_frames(pack)
        end = 0
        for m in pack.members:
            if m.offset < end or m.size < 0 or m.offset + m.size > pack.size \
                    or not _DIGEST.fullmatch(m.digest):
                raise SnapshotError(f"pack {pack.name}: member {m} overlaps another, is out "
                                    "of order or lies outside the pack")
            end = m.offset + m.size
            sizes.setdefault(m.digest, m.size)
    for e in entries:
        if e.kind == "file" and sizes.get(e.digest) != e.size:
            raise SnapshotError(f"{e.path!r}: no pack holds its {e.size} bytes ({e.digest})")


def check_frames(pack: Pack) -> None:
    """A compressed pack's frames must cover its raw bytes, one frame per `frame_bytes`."""
    if not pack.frames and not pack.frame_bytes:
        return
    if not 0 < pack.frame_bytes <= MAX_FRAME_BYTES or pack.size < 0:
        raise SnapshotError(f"pack {pack.name}: frame size {pack.frame_bytes} is not in "
                            f"1..{MAX_FRAME_BYTES}")
    bound = pack.frame_bytes + (pack.frame_bytes >> 7) + FRAME_OVERHEAD  # > zstd's worst
    if len(pack.frames) != -(-pack.size // pack.frame_bytes) \
            or any(not 0 < n <= bound for n in pack.frames):
        raise SnapshotError(f"pack {pack.name}: {len(pack.frames)} frames do not hold "
                            f"{pack.size} bytes in frames of {pack.frame_bytes}")


# ---- packing --------------------------------------------------------------------------


def pack_unit(path: str) -> str:
    """The unit a file is packed with (see the module docstring)."""
    parts = path.split("/")
    if "site-packages" not in parts[:-1]:
        return MISC_PACK
    rest = parts[parts.index("site-packages") + 1:]
    top = rest[0]
    if len(rest) == 1 or top.endswith(".dist-info"):
        return MISC_PACK
    unit = f"site-packages/{top}"
    return f"{unit}:bytecode" if "__pycache__" in rest[:-1] else unit


def layout_packs(files: Iterable[Entry]) -> list[PackLayout]:
    """Group the files into packs, each digest stored once per pack; sorted by name."""
    units: dict[str, list[Entry]] = {}
    for e in sorted(files, key=lambda e: e.path):
        units.setdefault(pack_unit(e.path), []).append(e)
    grouped: dict[str, list[Entry]] = {}
    for unit, unit_files in units.items():
        big = sum(e.size for e in unit_files) >= MIN_PACK_BYTES
        grouped.setdefault(unit if big else MISC_PACK, []).extend(unit_files)
    layouts = []
    for name in sorted(grouped, key=lambda n: (n == MISC_PACK, n)):
        for part, members in enumerate(_cut(sorted(grouped[name], key=lambda e: e.path))):
            layouts.append(PackLayout(name if part == 0 else f"{name}#{part + 1}", members))
    return layouts


def _cut(files: Sequence[Entry]) -> list[tuple[Member, ...]]:
    """Files as members of packs of up to about MAX_PACK_BYTES, each digest once."""
    parts: list[tuple[Member, ...]] = []
    members: list[Member] = []
    placed: set[str] = set()
    offset = 0
    for e in files:
        if e.digest in placed:
            continue
        placed.add(e.digest)
        if members and offset + e.size > MAX_PACK_BYTES:
            parts.append(tuple(members))
            members, offset = [], 0
        members.append(Member(e.digest, offset, e.size))
        offset += e.size
    if members:
        parts.append(tuple(members))
    return parts


# ---- the JSON rows ----------------------------------------------------------------------


def _entry_row(e: Entry) -> list[Any]:
    row: list[Any] = [e.path, e.kind, e.mode, e.mtime_ns]
    if e.kind == "file":
        row += [e.size, e.digest]
    elif e.kind == "symlink":
        row.append(e.target)
    return row


def _entry_from_row(row: Any) -> Entry:
    _typed(row, list)
    path, kind, mode, mtime = (_typed(row[0], str), _typed(row[1], str), _typed(row[2], int),
                               _typed(row[3], int))
    if kind == "file":
        return Entry(path, kind, mode, mtime, _typed(row[4], int), _typed(row[5], str))
    if kind == "symlink":
        return Entry(path, kind, mode, mtime, target=_typed(row[4], str))
    return Entry(path, kind, mode, mtime)


def _pack_dict(p: Pack) -> dict[str, Any]:
    out: dict[str, Any] = {"name": p.name, "content": p.content, "size": p.size,
                           "members": [[m.digest, m.offset, m.size] for m in p.members]}
    if p.frames:
        out.update(frame_bytes=p.frame_bytes, frames=list(p.frames))
    return out


def _pack_from_dict(raw: Any) -> Pack:
    members = tuple(Member(_typed(m[0], str), _typed(m[1], int), _typed(m[2], int))
                    for m in _typed(raw["members"], list))
    frames = tuple(_typed(n, int) for n in _typed(raw.get("frames", []), list))
    return Pack(_typed(raw["name"], str), _typed(raw["content"], str), _typed(raw["size"], int),
                members, _typed(raw.get("frame_bytes", 0), int), frames)


def _typed(value: Any, kind: type) -> Any:
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise TypeError(f"expected {kind.__name__}, got {type(value).__name__}")
    return value
