"""More origins for a published content: where else its bytes can be read.

A content id pins the bytes, not where they live, so the first publisher's
origin URL must not be the only one: a mistyped or dead origin would block
the content for good, and an insider who pre-publishes real digests with a
dead origin would block the real publisher. Publishing a manifest whose id is
already held, with the same kind and another origin, adds that origin.

The rule: any holder of the cluster secret may add an origin (the same right
as publishing), up to `MAX_ORIGINS` per content, and none is ever removed or
replaced through the API. That is safe because an origin is only ever a
place to try: every byte it sends is checked against the id-pinned digests,
and a node tries a content's origins in turn, the ones that failed last. The
worst an insider can do is fill the slots with dead origins (an operator
then removes their files from the state dir), never make a node accept other
bytes.

Each extra origin is a write-once document (tracker.store) under the key
`<content id>.<slot>`, slot 1..MAX_ORIGINS-1 (slot 0 is the manifest's own
`origin`), so replicas agree on it through the same first-writer-wins store.
"""

from __future__ import annotations

import json
import re

from p2p.content import MAX_FIELD_CHARS, MAX_ORIGINS, ContentId, ManifestError, check_content_id

KEY = re.compile(r"(c1-[0-9a-f]{64})\.([1-9][0-9]?)")
SLOTS = range(1, MAX_ORIGINS)


def key(content_id: ContentId, slot: int) -> str:
    return f"{content_id}.{slot}"


def check_key(text: str) -> str:
    match = KEY.fullmatch(text)
    if match is None or int(match.group(2)) not in SLOTS:
        raise ValueError(f"{text[:80]!r} is not an origin key (content id, '.', slot)")
    return text


def canonical(content_id: ContentId, url: str) -> bytes:
    return json.dumps({"content_id": content_id, "origin": url}, sort_keys=True,
                      separators=(",", ":")).encode()


def parse(body: bytes, key_: str | None = None) -> tuple[ContentId, str]:
    """A stored origin document; ValueError if it is malformed (or not `key_`'s)."""
    try:
        raw = json.loads(body)
        content_id = check_content_id(raw["content_id"])
        url = raw["origin"]
    except (TypeError, KeyError, RecursionError, ManifestError) as exc:
        raise ValueError(f"malformed origin document: {exc!r}") from None
    if not isinstance(url, str) or not 0 < len(url) <= MAX_FIELD_CHARS:
        raise ValueError(f"an origin is a URL of 1..{MAX_FIELD_CHARS} characters")
    if key_ is not None and not key_.startswith(f"{content_id}."):
        raise ValueError(f"the file for {key_} holds an origin of {content_id}")
    return content_id, url


def check_document(body: bytes, key_: str) -> bytes:
    """For the store's load: the canonical form of a valid origin file."""
    return canonical(*parse(body, key_))
