"""What /proc/self/mountinfo says of FUSE mounts, and the one knob of a mount the kernel
keeps outside it: the read-ahead of its backing device (BDI). Both the pyfuse3 server
(fusefs.mount) and the kernel-protocol server (fusefs.kernelfs) use these.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)


def mount_device(mountinfo: str, path: str) -> str | None:
    """The major:minor of the last FUSE mount at `path` in a /proc/<pid>/mountinfo text."""
    found = None
    for line in mountinfo.splitlines():
        fields = line.split()
        if len(fields) < 10 or "-" not in fields:
            continue
        fstype = fields[fields.index("-") + 1]
        if _unescape(fields[4]) == path and fstype.startswith("fuse"):
            found = fields[2]
    return found


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes."""
    for code in ("\\040", "\\011", "\\012", "\\134"):
        field = field.replace(code, chr(int(code[1:], 8)))
    return field


def set_read_ahead(path: str, kb: int) -> int | None:
    """Set the read-ahead of the FUSE mount at `path`; the value now in effect (None if the
    BDI cannot be found or written: the mount still works, with 128 KiB reads)."""
    try:
        device = mount_device(Path("/proc/self/mountinfo").read_text(), path)
        if device is None:
            log.warning("no FUSE mount at %s in /proc/self/mountinfo; read-ahead unchanged", path)
            return None
        knob = Path("/sys/class/bdi") / device / "read_ahead_kb"
        knob.write_text(f"{kb}\n")
        return int(knob.read_text())
    except OSError as exc:
        log.warning("cannot raise the read-ahead of %s (%s); reads stay at 128 KiB", path, exc)
        return None


def is_mounted(path: Path | str) -> bool:
    """Whether a FUSE mount is at `path` (from /proc/self/mountinfo, without touching it)."""
    text = Path("/proc/self/mountinfo").read_text()
    return mount_device(text, os.path.realpath(path)) is not None
