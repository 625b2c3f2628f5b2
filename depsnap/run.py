"""`depsnap run`: restore the key's snapshot if one exists, else install and publish it.

The prefix is a virtualenv that `depsnap run` owns: it must not exist yet (or
be an empty directory). If the tracker has a snapshot for the key, the
snapshot is restored there through the local agent and the command is not
run. Otherwise the venv is made with the given interpreter (with pip for a
pip command, without for uv, which brings its own), the command runs with the
venv first on PATH and as VIRTUAL_ENV (so `pip install ...` and `uv pip
install ...` install into it), and only if it exits 0 is the prefix captured
and published. A command that fails, or is interrupted, publishes nothing and
its exit status is returned (128 + N for a signal N); the prefix is left as
the command left it, for inspection.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from depsnap.key import KeyInputs
from depsnap.publish import Published, capture, find_snapshot, load_snapshot, publish
from depsnap.restore import restore
from p2p.agentclient import AgentClient
from p2p.content import Manifest
from p2p.tracker_client import TrackerClient

FREEZE = ("import importlib.metadata as m; print('\\n'.join(sorted("
          "f\"{d.metadata['Name']}=={d.version}\" for d in m.distributions())))")


@dataclass(frozen=True, slots=True)
class Places:
    """Where a node's services and files are."""

    tracker: str
    secret: bytes
    api_socket: str
    origin_dir: Path | None  # where created snapshots are written (None: cannot create)
    origin_url: str  # how agents reach origin_dir
    cache_dir: Path | None
    store_dir: Path | None = None  # the agent's chunk store, read directly when given
    origin_registry: str | None = None  # a repository new snapshots are pushed to instead


async def restore_key(places: Places, key: str, prefix: Path) -> dict[str, Any]:
    """Restore the snapshot of `key` at `prefix`; a summary."""
    started = time.monotonic()
    async with TrackerClient(places.tracker, places.secret) as tracker, \
            AgentClient(places.api_socket) as agent:
        tree, snapshot = await load_snapshot(tracker, agent, key, places.origin_url)
        stats = await restore(agent, snapshot, prefix, places.cache_dir, places.store_dir)
    return {"action": "restored", "key": key, "tree": tree, "prefix": str(prefix),
            "snapshot_prefix": snapshot.prefix, "packs": [p.content for p in snapshot.packs],
            **asdict(stats), "seconds": round(time.monotonic() - started, 3)}


async def snapshot_exists(places: Places, key: str) -> bool:
    """Whether anyone published a snapshot of `key`."""
    async with TrackerClient(places.tracker, places.secret) as tracker:
        return await find_snapshot(tracker, key, places.origin_url) is not None


def run(places: Places, inputs: KeyInputs, argv: Sequence[str], prefix: Path,
        environ: Mapping[str, str]) -> tuple[int, dict[str, Any]]:
    """Restore or install-and-publish; (exit status, summary)."""
    key = inputs.key()
    if asyncio.run(snapshot_exists(places, key)):
        return 0, asyncio.run(restore_key(places, key, prefix))
    if places.origin_dir is None and places.origin_registry is None:
        raise ValueError(f"no snapshot for key {key} yet, and no --origin-dir or "
                         "--origin-registry to publish one")
    started = time.monotonic()
    uses_uv = Path(argv[0]).name == "uv"
    status = _install(inputs.interpreter.executable, argv, prefix, environ, uses_uv)
    summary: dict[str, Any] = {"key": key, "prefix": str(prefix), "exit_status": status,
                               "install_seconds": round(time.monotonic() - started, 3)}
    if status != 0:
        return status, {**summary, "action": "failed", "published": False}
    published = _capture_and_publish(places, inputs, prefix, _freeze(prefix))
    return 0, {**summary, "action": "created", **asdict(published),
               "seconds": round(time.monotonic() - started, 3)}


def _capture_and_publish(places: Places, inputs: KeyInputs, prefix: Path,
                         resolved: tuple[str, ...]) -> Published:
    """Capture `prefix` into the origin directory, or into a staging directory pushed to
    the origin registry; then register it with the tracker, its name last."""
    key = inputs.key()
    with tempfile.TemporaryDirectory(prefix="bootseer-depsnap-") as staging:
        if places.origin_registry is None:
            assert places.origin_dir is not None
            where, url = places.origin_dir, places.origin_url
        else:
            where, url = Path(staging), f"file://{staging}"
        snapshot, manifests, new_bytes = capture(prefix, key, inputs, resolved, where, url)

        async def register() -> Published:
            nonlocal manifests, new_bytes
            if places.origin_registry is not None:
                manifests, new_bytes = await _push(places.origin_registry, key, where,
                                                   manifests)
            async with TrackerClient(places.tracker, places.secret) as tracker:
                return await publish(tracker, snapshot, manifests, new_bytes,
                                     places.origin_dir if places.origin_registry is None
                                     else None)

        return asyncio.run(register())


async def _push(repository: str, key: str, staging: Path, manifests: list[Manifest]
                ) -> tuple[list[Manifest], int]:
    from depsnap.registry import push_snapshot
    from p2p.origin.oci import RegistryClient
    from p2p.origin.oci_ref import parse_reference

    repo = parse_reference(repository)
    async with RegistryClient() as client:
        return await push_snapshot(client, repo, key, staging, manifests)


def _install(python: str, argv: Sequence[str], prefix: Path, environ: Mapping[str, str],
             uses_uv: bool) -> int:
    if prefix.exists() and (not prefix.is_dir() or any(prefix.iterdir())):
        raise ValueError(f"{prefix} exists and is not empty; `depsnap run` makes the prefix "
                         "itself (remove it, or pick another)")
    venv = [python, "-m", "venv", *(["--without-pip"] if uses_uv else []), str(prefix)]
    status = _call(venv, environ)
    if status != 0:
        return status
    env = {**environ, "VIRTUAL_ENV": str(prefix),
           "PATH": f"{prefix / 'bin'}{os.pathsep}{environ.get('PATH', os.defpath)}"}
    env.pop("PYTHONHOME", None)
    return _call(list(argv), env)


def _call(argv: list[str], env: Mapping[str, str]) -> int:
    """Run `argv`, its output on our stderr (our stdout carries only results); its exit
    status, 128 + N if a signal N ended it (or interrupted us)."""
    try:
        proc = subprocess.Popen(argv, env=dict(env), stdout=sys.stderr.fileno())
    except OSError as exc:
        raise ValueError(f"cannot run {argv[0]}: {exc.strerror}") from None
    try:
        code = proc.wait()
    except KeyboardInterrupt:  # the child got the SIGINT too: let it finish dying
        proc.send_signal(signal.SIGINT)
        code = proc.wait()
        return 128 + signal.SIGINT if code >= 0 else 128 - code
    return code if code >= 0 else 128 - code


def _freeze(prefix: Path) -> tuple[str, ...]:
    """What is installed in the venv, as `Name==version` lines."""
    done = subprocess.run([str(prefix / "bin" / "python"), "-I", "-B", "-c", FREEZE],
                          capture_output=True, text=True, check=False, timeout=120)
    return tuple(done.stdout.split()) if done.returncode == 0 else ()
