"""The tmpfs and overlayfs mounts under a container's scratch directory.

`mounted_tmpfs(dir)` mounts a private tmpfs (mode 0700) on `dir`;
`own_mount_namespace()` moves the calling process into a mount namespace of
its own, where `bind(source, target)` is seen by it alone;
`mounted_overlay(lower, dir)` makes `upper`, `work` and `merged` in `dir`
and mounts an overlayfs on `merged` with `lower` read-only beneath: every
write the container makes is copied up into `upper`, never into `lower`.
Both unmount on exit, whatever happened inside; an unmount the kernel
refuses as busy (a process we did not start still has a file open) is done
lazily (MNT_DETACH) so that the directory can still be removed.

Mounts go through libc's mount(2) and umount2(2) via ctypes: no `mount`
process per call, and the errno says what went wrong (ENODEV: no overlayfs
in this kernel; EPERM: not root).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from fusefs.image.process import ContainerError

MS_NOSUID = 2
MS_NODEV = 4
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MNT_DETACH = 2
CLONE_NEWNS = 0x00020000

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


def mount(source: str, target: Path, fstype: str, flags: int, data: str) -> None:
    if _libc.mount(source.encode(), os.fsencode(target), fstype.encode(), flags,
                   data.encode()) == 0:
        return
    code = ctypes.get_errno()
    hint = {errno.ENODEV: f"the kernel has no {fstype} (modprobe {fstype})",
            errno.EPERM: "mounting needs root (CAP_SYS_ADMIN)"}.get(code, os.strerror(code))
    if fstype == "overlay" and code != errno.ENODEV:
        # e.g. ENOSYS from a FUSE lower without statfs; the kernel logs the reason
        hint += " (the kernel log, dmesg, says which layer overlayfs refused and why)"
    raise ContainerError(f"cannot mount {fstype} on {target}: {hint} [{data}]")


def own_mount_namespace() -> None:
    """Move this process into a mount namespace of its own, whose mounts (and unmounts)
    no other process sees: a copy of the current one, made private all the way down."""
    if _libc.unshare(CLONE_NEWNS) != 0:
        code = ctypes.get_errno()
        raise ContainerError(f"cannot make a mount namespace: {os.strerror(code)}"
                             + (" (it needs root, CAP_SYS_ADMIN)" if code == errno.EPERM else ""))
    mount("none", Path("/"), "", MS_REC | MS_PRIVATE, "")


def bind(source: Path, target: Path) -> None:
    mount(str(source), target, "", MS_BIND, "")


def unmount(target: Path) -> None:
    """Unmount `target`; lazily if it is busy. A target not mounted is not an error."""
    if _libc.umount2(os.fsencode(target), 0) == 0:
        return
    code = ctypes.get_errno()
    if code == errno.EBUSY and _libc.umount2(os.fsencode(target), MNT_DETACH) == 0:
        return
    if code != errno.EINVAL:  # EINVAL: not a mount point (the mount never happened)
        raise ContainerError(f"cannot unmount {target}: {os.strerror(code)}")


@contextmanager
def mounted_tmpfs(target: Path) -> Iterator[Path]:
    mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0700")
    try:
        yield target
    finally:
        unmount(target)


def _escape(path: Path) -> str:
    """A path as an overlayfs option value (`,` separates options, `:` lower dirs)."""
    return str(path).replace("\\", "\\\\").replace(",", "\\,").replace(":", "\\:")


@contextmanager
def mounted_overlay(lower: Path, scratch: Path) -> Iterator[Path]:
    """An overlay of `lower` (read-only) and an upper in `scratch`; yields the merged dir."""
    upper, work, merged = scratch / "upper", scratch / "work", scratch / "merged"
    for directory in (upper, work, merged):
        directory.mkdir()
    # The upper's root takes the lower root's mode; a 0700 tmpfs would show through as /.
    os.chmod(upper, lower.stat().st_mode & 0o7777)
    options = (f"lowerdir={_escape(lower.resolve())},upperdir={_escape(upper)},"
               f"workdir={_escape(work)}")
    mount("overlay", merged, "overlay", 0, options)
    try:
        yield merged
    finally:
        unmount(merged)
