"""Which path served a mount's reads, from the serving process's own account.

The kernel-protocol server (`fusefs.kernelfs`) logs at unmount how many opens
went to passthrough and how many READs its handler answered; the pyfuse3
server answers every read itself. The read benches (`bench ckpt`, `bench image`,
benchmarks/fuse_read.py) report the path next to each GB/s figure.
"""

from __future__ import annotations

import re
from pathlib import Path

ACCOUNT = re.compile(r"unmounted .*: (\d+) passthrough opens, (\d+) handler opens, (\d+) "
                     r"handler reads of (\d+) bytes, \d+ failed, \d+ whole files built, "
                     r"(\d+) backing files checked")


def account(log: Path) -> dict[str, int] | None:
    """The last account in a mount's log (None: the pyfuse3 server, no account)."""
    found = ACCOUNT.findall(log.read_text(errors="replace")) if log.exists() else []
    if not found:
        return None
    keys = ("passthrough_opens", "handler_opens", "handler_reads", "handler_bytes",
            "backing_checked")
    return dict(zip(keys, map(int, found[-1]), strict=True))


def read_path(log: Path) -> str:
    """"passthrough" if no READ reached the handler and an open was passthrough, else
    "handler" (or "mixed": both served)."""
    got = account(log)
    if got is None or got["passthrough_opens"] == 0:
        return "handler"
    return "passthrough" if got["handler_reads"] == 0 else "mixed"
