"""`bootseer bench ckpt`: striped and swarm-shared checkpoint reads on the mini cluster."""

from __future__ import annotations

import argparse


def add_parser(kinds: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    kinds.add_parser("ckpt", help="checkpoint reads: one stream, striped, swarm (HDFS mini "
                     "cluster)")
