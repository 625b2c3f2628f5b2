"""Subcommands of this package (placeholder until its issue lands)."""

from __future__ import annotations

import argparse


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    pass
