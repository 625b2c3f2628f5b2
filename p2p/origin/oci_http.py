"""Registry answers turned into decisions and words: retry policy, error messages.

No network I/O. `RetryPolicy.delay` says how long to wait before attempt n+1
(or None: give up); `error_for_status` writes the one message a user sees for
an HTTP failure, naming the thing asked for and the registry, and saying what
to do about it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from email.utils import parsedate_to_datetime

from p2p.origin.base import OriginError
from p2p.origin.oci_auth import AUTH_ENV, AUTH_FILE_ENV

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
MAX_ERROR_BODY_BYTES = 64 * 1024


class RegistryError(OriginError):
    """A registry operation failed; the message names the image, the registry and the fix.

    `status` is the HTTP status when there was one (None: unreachable, bad data).
    """

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Bounded retries with exponential back-off on 429, 5xx and connection errors.

    No jitter: the delay is a pure function of the attempt, so runs repeat.
    A 429 or 503's `Retry-After` replaces the back-off, capped at `max_delay_s`.
    """

    attempts: int = 4
    first_delay_s: float = 0.25
    max_delay_s: float = 8.0

    def delay(self, attempt: int, retry_after_s: float | None = None) -> float | None:
        """Seconds to wait after failed attempt `attempt` (1-based), None to give up."""
        if attempt >= self.attempts:
            return None
        if retry_after_s is not None:
            return min(max(retry_after_s, 0.0), self.max_delay_s)
        return min(self.first_delay_s * 2.0 ** (attempt - 1), self.max_delay_s)


def parse_retry_after(value: str | None, now_epoch_s: float) -> float | None:
    """`Retry-After` in seconds from delta-seconds or an HTTP date; None if absent or bad."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        return max(parsedate_to_datetime(value).timestamp() - now_epoch_s, 0.0)
    except (TypeError, ValueError, IndexError):
        return None


def error_detail(body: bytes) -> str:
    """`: CODE message` from a distribution-style error body, or '' if there is none."""
    try:
        errors = json.loads(body).get("errors")
        first = errors[0]
        return f": {first.get('code', '')} {first.get('message', '')}".rstrip()
    except (ValueError, AttributeError, IndexError, KeyError, TypeError):
        return ""


@dataclass(frozen=True, slots=True)
class Failure:
    """An HTTP failure to explain: what was asked of which registry, and how it ended."""

    what: str  # "image 127.0.0.1:5000/busybox:1", "blob sha256:.. of 127.0.0.1:5000/busybox"
    registry: str
    status: int
    detail: str = ""
    attempts: int = 1
    sent_credentials: str | None = None  # the user name sent, if any
    push: bool = False
    insufficient_scope: bool = False  # a 401 that means "known user, not allowed"


def error_for_status(f: Failure) -> RegistryError:
    status = f"HTTP {f.status}{f.detail}"
    match f.status:
        case 401 if f.sent_credentials is None:
            text = (f"registry {f.registry} requires credentials for {f.what} ({status}) and "
                    f"none are configured: set {AUTH_ENV}=user:password or point "
                    f"{AUTH_FILE_ENV} at a docker config.json with an entry for {f.registry}")
        case 401 | 403 if f.status == 403 or f.insufficient_scope:
            action = "push" if f.push else "pull"
            text = (f"registry {f.registry} denied access to {f.what} ({status}): the "
                    f"credentials in use are not allowed to {action} it")
        case 401:
            text = (f"registry {f.registry} refused the credentials of user "
                    f"{f.sent_credentials!r} for {f.what} ({status}): check the user name and "
                    "password")
        case 404:
            text = f"{f.what} not found on registry {f.registry} ({status})"
        case 429:
            text = (f"registry {f.registry} kept rate-limiting requests for {f.what} "
                    f"({status}) through {f.attempts} attempts: try again later")
        case code if code >= 500:
            text = (f"registry {f.registry} failed on {f.what} with {status} through "
                    f"{f.attempts} attempts: the registry is in trouble, try again later")
        case _:
            text = f"registry {f.registry} answered {status} for {f.what}"
    return RegistryError(text, f.status)


def unreachable(what: str, registry: str, reason: str, attempts: int) -> RegistryError:
    return RegistryError(f"registry {registry} unreachable for {what}: {reason} (through "
                         f"{attempts} attempts); check the address and that it is running")
