"""HDFS URIs, file versions, and the names that tie a version to a content.

`hdfs://HOST:PORT/path` names a file; PORT is the NameNode's HTTP (WebHDFS)
port (9870 if left out), since WebHDFS is how Bootseer reads HDFS.

A *version* of a file is (length, modification time, file id): HDFS files are
replaced (a new file id and mtime) or appended (a new length and mtime), never
rewritten in place. A checkpoint content is made from exactly one version:

- its tracker name is `hdfs-file/` + SHA-256 of (URI, length, mtime) (the key the
  issue asks for; names are write-once, so a name pins one content forever,
  and a new version gets a new name);
- its manifest's origin URL carries the version as a query
  (`hdfs://h:p/path?length=L&mtime=M&fileid=F`), so the origin adapter reads only
  from that version and reports any other as changed (`FileChanged`).

Digests are the last line: a stripe read from a changed file fails its check
and is never stored. So a reader never gets bytes from two versions.

No I/O here.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from urllib.parse import parse_qs, quote, unquote, urlsplit

from p2p.errors import RemoteError, UserError

DEFAULT_HTTP_PORT = 9870
NAME_PREFIX = "hdfs-file/"
KIND = "hdfs-file"


class UriError(UserError, ValueError):
    """Not an hdfs://HOST:PORT/path URI."""


class FileChanged(RemoteError):
    """The file's length or modification time is not the version being read."""


@dataclass(frozen=True, slots=True)
class Version:
    length: int
    mtime_ms: int
    file_id: int

    def describe(self) -> str:
        return f"{self.length} bytes, modified at {self.mtime_ms} ms, file id {self.file_id}"


@dataclass(frozen=True, slots=True)
class HdfsUri:
    host: str
    port: int
    path: str  # absolute, without the query

    @property
    def endpoint(self) -> str:
        """The NameNode's WebHDFS base URL."""
        return f"http://{self.host}:{self.port}"

    @property
    def origin_key(self) -> str:
        return f"hdfs://{self.host}:{self.port}"

    def __str__(self) -> str:
        return f"{self.origin_key}{quote(self.path)}"

    def child(self, path: str) -> HdfsUri:
        return HdfsUri(self.host, self.port, path)


def parse_uri(text: str) -> HdfsUri:
    parts = urlsplit(text)
    if parts.scheme != "hdfs" or not parts.hostname:
        raise UriError(f"{text!r} is not an hdfs://HOST:PORT/path URI")
    path = unquote(parts.path) or "/"
    if not path.startswith("/") or any(seg in (".", "..") for seg in path.split("/")):
        raise UriError(f"{text!r}: the path must be absolute, without . or ..")
    try:
        port = parts.port or DEFAULT_HTTP_PORT
    except ValueError:
        raise UriError(f"{text!r}: bad port") from None
    return HdfsUri(parts.hostname, port, path)


def origin_url(uri: HdfsUri, version: Version) -> str:
    """The manifest's origin URL: the file, pinned to one version."""
    return (f"{uri}?length={version.length}&mtime={version.mtime_ms}"
            f"&fileid={version.file_id}")


def parse_origin_url(url: str) -> tuple[HdfsUri, Version]:
    uri = parse_uri(url.split("?", 1)[0])
    query = parse_qs(urlsplit(url).query)
    try:
        version = Version(int(query["length"][0]), int(query["mtime"][0]),
                          int(query["fileid"][0]))
    except (KeyError, ValueError, IndexError):
        raise UriError(f"{url!r} does not pin a file version (length, mtime, fileid)") \
            from None
    return uri, version


def content_name(uri: HdfsUri, version: Version) -> str:
    """The tracker name of the content made from this version of the file."""
    key = f"{uri}\0{version.length}\0{version.mtime_ms}".encode()
    return NAME_PREFIX + hashlib.sha256(key).hexdigest()


def check_same(uri: HdfsUri, expected: Version, now: Version) -> None:
    """FileChanged, in plain words, unless `now` is the version `expected`."""
    if now != expected:
        raise FileChanged(f"{uri} changed while it was being read: it was {expected.describe()}"
                          f", it is now {now.describe()}; open it again to read the new "
                          "version")
