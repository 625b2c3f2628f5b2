"""One registry conversation: URLs, authentication, retries (used by `RegistryClient`).

`RegistrySession.open` sends one request and yields a response whose status
was expected, after doing what the registry asked for on the way:

- auth: the first request to a registry goes out anonymous; a 401's
  `WWW-Authenticate` challenge is remembered per registry and answered
  (Basic credentials, or a Bearer token from the realm for the scope this
  request needs: `pull`, or `pull,push` to push), and the request is sent
  again. Later requests authenticate up front. A 401 on a request that
  carried credentials drops the token and re-authenticates once, no more.
- retries: 429, 5xx and connection failures are retried by `RetryPolicy`
  (honouring `Retry-After`); tokens are fetched the same way.
- errors: anything else becomes the one `RegistryError` written by
  `oci_http.error_for_status`, naming the thing asked for and the registry.

Transport: plain HTTP for loopback registries (`localhost`, `127.0.0.0/8`,
`::1`) and for those listed in `plain_http`; HTTPS for the rest.
"""

from __future__ import annotations

import asyncio
import ipaddress
import time
from collections.abc import AsyncIterator, Callable, Collection
from contextlib import asynccontextmanager

import aiohttp

from p2p.origin.base import http_session
from p2p.origin.oci_auth import (
    Challenge,
    Credentials,
    TokenCache,
    parse_challenge,
    repository_scope,
    token_from_answer,
)
from p2p.origin.oci_http import (
    MAX_ERROR_BODY_BYTES,
    RETRY_STATUSES,
    Failure,
    RegistryError,
    RetryPolicy,
    error_detail,
    error_for_status,
    parse_retry_after,
    unreachable,
)
from p2p.origin.oci_ref import ImageRef

READ_TIMEOUT_S = 30.0

CredentialLookup = Callable[[str], Credentials | None]


def _is_loopback(endpoint: str) -> bool:
    host = endpoint.rsplit(":", 1)[0] if endpoint.count(":") == 1 or "]" in endpoint \
        else endpoint
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class RegistrySession:
    """HTTP to registries for one client: one aiohttp session, challenges, token cache."""

    def __init__(self, credentials: CredentialLookup, plain_http: Collection[str],
                 retry: RetryPolicy) -> None:
        self.retry = retry
        self._credentials = credentials
        self._plain_http = frozenset(plain_http)
        self._session: aiohttp.ClientSession | None = None
        self._challenges: dict[str, Challenge] = {}
        self._tokens = TokenCache()
        self._token_locks: dict[tuple[str, str], asyncio.Lock] = {}

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _url(self, ref: ImageRef, path: str) -> str:
        if path.startswith(("http://", "https://")):
            return path
        endpoint = ref.endpoint
        plain = endpoint in self._plain_http or _is_loopback(endpoint)
        return f"{'http' if plain else 'https'}://{endpoint}/v2/{ref.repository}/{path}"

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = http_session(READ_TIMEOUT_S)
        return self._session

    @asynccontextmanager
    async def open(self, method: str, ref: ImageRef, path: str, what: str, *,
                   push: bool = False, headers: dict[str, str] | None = None,
                   data: bytes | None = None, expect: tuple[int, ...] = (200,)) \
            -> AsyncIterator[aiohttp.ClientResponse]:
        """One request, authenticated and retried; yields a response whose status is expected.

        `path` is relative to `/v2/<repository>/`, or an absolute URL (upload locations).
        `what` names the thing asked for in error messages. One loop, not helpers,
        because the attempt count, the single re-auth and the response's release
        all belong to the same request.
        """
        url = self._url(ref, path)
        reauthed = False
        attempt = 0
        while True:
            attempt += 1
            auth, user = await self._authorization(ref, push, what)
            try:
                resp = await self._client().request(method, url, data=data,
                                                    headers={**(headers or {}), **auth})
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                await self._pause(attempt, None, unreachable(what, ref.registry,
                                                             str(exc) or type(exc).__name__,
                                                             attempt))
                continue
            try:
                if resp.status in expect:
                    try:
                        yield resp
                    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                        raise RegistryError(f"connection to registry {ref.registry} broke "
                                            f"while reading {what}: {exc or type(exc).__name__}"
                                            ) from exc
                    return
                body = await resp.content.read(MAX_ERROR_BODY_BYTES)
            finally:
                resp.release()
            challenge = parse_challenge(resp.headers.get("WWW-Authenticate"))
            failure = Failure(what, ref.registry, resp.status, error_detail(body), attempt,
                              user, push, challenge is not None and user is not None
                              and challenge.param("error") == "insufficient_scope")
            if resp.status == 401 and not reauthed and self._learn(ref, resp, push, auth):
                reauthed, attempt = True, attempt - 1
                continue
            if 200 <= resp.status < 300:
                raise RegistryError(f"registry {ref.registry} answered HTTP {resp.status} for "
                                    f"{what} where HTTP {' or '.join(map(str, expect))} was "
                                    "expected", resp.status)
            if resp.status not in RETRY_STATUSES:
                raise error_for_status(failure)
            after = parse_retry_after(resp.headers.get("Retry-After"), time.time())
            await self._pause(attempt, after, error_for_status(failure))

    async def _pause(self, attempt: int, retry_after_s: float | None,
                     error: RegistryError) -> None:
        delay = self.retry.delay(attempt, retry_after_s)
        if delay is None:
            raise error
        await asyncio.sleep(delay)

    def _learn(self, ref: ImageRef, resp: aiohttp.ClientResponse, push: bool,
               sent: dict[str, str]) -> bool:
        """Note the registry's challenge; True if a new attempt could authenticate.

        A bearer token the registry refused is dropped from the cache; only that
        one, as concurrent requests may already have fetched a fresh one.
        """
        challenge = parse_challenge(resp.headers.get("WWW-Authenticate"))
        if challenge is None:
            return False
        self._challenges[ref.endpoint] = challenge
        refused = sent.get("Authorization", "")
        if refused.startswith("Bearer "):
            self._tokens.drop(ref.endpoint, repository_scope(ref.repository, push),
                              refused.removeprefix("Bearer "))
        return challenge.scheme == "bearer" or self._creds(ref) is not None

    def _creds(self, ref: ImageRef) -> Credentials | None:
        try:
            return self._credentials(ref.registry)
        except ValueError as exc:
            raise RegistryError(f"registry credentials for {ref.registry}: {exc}") from None

    async def _authorization(self, ref: ImageRef, push: bool, what: str) \
            -> tuple[dict[str, str], str | None]:
        """Headers to send and the user they speak for, by what the registry asked."""
        challenge = self._challenges.get(ref.endpoint)
        if challenge is None:
            return {}, None
        creds = self._creds(ref)
        user = creds.username if creds else None
        if challenge.scheme == "basic":
            return ({"Authorization": creds.basic_header()}, user) if creds else ({}, None)
        token = await self._token(ref, challenge, repository_scope(ref.repository, push),
                                  creds, what)
        return {"Authorization": f"Bearer {token}"}, user

    async def _token(self, ref: ImageRef, challenge: Challenge, scope: str,
                     creds: Credentials | None, what: str) -> str:
        key = (ref.endpoint, scope)
        async with self._token_locks.setdefault(key, asyncio.Lock()):
            now = asyncio.get_running_loop().time()
            token = self._tokens.get(ref.endpoint, scope, now)
            if token is None:
                token, lifetime = await self._fetch_token(ref, challenge, scope, creds, what)
                self._tokens.put(ref.endpoint, scope, token, lifetime, now)
            return token

    async def _fetch_token(self, ref: ImageRef, challenge: Challenge, scope: str,
                           creds: Credentials | None, what: str) -> tuple[str, float]:
        realm = challenge.param("realm") or ""
        if not realm.startswith(("https://", "http://")):
            raise RegistryError(f"registry {ref.registry} asked for a token from {realm!r}, "
                                f"which is not an http(s) URL ({what})")
        query = {"scope": scope, **({"service": s} if (s := challenge.param("service")) else {})}
        headers = {"Authorization": creds.basic_header()} if creds else {}
        token_what = f"a token for {what} from {realm}"
        for attempt in range(1, self.retry.attempts + 1):
            try:
                async with self._client().get(realm, params=query, headers=headers) as resp:
                    body = await resp.content.read(MAX_ERROR_BODY_BYTES)
                    status, after = resp.status, resp.headers.get("Retry-After")
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                await self._pause(attempt, None, unreachable(token_what, ref.registry,
                                                             str(exc) or type(exc).__name__,
                                                             attempt))
                continue
            if status == 200:
                try:
                    return token_from_answer(body)
                except ValueError as exc:
                    raise RegistryError(f"{token_what}: {exc}") from None
            failure = Failure(token_what, ref.registry, status, error_detail(body), attempt,
                              creds.username if creds else None, scope.endswith(",push"))
            if status not in RETRY_STATUSES:
                raise error_for_status(failure)
            await self._pause(attempt, parse_retry_after(after, time.time()),
                              error_for_status(failure))
        raise AssertionError("unreachable: _pause raises on the last attempt")

