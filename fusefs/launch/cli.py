"""`bootseer launch`: what a job launcher runs on every node.

    bootseer launch -f launch.toml [-- CMD ...]
    bootseer launch --image REF [--env-key KEY | --env-requirements FILE]
                    [--ckpt hdfs://NN:PORT/path ...] [--json] -- CMD ...

The image is mounted with its hot-block record prefetched, the environment
restored (or mounted), the checkpoint mounted (and prefetched), all at once;
then CMD runs in the image and its exit status is ours. Flags override the
file's settings (see `fusefs.launch.plan` for the file). The per-phase timeline
goes to stderr, and with `--json` to stdout as one JSON line.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from p2p.errors import UserError

if TYPE_CHECKING:
    from fusefs.launch.part import LaunchPart


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from fusefs.launch.part import load_parts
    from p2p.places import add_node_flags

    p = sub.add_parser("launch", help="bring up image, environment and checkpoint; run the job",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-f", "--file", type=Path, metavar="LAUNCH_TOML",
                   help="the launch's settings (flags override them)")
    p.add_argument("--image", metavar="REF", help="image reference, indexed with `image index`")
    p.add_argument("--runtime", choices=("runc", "bwrap"))
    p.add_argument("--plain-http", action="store_true", default=None,
                   help="reach the registry over plain HTTP")
    p.add_argument("--json", action="store_true", help="print the timeline as one JSON line")
    p.add_argument("--log-level", default="INFO", type=str.upper,
                   choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    add_node_flags(p)
    for part in load_parts().values():
        part.add_flags(p)
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD ...")
    p.set_defaults(run=_run)


def settings_of(args: argparse.Namespace,
                parts: dict[str, LaunchPart]) -> tuple[dict[str, Any], str]:
    """The file's settings with the flags over them, and the directory relative paths in the
    file start from."""
    from fusefs.launch.plan import merge

    file: dict[str, Any] = {}
    base = "."
    if args.file is not None:
        try:
            file = tomllib.loads(args.file.read_text())
        except OSError as exc:
            raise UserError(f"cannot read {args.file}: {exc.strerror}") from None
        except tomllib.TOMLDecodeError as exc:
            raise UserError(f"{args.file} is not valid TOML: {exc}") from None
        base = str(args.file.absolute().parent)
    command = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    flags: dict[str, object] = {"image": args.image, "command": command or None,
                                "runtime": args.runtime, "plain_http": args.plain_http}
    for name, part in parts.items():
        flags[name] = part.flag_settings(args)
    return merge(file, flags), base


def _run(args: argparse.Namespace) -> int:
    from fusefs.launch.part import load_parts
    from fusefs.launch.plan import PlanError, plan_from
    from fusefs.launch.run import launch
    from p2p.auth import load_secret
    from p2p.places import node_places

    logging.basicConfig(level=args.log_level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    parts = load_parts()
    settings, base = settings_of(args, parts)
    try:
        plan = plan_from(settings, base, {name: part.parse for name, part in parts.items()})
    except PlanError as exc:
        where = f"{args.file}: " if args.file else ""
        raise UserError(f"{where}{exc}") from None
    node = node_places(args, load_secret())
    try:
        status, timeline = launch(plan, node, parts, args, (UserError,))
    except OSError as exc:
        raise UserError(f"{exc.filename or ''}: {exc.strerror}") from None
    logging.getLogger("bootseer.launch").info("timeline: %s", json.dumps(timeline))
    if args.json:
        print(json.dumps(timeline), flush=True)
    return int(status)
