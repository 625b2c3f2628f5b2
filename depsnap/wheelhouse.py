"""Real wheels for the dependency-snapshot tests and benchmark, downloaded once.

`wheelhouse(specs)` makes sure the pinned wheels (and their dependencies) are
in `~/.cache/bootseer/wheelhouse` (`BOOTSEER_WHEELHOUSE` overrides), asking
the package index through pip only for what is missing, so CI downloads each
wheel once. It raises (the test fails, it does not skip) if they cannot be
had.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

PYTHON = "/usr/bin/python3.11"  # Debian's: the interpreter the snapshots' venvs are made with
TEST_WHEELS = ("numpy==2.2.6", "tabulate==0.9.0", "six==1.17.0")


def wheelhouse_dir() -> Path:
    default = Path.home() / ".cache" / "bootseer" / "wheelhouse"
    return Path(os.environ.get("BOOTSEER_WHEELHOUSE", default))


def _present(directory: Path, spec: str) -> bool:
    name, _, version = spec.partition("==")
    stem = f"{name.replace('-', '_')}-{version}-"
    return any(p.name.lower().startswith(stem.lower()) for p in directory.glob("*.whl"))


def wheelhouse(specs: Sequence[str] = TEST_WHEELS) -> Path:
    directory = wheelhouse_dir()
    directory.mkdir(parents=True, exist_ok=True)
    missing = [s for s in specs if not _present(directory, s)]
    if missing:
        done = subprocess.run([sys.executable, "-m", "pip", "download", "-q",
                               "--only-binary=:all:", "--python-version", "3.11",
                               "-d", str(directory), *missing],
                              capture_output=True, text=True, check=False, timeout=900)
        if done.returncode != 0:
            raise RuntimeError(f"cannot download the wheels {missing} into {directory}: "
                               f"{done.stderr.strip()[-1000:]}")
    return directory
