"""Human names for contents: image references, snapshot keys, checkpoint paths.

A content id pins bytes but says nothing to a person; a name does the
reverse. Names live in their own namespace, beside the manifests:

    PUT /v1/names/{name}   {"content_id": "c1-..."}   201 new, 200 same, 409 taken
    GET /v1/names/{name}   {"name": ..., "content_id": ...}, body MAC'd like a manifest

The rule: any node holding the cluster secret may create a name, for a
content whose manifest is already published; the first writer wins; nobody
may change or delete a name through the API. Writing the same id again is a
no-op (200), another id is a 409 that names the holder. An operator who must
repoint a name removes its file from the state dir and restarts the tracker.

A name is 1..255 characters of `A-Z a-z 0-9 . _ : @ + = ~ / -`, starting with
a letter or digit, with no empty, `.` or `..` path segment: that covers image
references and paths, and keeps every name a plain, canonical URL path. On
disk a name is stored under the SHA-256 of its text, so it never becomes a
path.
"""

from __future__ import annotations

import hashlib
import json
import re

from p2p.content import ContentId, ManifestError, check_content_id

MAX_NAME_CHARS = 255
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@+=~/-]{0,254}")  # MAX_NAME_CHARS in all
FILE_KEY = re.compile(r"[0-9a-f]{64}")


def check_name(text: str) -> str:
    """`text` if it is a well-formed name; else ValueError saying what is allowed."""
    if not NAME.fullmatch(text) or any(s in ("", ".", "..") for s in text.split("/")):
        raise ValueError(f"name {text[:80]!r} must be 1..{MAX_NAME_CHARS} characters of "
                         "A-Z a-z 0-9 . _ : @ + = ~ / -, start with a letter or digit, and "
                         "have no empty, '.' or '..' segment")
    return text


def file_key(name: str) -> str:
    """The name's key in the store (and its file name): hex SHA-256 of its text."""
    return hashlib.sha256(name.encode()).hexdigest()


def check_file_key(key: str) -> str:
    if not FILE_KEY.fullmatch(key):
        raise ValueError(f"{key[:80]!r} is not a name's file key")
    return key


def canonical(name: str, content_id: ContentId) -> bytes:
    return json.dumps({"content_id": content_id, "name": name}, sort_keys=True,
                      separators=(",", ":")).encode()


def parse(body: bytes, key: str | None = None) -> tuple[str, ContentId]:
    """A stored or served name document; ValueError if it is malformed (or not `key`'s)."""
    try:
        raw = json.loads(body)
        name = check_name(raw["name"])
        content_id = check_content_id(raw["content_id"])
    except (TypeError, KeyError, ManifestError) as exc:
        raise ValueError(f"malformed name document: {exc!r}") from None
    if key is not None and file_key(name) != key:
        raise ValueError(f"the file for {key} holds the name {name!r}")
    return name, content_id


def check_document(body: bytes, key: str) -> bytes:
    """For the store's load: the canonical form of a valid name file."""
    return canonical(*parse(body, key))
