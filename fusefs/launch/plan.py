"""What `bootseer launch` brings up: a launch.toml and the command line, checked, as a plan.

Pure: a dict of settings in (the TOML file's tables, with the command line's
flags laid over them), a `LaunchPlan` out, or a PlanError naming the setting
that is wrong and what it should be. The shell (`fusefs.launch.run`) does the rest.

The launch knows the image; every other part is a plug-in (`fusefs.launch.part`):
a content kind contributes one table of launch.toml, and a parser for it that
returns a `PartPlan` naming the paths it will take in the container, or None when
the table asks for nothing. Here the parts' tables are checked as a whole: no
unknown table, and no two parts' paths overlapping. depsnap contributes `[env]`
(`depsnap.launch`), hdfs_stripe `[ckpt]` (`hdfs_stripe.launch`):

    image = "registry:5000/train:1"       # what to run in (indexed with `image index`)
    command = ["python", "train.py"]      # default: the image's Entrypoint/Cmd
    runtime = "runc"                      # or "bwrap"

    [env]                                 # a dependency snapshot, by key ...
    key = "3f1c..."                       #   bound at the prefix it was made for
    mode = "restore"                      #   or "mount": lazily, files fetched when opened
    # ... or by requirements: restored if anyone published that key, else installed here
    # requirements = "requirements.txt"   #   (relative to the launch.toml's directory)
    # path = "/opt/venv"                  #   the venv's path, on the host and in the image
    # python = "python3"                  #   the interpreter the key and the venv use

    [ckpt]
    uris = ["hdfs://namenode:9870/ckpt/step-1000"]
    path = "/ckpt"                        # one URI: mounted there; several: path/NAME each
    prefetch = true                       # fetch every stripe now, not on first read

The typed readers below (`text`, `strings`, `choice`, `flag`, `absolute`, `known`) are
the parts' too, so every table's errors read alike.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Protocol

from p2p.errors import UserError

RUNTIMES = ("runc", "bwrap")
TOP_LEVEL = frozenset({"image", "command", "runtime", "plain_http"})


class PlanError(UserError, ValueError):
    """A setting is missing or wrong; the message names it."""


class PartPlan(Protocol):
    """A part's checked table."""

    def targets(self) -> list[str]:
        """The paths it takes in the container (what it binds there; may be none)."""
        ...


# A part's table (or None when absent) and the directory relative paths start from.
PartParser = Callable[[Mapping[str, object] | None, str], PartPlan | None]


@dataclass(frozen=True, slots=True)
class LaunchPlan:
    image: str
    command: tuple[str, ...] | None  # None: the image's own
    runtime: str
    plain_http: bool
    parts: dict[str, PartPlan]  # by table name; only the parts the settings ask for


def plan_from(settings: Mapping[str, object], base_dir: str,
              parsers: Mapping[str, PartParser]) -> LaunchPlan:
    """The plan `settings` (a launch.toml's tables, flags laid over them) describe, with each
    part's table read by its parser in `parsers` (by table name); relative paths in a table
    are taken from `base_dir` (the launch.toml's directory)."""
    known(settings, "", TOP_LEVEL | set(parsers))
    image = text(settings, "image", "")
    if image is None:
        raise PlanError("image: required (an image reference, e.g. registry:5000/train:1)")
    command = strings(settings, "command", "")
    runtime = choice(settings, "runtime", "", RUNTIMES, "runc")
    plain_http = flag(settings, "plain_http", "", False)
    parts: dict[str, PartPlan] = {}
    for name in sorted(parsers):
        plan = parsers[name](_table(settings, name), base_dir)
        if plan is not None:
            parts[name] = plan
    _check_separate(parts)
    return LaunchPlan(image, tuple(command) if command else None, runtime, plain_http, parts)


def _check_separate(parts: Mapping[str, PartPlan]) -> None:
    taken = [(name, target) for name in sorted(parts) for target in parts[name].targets()]
    for i, (name, target) in enumerate(taken):
        for other, other_target in taken[i + 1:]:
            if other != name and overlaps(target, other_target):
                raise PlanError(f"{name} path {target} and {other} path {other_target} "
                                "overlap; give them separate directories")


def merge(file: Mapping[str, object], flags: Mapping[str, object]) -> dict[str, object]:
    """`file`'s settings with `flags` (same shape; None means "not given") laid over them."""
    out: dict[str, object] = dict(file)
    for name, value in flags.items():
        if isinstance(value, Mapping):
            out[name] = merge(_table(file, name) or {}, value)
        elif value is not None:
            out[name] = value
    return out


# ---- typed reads ----------------------------------------------------------------------------


def _where(table: str, name: str) -> str:
    return f"[{table}] {name}" if table else name


def known(settings: Mapping[str, object], table: str, names: Collection[str]) -> None:
    """PlanError naming the first setting of `table` not in `names`."""
    unknown = sorted(set(settings) - set(names))
    if unknown:
        raise PlanError(f"{_where(table, unknown[0])}: unknown setting; known: "
                        f"{', '.join(sorted(names))}")


def _table(settings: Mapping[str, object], name: str) -> Mapping[str, object] | None:
    value = settings.get(name)
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise PlanError(f"{name}: must be a table ([{name}])")
    return value


def text(settings: Mapping[str, object], name: str, table: str) -> str | None:
    value = settings.get(name)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise PlanError(f"{_where(table, name)}: must be a string, not {value!r}")
    return value


def strings(settings: Mapping[str, object], name: str, table: str) -> list[str]:
    value = settings.get(name)
    if value is None:
        return []
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
        raise PlanError(f"{_where(table, name)}: must be a list of strings")
    return [str(v) for v in value]


def choice(settings: Mapping[str, object], name: str, table: str, choices: tuple[str, ...],
           default: str) -> str:
    value = text(settings, name, table) or default
    if value not in choices:
        raise PlanError(f"{_where(table, name)}: {value!r} is not one of {', '.join(choices)}")
    return value


def flag(settings: Mapping[str, object], name: str, table: str, default: bool) -> bool:
    value = settings.get(name, default)
    if not isinstance(value, bool):
        raise PlanError(f"{_where(table, name)}: must be true or false")
    return value


def absolute(settings: Mapping[str, object], name: str, table: str, default: str) -> str:
    value = text(settings, name, table) or default
    normal = posixpath.normpath(value)
    if not posixpath.isabs(value) or normal == "/" or ".." in value.split("/"):
        raise PlanError(f"{_where(table, name)}: {value!r} must be an absolute path below /, "
                        "without ..")
    return normal


def overlaps(a: str, b: str) -> bool:
    return a == b or a.startswith(b.rstrip("/") + "/") or b.startswith(a.rstrip("/") + "/")
