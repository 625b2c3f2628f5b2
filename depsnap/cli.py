"""`bootseer depsnap ...`: dependency snapshots, keyed by what produced them.

- `depsnap key --prefix DIR -- CMD ...`: print the key of installing with CMD
  into DIR, and every input that went into it (`--json`: one JSON line).
- `depsnap run --prefix DIR -- CMD ...`: if a snapshot for the key exists,
  restore it at DIR and skip CMD; else make a venv at DIR, run CMD in it,
  and if it succeeds publish the installed tree. Exits with CMD's status.
- `depsnap restore KEY --prefix DIR`: restore a published snapshot.
- `depsnap mount KEY DIR`: serve the snapshot read-only at DIR (FUSE),
  fetching only the files that are read; `depsnap umount DIR` ends it.

Expected failures (no agent, no tracker, no snapshot, an unsafe tree, a full
disk) are one line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from depsnap.places import (
    expected,
    node_flags,
    places,
    publish_flags,
)
from p2p.errors import UserError


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `bootseer depsnap`."""
    p = sub.add_parser("depsnap", help="dependency snapshots: install once, restore anywhere",
                       description=__doc__.splitlines()[0])
    ds = p.add_subparsers(dest="depsnap_command", required=True, metavar="COMMAND")

    k = ds.add_parser("key", help="print a snapshot key and its inputs")
    _key_flags(k)
    k.set_defaults(run=_run_key)

    r = ds.add_parser("run", help="restore the key's snapshot, or install and publish it")
    _key_flags(r)
    node_flags(r)
    publish_flags(r)
    r.set_defaults(run=_run_run)

    s = ds.add_parser("restore", help="restore a published snapshot at --prefix")
    s.add_argument("key", metavar="KEY")
    s.add_argument("--prefix", type=Path, required=True, help="where to restore the venv")
    s.add_argument("--json", action="store_true", help="one JSON line")
    node_flags(s)
    s.set_defaults(run=_run_restore)

    from depsnap.mount import add_mount_commands

    add_mount_commands(ds, node_flags)


def _key_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prefix", type=Path, required=True, help="the venv to install into")
    p.add_argument("--python", default="python3",
                   help="the interpreter the venv is made with (default: python3 on PATH)")
    p.add_argument("--base-image", default=os.environ.get("BOOTSEER_BASE_IMAGE", ""),
                   help="digest of the base image, when known (part of the key)")
    p.add_argument("--resolved", type=Path, action="append", default=[], metavar="FILE",
                   help="a resolved `name==version` list (lock file) that is part of the key")
    p.add_argument("--json", action="store_true", help="one JSON line")
    p.add_argument("install_command", nargs=argparse.REMAINDER, metavar="-- CMD ...")


def _command(args: argparse.Namespace) -> list[str]:
    given = args.install_command
    command: list[str] = given[1:] if given[:1] == ["--"] else given
    if not command:
        raise UserError("give the install command after --, e.g. -- pip install -r req.txt")
    return command


def _inputs(args: argparse.Namespace) -> Any:
    from depsnap.inputs import gather
    from depsnap.key import KeyInputError

    try:
        return gather(_command(args), args.prefix.absolute(), args.python, os.environ,
                      Path.cwd(), args.base_image, args.resolved)
    except KeyInputError as exc:
        raise UserError(str(exc)) from None


def _show(summary: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(summary), flush=True)
    else:
        for key, value in summary.items():
            print(f"{key}: {value}", file=sys.stderr)


# ---- commands -----------------------------------------------------------------------------


def _run_key(args: argparse.Namespace) -> int:
    inputs = _inputs(args)
    if args.json:
        print(json.dumps({"key": inputs.key(), "inputs": inputs.describe()}))
    else:
        print(inputs.key())
        print(json.dumps(inputs.describe(), indent=2))
    return 0


def _run_run(args: argparse.Namespace) -> int:
    from depsnap.run import run

    inputs = _inputs(args)
    where = places(args, args.origin_dir)
    status, summary = expected(lambda: run(where, inputs, _command(args),
                                           args.prefix.absolute(), os.environ))
    _show(summary, args.json)
    return int(status)


def _run_restore(args: argparse.Namespace) -> int:
    from depsnap.key import check_key
    from depsnap.run import restore_key

    key = expected(lambda: check_key(args.key))
    where = places(args)
    summary = expected(lambda: asyncio.run(restore_key(where, key, args.prefix.absolute())))
    _show(summary, args.json)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m depsnap ...`: `bootseer depsnap ...` without the console script."""
    from p2p.cli import main as bootseer_main

    return bootseer_main(["depsnap", *(sys.argv[1:] if argv is None else argv)])
