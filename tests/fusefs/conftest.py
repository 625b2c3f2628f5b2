"""Fixtures of the image and launch tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from helpers.registry import RunningRegistry, running_registry


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningRegistry]:
    """A real docker-registry (no auth) for the module's images: one per module, so no
    module sees another's pushes."""
    with running_registry(tmp_path_factory.mktemp("registry")) as started:
        yield started
