"""The `bootseer` console script: one subcommand per role.

Each package registers its subcommands through the `bootseer.commands`
entry-point group (see pyproject.toml), so this dispatcher imports no other
package directly. A subcommand sets `run=callable(args) -> int` as a default.
Expected failures are printed as one line on stderr with exit status 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from importlib.metadata import PackageNotFoundError, entry_points, version

from p2p.errors import UserError


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole parser; with `command` naming a command (e.g. "agent" or "image"), only
    the commands of the package that owns it: the others' modules are then never
    imported, which keeps the agent and every short-lived command (or the mount
    process `image run` starts) fast to start (`bootseer agent`: about 0.6 s less)."""
    parser = argparse.ArgumentParser(
        prog="bootseer",
        description="Fast startup for large training jobs: images, dependencies and "
                    "checkpoints from peers, not from the origin.")
    parser.add_argument("--version", action="version", version=f"bootseer {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    found = sorted(entry_points(group="bootseer.commands"), key=lambda e: e.name)
    if any(ep.name == command for ep in found):
        found = [ep for ep in found if ep.name == command]
    # A package owning several commands has an entry for each: register it once.
    for ep in {ep.value: ep for ep in found}.values():
        try:
            add: Callable[[argparse._SubParsersAction[argparse.ArgumentParser]], None] = ep.load()
        except ImportError as exc:
            # One package's missing optional dependency must not take the agent down.
            _unavailable(sub, ep.name, exc)
            continue
        add(sub)
    _explain(parser)
    return parser


# Flags that several packages' commands share, and what they mean wherever they appear.
COMMON_HELP = {
    "tracker": "tracker URL; replicas comma-separated (env BOOTSEER_TRACKER)",
    "api_socket": "the local agent's API socket (env BOOTSEER_API_SOCKET)",
    "store_dir": "the local agent's chunk store directory (env BOOTSEER_STORE_DIR)",
    "log_level": "DEBUG, INFO, WARNING or ERROR",
    "runtime": "the container runtime: runc or bwrap",
}


class _DefaultsFormatter(argparse.HelpFormatter):
    """Help that ends with the default, for every option that has one and does not say it."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (not action.option_strings or "default" in text or action.nargs == 0
                or default is None or default is argparse.SUPPRESS or default == []):
            return text
        shown = default.name if hasattr(default, "name") and callable(default) else default
        return f"{text} (default: {shown})".lstrip()


def _explain(parser: argparse.ArgumentParser) -> None:
    """Every parser below `parser` shows defaults, and shared flags say what they are."""
    parser.formatter_class = _DefaultsFormatter
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                _explain(child)
        elif action.help is None and action.dest in COMMON_HELP:
            action.help = COMMON_HELP[action.dest]


def _version() -> str:
    try:
        return version("bootseer")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def _unavailable(sub: argparse._SubParsersAction[argparse.ArgumentParser], name: str,
                 exc: ImportError) -> None:
    def run(args: argparse.Namespace) -> int:
        raise UserError(f"the {name} commands need a module that is not installed ({exc.name}); "
                        f"install the extra, e.g. pip install 'bootseer[sim]'")

    p = sub.add_parser(name, help=f"(unavailable: {exc.name} is not installed)")
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(run=run)


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(words[0] if words else None).parse_args(words)
    try:
        return int(args.run(args) or 0)
    except UserError as exc:
        print(f"bootseer {args.command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register the p2p subcommands (agent, origin, publish, get, status)."""
    from p2p import commands

    commands.register(sub)
