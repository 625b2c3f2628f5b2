"""Origin adapters: where a content's bytes come from when no peer has them.

An origin reads a byte range of the origin copy into a caller's buffer. The
manifest's `origin` URL picks the adapter by scheme (`http`, `https`, `file`, and
`oci`/`oci+http` for registry blobs, see `oci_origin`); HDFS adapters join through
`register` in their own packages.
Each origin is limited to a number of concurrent reads per node, so a
thousand-node launch cannot open a thousand connections per node to it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from importlib.metadata import entry_points
from urllib.parse import urlsplit

from p2p.origin.base import Origin, OriginError, Progress
from p2p.origin.file import FileOrigin
from p2p.origin.http import HttpOrigin
from p2p.origin.oci_origin import OciOrigin

__all__ = ["LimitedOrigin", "Origin", "OriginError", "OriginPool", "Progress", "register"]

_FACTORIES: dict[str, Callable[[str], Origin]] = {
    "http": HttpOrigin,
    "https": HttpOrigin,
    "file": FileOrigin,
    "oci": OciOrigin,
    "oci+http": OciOrigin,
}


_PLUGINS_LOADED = False
log = logging.getLogger(__name__)


def register(scheme: str, factory: Callable[[str], Origin]) -> None:
    _FACTORIES[scheme] = factory


def _factory(scheme: str) -> Callable[[str], Origin] | None:
    """The adapter factory for `scheme`, loading the entry-point adapters once."""
    global _PLUGINS_LOADED
    if scheme not in _FACTORIES and not _PLUGINS_LOADED:
        _PLUGINS_LOADED = True
        for ep in entry_points(group="bootseer.origins"):
            try:
                _FACTORIES.setdefault(ep.name, ep.load())
            except ImportError as exc:  # one broken package must not take the agent down
                log.warning("origin adapter %s (%s) cannot load: %s", ep.name, ep.value, exc)
    return _FACTORIES.get(scheme)


class LimitedOrigin:
    """An origin behind a semaphore: at most `limit` reads at once."""

    def __init__(self, origin: Origin, limit: int) -> None:
        self.origin = origin
        self._slots = asyncio.Semaphore(limit)

    async def read_into(self, url: str, offset: int, view: memoryview,
                        progress: Progress | None = None) -> None:
        async with self._slots:
            await self.origin.read_into(url, offset, view, progress)


class OriginPool:
    """One limited adapter per origin endpoint (scheme + host), made on first use.

    `read_into` takes every origin of a content and tries them in turn, those that
    failed least recently first, so a dead origin beside a good one costs one failed
    read, not the content.
    """

    def __init__(self, concurrency: int) -> None:
        self._concurrency = concurrency
        self._origins: dict[str, LimitedOrigin] = {}
        self._failed: dict[str, int] = {}  # url -> when it last failed, as a sequence number
        self._failures = 0

    async def read_into(self, urls: Sequence[str], offset: int, view: memoryview,
                        progress: Progress | None = None) -> None:
        """Fill `view` from the first of `urls` that can, or raise OriginError saying what
        each answered; it is `definite` only if every answer was. An origin that failed
        after relaying part of the view ends the attempt: the relays' bytes would restart."""
        errors: list[OriginError] = []
        for url in sorted(urls, key=lambda u: self._failed.get(u, -1)):
            started = False

            def seen(done: int) -> None:
                nonlocal started
                started = True
                if progress is not None:
                    progress(done)

            try:
                await self.for_url(url).read_into(url, offset, view, seen)
            except OriginError as exc:
                self._failures += 1
                self._failed[url] = self._failures
                errors.append(exc)
                if started:
                    break
            else:
                self._failed.pop(url, None)
                return
        if len(errors) == 1:
            raise errors[0]
        raise OriginError("; ".join(map(str, errors)),
                          definite=all(e.definite for e in errors))

    def for_url(self, url: str) -> LimitedOrigin:
        parts = urlsplit(url)
        key = f"{parts.scheme}://{parts.netloc}"
        if key not in self._origins:
            factory = _factory(parts.scheme)
            if factory is None:
                raise OriginError(f"no origin adapter for {parts.scheme!r} URLs ({url})",
                                  definite=True)
            self._origins[key] = LimitedOrigin(factory(key), self._concurrency)
        return self._origins[key]

    async def close(self) -> None:
        for limited in self._origins.values():
            await limited.origin.close()
