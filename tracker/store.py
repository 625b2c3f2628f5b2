"""First-writer-wins documents, in memory and persisted under the state dir.

The tracker keeps two such namespaces: manifests (key: content id) and human
names (key: name). A key is written once: the same bytes again are a no-op,
other bytes are a `Conflict` naming what is held. Nothing is ever changed or
deleted through the API. Keys become file names, so the caller must pass only
keys that its `check_key` accepts (a fixed alphabet, no `/`, no leading dot);
the store checks them again on load, so a stray file is skipped, not served.

Writes go to a temporary file, are fsynced, renamed into place and the
directory fsynced, off the event loop: a tracker killed at any moment leaves
either the old state or the new one.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from tracker.guard import Unavailable

log = logging.getLogger("bootseer.tracker")

Check = Callable[[bytes, str], bytes]  # (file bytes, key) -> canonical bytes, or ValueError


class Conflict(Exception):
    """The key is already held by other bytes (`held`)."""

    def __init__(self, key: str, held: bytes) -> None:
        super().__init__(key)
        self.key = key
        self.held = held


class Shared(Protocol):
    """Where replicas share documents (tracker.replicas): first writer wins."""

    async def get_document(self, kind: str, key: str) -> bytes | None: ...

    async def put_document(self, kind: str, key: str, body: bytes) -> bytes | None:
        """Write `body` unless `key` is held: None if written, else the held bytes."""


class Documents:
    """One namespace of write-once documents; see the module docstring.

    With `shared` (tracker replicas), the first writer among all replicas
    wins, and a key this replica has not seen is looked up there; what it
    reads is kept, since documents never change.
    """

    def __init__(self, state_dir: str | None, kind: str,
                 check_key: Callable[[str], object], check: Check) -> None:
        self.kind = kind
        self._dir = Path(state_dir, kind) if state_dir else None
        self._check_key = check_key
        self._check = check
        self._bodies: dict[str, bytes] = {}
        self._lock = asyncio.Lock()
        self.shared: Shared | None = None

    def __len__(self) -> int:
        return len(self._bodies)

    def held(self) -> dict[str, bytes]:
        """The documents this process holds, by key."""
        return dict(self._bodies)

    def load(self) -> None:
        """Read the persisted documents; a bad file is logged and skipped, not fatal."""
        if self._dir is None:
            return
        self._dir.mkdir(parents=True, exist_ok=True)
        for path in sorted(self._dir.glob("*.json")):
            key = path.name.removesuffix(".json")
            try:
                self._check_key(key)
                self._bodies[key] = self._check(path.read_bytes(), key)
            except (OSError, ValueError) as exc:
                log.error("skipping unreadable %s file %s: %s", self.kind, path, exc)
        log.info("loaded %d %s from %s", len(self._bodies), self.kind, self._dir)

    def cached(self, key: str) -> bytes | None:
        """The document if this process holds it (no lookup in the shared store)."""
        return self._bodies.get(key)

    async def get(self, key: str) -> bytes | None:
        body = self._bodies.get(key)
        if body is not None or self.shared is None:
            return body
        body = await self.shared.get_document(self.kind, key)
        return None if body is None else await self._keep(key, self._check_shared(body, key))

    async def put(self, key: str, body: bytes) -> bool:
        """Store `body` as `key`; True if new, False if identical; Conflict otherwise."""
        async with self._lock:
            held = self._bodies.get(key)
            if held is None and self.shared is not None:
                theirs = await self.shared.put_document(self.kind, key, body)
                if theirs is not None:  # another replica's: checked like a file we load
                    held = await self._keep(key, self._check_shared(theirs, key))
            if held == body:
                return False
            if held is not None:
                raise Conflict(key, held)
            await self._keep(key, body)
            return True

    def _check_shared(self, body: bytes, key: str) -> bytes:
        """A document read from the shared store, checked; Unavailable (503) if it fails.

        Redis is outside the tracker (docs/trust.md): a document there that
        fails its check was not written by a replica, and is neither served nor
        kept.
        """
        try:
            return self._check(body, key)
        except ValueError as exc:
            log.error("the %s document %r in the shared store fails its check: %s; an "
                      "operator must delete it", self.kind, key, exc)
            raise Unavailable(f"the tracker's shared store holds a {self.kind} document for "
                              f"{key[:200]!r} that fails its check; see the tracker's log"
                              ) from None

    async def _keep(self, key: str, body: bytes) -> bytes:
        """Hold `body` as `key`, and persist it if it is new here."""
        if self._dir is not None and key not in self._bodies:
            await asyncio.to_thread(_write_atomically, self._dir, key, body)
        self._bodies[key] = body
        return body


def _write_atomically(directory: Path, key: str, body: bytes) -> None:
    tmp = directory / f".{key}.{os.getpid()}.tmp"
    with open(tmp, "wb") as f:
        f.write(body)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, directory / f"{key}.json")
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)  # make the rename itself durable
    finally:
        os.close(fd)
