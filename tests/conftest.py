"""Fixtures shared by every test. Component fixtures live beside the tests that use them,
except FUSE's, which the mount, image and checkpoint tests all need, and the wheelhouse,
which the snapshot and launch tests both install from."""

from __future__ import annotations

import os
import secrets
import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from helpers.cluster import Background

# The everyday subset, `pytest -m "not slow"`: the modules that start no process (no agent,
# tracker, registry, HDFS, Redis, FUSE mount, compiler or installer) and take seconds.
# Every other module is marked slow, a new one too until it is listed here; `make test`
# runs everything.
FAST_MODULES = frozenset({
    "test_core_imports.py", "test_layering.py",
    "test_configfile.py", "test_content.py", "test_links.py", "test_node.py",
    "test_oci_core.py", "test_origin.py",
    "test_bytepath.py", "test_peer.py", "test_spool.py", "test_swarm.py", "test_swarm_lazy.py",
    "test_units.py",
    "test_upload_gate.py", "test_wire.py", "test_process.py",
    "test_tracker_batched.py",
    "test_fusefs_tree.py", "test_packed_tree.py", "test_image_record.py", "test_launch_plan.py",
    "test_depsnap_core.py", "test_depsnap_source.py",
    "test_stripe_plan.py", "test_webhdfs_errors.py",
    "test_sim_floor.py", "test_sim_imports.py", "test_sim_network.py", "test_sim_scenario.py",
    "test_sim_uploads.py", "test_sweep_plan.py", "test_sim_pinned.py", "test_values.py",
})


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: starts real processes or takes minutes; "
                                       "deselect with -m 'not slow'")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.name not in FAST_MODULES:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(params=["c", "python"])
def byte_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Each test that takes it runs twice: with the C byte path (p2p._bytepath) and with
    its pure-Python twin, in this process and in the agents it starts."""
    from p2p import bytepath
    if request.param == "c" and bytepath.native_module is None:
        pytest.fail("p2p._bytepath is not built: run `make setup` (it needs libxxhash-dev)")
    monkeypatch.setenv("BOOTSEER_BYTEPATH", request.param)
    with bytepath.use_native(request.param == "c"):
        yield request.param


@pytest.fixture
def tcp_pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    """(sender, receiver): a connected TCP pair on 127.0.0.1, the receiver non-blocking."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        sender = socket.create_connection(server.getsockname())
        receiver, _ = server.accept()
    receiver.setblocking(False)
    try:
        yield sender, receiver
    finally:
        sender.close()
        receiver.close()


@pytest.fixture(scope="session")
def cluster_secret() -> bytes:
    """A fresh cluster secret for this test session; nothing global is set."""
    return secrets.token_bytes(32)


@pytest.fixture
async def background() -> AsyncIterator[Background]:
    """Tasks a test runs beside its main line; whatever is left is cancelled at the end."""
    tasks = Background()
    try:
        yield tasks
    finally:
        await tasks.cancel_all()


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
