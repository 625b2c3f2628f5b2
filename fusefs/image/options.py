"""What an image mount is asked for (`MountOptions`), and its `image serve` command line.

Kept apart from the serving code (`fusefs.image.mount`) so that `bootseer image
run`, which has its mount served by the node's mount server when there is one
(`fusefs.image.run`), can say what to serve without importing how: this module
imports the standard library and two constants only.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from fusefs.mount import READ_AHEAD_KB
from fusefs.readbound import READ_TIMEOUT_S
from fusefs.record import WINDOW_S
from p2p.errors import UserError

if TYPE_CHECKING:
    from p2p.origin.oci_ref import ImageRef


@dataclass(frozen=True, slots=True)
class MountOptions:
    ref: str
    mountpoint: Path
    tracker: str
    api_socket: str
    store_dir: Path
    plain_http: bool = False
    record: bool = False
    window_s: float = WINDOW_S
    prefetch: bool = True
    read_timeout_s: float = READ_TIMEOUT_S
    read_ahead_kb: int = READ_AHEAD_KB
    allow_other: bool = False
    record_missing: bool = False  # record this launch if the image has no record yet
    passthrough: bool = True  # local files read by the kernel (kernelfs; fusefs.image.backing)
    summary: Path | None = None  # where the serving writes what it reports at its end

    def argv(self) -> list[str]:
        """The `bootseer image serve` command line for these options."""
        args = [sys.executable, "-m", "fusefs.image", "serve", self.ref, str(self.mountpoint),
                "--tracker", self.tracker, "--api-socket", self.api_socket,
                "--store-dir", str(self.store_dir), "--read-timeout", str(self.read_timeout_s),
                "--read-ahead-kb", str(self.read_ahead_kb), "--window", str(self.window_s),
                "--log-level", "INFO"]  # its stderr is the mount's log file
        if self.summary is not None:
            args += ["--summary", str(self.summary)]
        flags = {"--plain-http": self.plain_http, "--record": self.record,
                 "--no-prefetch": not self.prefetch, "--allow-other": self.allow_other,
                 "--record-missing": self.record_missing,
                 "--no-passthrough": not self.passthrough}
        return args + [flag for flag, on in flags.items() if on]


def image_ref(text: str) -> ImageRef:
    """The image reference `text`; UserError saying what is wrong with it. (`p2p.origin`
    imports aiohttp: loaded here, when a reference is parsed, not with this module.)"""
    from p2p.origin.oci_ref import ImageRefError, parse_reference

    try:
        return parse_reference(text)
    except ImageRefError as exc:
        raise UserError(str(exc)) from None
