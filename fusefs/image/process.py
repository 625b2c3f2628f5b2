"""What to run in a container: an image config's Entrypoint/Cmd/Env/WorkingDir/User as a `Process`.

`process_from_config` is pure: it takes the OCI config's `config` object
(the `config.config` of an image config blob), an optional command that
replaces `Cmd` (as `docker run IMAGE CMD...` does; `Entrypoint` stays in
front), and the text of the image's /etc/passwd and /etc/group, and returns
argv, env, cwd, uid and gid. Docker's rules apply: an empty `User` is root;
`uid`, `uid:gid`, `name`, `name:group` are accepted; a user given by name
takes its primary group from passwd unless a group is named; a numeric uid
with no passwd entry gets gid 0. `PATH` gets Debian's default when the image
sets none, `HOME` comes from passwd (or `/`).

`image_process` is the I/O shell: it reads those two files from a rootfs
through `resolve_in_root`, which resolves every symlink as if the rootfs
were `/` (an absolute target or a `..` never leaves it, as under chroot), so
a hostile image cannot make us read a host file. Names are resolved from the
image, not the host, because the container's `id` reads the image's files:
both must agree.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from fusefs.image.tool import ToolError

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
MAX_SYMLINKS = 40
MAX_ACCOUNT_FILE_BYTES = 4 << 20


class ContainerError(ToolError):
    """A container cannot be set up or run; the message names what is missing and the fix."""


@dataclass(frozen=True, slots=True)
class Bind:
    """A host directory made visible at `target` inside the container."""

    source: Path  # on the host
    target: str  # absolute, inside the container
    read_only: bool = True


@dataclass(frozen=True, slots=True)
class Process:
    argv: tuple[str, ...]
    env: tuple[str, ...]  # "NAME=value"
    cwd: str  # absolute, inside the container
    uid: int
    gid: int


def process_from_config(config_json: Mapping[str, object], argv_override: Sequence[str] | None,
                        *, passwd: str = "", group: str = "") -> Process:
    """The process an image config describes (see the module docstring)."""
    entrypoint = _strings(config_json.get("Entrypoint"), "Entrypoint")
    cmd = _strings(config_json.get("Cmd"), "Cmd")
    argv = (*entrypoint, *(cmd if argv_override is None else argv_override))
    if not argv:
        raise ContainerError("nothing to run: the image has no Entrypoint or Cmd and no "
                             "command was given")
    uid, gid, home = parse_user(str(config_json.get("User") or ""), passwd, group)
    env = _env(_strings(config_json.get("Env"), "Env"), home)
    cwd = "/" + str(config_json.get("WorkingDir") or "/").strip("/")
    return Process(argv, env, cwd, uid, gid)


def _strings(value: object, field: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ContainerError(f"image config {field} is not a list of strings: {value!r}")
    return tuple(value)


def _env(env: Sequence[str], home: str) -> tuple[str, ...]:
    names = {item.partition("=")[0] for item in env}
    defaults = [f"{name}={value}" for name, value in (("PATH", DEFAULT_PATH), ("HOME", home))
                if name not in names]
    return (*defaults, *env)


def parse_user(user: str, passwd: str, group: str) -> tuple[int, int, str]:
    """(uid, gid, home) for a config `User` value, given the image's passwd and group text."""
    name, _, group_name = user.partition(":")
    if not name:
        if group_name:
            raise ContainerError(f"image config User {user!r} names a group but no user")
        return 0, 0, "/root"
    users = _table(passwd)
    entry = users.get(name) or next((e for e in users.values() if e[1] == name), None)
    if entry is None and not name.isdigit():
        raise ContainerError(f"user {name!r} (image config User) is not in the image's "
                             "/etc/passwd; use a numeric uid:gid")
    uid = int(name) if name.isdigit() else int(entry[1])  # type: ignore[index]
    gid = int(entry[2]) if entry and entry[2].isdigit() else 0
    home = entry[4] if entry and len(entry) > 4 and entry[4] else "/"
    if group_name:
        gid = _gid(group_name, group)
    return uid, gid, home


def _gid(name: str, group: str) -> int:
    if name.isdigit():
        return int(name)
    entry = _table(group).get(name)
    if entry is None or not entry[1].isdigit():
        raise ContainerError(f"group {name!r} (image config User) is not in the image's "
                             "/etc/group; use a numeric gid")
    return int(entry[1])


def _table(text: str) -> dict[str, list[str]]:
    """name -> the remaining colon fields, for passwd(5) and group(5) lines.

    passwd: [password, uid, gid, gecos, home, shell]; group: [password, gid, members].
    """
    rows: dict[str, list[str]] = {}
    for line in text.splitlines():
        fields = line.split(":")
        if len(fields) >= 3 and fields[0] and not line.startswith(("#", "+", "-")):
            rows.setdefault(fields[0], fields[1:])
    return rows


# -- reading the image's files ---------------------------------------------------------------

def resolve_in_root(root: Path, path: str) -> Path:
    """`path` inside `root`, symlinks resolved as if `root` were `/` (never outside it).

    Raises ContainerError on a symlink loop. A missing component ends the walk:
    the result then names a path that does not exist.
    """
    parts = [p for p in path.split("/") if p not in ("", ".")]
    resolved: list[str] = []
    links = 0
    while parts:
        part = parts.pop(0)
        if part == "..":
            resolved = resolved[:-1]
            continue
        candidate = root.joinpath(*resolved, part)
        try:
            mode = candidate.lstat().st_mode
        except OSError:
            return root.joinpath(*resolved, part, *parts)
        if not stat.S_ISLNK(mode):
            resolved.append(part)
            continue
        links += 1
        if links > MAX_SYMLINKS:
            raise ContainerError(f"too many symlinks resolving {path} in {root}")
        target = os.readlink(candidate)
        if target.startswith("/"):
            resolved = []
        parts = [p for p in target.split("/") if p not in ("", ".")] + parts
    return root.joinpath(*resolved)


def read_in_root(root: Path, path: str, max_bytes: int = MAX_ACCOUNT_FILE_BYTES) -> str:
    """The text of `path` inside `root` ('' if absent), read through `resolve_in_root`."""
    target = resolve_in_root(root, path)
    try:
        fd = os.open(target, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as e:
        if e.errno in (errno.ENOENT, errno.ENOTDIR):
            return ""
        raise ContainerError(f"cannot read {path} in the image at {root}: {e.strerror}") from e
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ContainerError(f"{path} in the image at {root} is not a regular file")
        return f.read(max_bytes).decode(errors="replace")


def image_process(rootfs: Path, config_json: Mapping[str, object],
                  argv_override: Sequence[str] | None) -> Process:
    """`process_from_config` with the rootfs's own /etc/passwd and /etc/group."""
    needs_names = any(not part.isdigit() for part in str(config_json.get("User") or "0")
                      .split(":") if part)
    passwd = read_in_root(rootfs, "/etc/passwd")
    group = read_in_root(rootfs, "/etc/group") if needs_names else ""
    return process_from_config(config_json, argv_override, passwd=passwd, group=group)
