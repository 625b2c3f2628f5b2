"""The one configuration reader: unknown keys, types, tables and sources, named."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from p2p.configfile import ConfigError, apply, read_toml


@dataclass(frozen=True, slots=True)
class Inner:
    depth: int = 1


@dataclass(frozen=True, slots=True)
class Sample:
    name: str = "a"
    rate: float | None = None
    on: bool = False
    inner: Inner = field(default_factory=Inner)

    def __post_init__(self) -> None:
        if self.name == "bad":
            raise ValueError("name 'bad' is not allowed")


def test_a_file_lays_its_keys_and_tables_over_the_defaults(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('name = "b"\nrate = 3\n[inner]\ndepth = 4\n')
    got = apply(Sample(), read_toml(str(path)), f"config file {path}")
    assert got == Sample("b", 3.0, False, Inner(4))


@pytest.mark.parametrize(("values", "message"), [
    ({"nmae": "x"}, r"unknown key 'nmae' in the file; known keys: inner, name, on, rate"),
    ({"inner": {"deep": 1}}, r"unknown key 'inner.deep' in the file"),
    ({"rate": "3"}, r"key 'rate' in the file must be float or empty, not str"),
    ({"on": 1}, r"key 'on' in the file must be bool"),
    ({"rate": -1.0}, r"rate in the file: -1.0 is not valid \(must not be negative\)"),
    ({"name": "bad"}, r"name 'bad' is not allowed \(from the file\)"),
    ({"inner": 3}, r"inner in the file must be a table"),
])
def test_every_mistake_names_its_key_and_source(values: dict[str, object],
                                                message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        apply(Sample(), values, "the file")


def test_text_from_the_environment_is_converted() -> None:
    got = apply(Sample(), {"rate": "2.5", "on": "yes", "inner": {"depth": "7"}}, "env",
                text=True)
    assert got == Sample("a", 2.5, True, Inner(7))
    with pytest.raises(ConfigError, match="on in env: 'maybe' is not valid"):
        apply(Sample(), {"on": "maybe"}, "env", text=True)


def test_an_unreadable_or_broken_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        read_toml(str(tmp_path / "missing.toml"))
    (tmp_path / "b.toml").write_text("name = \n")
    with pytest.raises(ConfigError, match="is not valid TOML"):
        read_toml(str(tmp_path / "b.toml"))
