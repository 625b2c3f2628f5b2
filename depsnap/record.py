"""Key records at the origin: find a snapshot the tracker does not know.

A key record, `keys/<key>.json` in the origin directory, names the tree of a
key and carries the swarm manifests of its packs and tree (tree last). It is
written once, by `link` (the first writer wins), after the packs and the tree
are in place and before the tracker name is bound, so an origin directory
shared by several creators also arbitrates between them: a creator that
finds a record already there publishes that record's tree, not its own.

A node whose tracker has no name for a key (a tracker that lost its state, a
second cluster sharing the origin) reads the record at the origin URL
(`http(s)://` or `file://`), checks it (every manifest certifies its id; the
tree named is the last manifest; the key is the one asked for), registers
the manifests with its tracker and binds the name (`adopt`): from then on the
snapshot is found as any other. The tree itself is still checked against
the key when it is loaded.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from urllib.parse import unquote, urlsplit

import aiohttp

from depsnap.key import check_key, key_name
from p2p.content import ContentId, Manifest, ManifestError
from p2p.errors import UserError
from p2p.origin.base import OriginError
from p2p.tracker_client import TrackerClient, TrackerError

RECORDS = "keys"
MAX_RECORD_BYTES = 16 << 20
TIMEOUT_S = 30.0


class KeyRecordError(UserError):
    """A key record at the origin is unreadable or inconsistent; the message says why."""


def record_bytes(key: str, manifests: list[Manifest]) -> bytes:
    return json.dumps({"key": key, "tree": manifests[-1].content_id,
                       "manifests": [m.to_dict() for m in manifests]}).encode()


def parse_record(data: bytes, key: str, where: str) -> list[Manifest]:
    """The manifests of a record for `key` (tree last); KeyRecordError if it is not one."""
    try:
        raw = json.loads(data)
        manifests = [Manifest.from_dict(m) for m in raw["manifests"]]
        if raw["key"] != key or not manifests or raw["tree"] != manifests[-1].content_id:
            raise KeyRecordError(f"{where} is not the record of key {key}")
        return manifests
    except (ValueError, KeyError, TypeError, ManifestError) as exc:
        if isinstance(exc, KeyRecordError):
            raise
        raise KeyRecordError(f"{where} is not a key record ({exc})") from None


def write_record(origin_dir: Path, key: str, manifests: list[Manifest]) -> list[Manifest]:
    """Write the record of `key` unless one is there; the manifests the record holds."""
    directory = origin_dir / RECORDS
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / f"{check_key(key)}.json"
    fd, tmp = tempfile.mkstemp(prefix=".key-", dir=directory)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(record_bytes(key, manifests))
        os.chmod(tmp, 0o644)
        os.link(tmp, final)  # fails if a record is there: the first writer wins
        return manifests
    except FileExistsError:
        return parse_record(final.read_bytes(), key, str(final))
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


async def read_record(origin_url: str, key: str) -> list[Manifest] | None:
    """The record of `key` at `origin_url`, or None if there is none."""
    path = f"{RECORDS}/{check_key(key)}.json"
    data = await read_origin_file(origin_url, path, MAX_RECORD_BYTES)
    return None if data is None else parse_record(data, key, f"{origin_url}/{path}")


async def read_origin_file(origin_url: str, path: str, max_bytes: int) -> bytes | None:
    """The file at `path` under `origin_url` (`http(s)://` or `file://`), or None if there
    is none; OriginError if it cannot be read or is larger than `max_bytes`."""
    url = f"{origin_url.rstrip('/')}/{path}"
    parts = urlsplit(url)
    if parts.scheme == "file":
        try:
            with open(unquote(parts.path), "rb") as file:
                data = file.read(max_bytes + 1)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise OriginError(f"cannot read {url}: {exc.strerror}") from None
    else:
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TIMEOUT_S)) \
                    as http, http.get(url) as resp:
                if resp.status == 404:
                    return None
                if resp.status != 200:
                    raise OriginError(f"{url}: HTTP {resp.status}")
                data = await _read_up_to(resp.content, max_bytes + 1)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise OriginError(f"cannot read {url}: {exc or type(exc).__name__}") from None
    if len(data) > max_bytes:
        raise OriginError(f"{url} is larger than {max_bytes} bytes")
    return data


async def _read_up_to(stream: aiohttp.StreamReader, limit: int) -> bytes:
    """The body up to `limit` bytes (one `read(n)` returns what is buffered, maybe less)."""
    data = bytearray()
    while len(data) < limit:
        piece = await stream.read(limit - len(data))
        if not piece:
            break
        data += piece
    return bytes(data)


async def adopt(tracker: TrackerClient, origin_url: str, key: str) -> ContentId | None:
    """Register the origin's record of `key` with the tracker; the tree the name now
    points at, or None if the origin has no record either."""
    manifests = await read_record(origin_url, key)
    if manifests is None:
        return None
    for manifest in manifests:
        await tracker.put_manifest(manifest)
    try:
        await tracker.put_name(key_name(key), manifests[-1].content_id)
    except TrackerError as exc:
        if exc.status != 409:
            raise
    return await tracker.get_name(key_name(key))
