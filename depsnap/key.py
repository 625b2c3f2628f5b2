"""The snapshot key: a hash of everything that decides an installed tree.

Theory of operation
-------------------
A key must be known *before* the install runs (that is how a node decides to
restore instead of installing), so it hashes the inputs of the install, in a
canonical form in which only meaning counts:

- the install command, with every file option (`-r`, `-c`, `--override`, ...)
  replaced by the file's *contents* (never its name), options paired with
  their values and sorted, package specs normalised (PEP 503 names) and
  sorted: `pip install b a` and `pip install a b` give one key;
- the contents of those requirement, constraint and lock files, each reduced
  to its sorted set of meaningful lines (comments, blank lines, line
  continuations and spacing do not count; name case and `_`/`.`/`-` do not);
- an optional resolved list (`name==version` lines, e.g. from `uv pip
  compile` or a previous `pip freeze`): a pinned, resolved list is what makes
  a key stable over time, since an unpinned `numpy` resolves to whatever the
  index offers today. The list the installer reports *after* the install is
  recorded in the snapshot (it cannot be in a key that must exist before);
- the installer and its version, the target Python (version, ABI tag,
  platform tag, the base interpreter's path), the base image digest when
  known, the target prefix (a venv only works where it was installed), and
  the environment variables that change what an install produces (index
  URLs, constraints, build flags; not caches, verbosity or progress bars).

`derive_key` hashes the canonical JSON of a `KeyInputs` under a version tag;
`KeyInputs.describe()` is what `bootseer depsnap key` prints, so a user can
diff the inputs of two keys. Reading files and asking interpreters for their
versions is the shell's job (`depsnap.inputs`); this module does no I/O.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from p2p.errors import UserError

KEY_VERSION = "bootseer-depsnap-key-v1"
KEY_HEX = 64
NAME_PREFIX = "depsnap/"  # the tracker name space of snapshot keys

# Options whose value is a file whose contents decide the install.
FILE_OPTIONS = frozenset({"-r", "--requirement", "-c", "--constraint", "--override",
                          "--overrides", "--build-constraint", "--build-constraints"})
# Options that take a value (paired with it before sorting).
VALUE_OPTIONS = frozenset({
    "-i", "--index-url", "--extra-index-url", "--index", "--default-index", "-f",
    "--find-links", "-p", "--python", "-t", "--target", "--prefix", "--root",
    "--platform", "--python-platform", "--python-version", "--implementation", "--abi",
    "--no-binary", "--only-binary", "--upgrade-strategy", "--index-strategy",
    "--resolution", "--prerelease", "--extra", "--group", "--config-settings", "-C",
    "--exclude-newer", "--link-mode", "--keyring-provider", "--trusted-host",
})
# Environment variables that change what an install produces. PIP_* and UV_* count
# unless listed in IGNORED_ENV (they change where caches live or what is printed).
ENV_PREFIXES = ("PIP_", "UV_")
BUILD_ENV = frozenset({"CC", "CXX", "CFLAGS", "CXXFLAGS", "CPPFLAGS", "LDFLAGS", "MAKEFLAGS",
                       "SETUPTOOLS_USE_DISTUTILS", "SOURCE_DATE_EPOCH", "PYTHONHASHSEED",
                       "CMAKE_ARGS", "NPY_BLAS_ORDER", "NPY_LAPACK_ORDER"})
IGNORED_ENV = frozenset({"PIP_CACHE_DIR", "PIP_NO_CACHE_DIR", "PIP_PROGRESS_BAR",
                         "PIP_QUIET", "PIP_VERBOSE", "PIP_NO_COLOR", "PIP_LOG",
                         "PIP_DISABLE_PIP_VERSION_CHECK", "PIP_ROOT_USER_ACTION",
                         "UV_CACHE_DIR", "UV_NO_CACHE", "UV_NO_PROGRESS", "UV_LINK_MODE",
                         "UV_CONCURRENT_DOWNLOADS", "UV_CONCURRENT_INSTALLS",
                         "UV_CONCURRENT_BUILDS", "UV_HTTP_TIMEOUT", "UV_NATIVE_TLS",
                         "UV_PYTHON_INSTALL_DIR", "UV_TOOL_DIR"})

_NAME = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(.*)$", re.DOTALL)
_KEY = re.compile(rf"[0-9a-f]{{{KEY_HEX}}}")


class KeyInputError(UserError, ValueError):
    """An input cannot go into a key (e.g. a file option without a file)."""


@dataclass(frozen=True, slots=True)
class Interpreter:
    """The Python a snapshot is installed for, as the shell asked it."""

    version: str  # "3.11.2"
    abi: str  # "cpython-311" (sys.implementation.cache_tag) plus abiflags
    platform: str  # "linux-x86_64" (sysconfig.get_platform())
    executable: str  # the base interpreter's real path: a venv's bin/python points there


@dataclass(frozen=True, slots=True)
class KeyInputs:
    """Everything a key is made of, already canonical (see `canonical_inputs`)."""

    command: tuple[str, ...]
    files: tuple[tuple[str, tuple[str, ...]], ...]  # (option, canonical lines), sorted
    resolved: tuple[str, ...]
    installer: str  # "pip 24.0", "uv 0.5.1"
    interpreter: Interpreter
    prefix: str
    base_image: str
    env: tuple[tuple[str, str], ...]

    def describe(self) -> dict[str, Any]:
        """The inputs as plain JSON values, in the order they are hashed."""
        return {
            "command": list(self.command),
            "files": [{"option": option, "lines": list(lines)} for option, lines in self.files],
            "resolved": list(self.resolved),
            "installer": self.installer,
            "python": {"version": self.interpreter.version, "abi": self.interpreter.abi,
                       "platform": self.interpreter.platform,
                       "executable": self.interpreter.executable},
            "prefix": self.prefix,
            "base_image": self.base_image,
            "env": dict(self.env),
        }

    def key(self) -> str:
        return derive_key(self)


def derive_key(inputs: KeyInputs) -> str:
    """64 hex digits: SHA-256 of the version tag and the canonical JSON of the inputs."""
    text = json.dumps(inputs.describe(), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(f"{KEY_VERSION}\0{text}".encode()).hexdigest()


def check_key(text: object) -> str:
    """`text` if it is a well-formed key (64 lower-case hex digits); else KeyInputError."""
    if not isinstance(text, str) or not _KEY.fullmatch(text):
        shown = text[:80] if isinstance(text, str) else type(text).__name__
        raise KeyInputError(f"{shown!r} is not a snapshot key ({KEY_HEX} hex digits; "
                            "`bootseer depsnap key` prints one)")
    return text


def key_name(key: str) -> str:
    """The tracker name a key's snapshot is published under."""
    return NAME_PREFIX + check_key(key)


# ---- canonical forms -------------------------------------------------------------------


def normalise_name(name: str) -> str:
    """PEP 503: lower case, runs of `-`, `_`, `.` as one `-`."""
    return re.sub(r"[-_.]+", "-", name).lower()


def canonical_spec(spec: str) -> str:
    """A requirement spec with its name normalised and its spacing removed."""
    spec = "".join(spec.split())
    match = _NAME.match(spec)
    if match is None or "://" in spec or spec.startswith((".", "/")):
        return spec  # a URL or a path: kept as written
    return normalise_name(match[1]) + match[2].lower()


def canonical_lines(text: str) -> tuple[str, ...]:
    """The meaningful lines of a requirements/constraints/lock file, sorted, unique."""
    joined = re.sub(r"\\\r?\n", "", text)
    lines = set()
    for raw in joined.splitlines():
        line = re.sub(r"(^|\s)#.*$", "", raw).strip()
        if not line:
            continue
        lines.add(line if line.startswith("-") else canonical_spec(line))
    return tuple(sorted(lines))


@dataclass(frozen=True, slots=True)
class ParsedCommand:
    """An install command: canonical tokens, and the files whose contents count."""

    tokens: tuple[str, ...]
    files: tuple[tuple[str, str], ...]  # (option, file name as given), in command order


def parse_command(argv: Sequence[str]) -> ParsedCommand:
    """Split `argv` into the canonical command and the files it names.

    The head (program and subcommands, up to the first option or spec after
    `install`/`sync`) keeps its order; everything after it is a set.
    """
    if not argv:
        raise KeyInputError("no install command given (put it after --)")
    if not is_installer(argv):
        return ParsedCommand((_program(argv[0]), *argv[1:]), ())  # opaque: kept as given
    head = [_program(argv[0])]
    index = 1
    while index < len(argv) and not argv[index].startswith("-") and head[-1] not in (
            "install", "sync"):
        head.append(argv[index])
        index += 1
    items: list[str] = []
    files: list[tuple[str, str]] = []
    while index < len(argv):
        token = argv[index]
        option, eq, value = token.partition("=")
        takes = option in FILE_OPTIONS or option in VALUE_OPTIONS
        if takes and not eq:
            if index + 1 >= len(argv):
                raise KeyInputError(f"{option} needs a value")
            value, index = argv[index + 1], index + 1
        if option in FILE_OPTIONS:
            files.append((option, value))
        elif takes:
            items.append(f"{option}={value}")
        else:
            items.append(token if token.startswith("-") else canonical_spec(token))
        index += 1
    return ParsedCommand((*head, *sorted(set(items))), tuple(files))


def is_installer(argv: Sequence[str]) -> bool:
    """pip, pip3..., uv, or `python -m pip`: commands whose options this module knows."""
    name = _program(argv[0])
    return name.startswith("pip") or name == "uv" or (
        name.startswith("python") and list(argv[1:3]) == ["-m", "pip"])


def _program(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1]


def canonical_env(environ: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """The environment variables that change an install, sorted."""
    return tuple(sorted((k, v) for k, v in environ.items() if k not in IGNORED_ENV and (
        k.startswith(ENV_PREFIXES) or k in BUILD_ENV)))


def canonical_inputs(command: ParsedCommand, file_texts: Iterable[tuple[str, str]],
                     resolved: Iterable[str], installer: str, interpreter: Interpreter,
                     prefix: str, base_image: str, environ: Mapping[str, str]) -> KeyInputs:
    """KeyInputs from raw inputs: `file_texts` are (option, file contents) pairs."""
    files = sorted({(option, canonical_lines(text)) for option, text in file_texts})
    pins = sorted({canonical_spec(line) for text in resolved for line in canonical_lines(text)})
    return KeyInputs(command.tokens, tuple(files), tuple(pins), installer, interpreter,
                     prefix.rstrip("/") or "/", base_image, canonical_env(environ))
