"""The FUSE kernel protocol, as bytes in and bytes out: no device, no file, no clock.

Why we speak it ourselves. The kernel (Linux >= 6.9) can read a file of a FUSE
mount straight from a backing file the server names ("passthrough"): no request
reaches the server for its data. pyfuse3 3.4 and libfuse 3.14 cannot ask for
that, so the mounts that want it talk to /dev/fuse directly (`fusefs.kernelfs`,
the shell) through this codec. The layout follows `linux/fuse.h` at protocol
7.40; Debian's header is older (7.38), so the passthrough parts are spelled out
here.

A request the kernel writes is one `fuse_in_header` (40 bytes) then the
opcode's arguments; a reply is one `fuse_out_header` (16 bytes: length, minus
errno, the request's `unique`) then the opcode's result, written in one
`writev`. FORGET, BATCH_FORGET and INTERRUPT get no reply.

INIT is a negotiation: the kernel offers flags (64 bits with FUSE_INIT_EXT),
the server answers with the subset it takes. Passthrough is on only if the
kernel offered FUSE_PASSTHROUGH and the reply takes it with a stack depth of 1
(backing files on an ordinary file system); `negotiate` decides that and the
shell falls back when it is off. Decoders raise `ProtocolError` on a short or
malformed message: the kernel is trusted, so that is a bug to report, not a
peer to drop.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass

OUR_MINOR = 40  # FUSE_PASSTHROUGH's minor; we answer with min(kernel's, ours)
MIN_MINOR = 31  # entry and attr layouts we encode need >= 7.9; 7.31 is Linux 5.x

FUSE_ROOT_ID = 1


class Op:
    """Opcodes (`enum fuse_opcode`) this server answers or must recognise."""

    LOOKUP, FORGET, GETATTR, SETATTR, READLINK, SYMLINK = 1, 2, 3, 4, 5, 6
    MKNOD, MKDIR, UNLINK, RMDIR, RENAME, LINK, OPEN, READ, WRITE = 8, 9, 10, 11, 12, 13, 14, 15, 16
    STATFS, RELEASE, FSYNC, SETXATTR, GETXATTR, LISTXATTR = 17, 18, 20, 21, 22, 23
    REMOVEXATTR, FLUSH, INIT, OPENDIR, READDIR, RELEASEDIR = 24, 25, 26, 27, 28, 29
    ACCESS, CREATE, INTERRUPT, DESTROY, BATCH_FORGET, RENAME2, TMPFILE = 34, 35, 36, 38, 42, 45, 51
    IOCTL, READDIRPLUS = 39, 44


NAMES = {value: name for name, value in vars(Op).items() if name.isupper()}


NO_REPLY = frozenset({Op.FORGET, Op.BATCH_FORGET, Op.INTERRUPT})
WRITE_OPS = frozenset({Op.SETATTR, Op.SYMLINK, Op.MKNOD, Op.MKDIR, Op.UNLINK, Op.RMDIR,
                       Op.RENAME, Op.LINK, Op.WRITE, Op.SETXATTR, Op.REMOVEXATTR, Op.CREATE,
                       Op.RENAME2, Op.TMPFILE})

# INIT flags (bit numbers from linux/fuse.h; flags2 holds bits 32-63)
ASYNC_READ = 1 << 0
ATOMIC_O_TRUNC = 1 << 3
DO_READDIRPLUS = 1 << 13
NO_OPEN_SUPPORT = 1 << 17
PARALLEL_DIROPS = 1 << 18
MAX_PAGES = 1 << 22
CACHE_SYMLINKS = 1 << 23
NO_OPENDIR_SUPPORT = 1 << 24
INIT_EXT = 1 << 30
PASSTHROUGH = 1 << 37

# OPEN reply flags
FOPEN_KEEP_CACHE = 1 << 1
FOPEN_CACHE_DIR = 1 << 3
FOPEN_PASSTHROUGH = 1 << 7

# ioctls on /dev/fuse: _IOW(229, nr, size) = (1 << 30) | (size << 16) | (229 << 8) | nr
BACKING_MAP = struct.Struct("<iIQ")  # struct fuse_backing_map: fd, flags, padding
DEV_IOC_BACKING_OPEN = (1 << 30) | (BACKING_MAP.size << 16) | (229 << 8) | 1
DEV_IOC_BACKING_CLOSE = (1 << 30) | (4 << 16) | (229 << 8) | 2

IN_HEADER = struct.Struct("<IIQQIIIHH")  # len opcode unique nodeid uid gid pid extlen pad
OUT_HEADER = struct.Struct("<IiQ")
INIT_IN = struct.Struct("<IIII")  # major minor max_readahead flags (flags2 follows if EXT)
INIT_OUT = struct.Struct("<IIIIHHIIHHII24x")  # 64 bytes at 7.40
ATTR = struct.Struct("<QQQQQQIIIIIIIIII")
ENTRY_OUT_HEAD = struct.Struct("<QQQQII")
ATTR_OUT_HEAD = struct.Struct("<QII")
OPEN_IN = struct.Struct("<II")
OPEN_OUT = struct.Struct("<QIi")
READ_IN = struct.Struct("<QQII")  # fh offset size read_flags (lock_owner, flags follow)
RELEASE_IN = struct.Struct("<QII")
GETXATTR_IN = struct.Struct("<II")
GETXATTR_OUT = struct.Struct("<II")
ACCESS_IN = struct.Struct("<II")
FORGET_ONE = struct.Struct("<QQ")
BATCH_FORGET_IN = struct.Struct("<II")
STATFS_OUT = struct.Struct("<QQQQQIII4x24x")
DIRENT_HEAD = struct.Struct("<QQII")

MAX_READAHEAD = 1 << 20


class ProtocolError(Exception):
    """The kernel sent something this codec cannot read (a bug, not a user error)."""


@dataclass(frozen=True, slots=True)
class Header:
    opcode: int
    unique: int
    nodeid: int
    uid: int
    gid: int
    pid: int


def parse(message: memoryview) -> tuple[Header, memoryview]:
    """The header of one request read from the device, and its arguments."""
    if len(message) < IN_HEADER.size:
        raise ProtocolError(f"a request of {len(message)} bytes is shorter than its header")
    length, opcode, unique, nodeid, uid, gid, pid, _, _ = IN_HEADER.unpack_from(message)
    if length != len(message):
        raise ProtocolError(f"request {unique} says {length} bytes, {len(message)} came")
    return Header(opcode, unique, nodeid, uid, gid, pid), message[IN_HEADER.size:]


def _unpack(shape: struct.Struct, body: memoryview) -> tuple[int, ...]:
    if len(body) < shape.size:
        raise ProtocolError(f"arguments of {len(body)} bytes, {shape.size} expected")
    return shape.unpack_from(body)


def name_arg(body: memoryview) -> bytes:
    """A NUL-terminated name (LOOKUP), without its NUL."""
    raw = bytes(body)
    end = raw.find(b"\0")
    if end < 0:
        raise ProtocolError("a name without its terminating NUL")
    return raw[:end]


@dataclass(frozen=True, slots=True)
class InitIn:
    major: int
    minor: int
    max_readahead: int
    flags: int  # all 64 bits


def init_in(body: memoryview) -> InitIn:
    major, minor, readahead, flags = _unpack(INIT_IN, body)
    if flags & INIT_EXT and len(body) >= INIT_IN.size + 4:
        flags |= struct.unpack_from("<I", body, INIT_IN.size)[0] << 32
    return InitIn(major, minor, readahead, flags)


@dataclass(frozen=True, slots=True)
class InitOut:
    """What we answer INIT with; `passthrough` tells the shell whether it may use it,
    `no_open` whether it may answer OPEN and OPENDIR with ENOSYS (the kernel then stops
    sending them, and their RELEASEs, for the rest of the mount)."""

    minor: int
    flags: int
    max_readahead: int
    max_pages: int
    passthrough: bool
    no_open: bool = False


def negotiate(offer: InitIn, want_passthrough: bool, max_pages: int = 256,
              want_no_open: bool = False) -> InitOut:
    """The flags we take from the kernel's offer. ProtocolError for a kernel too old for
    the layouts encoded here (major 7, minor >= MIN_MINOR). No-open and passthrough
    exclude each other: passthrough is chosen in OPEN's reply."""
    if offer.major != 7 or offer.minor < MIN_MINOR:
        raise ProtocolError(f"kernel FUSE protocol {offer.major}.{offer.minor}; "
                            f"7.{MIN_MINOR} or later needed")
    wanted = (ASYNC_READ | ATOMIC_O_TRUNC | PARALLEL_DIROPS | MAX_PAGES | CACHE_SYMLINKS
              | INIT_EXT | DO_READDIRPLUS)
    if want_passthrough:
        wanted |= PASSTHROUGH
    elif want_no_open:
        wanted |= NO_OPEN_SUPPORT | NO_OPENDIR_SUPPORT
    flags = offer.flags & wanted
    no_open = flags & (NO_OPEN_SUPPORT | NO_OPENDIR_SUPPORT) == NO_OPEN_SUPPORT | NO_OPENDIR_SUPPORT
    return InitOut(min(offer.minor, OUR_MINOR), flags, min(offer.max_readahead, MAX_READAHEAD),
                   max_pages, bool(flags & PASSTHROUGH), no_open)


def init_out(reply: InitOut) -> bytes:
    stack_depth = 1 if reply.passthrough else 0
    return INIT_OUT.pack(7, reply.minor, reply.max_readahead, reply.flags & 0xFFFFFFFF,
                         64, 48,  # max_background, congestion_threshold: read-ahead in flight
                         4096, 1, reply.max_pages, 0, reply.flags >> 32, stack_depth)


@dataclass(frozen=True, slots=True)
class Attr:
    """What `fuse_attr` carries, in the units it carries them."""

    ino: int
    size: int
    mode: int
    nlink: int
    uid: int
    gid: int
    mtime_ns: int
    blksize: int


def _attr(a: Attr) -> bytes:
    sec, nsec = divmod(a.mtime_ns, 1_000_000_000)
    return ATTR.pack(a.ino, a.size, (a.size + 511) // 512, sec, sec, sec, nsec, nsec, nsec,
                     a.mode, a.nlink, a.uid, a.gid, 0, a.blksize, 0)


def _timeout(seconds: float) -> tuple[int, int]:
    whole = int(seconds)
    return whole, int((seconds - whole) * 1e9)


def entry_out(attr: Attr | None, timeout_s: float) -> bytes:
    """A LOOKUP answer; None is a negative entry the kernel caches for `timeout_s`."""
    sec, nsec = _timeout(timeout_s)
    if attr is None:
        return ENTRY_OUT_HEAD.pack(0, 0, sec, 0, nsec, 0) + bytes(ATTR.size)
    return ENTRY_OUT_HEAD.pack(attr.ino, 0, sec, sec, nsec, nsec) + _attr(attr)


def attr_out(attr: Attr, timeout_s: float) -> bytes:
    sec, nsec = _timeout(timeout_s)
    return ATTR_OUT_HEAD.pack(sec, nsec, 0) + _attr(attr)


def open_in(body: memoryview) -> int:
    """The open(2) flags of OPEN or OPENDIR."""
    return _unpack(OPEN_IN, body)[0]


def open_out(fh: int, flags: int, backing_id: int = 0) -> bytes:
    return OPEN_OUT.pack(fh, flags, backing_id)


@dataclass(frozen=True, slots=True)
class ReadIn:
    fh: int
    offset: int
    size: int


def read_in(body: memoryview) -> ReadIn:
    fh, offset, size, _ = _unpack(READ_IN, body)
    return ReadIn(fh, offset, size)


def release_fh(body: memoryview) -> int:
    return _unpack(RELEASE_IN, body)[0]


def xattr_in(body: memoryview) -> tuple[int, bytes]:
    """(size the caller's buffer holds, name) of GETXATTR; LISTXATTR has no name."""
    size = _unpack(GETXATTR_IN, body)[0]
    rest = body[GETXATTR_IN.size:]
    return size, name_arg(rest) if len(rest) else b""


def xattr_size_out(size: int) -> bytes:
    return GETXATTR_OUT.pack(size, 0)


def access_mask(body: memoryview) -> int:
    return _unpack(ACCESS_IN, body)[0]


def forgets(header: Header, body: memoryview) -> list[tuple[int, int]]:
    """(nodeid, count) pairs of FORGET or BATCH_FORGET."""
    if header.opcode == Op.FORGET:
        return [(header.nodeid, struct.unpack_from("<Q", body)[0])]
    count = _unpack(BATCH_FORGET_IN, body)[0]
    start = BATCH_FORGET_IN.size
    if len(body) < start + count * FORGET_ONE.size:
        raise ProtocolError(f"BATCH_FORGET of {count} nodes in {len(body)} bytes")
    return [FORGET_ONE.unpack_from(body, start + i * FORGET_ONE.size) for i in range(count)]


def statfs_out(blocks: int, files: int, name_max: int) -> bytes:
    return STATFS_OUT.pack(blocks, 0, 0, files, 0, 4096, name_max, 4096)


def dirents(entries: Iterable[tuple[bytes, int, int, int]], limit: int) -> bytes:
    """READDIR's answer: (name, ino, mode, next offset) packed while they fit `limit`."""
    out = bytearray()
    for name, ino, mode, next_off in entries:
        size = DIRENT_HEAD.size + len(name)
        padded = (size + 7) & ~7
        if len(out) + padded > limit:
            break
        out += DIRENT_HEAD.pack(ino, next_off, len(name), (mode >> 12) & 0o17)
        out += name + bytes(padded - size)
    return bytes(out)


def direntplus(entries: Iterable[tuple[bytes, Attr, int]], limit: int, timeout_s: float
               ) -> bytes:
    """READDIRPLUS's answer: each (name, attributes, next offset) as an entry the kernel
    caches (as a LOOKUP's answer) followed by its dirent, packed while they fit `limit`.
    A listing then spares the LOOKUP of every name in it (Python's import system lists
    each package directory, then opens names from it)."""
    out = bytearray()
    for name, attr, next_off in entries:
        size = DIRENT_HEAD.size + len(name)
        padded = (size + 7) & ~7
        entry = entry_out(attr, timeout_s)
        if len(out) + len(entry) + padded > limit:
            break
        out += entry
        out += DIRENT_HEAD.pack(attr.ino, next_off, len(name), (attr.mode >> 12) & 0o17)
        out += name + bytes(padded - size)
    return bytes(out)


def reply_header(unique: int, payload_bytes: int, error: int = 0) -> bytes:
    """The header of a reply: `error` is a positive errno (0: success)."""
    return OUT_HEADER.pack(OUT_HEADER.size + payload_bytes, -error, unique)


NOTIFY_RESEND = 7  # enum fuse_notify_code; Linux 6.9 (protocol 7.40)


def notify_resend() -> bytes:
    """FUSE_NOTIFY_RESEND: the kernel queues again every request this device's readers
    took but did not answer (a server that died had them); no payload."""
    return OUT_HEADER.pack(OUT_HEADER.size, NOTIFY_RESEND, 0)


def backing_map(fd: int) -> bytes:
    """The argument of FUSE_DEV_IOC_BACKING_OPEN for an open file `fd`."""
    return BACKING_MAP.pack(fd, 0, 0)
