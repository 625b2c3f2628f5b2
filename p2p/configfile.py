"""One reader for configuration: a TOML file, the environment and the command line laid,
in that order, over a frozen config dataclass's defaults.

Every key is checked against the dataclass's fields: an unknown key is refused naming
it, where it came from and the keys there are; a table (`[swarm]`) fills a field that is
itself a dataclass. A file's values must have the field's type already (TOML has
types; an int is a float too), since a quoted number in a file is a mistake worth
hearing about. Values from the environment arrive as text and are converted. Either
way a wrong value names its key and its source, and whatever the dataclass's own
`__post_init__` refuses comes back with its source too. The agent (p2p.config) and the
tracker (tracker.config) read their files here.
"""

from __future__ import annotations

import dataclasses
import tomllib
from collections.abc import Mapping
from typing import Any, TypeVar

from p2p.errors import UserError

C = TypeVar("C")
TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
FALSE_WORDS = frozenset({"0", "false", "no", "off", ""})


class ConfigError(UserError, ValueError):
    """The configuration is invalid; the message names the key and where it came from."""


def read_toml(path: str) -> dict[str, Any]:
    """The tables of the TOML file at `path`; ConfigError if it cannot be read or parsed."""
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from exc


def apply(config: C, values: Mapping[str, Any], source: str, *, text: bool = False,
          prefix: str = "") -> C:
    """`config` with `values` laid over it (`text`: they are strings to convert, as the
    environment gives them); ConfigError naming the key and `source` for anything wrong."""
    known = {f.name: f for f in dataclasses.fields(config)}  # type: ignore[arg-type]
    changes: dict[str, Any] = {}
    for key, value in values.items():
        if key not in known:
            raise ConfigError(f"unknown key {prefix + key!r} in {source}; known keys: "
                              f"{', '.join(sorted(known))}")
        current = getattr(config, key)
        if dataclasses.is_dataclass(current):
            if not isinstance(value, Mapping):
                raise ConfigError(f"{prefix}{key} in {source} must be a table")
            changes[key] = apply(current, value, source, text=text, prefix=f"{prefix}{key}.")
        else:
            changes[key] = _checked(value, str(known[key].type), f"{prefix}{key}", source, text)
    try:
        return dataclasses.replace(config, **changes)  # type: ignore[type-var]
    except ValueError as exc:  # a ConfigError from __post_init__ too
        raise ConfigError(f"{exc} (from {source})") from None


def _checked(value: Any, annotation: str, key: str, source: str, text: bool) -> Any:
    kind = annotation.split("|")[0].strip()
    try:
        if text and isinstance(value, str):
            value = _from_text(value, kind)
        if not _is(value, kind):
            want = kind + (" or empty" if "None" in annotation else "")
            raise ConfigError(f"key {key!r} in {source} must be {want}, not "
                              f"{type(value).__name__}")
        if kind == "float" and value < 0:
            raise ValueError("must not be negative")
        return float(value) if kind == "float" else value
    except ValueError as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(f"{key} in {source}: {value!r} is not valid ({exc})") from None


def _from_text(value: str, kind: str) -> Any:
    if kind == "bool":
        if value.lower() not in TRUE_WORDS | FALSE_WORDS:
            raise ValueError("not a yes or no")
        return value.lower() in TRUE_WORDS
    if kind == "int":
        return int(value)
    if kind == "float":
        return float(value)
    return value


def _is(value: Any, kind: str) -> bool:
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "float":
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind == "str":
        return isinstance(value, str)
    return True  # a type this reader does not know: the dataclass checks it
