"""Gather a key's inputs from this node: files, interpreters, installers, environment.

The shell around `depsnap.key`: it reads the requirement files the command
names (and the files they include with `-r`/`-c`, inlined, so only contents
count), asks the target interpreter for its version, ABI and platform, and
asks the installer for its version. An installer that will come from the
prefix's own virtualenv (plain `pip` in a prefix that `depsnap run` creates)
is the pip that `ensurepip` bundles with that interpreter, so its version is
known before the venv exists.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from depsnap.key import (
    Interpreter,
    KeyInputError,
    KeyInputs,
    canonical_inputs,
    parse_command,
)

PROBE = ("import json, sys, sysconfig, ensurepip; print(json.dumps({"
         "'version': '.'.join(map(str, sys.version_info[:3])), "
         "'abi': sys.implementation.cache_tag + getattr(sys, 'abiflags', ''), "
         "'platform': sysconfig.get_platform(), 'pip': ensurepip.version()}))")
TIMEOUT_S = 60.0
MAX_INCLUDE_DEPTH = 8


def probe_interpreter(python: str) -> tuple[Interpreter, str]:
    """The interpreter `python` (a name on PATH or a path) and its bundled pip version."""
    path = shutil.which(python)
    if path is None:
        raise KeyInputError(f"no Python interpreter {python!r} (give --python PATH)")
    out = _output([path, "-c", PROBE], f"asking {path} for its version")
    info = json.loads(out)
    return Interpreter(info["version"], info["abi"], info["platform"],
                       os.path.abspath(path)), str(info["pip"])


def installer_version(argv: Sequence[str], bundled_pip: str,
                      environ: Mapping[str, str]) -> str:
    """`pip 24.0`, `uv 0.5.1`, ... for the program the command runs."""
    program, name = argv[0], Path(argv[0]).name
    as_module = name.startswith("python") and list(argv[1:3]) == ["-m", "pip"]
    if as_module:
        name = "pip"
    elif name.startswith("pip") and "/" not in program:
        # The pip of the venv `depsnap run` makes: it runs first on PATH. Whatever the
        # prefix holds now does not count (run refuses a prefix that is not empty), so
        # a node that restored this prefix before computes the same key as one that
        # did not.
        return f"pip {bundled_pip}"
    elif not name.startswith(("pip", "uv")):
        return name  # not an installer we know: its command line is all the key has
    path = shutil.which(program, path=environ.get("PATH"))
    if path is None:
        raise KeyInputError(f"the installer {program!r} is not on PATH")
    version = [path, "-m", "pip", "--version"] if as_module else [path, "--version"]
    words = _output(version, f"asking {program} for its version", environ).split()
    return f"{name} {words[1] if len(words) > 1 else ' '.join(words)}"


def read_with_includes(path: Path, depth: int = 0) -> str:
    """A requirements file with the files it includes (-r/-c) inlined."""
    if depth > MAX_INCLUDE_DEPTH:
        raise KeyInputError(f"{path}: includes nest more than {MAX_INCLUDE_DEPTH} deep")
    try:
        text = path.read_text()
    except OSError as exc:
        raise KeyInputError(f"cannot read {path}: {exc.strerror}") from None
    out = []
    for line in text.splitlines():
        words = line.split()
        if len(words) == 2 and words[0] in ("-r", "--requirement", "-c", "--constraint"):
            out.append(read_with_includes(path.parent / words[1], depth + 1))
        else:
            out.append(line)
    return "\n".join(out)


def gather(argv: Sequence[str], prefix: Path, python: str, environ: Mapping[str, str],
           cwd: Path, base_image: str = "", resolved: Sequence[Path] = ()) -> KeyInputs:
    """The canonical key inputs of `argv` installing into `prefix` for `python`."""
    command = parse_command(argv)
    interpreter, bundled = probe_interpreter(python)
    files = [(option, read_with_includes(cwd / name)) for option, name in command.files]
    pins = [read_with_includes(cwd / p) for p in resolved]
    installer = installer_version(argv, bundled, environ)
    return canonical_inputs(command, files, pins, installer, interpreter,
                            str(prefix.absolute()), base_image, environ)


def _output(argv: list[str], what: str, environ: Mapping[str, str] | None = None) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S,
                              check=False, env=None if environ is None else dict(environ))
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise KeyInputError(f"{what}: {exc}") from None
    if done.returncode != 0:
        raise KeyInputError(f"{what}: exit status {done.returncode}: "
                            f"{done.stderr.strip()[-300:]}")
    return done.stdout
