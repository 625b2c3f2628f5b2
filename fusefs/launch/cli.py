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
from typing import Any

from p2p.errors import UserError


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from depsnap.cli import node_flags, publish_flags

    p = sub.add_parser("launch", help="bring up image, environment and checkpoint; run the job",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-f", "--file", type=Path, metavar="LAUNCH_TOML",
                   help="the launch's settings (flags override them)")
    p.add_argument("--image", metavar="REF", help="image reference, indexed with `image index`")
    p.add_argument("--runtime", choices=("runc", "bwrap"))
    p.add_argument("--plain-http", action="store_true", default=None,
                   help="reach the registry over plain HTTP")
    e = p.add_argument_group("environment (a dependency snapshot)")
    e.add_argument("--env-key", metavar="KEY", help="a published snapshot's key")
    e.add_argument("--env-requirements", type=Path, metavar="FILE",
                   help="a requirements file: restored if published, else installed here")
    e.add_argument("--env-path", metavar="DIR", help="the venv's path (requirements only)")
    e.add_argument("--env-mode", choices=("restore", "mount"))
    e.add_argument("--python", metavar="PYTHON", help="the interpreter of the venv and key")
    c = p.add_argument_group("checkpoint")
    c.add_argument("--ckpt", action="append", metavar="URI", help="hdfs://HOST:PORT/path; "
                   "repeat for several")
    c.add_argument("--ckpt-path", metavar="DIR", help="where it appears in the image")
    c.add_argument("--no-ckpt-prefetch", dest="ckpt_prefetch", action="store_false",
                   default=None, help="fetch stripes on first read only")
    p.add_argument("--json", action="store_true", help="print the timeline as one JSON line")
    p.add_argument("--log-level", default="INFO", type=str.upper,
                   choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    node_flags(p)
    publish_flags(p)
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD ...")
    p.set_defaults(run=_run)


def settings_of(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
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
    requirements = args.env_requirements.absolute() if args.env_requirements else None
    flags = {"image": args.image, "command": command or None, "runtime": args.runtime,
             "plain_http": args.plain_http,
             "env": {"key": args.env_key, "path": args.env_path, "mode": args.env_mode,
                     "python": args.python,
                     "requirements": str(requirements) if requirements else None},
             "ckpt": {"uris": args.ckpt, "path": args.ckpt_path,
                      "prefetch": args.ckpt_prefetch}}
    return merge(file, flags), base


def expected_errors() -> tuple[type[Exception], ...]:
    from depsnap.cli import expected_errors as depsnap_errors
    from fusefs.image.cli import expected_errors as image_errors
    from fusefs.launch.plan import PlanError
    from fusefs.launch.run import LaunchError
    from hdfs_stripe.cli import expected_errors as ckpt_errors

    return (*image_errors(), *depsnap_errors(), *ckpt_errors(), PlanError, LaunchError)


def _run(args: argparse.Namespace) -> int:
    from depsnap.cli import places
    from fusefs.launch.plan import PlanError, plan_from
    from fusefs.launch.run import launch

    logging.basicConfig(level=args.log_level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings, base = settings_of(args)
    try:
        plan = plan_from(settings, base)
    except PlanError as exc:
        where = f"{args.file}: " if args.file else ""
        raise UserError(f"{where}{exc}") from None
    node = places(args, args.origin_dir)
    errors = expected_errors()
    try:
        status, timeline = launch(plan, node, errors)
    except errors as exc:
        raise UserError(str(exc)) from None
    except OSError as exc:
        raise UserError(f"{exc.filename or ''}: {exc.strerror}") from None
    logging.getLogger("bootseer.launch").info("timeline: %s", json.dumps(timeline))
    if args.json:
        print(json.dumps(timeline), flush=True)
    return int(status)
