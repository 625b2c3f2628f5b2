"""Fixtures shared by every test. Component fixtures live beside the tests that use them."""

from __future__ import annotations

import secrets

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: takes more than a few seconds")


@pytest.fixture(scope="session")
def cluster_secret() -> bytes:
    """A fresh cluster secret for this test session; nothing global is set."""
    return secrets.token_bytes(32)
