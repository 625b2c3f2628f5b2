"""The test and bench wheelhouses: every wheel of their closure pinned to the file."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from depsnap.testing.wheelhouse import ML_LOCK, ML_WHEELS, TEST_LOCK, TEST_WHEELS, wheelhouse

PIN = re.compile(r"^([a-z0-9-]+)==([\w.]+) --hash=sha256:[0-9a-f]{64}$")


def pins(lock: Path) -> dict[str, str]:
    lines = [line for line in lock.read_text().splitlines() if line and line[0] != "#"]
    found = [PIN.match(line) for line in lines]
    assert all(found), [line for line, m in zip(lines, found, strict=True) if not m]
    return {m[1]: m[2] for m in found if m}


@pytest.mark.parametrize(("lock", "top"), [(TEST_LOCK, TEST_WHEELS), (ML_LOCK, ML_WHEELS)])
def test_each_lock_pins_its_top_level_wheels_by_version_and_hash(lock: Path,
                                                                 top: tuple[str, ...]) -> None:
    pinned = pins(lock)
    for spec in top:
        name, version = spec.split("==")
        assert pinned.get(name) == version, f"{lock.name} does not pin {spec}"


def test_the_ml_lock_carries_six_for_the_benchs_second_environment() -> None:
    assert "six" in pins(ML_LOCK)  # python-dateutil 4 no longer brings it


def test_the_test_wheelhouse_holds_every_pinned_file(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A real download (pip, the configured index) into an empty wheelhouse: exactly the
    pinned files arrive, whatever the index holds newer."""
    monkeypatch.setenv("BOOTSEER_WHEELHOUSE", str(tmp_path / "wh"))
    directory = wheelhouse(TEST_LOCK)
    got = {w.name.split("-")[0].replace("_", "-").lower(): w.name.split("-")[1]
           for w in directory.glob("*.whl")}
    assert got == pins(TEST_LOCK)
