"""Progress of long work, as people and logs each want it.

On a terminal (stderr is a TTY) a bar redrawn in place: bytes held of the total,
the rate and the time left (tqdm). Anywhere else a plain line every
`PLAIN_EVERY_S` (10 s; `BOOTSEER_PROGRESS_EVERY_S` sets another), so a log
shows that the work moves without a line per refresh, and no control
characters. The caller reports what it knows (`update(done, peers, origin)`);
this module only decides how it is shown.
"""

from __future__ import annotations

import os
import sys
import time
from typing import IO, Any

PLAIN_EVERY_S = 10.0
REFRESH_S = 0.5  # how often callers look at the work and report it
MB = 1e6


class Progress:
    """The progress of `what` towards `total` bytes, shown on `stream`."""

    def __init__(self, what: str, total: int, stream: IO[str] | None = None) -> None:
        self.what = what
        self.total = total
        self.stream = stream or sys.stderr
        self._bar: Any = None
        self._every_s = float(os.environ.get("BOOTSEER_PROGRESS_EVERY_S") or PLAIN_EVERY_S)
        self._next_line = time.monotonic() + self._every_s
        if self.stream.isatty():
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=what, unit="B", unit_scale=True,
                             unit_divisor=1000, file=self.stream, leave=True,
                             dynamic_ncols=True)

    def update(self, done: int, peer_bytes: int, origin_bytes: int) -> None:
        if self._bar is not None:
            self._bar.set_postfix_str(f"peers {peer_bytes / MB:,.1f} MB, "
                                      f"origin {origin_bytes / MB:,.1f} MB", refresh=False)
            self._bar.update(done - self._bar.n)
        elif time.monotonic() >= self._next_line:
            self._next_line = time.monotonic() + self._every_s
            self.stream.write(f"{self.what}: {done / MB:,.1f} of {self.total / MB:,.1f} MB "
                              f"(from peers {peer_bytes / MB:,.1f} MB, from the origin "
                              f"{origin_bytes / MB:,.1f} MB)\n")
            self.stream.flush()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
