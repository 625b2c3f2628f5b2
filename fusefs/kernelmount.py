"""Mounting and unmounting a FUSE device as root, without fusermount3.

mount(2) with `fd=N,rootmode=40000,user_id=...,group_id=...` options on an
open /dev/fuse, read-only, nosuid, nodev; umount2 to undo it (lazily if files
are still open). Passthrough (`fusefs.kernelfs`) needs root anyway
(FUSE_DEV_IOC_BACKING_OPEN checks CAP_SYS_ADMIN), so the setuid helper has
nothing to add. `kernel_supports_passthrough` says, before anything is
mounted, why this node cannot have it; the kernel's INIT says the rest.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
from typing import Any

log = logging.getLogger(__name__)

MS_RDONLY, MS_NOSUID, MS_NODEV = 1, 2, 4
MNT_DETACH = 2
MIN_KERNEL = (6, 9)


class PassthroughUnavailable(Exception):
    """This mount cannot be served by the kernel protocol here; the message says why."""


def kernel_supports_passthrough(release: str | None = None) -> str | None:
    """Why passthrough cannot work on this node (None: it may; INIT decides)."""
    release = release or os.uname().release
    try:
        version = tuple(int(x) for x in release.split("-")[0].split(".")[:2])
    except ValueError:
        return f"cannot read the kernel version {release!r}"
    if version < MIN_KERNEL:
        return f"kernel {release} has no FUSE passthrough (Linux 6.9 or later)"
    if os.geteuid() != 0:
        return "FUSE passthrough needs root (CAP_SYS_ADMIN)"
    return None


def _libc() -> Any:
    return ctypes.CDLL(None, use_errno=True)


def mount_device(path: str, allow_other: bool) -> int:
    """Open /dev/fuse and mount it read-only at `path`; the device fd. Any failure is
    PassthroughUnavailable: the pyfuse3 path then tries, and says what is wrong if it
    cannot mount either."""
    try:
        fd = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        raise PassthroughUnavailable(f"cannot open /dev/fuse: {exc.strerror}") from None
    options = (f"fd={fd},rootmode=40000,user_id={os.getuid()},group_id={os.getgid()},"
               "default_permissions" + (",allow_other" if allow_other else ""))
    if _libc().mount(b"bootseer", os.fsencode(path), b"fuse.bootseer",
                     MS_RDONLY | MS_NOSUID | MS_NODEV, options.encode()) != 0:
        code = ctypes.get_errno()
        os.close(fd)
        raise PassthroughUnavailable(f"mount(2) of {path}: {os.strerror(code)}")
    return fd


def unmount(path: str) -> None:
    """umount2, lazily if files are still open; quiet if nothing is mounted there."""
    libc = _libc()
    for flags in (0, MNT_DETACH):
        if libc.umount2(os.fsencode(path), flags) == 0:
            return
        code = ctypes.get_errno()
        if code in (errno.EINVAL, errno.ENOENT):
            return
    log.warning("cannot unmount %s: %s", path, os.strerror(code))
