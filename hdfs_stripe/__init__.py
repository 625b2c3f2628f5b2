"""hdfs_stripe: striped, swarm-shared reads of HDFS checkpoints.

Owns the WebHDFS client (`webhdfs`), the no-I/O stripe plan (`stripe`), striped
replica-aware reads (`reader`), the agent's `hdfs://` origin adapter (`origin`),
indexing a file as its first reader (`index`), the mount and the file object
(`mount`, `fileobj`), `bootseer ckpt` (`cli`) and `bootseer bench ckpt` (`bench`).
Builds on p2p (agent API, tracker client, contents) and fusefs; p2p never imports
it. This module imports nothing at import time: the stripe plan stays a pure core.
"""

from __future__ import annotations

from typing import Any


def open(uri: str, **options: Any) -> Any:
    """A read-only, seekable file object of `uri` (hdfs://HOST:PORT/path), read through
    the local agent; see `hdfs_stripe.fileobj.open_stripes` for the options."""
    from hdfs_stripe.fileobj import open_stripes

    return open_stripes(uri, **options)
