"""Real wheels for the dependency-snapshot tests and benchmark, downloaded once.

`wheelhouse(specs)` makes sure the pinned wheels and their dependencies are
in `~/.cache/bootseer/wheelhouse` (`BOOTSEER_WHEELHOUSE` overrides). pip
downloads them from the package index it is configured with, once: a marker
file per set of specs records a complete download, so CI does not ask again.
It raises `WheelhouseError` (a test fails, it does not skip) if they cannot
be had.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

PYTHON = "/usr/bin/python3.11"  # Debian's: the interpreter snapshot venvs are made with
TEST_WHEELS = ("numpy==2.2.6", "tabulate==0.9.0", "six==1.17.0")
ML_WHEELS = ("numpy==2.2.6", "pandas==2.2.3", "pyarrow==19.0.1", "scipy==1.15.3")
DOWNLOAD_TIMEOUT_S = 1800


class WheelhouseError(Exception):
    """The wheels cannot be had; the message says which and why."""


def wheelhouse_dir() -> Path:
    default = Path.home() / ".cache" / "bootseer" / "wheelhouse"
    return Path(os.environ.get("BOOTSEER_WHEELHOUSE", default))


def wheelhouse(specs: Sequence[str] = TEST_WHEELS) -> Path:
    """The wheelhouse directory, holding `specs` and their dependencies for `PYTHON`."""
    directory = wheelhouse_dir()
    directory.mkdir(parents=True, exist_ok=True)
    tag = hashlib.sha256("\n".join(sorted(specs)).encode()).hexdigest()[:16]
    marker = directory / f".complete-{tag}"
    if marker.exists():
        return directory
    try:
        done = subprocess.run([sys.executable, "-m", "pip", "download", "-q",
                               "--only-binary=:all:", "--python-version", "3.11",
                               "--platform", "manylinux2014_x86_64",
                               "--platform", "manylinux_2_28_x86_64",
                               "-d", str(directory), *specs],
                              capture_output=True, text=True, check=False,
                              timeout=DOWNLOAD_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise WheelhouseError(f"cannot run pip download: {exc}") from None
    if done.returncode != 0:
        raise WheelhouseError(f"cannot download the wheels {list(specs)} into {directory}: "
                              f"{done.stderr.strip()[-1000:]}")
    marker.write_text("\n".join(specs) + "\n")
    return directory
