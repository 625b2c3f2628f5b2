"""A snapshot restored at another prefix than the one it was made at: its entry points
rewritten so that they name where they now are.

A virtualenv names its own prefix in a few places that run code: every console
script's `#!` line (pip writes `#!PREFIX/bin/python`; for a path over 127
bytes, a `#!/bin/sh` line and an `exec 'PREFIX/bin/python'` line below it),
and the activation scripts (`VIRTUAL_ENV=PREFIX`). Restored unchanged at
another prefix, those scripts run the interpreter of the old prefix, or none:
silently broken. So after a restore at another prefix, in `bin/` only, the
head (`HEAD_LINES`) of each script that starts with `#!` and the whole of each
`activate*` file have the old prefix replaced by the new one. `__pycache__`
and RECORD files also name the prefix, but nothing runs from those names.

Each rewritten file is replaced (written beside it, then renamed), never
changed in place: restored files may be hard links into the restore cache and
to their identical twins, which must keep the snapshot's bytes. Its mode and
mtime are kept.
"""

from __future__ import annotations

import os
from pathlib import Path

HEAD_LINES = 3  # the `#!` line and, for long paths, pip's `exec` trampoline under it
MAX_SCRIPT_BYTES = 1 << 20  # a larger file in bin/ is a program, not a script


def relocate(root: Path, old_prefix: str, new_prefix: str) -> list[str]:
    """Rewrite the entry points under `root/bin` from `old_prefix` to `new_prefix`; the
    paths rewritten, relative to `root`."""
    old, new = old_prefix.rstrip("/").encode(), new_prefix.rstrip("/").encode()
    bin_dir = root / "bin"
    if old == new or not bin_dir.is_dir():
        return []
    done: list[str] = []
    kept = bin_dir.stat()  # the directory's mtime is the snapshot's: renames must not move it
    for path in sorted(bin_dir.iterdir()):
        if path.is_symlink() or not path.is_file() or path.stat().st_size > MAX_SCRIPT_BYTES:
            continue
        data = path.read_bytes()
        if path.name.startswith("activate"):
            changed = data.replace(old, new)
        elif data.startswith(b"#!"):
            head, sep, rest = _split_head(data)
            changed = head.replace(old + b"/", new + b"/") + sep + rest
        else:
            continue
        if changed != data:
            _replace(path, changed)
            done.append(str(path.relative_to(root)))
    os.utime(bin_dir, ns=(kept.st_atime_ns, kept.st_mtime_ns))
    return done


def _split_head(data: bytes) -> tuple[bytes, bytes, bytes]:
    lines = data.split(b"\n", HEAD_LINES)
    if len(lines) <= HEAD_LINES:
        return data, b"", b""
    return b"\n".join(lines[:HEAD_LINES]), b"\n", lines[HEAD_LINES]


def _replace(path: Path, data: bytes) -> None:
    st = path.stat()
    fresh = path.with_name(f".{path.name}.relocated")
    fresh.write_bytes(data)
    os.chmod(fresh, st.st_mode & 0o7777)
    os.utime(fresh, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(fresh, path)
