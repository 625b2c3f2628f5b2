"""Tracker replicas on Redis: one ordered log of ops, applied by every replica.

Theory of operation. The tracker's swarm state changes only by ops
(tracker.machine). With `redis_url` set, a replica does not apply an op when
its request arrives: it appends the op to a Redis stream (`XADD`, one round
trip) and waits. A consumer task reads the stream in order (`XREAD`) and
applies every entry, its own and the other replicas', with `now` taken from
the entry id (milliseconds on Redis's clock, the same for every replica and
never decreasing) and, for its own entries, an rng seeded from the cluster's
seed and the entry id. So every replica holds the same registry, and a reply
(peers, origin slot) is exactly what one process applying the same log would
give: origin-fetcher appointments are consistent across replicas because the
log orders the announces that make them, with no lock. Each replica's
expiry timer appends a `Tick`, so members expire at the same log position
everywhere.

Snapshots bound the log. Every `SNAPSHOT_SECONDS`, one replica (the first
to take that period's turn in Redis; all states are equal) writes its
registry as of its last applied entry (plain msgpack, MAC'd; tracker.snapshot)
unless a newer snapshot is there, and trims the log up to the snapshot it
replaced. Packing stops that replica's event loop for a moment (10,000 nodes x
3 contents, 4.8 MB: 0.22 s, where the pickle it replaced took 1.38 s in the
same run on a loaded machine; reading one back, with its checks, 1.7 s, only
at start or recovery), once a period for the whole cluster. The log keeps
one snapshot period of history, so a replica that lags less than that never
misses an entry. A replica starting, or finding that entries it had not
read are gone (it lagged more, or Redis lost its data), loads the newest
snapshot and reads on from it.

Redis restarted. A replica that loses Redis answers 503 (agents go to
another tracker URL, then retry) and reconnects with back-off. If Redis kept
its data (AOF or RDB), the replica reads on where it was. If not, the log is
empty and every replica starts over from an empty registry at the same
point, the start of the new log: the state is rebuilt from the next
announces (one interval), and each replica writes back the manifests and
names it holds (`HSETNX`, first writer wins as always). A replica does the
same at start, so the `--state-dir` of a tracker that ran alone before
reaches the other replicas.

What is read from Redis is checked before it is used (docs/trust.md). Every
log entry carries a MAC under a key derived from the cluster secret, and is
decoded field by field (tracker.machine.decode): an entry that fails either
check is skipped, logged and counted (`log_entries_skipped`), and every
replica skips it alike, so they stay equal. A snapshot carries a MAC too and
is plain data rebuilt under checks (tracker.snapshot); one that fails is
refused (`snapshots_refused`), deleted so that the next period's writer can
replace it, and the replica reads the log from its start instead (whatever
the log lost is rebuilt by the next announces, one interval). The log
reader never stops on what it reads; `/healthz` fails if it stopped anyway.
Redis must require AUTH (`redis_password_file`, with `redis_username` for an
ACL user); `rediss://` URLs use TLS, checked against `redis_ca_file`.

Manifests and names are Redis hashes written with `HSETNX`, so two replicas
publishing at once end with one document; each replica caches what it has
read (documents never change).

Keys, under the configured prefix `P`: `P:log` (stream), `P:seed`,
`P:snapshot` (hash: id, state, mac), `P:turn` (who snapshots this period),
`P:manifests`, `P:names`.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import os
import random
import re
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import redis.asyncio as aioredis
from redis.exceptions import AuthenticationError, RedisError

from tracker import machine, snapshot
from tracker.config import TrackerConfig
from tracker.guard import Unavailable
from tracker.machine import Machine, Op
from tracker.registry import IdentityError
from tracker.store import Documents

if TYPE_CHECKING:
    from tracker.state import Metrics

log = logging.getLogger("bootseer.tracker")

APPLY_TIMEOUT_SECONDS = 5.0  # an op not applied by then is a 503: the agent tries again
READ_BATCH = 1000
READ_BLOCK_MS = 1000
SNAPSHOT_SECONDS = 30.0
RECONNECT_SECONDS = (0.1, 2.0)  # first and longest pause between attempts
MAC_BYTES = 16
ENTRY_ID = re.compile(rb"[0-9]{1,20}-[0-9]{1,20}")

# Write the snapshot only if newer than the stored one; return the id it replaced.
_PUT_SNAPSHOT = """
local old = redis.call('HGET', KEYS[1], 'id')
if old then
  local oms, oseq = string.match(old, '(%d+)-(%d+)')
  local nms, nseq = string.match(ARGV[1], '(%d+)-(%d+)')
  if tonumber(oms) > tonumber(nms) or
     (oms == nms and tonumber(oseq) >= tonumber(nseq)) then return false end
end
redis.call('HSET', KEYS[1], 'id', ARGV[1], 'state', ARGV[2], 'mac', ARGV[3])
return old or ''
"""


class Replicas:
    """A replica's link to the shared log; `submit` an op, get its reply."""

    def __init__(self, config: TrackerConfig, secret: bytes, machine_: Machine,
                 on_expired: Callable[[int], None],
                 documents: Sequence[Documents], metrics: Metrics) -> None:
        """Unavailable if the Redis credentials cannot be read."""
        assert config.redis_url is not None
        self.url = url = config.redis_url
        # Any: redis-py types every reply as bytes | str | ...; ours are bytes (no decoding)
        self._redis: Any = aioredis.from_url(url, socket_connect_timeout=2.0,
                                             **redis_options(config))
        self._keys = {k: f"{config.redis_prefix}:{k}" for k in (
            "log", "seed", "snapshot", "turn", "manifests", "names", "origins")}
        self._mac_key = mac_key(secret)
        self._machine = machine_
        self._on_expired = on_expired
        self._metrics = metrics
        self._documents = documents  # written back to Redis at start and after a loss
        self._name = os.urandom(6).hex()
        self._sent = 0
        self._waiters: dict[bytes, asyncio.Future[Any]] = {}
        self._last = b"0-0"  # id of the last entry applied
        self._run_id = ""
        self._seed = b""
        self._tasks: list[asyncio.Task[None]] = []

    # -- lifecycle ----------------------------------------------------------------

    async def start(self) -> None:
        """Connect, load the newest snapshot, start reading; Unavailable naming the URL."""
        try:
            await self._redis.set(self._keys["seed"], os.urandom(8).hex(), nx=True)
            self._seed = await self._redis.get(self._keys["seed"])
            self._run_id = await self._server_run_id()
            await self._load_snapshot()
            await self._write_back_documents()  # e.g. a --state-dir of a single tracker
        except AuthenticationError as exc:
            await self._redis.aclose()
            raise Unavailable(f"Redis at {self.url} refused the tracker's credentials ({exc}); "
                              "check redis_password_file and redis_username against the "
                              "server's requirepass or ACL user") from None
        except RedisError as exc:
            await self._redis.aclose()
            raise Unavailable(f"cannot reach Redis at {self.url}: {exc}; start redis-server "
                              "or fix redis_url") from None
        log.info("replica %s on Redis at %s, from log entry %s", self._name, self.url,
                 self._last.decode())
        self._tasks = [asyncio.create_task(self._consume(), name="tracker-log"),
                       asyncio.create_task(self._snapshots(), name="tracker-snapshots")]
        self._tasks[0].add_done_callback(_reader_died)

    def problem(self) -> str | None:
        """Why this replica cannot serve (its log reader stopped), or None."""
        if self._tasks and not self._tasks[0].done():
            return None
        return "the tracker log reader is not running; restart this replica"

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._redis.aclose()

    # -- ops ----------------------------------------------------------------------

    async def submit(self, op: Op) -> Any:
        """Append `op`, wait until this replica applied it, return its reply."""
        self._sent += 1
        token = f"{self._name}:{self._sent}".encode()
        done = asyncio.get_running_loop().create_future()
        self._waiters[token] = done
        try:
            await self._append(op, token)
            async with asyncio.timeout(APPLY_TIMEOUT_SECONDS):
                return await done
        except TimeoutError:
            raise Unavailable(f"the shared log at {self.url} did not apply this request "
                              f"within {APPLY_TIMEOUT_SECONDS:g} s; try again") from None
        finally:
            del self._waiters[token]

    async def append(self, op: Op) -> None:
        """Append `op` without waiting for it (ticks)."""
        await self._append(op, b"")

    async def _append(self, op: Op, token: bytes) -> None:
        try:
            entry = machine.encode(op)
            await self._redis.xadd(self._keys["log"], {"e": entry, "w": token,
                                                       "m": self._mac(b"e", entry, token)})
        except RedisError as exc:
            raise self._unreachable(exc) from None

    def _mac(self, kind: bytes, *parts: bytes) -> bytes:
        return mac(self._mac_key, kind, *parts)

    def _apply(self, entry_id: bytes, fields: dict[bytes, bytes]) -> None:
        self._last = entry_id
        now = int(entry_id.partition(b"-")[0]) / 1000
        entry, token = fields.get(b"e", b""), fields.get(b"w", b"")
        waiter = self._waiters.get(token)
        try:
            if not hmac.compare_digest(fields.get(b"m", b""), self._mac(b"e", entry, token)):
                raise ValueError("its MAC is missing or wrong (not written by a replica)")
            op = machine.decode(entry)
        except ValueError as exc:
            self._skip(entry_id, str(exc), waiter)
            return
        rng = random.Random(self._seed + b":" + entry_id) if waiter is not None else None
        try:
            result = self._machine.apply(op, now, rng)
        except IdentityError as exc:  # every replica refuses it alike; nothing changed
            if waiter is not None and not waiter.done():
                waiter.set_exception(exc)
            return
        except Exception as exc:
            # A checked op that `apply` still trips over is our bug. `apply` is
            # deterministic, so every replica trips at this entry alike: skipping it
            # keeps them equal, where stopping would stop the whole cluster for good.
            log.exception("applying log entry %s failed", entry_id.decode())
            self._skip(entry_id, f"applying it failed: {exc!r}", waiter)
            return
        if isinstance(op, machine.Tick) and result:
            self._on_expired(len(result))
        if waiter is not None and not waiter.done():
            waiter.set_result(result)

    def _skip(self, entry_id: bytes, why: str,
              waiter: asyncio.Future[Any] | None) -> None:
        self._metrics.log_entries_skipped.inc()
        log.error("skipping tracker log entry %s: %s", entry_id.decode(), why)
        if waiter is not None and not waiter.done():
            waiter.set_exception(Unavailable("the shared log refused this request's entry; "
                                             "try again"))

    # -- reading the log ----------------------------------------------------------

    async def _consume(self) -> None:
        pause = RECONNECT_SECONDS[0]
        while True:
            try:
                got = await self._redis.xread({self._keys["log"]: self._last},
                                              count=READ_BATCH, block=READ_BLOCK_MS)
                pause = RECONNECT_SECONDS[0]
            except RedisError as exc:
                log.warning("lost Redis at %s (%s); retrying in %.1f s", self.url, exc, pause)
                await asyncio.sleep(pause)
                pause = min(pause * 2, RECONNECT_SECONDS[1])
                await self._recover()
                continue
            for _stream, entries in got:
                for entry_id, fields in entries:
                    self._apply(entry_id, fields)

    async def _recover(self) -> None:
        """After an outage: carry on, or start over if Redis lost what we had not read."""
        try:
            run_id = await self._server_run_id()
            if run_id == self._run_id:
                return
            log.warning("Redis at %s restarted", self.url)
            self._run_id = run_id
            if await self._missed_entries():
                await self._start_over()
        except RedisError:
            pass  # still down: the next read fails and we come back here

    async def _missed_entries(self) -> bool:
        """Whether entries after the last one we applied are gone from the log."""
        if self._last == b"0-0":
            return False
        return not await self._redis.xrange(self._keys["log"], self._last, self._last)

    async def _start_over(self) -> None:
        """Load the newest snapshot, or an empty registry; re-publish our documents."""
        if not await self._load_snapshot():
            log.warning("Redis lost the tracker log: starting over from an empty registry; "
                        "the next announces rebuild it")
            self._machine.registry.reset()
            self._last = b"0-0"
        await self._write_back_documents()

    async def _write_back_documents(self) -> None:
        """Offer Redis the documents this replica holds (first writer wins, as always)."""
        for documents in self._documents:
            for key, body in documents.held().items():
                await self._redis.hsetnx(self._keys[documents.kind], key, body)

    # -- snapshots ----------------------------------------------------------------

    async def _load_snapshot(self) -> bool:
        """Load the newest snapshot if there is a sound one; False: read the log from its start.

        A snapshot that fails its checks is refused and deleted (the next period's
        writer then puts a sound one there), never fatal.
        """
        key = self._keys["snapshot"]
        entry_id, state, mac = await self._redis.hmget(key, ["id", "state", "mac"])
        if entry_id is None and state is None:
            return False
        try:
            if not isinstance(entry_id, bytes) or not ENTRY_ID.fullmatch(entry_id) \
                    or not isinstance(state, bytes):
                raise snapshot.SnapshotError("it has no proper id and state")
            if not hmac.compare_digest(mac or b"", self._mac(b"s", entry_id, state)):
                raise snapshot.SnapshotError("its MAC is missing or wrong (not written by a "
                                             "replica)")
            registry = snapshot.load(state, self._machine.registry)
        except snapshot.SnapshotError as exc:
            self._metrics.snapshots_refused.inc()
            log.error("refusing the tracker snapshot %s in Redis at %s: %s; deleting it and "
                      "reading the log from its start", key, self.url, exc)
            await self._redis.delete(key)
            return False
        self._machine.registry.restore(registry)
        self._last = entry_id
        return True

    async def _snapshots(self) -> None:
        while True:
            await asyncio.sleep(SNAPSHOT_SECONDS * random.uniform(0.9, 1.1))
            try:
                await self._snapshot()
            except RedisError as exc:
                log.warning("could not write a snapshot to Redis at %s: %s", self.url, exc)

    async def _snapshot(self) -> None:
        if await self._missed_entries():  # lagged by more than a period: catch up at once
            log.warning("this replica fell more than a snapshot period behind; reloading")
            await self._start_over()
            return
        turn = int(SNAPSHOT_SECONDS * 800)  # ms: one writer per period (the states are equal)
        if self._last == b"0-0" or not await self._redis.set(self._keys["turn"], self._name,
                                                             nx=True, px=turn):
            return
        started = time.monotonic()
        entry_id, state = self._last, snapshot.dump(self._machine.registry)
        packed = time.monotonic() - started
        replaced = await self._redis.eval(_PUT_SNAPSHOT, 1, self._keys["snapshot"],
                                          entry_id, state, self._mac(b"s", entry_id, state))
        if replaced:  # keep the log since the snapshot we replaced: one period of history
            await self._redis.xtrim(self._keys["log"], minid=replaced, approximate=False)
        log.info("snapshot at log entry %s: %d bytes, packed in %.3f s", entry_id.decode(),
                 len(state), packed)

    # -- documents ----------------------------------------------------------------

    async def get_document(self, kind: str, key: str) -> bytes | None:
        try:
            body: bytes | None = await self._redis.hget(self._keys[kind], key)
        except RedisError as exc:
            raise self._unreachable(exc) from None
        return body

    async def put_document(self, kind: str, key: str, body: bytes) -> bytes | None:
        """Write `body` unless `key` is held; None if written, else the held bytes."""
        try:
            if await self._redis.hsetnx(self._keys[kind], key, body):
                return None
            held: bytes = await self._redis.hget(self._keys[kind], key)
        except RedisError as exc:
            raise self._unreachable(exc) from None
        return held

    def _unreachable(self, exc: RedisError) -> Unavailable:
        return Unavailable(f"the tracker's Redis at {self.url} is unreachable: {exc}")

    async def _server_run_id(self) -> str:
        info = await self._redis.info("server")
        return str(info.get("run_id", ""))


def _reader_died(task: asyncio.Task[None]) -> None:
    """A bug stopped the log reader: say so loudly (every request now times out, 503)."""
    if not task.cancelled() and task.exception() is not None:
        log.critical("the tracker log reader stopped; this replica answers 503 until "
                     "restarted", exc_info=task.exception())


def mac_key(secret: bytes) -> bytes:
    """The key of the log's and snapshots' MACs, derived from the cluster secret."""
    return hmac.digest(secret, b"bootseer-tracker-replicas-v1", "sha256")


def mac(key: bytes, kind: bytes, *parts: bytes) -> bytes:
    """The MAC of a log entry (`kind` b"e": op, token) or a snapshot (b"s": id, state)."""
    framed = b"".join(len(p).to_bytes(8, "big") + p for p in (kind, *parts))  # unambiguous
    return hmac.digest(key, framed, "sha256")[:MAC_BYTES]


def redis_options(config: TrackerConfig) -> dict[str, Any]:
    """redis-py's connection options for `config`: AUTH from the files, TLS's CA.

    Unavailable naming the file if a credential cannot be read.
    """
    options: dict[str, Any] = {}
    if config.redis_password_file is not None:
        try:
            with open(config.redis_password_file, encoding="utf-8") as f:
                password = f.read().strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise Unavailable(f"cannot read redis_password_file {config.redis_password_file}: "
                              f"{getattr(exc, 'strerror', None) or exc}") from None
        if not password:
            raise Unavailable(f"redis_password_file {config.redis_password_file} is empty")
        options["password"] = password
    if config.redis_username is not None:
        options["username"] = config.redis_username
    if config.redis_ca_file is not None:
        options["ssl_ca_certs"] = config.redis_ca_file
    return options
