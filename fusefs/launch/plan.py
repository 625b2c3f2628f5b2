"""What `bootseer launch` brings up: a launch.toml and the command line, checked, as a plan.

Pure: a dict of settings in (the TOML file's tables, with the command line's
flags laid over them), a `LaunchPlan` out, or a PlanError naming the setting
that is wrong and what it should be. The shell (`fusefs.launch.run`) does the rest.

A launch.toml, every key optional except `image`:

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
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from dataclasses import dataclass

from depsnap.key import KeyInputError, check_key

RUNTIMES = ("runc", "bwrap")
ENV_MODES = ("restore", "mount")
INSTALLERS = ("pip", "uv")
DEFAULT_ENV_PATH = "/opt/venv"
DEFAULT_CKPT_PATH = "/ckpt"
TABLES = {"": {"image", "command", "runtime", "plain_http", "env", "ckpt"},
          "env": {"key", "requirements", "path", "mode", "python", "installer"},
          "ckpt": {"uris", "path", "prefetch"}}


class PlanError(ValueError):
    """A setting is missing or wrong; the message names it."""


@dataclass(frozen=True, slots=True)
class EnvPlan:
    key: str | None  # a published snapshot ...
    requirements: str | None  # ... or a requirements file (a path on this host)
    path: str | None  # requirements mode: the venv's path, on the host and in the image
    # (a snapshot by key is bound at the prefix it was made for)
    mode: str  # "restore" (a private copy) or "mount" (lazy, read-only; key only)
    python: str
    installer: str

    def install_command(self) -> list[str]:
        """The command a requirements launch installs with when no snapshot exists."""
        assert self.requirements is not None
        pip = ["uv", "pip"] if self.installer == "uv" else ["pip"]
        return [*pip, "install", "-r", self.requirements]


@dataclass(frozen=True, slots=True)
class CkptPlan:
    uris: tuple[str, ...]
    path: str
    prefetch: bool

    def targets(self) -> list[tuple[str, str]]:
        """(URI, path in the container) for each URI: one at `path`, several under it."""
        if len(self.uris) == 1:
            return [(self.uris[0], self.path)]
        return [(uri, posixpath.join(self.path, _last_name(uri))) for uri in self.uris]


@dataclass(frozen=True, slots=True)
class LaunchPlan:
    image: str
    command: tuple[str, ...] | None  # None: the image's own
    runtime: str
    plain_http: bool
    env: EnvPlan | None
    ckpt: CkptPlan | None


def plan_from(settings: Mapping[str, object], base_dir: str = ".") -> LaunchPlan:
    """The plan `settings` (a launch.toml's tables, flags laid over them) describe; relative
    requirement paths are taken from `base_dir` (the launch.toml's directory)."""
    _known(settings, "")
    image = _text(settings, "image", "")
    if image is None:
        raise PlanError("image: required (an image reference, e.g. registry:5000/train:1)")
    command = _strings(settings, "command", "")
    runtime = _choice(settings, "runtime", "", RUNTIMES, "runc")
    plain_http = _flag(settings, "plain_http", "", False)
    env = _env(_table(settings, "env"), base_dir)
    ckpt = _ckpt(_table(settings, "ckpt"))
    if env is not None and ckpt is not None:
        taken = {target for _, target in ckpt.targets()}
        if env.path is not None and any(_overlaps(env.path, t) for t in taken):
            raise PlanError(f"env path {env.path} and ckpt path {ckpt.path} overlap; "
                            "give them separate directories")
    return LaunchPlan(image, tuple(command) if command else None, runtime, plain_http, env,
                      ckpt)


def merge(file: Mapping[str, object], flags: Mapping[str, object]) -> dict[str, object]:
    """`file`'s settings with `flags` (same shape; None means "not given") laid over them."""
    out: dict[str, object] = dict(file)
    for name, value in flags.items():
        if isinstance(value, Mapping):
            out[name] = merge(_table(file, name) or {}, value)
        elif value is not None:
            out[name] = value
    return out


def _env(table: Mapping[str, object] | None, base_dir: str) -> EnvPlan | None:
    if not table:
        return None
    _known(table, "env")
    key = _text(table, "key", "env")
    if key is not None:
        try:
            check_key(key)
        except KeyInputError as exc:
            raise PlanError(f"[env] key: {exc}") from None
    requirements = _text(table, "requirements", "env")
    if (key is None) == (requirements is None):
        raise PlanError("[env]: give exactly one of key (a published snapshot) or "
                        "requirements (a requirements file)")
    mode = _choice(table, "mode", "env", ENV_MODES, "restore")
    if mode == "mount" and key is None:
        raise PlanError("[env] mode = \"mount\" needs a key: a requirements launch may have "
                        "to install, and an install is restored, not mounted")
    if key is not None and table.get("path") is not None:
        raise PlanError("[env] path: a snapshot given by key is bound at the prefix it was "
                        "made for (a venv works only there); path is for requirements")
    path = None if key is not None else _absolute(table, "path", "env", DEFAULT_ENV_PATH)
    if requirements is not None and not posixpath.isabs(requirements):
        requirements = posixpath.normpath(posixpath.join(base_dir, requirements))
    return EnvPlan(key, requirements, path, mode, _text(table, "python", "env") or "python3",
                   _choice(table, "installer", "env", INSTALLERS, "pip"))


def _ckpt(table: Mapping[str, object] | None) -> CkptPlan | None:
    if not table:
        return None
    _known(table, "ckpt")
    uris = _strings(table, "uris", "ckpt")
    if not uris:
        return None
    for uri in uris:
        if not uri.startswith("hdfs://"):
            raise PlanError(f"[ckpt] uris: {uri!r} is not an hdfs://HOST:PORT/path URI")
    plan = CkptPlan(tuple(uris), _absolute(table, "path", "ckpt", DEFAULT_CKPT_PATH),
                    _flag(table, "prefetch", "ckpt", True))
    names = [target for _, target in plan.targets()]
    if len(set(names)) != len(names):
        raise PlanError("[ckpt] uris: two URIs end in the same name; each is mounted at "
                        f"{plan.path}/NAME, so their last path components must differ")
    return plan


# ---- typed reads ----------------------------------------------------------------------------


def _where(table: str, name: str) -> str:
    return f"[{table}] {name}" if table else name


def _known(settings: Mapping[str, object], table: str) -> None:
    unknown = sorted(set(settings) - TABLES[table])
    if unknown:
        raise PlanError(f"{_where(table, unknown[0])}: unknown setting; known: "
                        f"{', '.join(sorted(TABLES[table]))}")


def _table(settings: Mapping[str, object], name: str) -> Mapping[str, object] | None:
    value = settings.get(name)
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise PlanError(f"{name}: must be a table ([{name}])")
    return value


def _text(settings: Mapping[str, object], name: str, table: str) -> str | None:
    value = settings.get(name)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise PlanError(f"{_where(table, name)}: must be a string, not {value!r}")
    return value


def _strings(settings: Mapping[str, object], name: str, table: str) -> list[str]:
    value = settings.get(name)
    if value is None:
        return []
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
        raise PlanError(f"{_where(table, name)}: must be a list of strings")
    return [str(v) for v in value]


def _choice(settings: Mapping[str, object], name: str, table: str, choices: tuple[str, ...],
            default: str) -> str:
    value = _text(settings, name, table) or default
    if value not in choices:
        raise PlanError(f"{_where(table, name)}: {value!r} is not one of {', '.join(choices)}")
    return value


def _flag(settings: Mapping[str, object], name: str, table: str, default: bool) -> bool:
    value = settings.get(name, default)
    if not isinstance(value, bool):
        raise PlanError(f"{_where(table, name)}: must be true or false")
    return value


def _absolute(settings: Mapping[str, object], name: str, table: str, default: str) -> str:
    value = _text(settings, name, table) or default
    normal = posixpath.normpath(value)
    if not posixpath.isabs(value) or normal == "/" or ".." in value.split("/"):
        raise PlanError(f"{_where(table, name)}: {value!r} must be an absolute path below /, "
                        "without ..")
    return normal


def _overlaps(a: str, b: str) -> bool:
    return a == b or a.startswith(b.rstrip("/") + "/") or b.startswith(a.rstrip("/") + "/")


def _last_name(uri: str) -> str:
    return uri.rstrip("/").rsplit("/", 1)[-1] or "root"
