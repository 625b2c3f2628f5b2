"""A detached mount's log is a new private file: a symlink planted where it would be
written is refused, not followed (a mount writing through it would write another
file with the mount's privileges, root for FUSE)."""

from __future__ import annotations

import stat
import sys
import time
from pathlib import Path

import pytest

from fusefs.mount import MountError, mount_log, start_detached

READY = "import json, sys; sys.stderr.write('mount log line\\n'); print(json.dumps({'ok': 1}))"


def test_a_planted_symlink_at_the_log_path_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BOOTSEER_MOUNT_SERVER", raising=False)
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    planted = tmp_path / "bootseer-image-1234.log"
    planted.symlink_to(victim)
    with pytest.raises(MountError, match="must be a new file"):
        start_detached([sys.executable, "-c", READY], planted, 30.0)
    assert victim.read_text() == "precious\n"


def test_the_log_goes_to_a_private_directory_and_works(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BOOTSEER_MOUNT_SERVER", raising=False)
    monkeypatch.delenv("BOOTSEER_LOG_DIR", raising=False)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # TMPDIR is read again
    path = mount_log("image")
    assert path.parent.parent == tmp_path
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    ready = start_detached([sys.executable, "-c", READY], path, 30.0)
    assert ready["ok"] == 1
    assert "mount log line" in path.read_text()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_a_private_log_is_removed_after_a_clean_unmount(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`serve` ends a clean unmount with `drop_private_log`; here a child stands in for the
    serving process and does just that, as its last act."""
    monkeypatch.delenv("BOOTSEER_MOUNT_SERVER", raising=False)
    monkeypatch.delenv("BOOTSEER_LOG_DIR", raising=False)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    path = mount_log("image")
    ended = tmp_path / "ended"
    child = (f"{READY}; import sys, pathlib; sys.stdout.flush(); "
             f"from fusefs.mount import drop_private_log; drop_private_log(); "
             f"pathlib.Path({str(ended)!r}).touch()")
    start_detached([sys.executable, "-c", child], path, 30.0)
    for _ in range(100):  # bounded: 10 s for the child to finish
        if ended.exists():
            break
        time.sleep(0.1)
    assert ended.exists()
    assert not path.exists() and not path.parent.exists()
    assert list(tmp_path.iterdir()) == [ended]
