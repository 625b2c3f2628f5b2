"""Today's way to start a job on one node: the baseline arm of `bootseer bench launch`.

    python -m fusefs.bench.launch_baseline --image REF --mirror URL --work DIR
        [--package SPEC ...] [--ckpt hdfs://HOST:PORT/path] [--python PY]
        [--runtime runc] -- CMD ...

With the standard tools and nothing shared between nodes, three parts at once
(as generous to the baseline as `bootseer launch` is to itself):

- image: `skopeo copy` of every blob, then `umoci unpack` (`fusefs.bench.baseline`);
- environment: `python -m venv`, then `pip install` of the pinned packages from
  the package mirror at URL (a plain directory listing, as `--find-links` reads);
- checkpoint: each hdfs:// file read in one WebHDFS stream into a local file;

then CMD in the unpacked image under the same runtime, the venv bound at its
own path and the checkpoint files at /ckpt, with the same environment variables
`bootseer launch` sets. CMD's output passes through; the last stdout line is
this run's JSON: seconds per part, when the command started, and its status.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import mmap
import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from hdfs_stripe.webhdfs import HdfsError
from p2p.process import own_and_children

CKPT_PATH = "/ckpt"
READ_BLOCK = 1 << 20


class BaselineError(Exception):
    """A step of the baseline failed; the message names it."""


async def _image(ref: str, work: Path) -> tuple[Path, dict[str, Any]]:
    from fusefs.bench.baseline import full_pull
    from fusefs.image.catalog import resolve
    from p2p.origin.oci import RegistryClient
    from p2p.origin.oci_ref import parse_reference

    parsed = parse_reference(ref)
    pulled = await full_pull(ref, work / "image", plain_http=True)
    async with RegistryClient(plain_http=(parsed.registry,)) as client:
        _, config = await resolve(client, parsed)
    return pulled.rootfs, dict(config.get("config") or {})


async def _env(python: str, venv: Path, mirror: str, packages: list[str]) -> None:
    await _call([python, "-m", "venv", str(venv)], "python -m venv")
    await _call([str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check",
                 "--no-index", "--find-links", mirror, "--trusted-host", urlsplit(mirror).hostname
                 or "", *packages], "pip install")


async def _ckpt(uris: list[str], into: Path) -> None:
    """Each file read in one WebHDFS stream (the project's client, as `bench ckpt`'s single
    stream reads) straight into a local file of its size."""
    from hdfs_stripe.naming import parse_uri
    from hdfs_stripe.origin import webhdfs_for

    into.mkdir(parents=True, exist_ok=True)
    for text in uris:
        uri = parse_uri(text)
        async with webhdfs_for(uri) as client:
            size = (await client.status(uri.path)).length
            with open(into / uri.path.rsplit("/", 1)[-1], "w+b") as out:
                out.truncate(size)
                with mmap.mmap(out.fileno(), size) as view:
                    await client.read_into(uri.path, 0, memoryview(view))


async def _call(argv: list[str], what: str) -> None:
    proc = await asyncio.create_subprocess_exec(*argv, stdout=sys.stderr.fileno())
    if await proc.wait() != 0:
        raise BaselineError(f"{what} exited {proc.returncode}")


async def _timed(name: str, work: Any, into: dict[str, float], started: float) -> Any:
    result = await work
    into[f"{name}_s"] = round(time.monotonic() - started, 3)
    return result


async def baseline(args: argparse.Namespace) -> dict[str, Any]:
    from fusefs.image.process import Bind, image_process
    from fusefs.image.runtime import run_in_rootfs
    from fusefs.launch.run import with_environ

    started, parts = time.monotonic(), dict[str, float]()
    venv, ckpt = args.work / "venv", args.work / "ckpt"
    async with asyncio.TaskGroup() as group:
        image = group.create_task(_timed("image", _image(args.image, args.work), parts, started))
        if args.package:
            group.create_task(_timed("env", _env(args.python, venv, args.mirror, args.package),
                                     parts, started))
        if args.ckpt:
            group.create_task(_timed("ckpt", _ckpt(args.ckpt, ckpt), parts, started))
    rootfs, config = image.result()
    command = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    process = await asyncio.to_thread(image_process, rootfs, config, command or None)
    binds, environ = list[Bind](), dict[str, str]()
    if args.package:
        binds.append(Bind(venv, str(venv), read_only=False))
        environ |= {"VIRTUAL_ENV": str(venv), "PATH": f"{venv}/bin"}
    if args.ckpt:
        binds.append(Bind(ckpt, CKPT_PATH))
        environ["BOOTSEER_CKPT"] = CKPT_PATH
    process = replace(process, env=with_environ(process.env, environ))
    command_started = round(time.monotonic() - started, 3)
    cpu_ready = round(sum(own_and_children()), 2)
    status = await run_in_rootfs(rootfs, process, runtime=args.runtime, binds=binds)
    return {"exit_status": status, **parts, "command_started_s": command_started,
            "cpu_ready_s": cpu_ready,
            "command_s": round(time.monotonic() - started - command_started, 3),
            "seconds": round(time.monotonic() - started, 3)}


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m fusefs.bench.launch_baseline", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--image", required=True)
    p.add_argument("--mirror", default="", help="package mirror URL (a directory listing)")
    p.add_argument("--package", action="append", default=[])
    p.add_argument("--ckpt", action="append", default=[], metavar="URI",
                   help="hdfs://HOST:PORT/path of a checkpoint file")
    p.add_argument("--python", default="python3")
    p.add_argument("--runtime", default="runc", choices=("runc", "bwrap"))
    p.add_argument("--work", type=Path, required=True)
    p.add_argument("cmd", nargs=argparse.REMAINDER)
    args = p.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    try:
        result = asyncio.run(baseline(args))
    except ExceptionGroup as group:
        failed = group.exceptions[0]
        if not isinstance(failed, BaselineError | OSError | HdfsError):
            raise
        print(f"baseline: {failed}", file=sys.stderr)
        return 2
    print(json.dumps(result), flush=True)
    return 0 if result["exit_status"] == 0 else 1


if __name__ == "__main__":
    os.umask(0o022)
    sys.exit(main())
