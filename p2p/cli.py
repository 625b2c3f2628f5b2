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
from importlib.metadata import entry_points


class UserError(Exception):
    """An expected failure: bad input or a missing server. Printed, not traced."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bootseer", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for ep in sorted(entry_points(group="bootseer.commands"), key=lambda e: e.name):
        add: Callable[[argparse._SubParsersAction[argparse.ArgumentParser]], None] = ep.load()
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except UserError as exc:
        print(f"bootseer {args.command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register the p2p subcommands (agent, demo, bench)."""
    from p2p import commands

    commands.register(sub)
