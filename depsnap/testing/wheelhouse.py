"""Real wheels for the dependency-snapshot tests and benchmark, downloaded once.

`wheelhouse(lock)` makes sure the wheels a lock file names are in
`~/.cache/bootseer/wheelhouse` (`BOOTSEER_WHEELHOUSE` overrides). A lock file
pins the whole dependency closure, each wheel by version and sha256, so an
upstream release can neither break a test nor silently change a benchmark
(python-dateutil 4 dropping six once broke `bench depsnap` on a fresh cache).
pip downloads them from the package index it is configured with, once, with
`--no-deps --require-hashes`: a marker file per lock records a complete
download, so CI does not ask again. It raises `WheelhouseError` (a test
fails, it does not skip) if they cannot be had.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

PYTHON = "/usr/bin/python3.11"  # Debian's: the interpreter snapshot venvs are made with
TEST_WHEELS = ("numpy==2.2.6", "tabulate==0.9.0", "six==1.17.0")  # what the tests install
ML_WHEELS = ("numpy==2.2.6", "pandas==2.2.3", "pyarrow==19.0.1", "scipy==1.15.3")
TEST_LOCK = Path(__file__).with_name("test-wheels.lock")  # their closure, pinned to the file
ML_LOCK = Path(__file__).with_name("ml-wheels.lock")
DOWNLOAD_TIMEOUT_S = 1800


class WheelhouseError(Exception):
    """The wheels cannot be had; the message says which and why."""


def wheelhouse_dir() -> Path:
    default = Path.home() / ".cache" / "bootseer" / "wheelhouse"
    return Path(os.environ.get("BOOTSEER_WHEELHOUSE", default))


def wheelhouse(lock: Path = TEST_LOCK, specs: Sequence[str] = ()) -> Path:
    """The wheelhouse directory, holding every wheel `lock` pins, for `PYTHON`; or, when a
    benchmark is given other `specs` than its default, those and whatever they depend on
    today (not pinned: the caller chose them)."""
    directory = wheelhouse_dir()
    directory.mkdir(parents=True, exist_ok=True)
    pins = "\n".join(sorted(specs)) + "\n" if specs else lock.read_text()
    tag = hashlib.sha256(pins.encode()).hexdigest()[:16]
    marker = directory / f".complete-{tag}"
    if marker.exists():
        return directory
    what = [*specs] if specs else ["--no-deps", "--require-hashes", "-r", str(lock)]
    try:
        done = subprocess.run([sys.executable, "-m", "pip", "download", "-q",
                               "--only-binary=:all:", "--python-version", "3.11",
                               "--platform", "manylinux2014_x86_64",
                               "--platform", "manylinux_2_28_x86_64",
                               "-d", str(directory), *what],
                              capture_output=True, text=True, check=False,
                              timeout=DOWNLOAD_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise WheelhouseError(f"cannot run pip download: {exc}") from None
    if done.returncode != 0:
        raise WheelhouseError(f"cannot download the wheels {list(specs) or lock.name} into "
                              f"{directory}: "
                              f"{done.stderr.strip()[-1000:]}")
    marker.write_text(pins)
    return directory
