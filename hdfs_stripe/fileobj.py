"""`hdfs_stripe.open(uri)`: a checkpoint file as a read-only, seekable file object.

For training scripts: `torch.load`, `safetensors` and numpy read through it as
through a local file. Behind it, the file's current version is resolved to a
content (found by name, or indexed by this node as its first reader; see
`index`), and reads go through `mount.StripeSource`: verified stripes straight
from the local agent's store files (a `pread`, no HTTP round trip), missing
ones through the agent (peers first, HDFS for the rest), with read-ahead for
sequential readers.

The object is synchronous; its asyncio work runs on a private event loop in a
daemon thread, started by `open` and stopped by `close` (or `with`).
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

from fusefs.source import AgentSource, Buffer, RangeFile, SourceError
from hdfs_stripe.index import Resolved, resolve
from hdfs_stripe.mount import StripeSource, attached_by
from hdfs_stripe.naming import parse_uri
from hdfs_stripe.origin import webhdfs_for
from hdfs_stripe.reader import StripeReader
from p2p.agentclient import AgentClient
from p2p.tracker_client import TrackerClient

T = TypeVar("T")


class _LoopThread:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True,
                                        name="hdfs-stripe-loop")
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


class StripeFile(RangeFile):
    """One version of an HDFS file, read through the swarm (see the module docstring)."""

    def __init__(self, resolved: Resolved, source: StripeSource, loop: _LoopThread) -> None:
        super().__init__(resolved.version.length, self._read_at)
        self.resolved = resolved
        self.name = str(resolved.uri)
        self._source = source
        self._loop = loop

    def _read_at(self, offset: int, n: int) -> Buffer:
        try:
            return self._loop.run(self._source.read(self.resolved.content_id, offset, n))
        except SourceError as exc:
            raise OSError(f"{self.name}: {exc}") from exc

    def close(self) -> None:
        if not self.closed:
            try:
                self._loop.run(self._source.close())
            finally:
                self._loop.stop()
        super().close()


def open_stripes(uri: str, *, tracker: str | None = None, api_socket: str | None = None,
                 store_dir: str | Path | None = None, secret: bytes | None = None) -> StripeFile:
    """Open `uri` (hdfs://HOST:PORT/path) for reading through the local agent. Defaults
    come from BOOTSEER_TRACKER, BOOTSEER_API_SOCKET, BOOTSEER_STORE_DIR, BOOTSEER_SECRET."""
    from p2p.auth import load_secret

    env = os.environ.get
    parsed = parse_uri(uri)
    store = Path(store_dir or env("BOOTSEER_STORE_DIR", "/var/cache/bootseer"))
    sock = api_socket or env("BOOTSEER_API_SOCKET", "/run/bootseer/agent.sock")
    tracker_url = tracker or env("BOOTSEER_TRACKER", "http://127.0.0.1:7070")
    key = secret or load_secret()
    loop = _LoopThread()

    async def start() -> tuple[Resolved, StripeSource]:
        reader = StripeReader(webhdfs_for(parsed))
        agent = AgentClient(sock)
        try:
            async with TrackerClient(tracker_url, key) as client:
                resolved = await resolve(reader, client, parsed, store,
                                         attach=attached_by(agent))
        except BaseException:
            await agent.close()
            raise
        finally:
            await reader.close()
        return resolved, StripeSource(AgentSource(store, agent))

    try:
        resolved, source = loop.run(start())
    except BaseException:
        loop.stop()
        raise
    return StripeFile(resolved, source, loop)
