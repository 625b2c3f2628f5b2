"""Image references: `[registry[:port]/]repository[:tag][@sha256:<64 hex>]`.

No I/O. Rules, as `docker pull` applies them:

- The first `/`-separated component is the registry when it contains a `.` or a
  `:`, or is `localhost`; otherwise the registry is Docker Hub (`docker.io`,
  served from `registry-1.docker.io`) and a one-component repository gets the
  `library/` prefix (`busybox` -> `docker.io/library/busybox`).
- The repository is lower-case path components of `[a-z0-9]` joined by `.`,
  `_`, `__` or `-`, separated by `/`; at most 255 characters.
- The tag is `[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}`; with neither tag nor digest
  the tag is `latest`. With a digest and no tag, the digest alone names the
  manifest; with both, the digest wins and the tag is kept for messages only.
- The digest must be `sha256:` and 64 lower-case hex digits: the only algorithm
  this client verifies, so it accepts no other.

Anything else raises `ImageRefError` with the reason; nothing is guessed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

DOCKER_HUB = "docker.io"
DOCKER_HUB_ENDPOINT = "registry-1.docker.io"
DEFAULT_TAG = "latest"

_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_REPOSITORY_RE = re.compile(rf"{_COMPONENT}(?:/{_COMPONENT})*")
_TAG_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
_DIGEST_RE = re.compile(r"sha256:[0-9a-f]{64}")
_HOST_RE = re.compile(
    r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*"
    r"|\[[0-9A-Fa-f:.]+\])(?::[0-9]{1,5})?"
)
MAX_REPOSITORY_CHARS = 255


class ImageRefError(ValueError):
    """An image reference or digest that does not parse; the message says which part."""


@dataclass(frozen=True, slots=True)
class ImageRef:
    """A parsed image reference. `registry` is `host[:port]` as written."""

    registry: str
    repository: str
    tag: str | None = None
    digest: str | None = None

    @property
    def reference(self) -> str:
        """What goes after `/manifests/`: the digest if there is one, else the tag."""
        return self.digest or self.tag or DEFAULT_TAG

    @property
    def endpoint(self) -> str:
        """`host[:port]` to connect to (Docker Hub's API lives on another host)."""
        return DOCKER_HUB_ENDPOINT if self.registry == DOCKER_HUB else self.registry

    def with_digest(self, digest: str) -> ImageRef:
        return ImageRef(self.registry, self.repository, self.tag, check_digest(digest))

    def with_tag(self, tag: str) -> ImageRef:
        return ImageRef(self.registry, self.repository, _check_tag(tag, tag), None)

    def __str__(self) -> str:
        text = f"{self.registry}/{self.repository}"
        if self.tag:
            text += f":{self.tag}"
        if self.digest:
            text += f"@{self.digest}"
        return text


def check_digest(digest: str) -> str:
    """Return `digest` if it is `sha256:` + 64 lower-case hex digits, else ImageRefError."""
    if not _DIGEST_RE.fullmatch(digest):
        raise ImageRefError(f"bad digest {digest!r}: expected sha256: and 64 lower-case hex "
                             "digits (no other algorithm is supported)")
    return digest


def parse_reference(text: str) -> ImageRef:
    """Parse an image reference by the rules in this module's docstring."""
    if not text or text != text.strip():
        raise ImageRefError(f"bad image reference {text!r}: empty or surrounded by spaces")
    rest, digest = _split_digest(text)
    registry, path = _split_registry(text, rest)
    return _in_registry(text, registry, path, digest)


def parse_in_registry(registry: str, rest: str) -> ImageRef:
    """Parse `repository[:tag][@digest]` known to live in `registry` (`host[:port]`)."""
    text = f"{registry}/{rest}"
    if not _HOST_RE.fullmatch(registry):
        raise ImageRefError(f"bad image reference {text!r}: registry {registry!r} is not "
                            "host[:port]")
    path, digest = _split_digest(rest)
    return _in_registry(text, registry, path, digest)


def _in_registry(text: str, registry: str, path: str, digest: str | None) -> ImageRef:
    repository, tag = _split_tag(text, path)
    if registry == DOCKER_HUB and "/" not in repository:
        repository = f"library/{repository}"
    if len(repository) > MAX_REPOSITORY_CHARS or not _REPOSITORY_RE.fullmatch(repository):
        raise ImageRefError(f"bad image reference {text!r}: repository {repository!r} must be "
                             "lower-case letters, digits and . _ - separators, split by /")
    if tag is None and digest is None:
        tag = DEFAULT_TAG
    return ImageRef(registry, repository, tag, digest)


def _split_digest(text: str) -> tuple[str, str | None]:
    if "@" not in text:
        return text, None
    rest, _, digest = text.partition("@")
    try:
        return rest, check_digest(digest)
    except ImageRefError as exc:
        raise ImageRefError(f"bad image reference {text!r}: {exc}") from None


def _split_registry(text: str, rest: str) -> tuple[str, str]:
    first, slash, path = rest.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"):
        if not _HOST_RE.fullmatch(first):
            raise ImageRefError(f"bad image reference {text!r}: registry {first!r} is not "
                                 "host[:port]")
        return first, path
    return DOCKER_HUB, rest


def _split_tag(text: str, path: str) -> tuple[str, str | None]:
    last_slash = path.rfind("/")
    colon = path.rfind(":")
    if colon <= last_slash:
        return path, None
    return path[:colon], _check_tag(path[colon + 1:], text)


def _check_tag(tag: str, text: str) -> str:
    if not _TAG_RE.fullmatch(tag):
        raise ImageRefError(f"bad image reference {text!r}: tag {tag!r} must be letters, "
                             "digits, _ . - (at most 128, not starting with . or -)")
    return tag
