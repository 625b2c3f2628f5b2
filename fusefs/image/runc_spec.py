"""The OCI runtime spec (`config.json`) that `runtime` hands to runc. Pure: values in, dict out.

It follows `runc spec`'s defaults where they suit a training job and
departs from them where they do not:

- namespaces pid, ipc, uts and mount; the network namespace is the host's
  (a job talks to its peers and the local agent at the host's addresses);
  the uts namespace is private but keeps the host's name (no `hostname`
  set), which jobs use for rendezvous;
- /proc, a tmpfs /dev (runc adds the standard device nodes), /dev/pts,
  /dev/shm without runc's 64 MiB cap (data loaders share batches through
  it; a tmpfs's default cap is half of RAM), /dev/mqueue, /sys read-only;
  no /tmp mount: the root is already an overlay on tmpfs;
- the host's resolv.conf and hosts bound read-only (host network, host DNS);
- Docker's default capabilities, and runc's masked and read-only /proc paths;
- no cgroup limits and no rlimits: the command inherits runc's.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from fusefs.image.process import Bind, Process

OCI_VERSION = "1.0.2"
CAPABILITIES = ["CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD",
                "CAP_NET_RAW", "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP",
                "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE"]
MASKED_PATHS = ["/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys",
                "/proc/latency_stats", "/proc/timer_list", "/proc/timer_stats",
                "/proc/sched_debug", "/sys/firmware", "/proc/scsi"]
READONLY_PATHS = ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"]
NAMESPACES = ["pid", "ipc", "uts", "mount"]


def _mount(destination: str, kind: str, source: str, *options: str) -> dict[str, object]:
    return {"destination": destination, "type": kind, "source": source,
            "options": list(options)}


MOUNTS = [
    _mount("/proc", "proc", "proc"),
    _mount("/dev", "tmpfs", "tmpfs", "nosuid", "strictatime", "mode=755", "size=65536k"),
    _mount("/dev/pts", "devpts", "devpts", "nosuid", "noexec", "newinstance",
           "ptmxmode=0666", "mode=0620", "gid=5"),
    _mount("/dev/shm", "tmpfs", "shm", "nosuid", "noexec", "nodev", "mode=1777"),
    _mount("/dev/mqueue", "mqueue", "mqueue", "nosuid", "noexec", "nodev"),
    _mount("/sys", "sysfs", "sysfs", "nosuid", "noexec", "nodev", "ro"),
]


def runc_spec(process: Process, root: Path, host_files: list[str],
              binds: Sequence[Bind] = ()) -> dict[str, object]:
    """The spec for `process` with `root` (the overlay) as its root filesystem, and
    `binds` (the launch's environment and checkpoint) mounted into it."""
    caps = list(CAPABILITIES) if process.uid == 0 else []
    extra = [*(_mount(path, "bind", path, "rbind", "ro", "nosuid", "nodev")
               for path in host_files),
             *(_mount(b.target, "bind", str(b.source), "rbind", "ro" if b.read_only else "rw",
                      "nosuid", "nodev") for b in binds)]
    return {
        "ociVersion": OCI_VERSION,
        "process": {
            "terminal": False,
            "user": {"uid": process.uid, "gid": process.gid},
            "args": list(process.argv),
            "env": list(process.env),
            "cwd": process.cwd,
            "capabilities": {"bounding": list(CAPABILITIES), "effective": caps,
                             "permitted": caps},
            "noNewPrivileges": False,
        },
        "root": {"path": str(root), "readonly": False},
        "mounts": [*MOUNTS, *extra],
        "linux": {
            "namespaces": [{"type": kind} for kind in NAMESPACES],
            "maskedPaths": list(MASKED_PATHS),
            "readonlyPaths": list(READONLY_PATHS),
        },
    }
