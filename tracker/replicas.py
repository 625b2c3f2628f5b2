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
registry as of its last applied entry (pickled; read back through an
allow-list of the registry's own classes) unless a newer snapshot is there,
and trims the log up to the snapshot it replaced. Pickling stops that
replica's event loop for a moment (0.16 s for 10,000 nodes x 3 contents,
3.9 MB, measured here), once a period for the whole cluster. The log keeps
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

Manifests and names are Redis hashes written with `HSETNX`, so two replicas
publishing at once end with one document; each replica caches what it has
read (documents never change).

Keys, under the configured prefix `P`: `P:log` (stream), `P:seed`,
`P:snapshot` (hash: id, state), `P:turn` (who snapshots this period),
`P:manifests`, `P:names`.
"""

from __future__ import annotations

import asyncio
import io
import logging
import os
import pickle
import random
import time
from collections.abc import Callable, Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from tracker import machine
from tracker.guard import Unavailable
from tracker.machine import Machine, Op
from tracker.registry import IdentityError, Registry
from tracker.store import Documents

log = logging.getLogger("bootseer.tracker")

APPLY_TIMEOUT_SECONDS = 5.0  # an op not applied by then is a 503: the agent tries again
READ_BATCH = 1000
READ_BLOCK_MS = 1000
SNAPSHOT_SECONDS = 30.0
RECONNECT_SECONDS = (0.1, 2.0)  # first and longest pause between attempts

# Write the snapshot only if newer than the stored one; return the id it replaced.
_PUT_SNAPSHOT = """
local old = redis.call('HGET', KEYS[1], 'id')
if old then
  local oms, oseq = string.match(old, '(%d+)-(%d+)')
  local nms, nseq = string.match(ARGV[1], '(%d+)-(%d+)')
  if tonumber(oms) > tonumber(nms) or
     (oms == nms and tonumber(oseq) >= tonumber(nseq)) then return false end
end
redis.call('HSET', KEYS[1], 'id', ARGV[1], 'state', ARGV[2])
return old or ''
"""


class Replicas:
    """A replica's link to the shared log; `submit` an op, get its reply."""

    def __init__(self, url: str, prefix: str, machine_: Machine,
                 on_expired: Callable[[int], None],
                 documents: Sequence[Documents]) -> None:
        self.url = url
        # Any: redis-py types every reply as bytes | str | ...; ours are bytes (no decoding)
        self._redis: Any = aioredis.from_url(url, socket_connect_timeout=2.0)
        self._keys = {k: f"{prefix}:{k}" for k in ("log", "seed", "snapshot", "turn",
                                                   "manifests", "names", "origins")}
        self._machine = machine_
        self._on_expired = on_expired
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
        except RedisError as exc:
            await self._redis.aclose()
            raise Unavailable(f"cannot reach Redis at {self.url}: {exc}; start redis-server "
                              "or fix redis_url") from None
        except pickle.UnpicklingError as exc:
            await self._redis.aclose()
            raise Unavailable(f"the snapshot {self._keys['snapshot']} in Redis at {self.url} "
                              f"is unreadable ({exc}); delete that key to start over from "
                              "the log") from None
        log.info("replica %s on Redis at %s, from log entry %s", self._name, self.url,
                 self._last.decode())
        self._tasks = [asyncio.create_task(self._consume(), name="tracker-log"),
                       asyncio.create_task(self._snapshots(), name="tracker-snapshots")]
        self._tasks[0].add_done_callback(_reader_died)

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
            await self._redis.xadd(self._keys["log"], {"e": machine.encode(op), "w": token})
        except RedisError as exc:
            raise self._unreachable(exc) from None

    def _apply(self, entry_id: bytes, fields: dict[bytes, bytes]) -> None:
        self._last = entry_id
        now = int(entry_id.partition(b"-")[0]) / 1000
        try:
            op = machine.decode(fields[b"e"])
        except (KeyError, ValueError) as exc:
            log.error("skipping log entry %s: %s", entry_id.decode(), exc)
            return
        waiter = self._waiters.get(fields.get(b"w", b""))
        rng = random.Random(self._seed + b":" + entry_id) if waiter is not None else None
        try:
            result = self._machine.apply(op, now, rng)
        except IdentityError as exc:  # every replica refuses it alike; nothing changed
            if waiter is not None and not waiter.done():
                waiter.set_exception(exc)
            return
        if isinstance(op, machine.Tick) and result:
            self._on_expired(len(result))
        if waiter is not None and not waiter.done():
            waiter.set_result(result)

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
        got = await self._redis.hmget(self._keys["snapshot"], ["id", "state"])
        if got[0] is None or got[1] is None:
            return False
        self._machine.registry.restore(_loads(got[1]))
        self._last = got[0]
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
        entry_id, state = self._last, pickle.dumps(self._machine.registry, protocol=5)
        pickled = time.monotonic() - started
        replaced = await self._redis.eval(_PUT_SNAPSHOT, 1, self._keys["snapshot"],
                                          entry_id, state)
        if replaced:  # keep the log since the snapshot we replaced: one period of history
            await self._redis.xtrim(self._keys["log"], minid=replaced, approximate=False)
        log.info("snapshot at log entry %s: %d bytes, pickled in %.3f s", entry_id.decode(),
                 len(state), pickled)

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


class _RegistryUnpickler(pickle.Unpickler):
    """Only the registry's own classes and the containers it uses: nothing else runs."""

    ALLOWED = {("tracker.registry", n) for n in ("Registry", "Member", "Report", "_Swarm")} | {
        ("tracker.index", n) for n in ("SwarmIndex", "_Bag", "_Rack")} | {
        ("collections", "OrderedDict"), ("collections", "deque"), ("builtins", "set")}

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(f"a tracker snapshot may not hold {module}.{name}")
        return super().find_class(module, name)


def _loads(raw: bytes) -> Registry:
    try:
        state = _RegistryUnpickler(io.BytesIO(raw)).load()
    except (EOFError, ValueError, TypeError, AttributeError, IndexError) as exc:
        raise pickle.UnpicklingError(str(exc)) from None
    if not isinstance(state, Registry):
        raise pickle.UnpicklingError("a tracker snapshot holds no registry")
    return state
