"""What a test can see of live processes and mounts, from /proc."""

from __future__ import annotations

from pathlib import Path


def processes_naming(*words: str) -> list[str]:
    """The command lines of live processes that contain any of `words`."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue  # gone meanwhile
        if any(word in text for word in words):
            found.append(text)
    return found
