"""Fixtures shared by every test. Component fixtures live beside the tests that use them,
except FUSE's, which the mount, image and checkpoint tests all need, and the wheelhouse,
which the snapshot and launch tests both install from."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: takes more than a few seconds")


@pytest.fixture(scope="session")
def cluster_secret() -> bytes:
    """A fresh cluster secret for this test session; nothing global is set."""
    return secrets.token_bytes(32)


@pytest.fixture(scope="session")
def fuse_ready() -> None:
    """Fails, naming what to install, unless FUSE mounts can work on this node."""
    from fusefs.mount import MountError, check_fuse

    try:
        check_fuse()
    except MountError as exc:
        pytest.fail(f"FUSE is not usable on this node: {exc}")
    try:
        import pyfuse3  # noqa: F401
    except ImportError:
        pytest.fail("pyfuse3 is not installed: install the Debian packages fuse3 and "
                    "libfuse3-dev, then pip install 'bootseer[fuse]'")


@pytest.fixture(scope="module")
def wheels() -> Path:
    """The local wheelhouse of real wheels (numpy, tabulate, six), downloaded once."""
    from depsnap.testing.wheelhouse import PYTHON, wheelhouse

    if not os.path.exists(PYTHON):
        pytest.fail(f"{PYTHON} is missing: install the Debian packages python3 and python3-venv")
    return wheelhouse()
