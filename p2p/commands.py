"""Subcommands owned by p2p: agent, demo, bench (filled in by the agent work)."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    pass
