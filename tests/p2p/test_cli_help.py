"""Every command's --help says what each option is, its unit and its default; --version."""

from __future__ import annotations

import argparse
import dataclasses
import re
import subprocess
import sys
from collections.abc import Iterator
from importlib.metadata import version

from p2p.cli import build_parser
from p2p.config import AgentConfig

RATE = re.compile(r"mbps|_cap$")


def options() -> Iterator[tuple[str, argparse.ArgumentParser, argparse.Action]]:
    def walk(parser: argparse.ArgumentParser, path: str
             ) -> Iterator[tuple[str, argparse.ArgumentParser, argparse.Action]]:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    yield from walk(child, f"{path} {name}")
            elif action.option_strings and action.dest != "help":
                yield path, parser, action

    yield from walk(build_parser(), "bootseer")


def shown(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    formatter = parser._get_formatter()
    formatter.add_argument(action)
    return " ".join(formatter.format_help().split())


def test_every_option_says_what_it_is() -> None:
    missing = [f"{path} {action.option_strings[0]}" for path, _, action in options()
               if not action.help and action.help != argparse.SUPPRESS]
    assert missing == []


def test_every_option_with_a_value_shows_its_default() -> None:
    # The agent's flags default to "not given" (the config file and the environment come
    # first); their help shows AgentConfig's defaults instead.
    agent_keys = {f.name for f in dataclasses.fields(AgentConfig)}
    missing = []
    for path, parser, action in options():
        default = action.default
        if default is argparse.SUPPRESS and action.dest in agent_keys:
            default = getattr(AgentConfig(), action.dest)
        if action.nargs == 0 or default in (None, [], argparse.SUPPRESS):
            continue
        if "default" not in shown(parser, action):
            missing.append(f"{path} {action.option_strings[0]}")
    assert missing == []


def test_rates_say_their_unit() -> None:
    unitless = [f"{path} {action.option_strings[0]}" for path, parser, action in options()
                if RATE.search(action.dest) and "MB/s" not in shown(parser, action)]
    assert unitless == []


def test_version() -> None:
    done = subprocess.run([sys.executable, "-m", "p2p", "--version"], capture_output=True,
                          text=True, check=True)
    assert done.stdout == f"bootseer {version('bootseer')}\n"
