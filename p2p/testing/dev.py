"""`bootseer dev ...`: the prerequisites of a first launch on one machine, one command each.

A launch needs an image in a registry, and a checkpoint in HDFS; the tests start
both with tooling of their own. These commands start the very same tooling for
a person: `dev registry` (a real docker-registry), `dev image` (a test image,
with Python, pushed to it) and `dev hdfs` (Hadoop's mini cluster). They belong
to the packages that own the tooling, which add them through the `bootseer.dev`
entry-point group, as benchmarks are added under `bootseer bench`. Servers run
in the foreground and print one `{"event": "listening", ...}` line once ready;
SIGTERM or Ctrl-C stops them and removes nothing but their processes.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from importlib.metadata import entry_points


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("dev", help="start a launch's prerequisites on this machine: a "
                                   "registry, a test image, HDFS (for trying Bootseer)")
    kinds = p.add_subparsers(dest="dev", required=True, metavar="WHAT")
    for ep in sorted(entry_points(group="bootseer.dev"), key=lambda e: e.name):
        ep.load()(kinds)


STOPS = (signal.SIGTERM, signal.SIGINT)


def wait_for_stop() -> None:
    """Block until SIGTERM or SIGINT; both end a dev server normally (status 0). Call
    from the main thread: a signal blocked in another thread still kills the process."""
    signal.pthread_sigmask(signal.SIG_BLOCK, STOPS)
    signal.sigwait(STOPS)


async def until_stopped() -> None:
    """`wait_for_stop` for a server running on an event loop."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in STOPS:
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
