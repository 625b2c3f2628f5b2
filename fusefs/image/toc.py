"""A layer's tar table of contents: one `Member` per tar member, and its compact form.

Theory of operation
-------------------
`member_from_tarinfo` turns what `tarfile` parsed from a layer's tar stream into
a `Member`: an `Entry` of `fusefs.tree` without its content id. The index is a
pure function of the layer blob, and the swarm content id that will serve the
bytes is chosen later, so `Member.entry(content)` puts the id in the file's one
`Extent(content, data_offset, size)`. Paths lose their leading `./` and are
otherwise kept as written: absolute paths, `..` and duplicates reach
`build_tree`, which refuses them naming the layer and the path. Sparse members
and member types a runtime would not extract as files, directories, links or
device nodes are refused here (`LayerError`).

Compact form. `pack_members` writes columns, not rows, because one column's
values resemble each other: paths are front coded (characters shared with the
previous path, then the rest), mode, uid, gid and mtime seconds are deltas
from the previous member, a file's data offset is the number of 512-byte
blocks since the previous file's data ended (its headers: 1 to 3 blocks), and
targets and xattrs are listed only for the members that have them. The columns
are msgpack-ready values; `unpack_members` is a trust boundary: it checks
every type, length and range and raises `LayerError` instead of crashing, and
it is linear in the input.

This module does no I/O and reads no clock.
"""

from __future__ import annotations

import itertools
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from fusefs.tree import Entry, Extent, Kind
from p2p.errors import RemoteError

BLOCK_BYTES = 512
NS_PER_S = 10**9
MAX_ID = 2**32 - 1
MAX_MTIME_S = 2**40  # far beyond any real clock; bounds the integers a hostile header makes
MAX_PATH_CHARS = 4096  # Linux's PATH_MAX; also bounds what front coding can rebuild
PERMISSION_BITS = 0o7777
XATTR_PREFIX = "SCHILY.xattr."

_KINDS = {tarfile.REGTYPE: Kind.FILE, tarfile.AREGTYPE: Kind.FILE, tarfile.CONTTYPE: Kind.FILE,
          tarfile.DIRTYPE: Kind.DIR, tarfile.SYMTYPE: Kind.SYMLINK, tarfile.LNKTYPE: Kind.HARDLINK,
          tarfile.CHRTYPE: Kind.DEVICE, tarfile.BLKTYPE: Kind.DEVICE,
          tarfile.FIFOTYPE: Kind.DEVICE}
_CODES = {Kind.FILE: ord("f"), Kind.DIR: ord("d"), Kind.SYMLINK: ord("l"),
          Kind.HARDLINK: ord("h"), Kind.DEVICE: ord("c")}
_KIND_OF_CODE = {code: kind for kind, code in _CODES.items()}
_INT_COLUMNS = ("path_keep", "mode", "uid", "gid", "mtime_s", "mtime_frac_ns", "size",
                "gap_blocks")
_FILE_COLUMNS = ("size", "gap_blocks")  # one value per file, not per member
_SPARSE_COLUMNS = ("uid", "gid", "mtime_frac_ns")  # mostly 0: [rows, values] of the others


class LayerError(RemoteError, ValueError):
    """A layer blob or its index is unusable; the message names the layer and where."""

    def __init__(self, layer: str, where: str, why: str) -> None:
        super().__init__(f"layer {layer}: {where}: {why}" if where else f"layer {layer}: {why}")
        self.layer = layer
        self.where = where
        self.why = why


@dataclass(frozen=True, slots=True)
class Member:
    """One tar member; `data_offset` is where a file's bytes start in the uncompressed tar."""

    path: str
    kind: Kind
    mode: int
    uid: int
    gid: int
    mtime_ns: int
    size: int = 0
    data_offset: int = 0
    target: str = ""
    xattrs: tuple[tuple[str, bytes], ...] = ()

    def entry(self, content: str) -> Entry:
        """This member as a `build_tree` entry whose bytes are `content`'s at `data_offset`."""
        extents = (Extent(content, self.data_offset, self.size),) if self.size else ()
        return Entry(self.path, self.kind, self.mode, self.uid, self.gid, self.mtime_ns,
                     self.size, extents, self.target, dict(self.xattrs))


# ---- from tarfile --------------------------------------------------------------------


def member_from_tarinfo(info: tarfile.TarInfo, layer: str) -> Member:
    """The member `tarfile` parsed; LayerError for sparse or unsupported members."""
    where = f"member {info.name!r}"
    if info.issparse() or info.type == tarfile.GNUTYPE_SPARSE:
        raise LayerError(layer, where, "sparse members are not supported")
    kind = _KINDS.get(info.type)
    if len(info.name) > MAX_PATH_CHARS or len(info.linkname) > MAX_PATH_CHARS:
        raise LayerError(layer, where, f"a path longer than {MAX_PATH_CHARS} characters")
    if kind is None:
        raise LayerError(layer, where, f"unsupported member type {info.type!r}")
    uid, gid = info.uid, info.gid
    if not (0 <= uid <= MAX_ID and 0 <= gid <= MAX_ID):
        raise LayerError(layer, where, f"uid {uid} or gid {gid} out of range")
    size = info.size if kind is Kind.FILE else 0
    target = info.linkname if kind is Kind.SYMLINK else ""
    if kind is Kind.HARDLINK:
        target = _strip_dot(info.linkname)
    return Member(_strip_dot(info.name), kind, info.mode & PERMISSION_BITS, uid, gid,
                  _mtime_ns(info, layer, where), size,
                  info.offset_data if kind is Kind.FILE else 0, target, _xattrs(info))


def _strip_dot(path: str) -> str:
    while path.startswith("./") and len(path) > 2:
        path = path[2:]
    return "." if path in ("./", ".") else path


def _mtime_ns(info: tarfile.TarInfo, layer: str, where: str) -> int:
    """Exact nanoseconds: a PAX mtime is a decimal string, which a float would round."""
    try:
        seconds = Decimal(info.pax_headers.get("mtime", info.mtime))
    except (InvalidOperation, TypeError, ValueError):
        raise LayerError(layer, where, f"bad mtime {info.mtime!r}") from None
    if not seconds.is_finite() or abs(seconds) >= MAX_MTIME_S:
        raise LayerError(layer, where, f"mtime {info.mtime!r} out of range")
    return int(seconds * NS_PER_S)


def _xattrs(info: tarfile.TarInfo) -> tuple[tuple[str, bytes], ...]:
    return tuple(sorted((key[len(XATTR_PREFIX):], value.encode("utf-8", "surrogateescape"))
                        for key, value in info.pax_headers.items()
                        if key.startswith(XATTR_PREFIX)))


# ---- the compact form ---------------------------------------------------------------


def pack_members(members: Sequence[Member]) -> dict[str, Any]:
    """Columns of msgpack-ready values (see the module docstring)."""
    cols: dict[str, Any] = {name: [] for name in ("path_keep", "path_rest", *_INT_COLUMNS[1:])}
    cols |= {"kind": bytes(_CODES[m.kind] for m in members), "target_rows": [], "targets": [],
             "xattr_rows": [], "xattrs": []}
    previous, data_end = Member("", Kind.DIR, 0, 0, 0, 0), 0
    for row, member in enumerate(members):
        keep = _shared_prefix(previous.path, member.path)
        cols["path_keep"].append(keep)
        cols["path_rest"].append(member.path[keep:])
        for name in ("mode", "uid", "gid"):
            cols[name].append(getattr(member, name) - getattr(previous, name))
        seconds, frac = divmod(member.mtime_ns, NS_PER_S)
        cols["mtime_s"].append(seconds - previous.mtime_ns // NS_PER_S)
        cols["mtime_frac_ns"].append(frac)
        if member.kind is Kind.FILE:
            cols["size"].append(member.size)
            cols["gap_blocks"].append((member.data_offset - data_end) // BLOCK_BYTES)
            data_end = member.data_offset + _padded(member.size)
        if member.target:
            cols["target_rows"].append(row)
            cols["targets"].append(member.target)
        if member.xattrs:
            cols["xattr_rows"].append(row)
            cols["xattrs"].append([[key, value] for key, value in member.xattrs])
        previous = member
    for name in _SPARSE_COLUMNS:
        values = cols[name]
        rows = [row for row, value in enumerate(values) if value]
        cols[name] = [rows, [values[row] for row in rows]]
    return cols


def _shared_prefix(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def _padded(size: int) -> int:
    return -(-size // BLOCK_BYTES) * BLOCK_BYTES


def unpack_members(raw: Any, layer: str, tar_bytes: int, max_members: int
                   ) -> tuple[Member, ...]:
    """The members `pack_members` wrote; LayerError if anything is malformed."""
    if not isinstance(raw, dict):
        raise LayerError(layer, "index", "the table of contents is not a map")
    kinds = raw.get("kind")
    if not isinstance(kinds, bytes) or len(kinds) > max_members:
        raise LayerError(layer, "index", "bad member kinds")
    n_files = sum(1 for code in kinds if code == _CODES[Kind.FILE])
    cols = {name: _sparse_ints(raw, name, len(kinds), layer) if name in _SPARSE_COLUMNS
            else _int_column(raw, name, n_files if name in _FILE_COLUMNS else len(kinds), layer)
            for name in _INT_COLUMNS}
    rests = _column(raw, "path_rest", len(kinds), str, layer)
    targets = _sparse(raw, "target_rows", "targets", len(kinds), layer)
    xattrs = _sparse(raw, "xattr_rows", "xattrs", len(kinds), layer)
    members: list[Member] = []
    previous, data_end, file_row = Member("", Kind.DIR, 0, 0, 0, 0), 0, 0
    for row, code in enumerate(kinds):
        kind = _KIND_OF_CODE.get(code)
        keep = cols["path_keep"][row]
        if kind is None or keep > len(previous.path) \
                or keep + len(rests[row]) > MAX_PATH_CHARS:
            raise LayerError(layer, "index", f"member {row} is malformed")
        size = data_offset = 0
        if kind is Kind.FILE:
            size = cols["size"][file_row]
            data_offset = data_end + cols["gap_blocks"][file_row] * BLOCK_BYTES
            data_end = data_offset + _padded(size)
            file_row += 1
        member = Member(
            previous.path[:keep] + rests[row], kind,
            previous.mode + cols["mode"][row], previous.uid + cols["uid"][row],
            previous.gid + cols["gid"][row],
            (previous.mtime_ns // NS_PER_S + cols["mtime_s"][row]) * NS_PER_S
            + cols["mtime_frac_ns"][row],
            size, data_offset, _target(targets.get(row, ""), row, layer),
            _xattr_pairs(xattrs.get(row, []), row, layer))
        _check_member(member, layer, row, data_end, tar_bytes)
        members.append(member)
        previous = member
    return tuple(members)


def _check_member(member: Member, layer: str, row: int, data_end: int, tar_bytes: int) -> None:
    fields_ok = (0 <= member.mode <= PERMISSION_BITS and 0 <= member.uid <= MAX_ID
                 and 0 <= member.gid <= MAX_ID and abs(member.mtime_ns) < MAX_MTIME_S * NS_PER_S
                 and member.size >= 0 and data_end <= tar_bytes)
    if not fields_ok:
        raise LayerError(layer, "index", f"member {row} ({member.path!r}) is out of range")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _column(raw: dict[str, Any], name: str, length: int, kind: type, layer: str) -> list[Any]:
    values = raw.get(name)
    if not isinstance(values, list) or len(values) != length \
            or not all(isinstance(v, kind) for v in values):
        raise LayerError(layer, "index", f"bad column {name!r}")
    return values


def _int_column(raw: dict[str, Any], name: str, length: int, layer: str) -> list[int]:
    values = _column(raw, name, length, int, layer)
    if not all(_is_int(v) and abs(v) < 2**64 for v in values):
        raise LayerError(layer, "index", f"bad column {name!r}")
    return values


def _sparse_ints(raw: dict[str, Any], name: str, n_rows: int, layer: str) -> list[int]:
    pair = raw.get(name)
    if not isinstance(pair, list) or len(pair) != 2:
        raise LayerError(layer, "index", f"bad column {name!r}")
    values = _sparse({"rows": pair[0], "values": pair[1]}, "rows", "values", n_rows, layer)
    if not all(_is_int(v) and abs(v) < 2**64 for v in values.values()):
        raise LayerError(layer, "index", f"bad column {name!r}")
    return [values.get(row, 0) for row in range(n_rows)]


def _sparse(raw: dict[str, Any], rows_name: str, values_name: str, n_rows: int, layer: str
            ) -> dict[int, Any]:
    given = raw.get(rows_name)
    rows = _int_column(raw, rows_name, len(given) if isinstance(given, list) else -1, layer)
    values = _column(raw, values_name, len(rows), object, layer)
    if any(not 0 <= r < n_rows for r in rows) or any(b <= a for a, b in itertools.pairwise(rows)):
        raise LayerError(layer, "index", f"bad column {rows_name!r}")
    return dict(zip(rows, values, strict=True))


def _target(value: Any, row: int, layer: str) -> str:
    if not isinstance(value, str):
        raise LayerError(layer, "index", f"member {row} has a bad link target")
    return value


def _xattr_pairs(value: Any, row: int, layer: str) -> tuple[tuple[str, bytes], ...]:
    if not isinstance(value, list) or not all(
            isinstance(p, list) and len(p) == 2 and isinstance(p[0], str)
            and isinstance(p[1], bytes) for p in value):
        raise LayerError(layer, "index", f"member {row} has bad xattrs")
    return tuple((p[0], p[1]) for p in value)
