"""A load generator that announces like N agents, for `bootseer bench tracker`.

Theory of operation. Every announce to the tracker is signed (p2p.auth) over
its body and a stamp, and the tracker refuses a signature it has seen before,
so a request can be sent once. Signing in the sending loop would make the
generator, not the tracker, the bottleneck; so the requests are built and
signed ahead (`build_pool`, each with its own microsecond stamp), written to
a file as raw HTTP/1.1, and replayed by `wrk` (C, one event loop per thread)
through a small Lua script that hands out the next prepared request. A pool
is sized for `max_rate` requests per second; a thread that runs dry sends a
cheap `GET /healthz` instead and counts it, and the bench then refuses to
report a rate (the tracker was faster than the pool, which is not a figure).

The warm-up (one announce per node and content, so the swarm has its full
size before the clock starts) goes through `send_pool`: a plain asyncio
sender over keep-alive connections; its speed does not matter.

A node is `n00042`, its rack `r0003` (`nodes_per_rack` per rack), its address
127.0.0.1 with a port of its own, and the contents `c1-...` ids fixed by
their index. `want_share` of the announced contents ask for peers; the rest
send `want: 0`, as an agent with enough peers does.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from p2p.auth import sign_request

ANNOUNCE_PATH = "/v1/announce"
FIRST_PORT = 10_000
RECORD_HEADER = b"%d\n"

WRK_SCRIPT = r"""
-- Replays prepared requests: file <prefix>.<thread index>, records "<length>\n<bytes>".
local threads, counter = {}, 0
function setup(thread)
  thread:set("index", counter)
  counter = counter + 1
  table.insert(threads, thread)
end
function init(args)
  local f = assert(io.open(args[1] .. "." .. index, "rb"))
  local data = f:read("*a")
  f:close()
  pool, sent, dry = {}, 0, 0
  local pos = 1
  while pos <= #data do
    local nl = data:find("\n", pos, true)
    local len = tonumber(data:sub(pos, nl - 1))
    pool[#pool + 1] = data:sub(nl + 1, nl + len)
    pos = nl + 1 + len
  end
  healthz = wrk.format("GET", "/healthz")
end
function request()
  sent = sent + 1
  if sent > #pool then
    dry = dry + 1
    return healthz
  end
  return pool[sent]
end
function done(summary, latency, requests)
  local dry_total = 0
  for _, t in ipairs(threads) do dry_total = dry_total + t:get("dry") end
  local e = summary.errors
  io.write(string.format(
    'WRKJSON {"requests":%d,"duration_us":%d,"p50_us":%d,"p99_us":%d,' ..
    '"errors":%d,"status_errors":%d,"dry":%d}\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    e.connect + e.read + e.write + e.timeout, e.status, dry_total))
end
"""


@dataclass(frozen=True, slots=True)
class Swarm:
    """The simulated cluster: who announces what, and how requests are shaped."""

    nodes: int
    contents: int
    nodes_per_rack: int = 40
    want_share: float = 0.1
    handout_limit: int = 30
    batched: bool = True  # one request per node (all its contents), or one per content

    def content_id(self, index: int) -> str:
        return "c1-" + f"{index + 1:x}".rjust(64, "0")

    def requests_per_round(self) -> int:
        return self.nodes if self.batched else self.nodes * self.contents

    def bodies(self, rng: random.Random, want_share: float | None = None) -> Iterator[bytes]:
        """Announce bodies, node after node, forever; `want_share` overrides the default."""
        share = self.want_share if want_share is None else want_share
        ids = [self.content_id(c) for c in range(self.contents)]
        while True:
            for n in range(self.nodes):
                node = {"peer": f"n{n:05d}", "addr": f"127.0.0.1:{FIRST_PORT + n}",
                        "rack": f"r{n // self.nodes_per_rack:04d}"}
                have = (n * 7919) % 1000
                wants = [self.handout_limit if rng.random() < share else 0 for _ in ids]
                if self.batched:
                    contents = {cid: {"have": have, "complete": have > 900, "want": w}
                                for cid, w in zip(ids, wants, strict=True)}
                    yield _json({**node, "contents": contents})
                else:
                    for cid, w in zip(ids, wants, strict=True):
                        yield _json({**node, "content": cid, "have": have,
                                     "complete": have > 900, "want": w})


def _json(value: dict[str, Any]) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def raw_request(secret: bytes, host: str, body: bytes, stamp: float) -> bytes:
    """One signed HTTP/1.1 announce, ready to write to a socket."""
    signed = sign_request(secret, "POST", ANNOUNCE_PATH, body, stamp)
    head = [f"POST {ANNOUNCE_PATH} HTTP/1.1", f"Host: {host}",
            "Content-Type: application/json", f"Content-Length: {len(body)}",
            *(f"{k}: {v}" for k, v in signed.items())]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def build_pool(swarm: Swarm, secret: bytes, host: str, count: int, seed: int,
               want_share: float | None = None) -> list[bytes]:
    """`count` distinct signed announces (stamps one microsecond apart)."""
    rng = random.Random(seed)
    stamp = time.time()
    bodies = swarm.bodies(rng, want_share)
    return [raw_request(secret, host, next(bodies), stamp + i * 1e-6) for i in range(count)]


def write_pool(pool: list[bytes], prefix: Path, threads: int) -> None:
    """Split `pool` round-robin into `prefix.0` .. `prefix.<threads-1>`."""
    for t in range(threads):
        with open(f"{prefix}.{t}", "wb") as f:
            for raw in pool[t::threads]:
                f.write(RECORD_HEADER % len(raw))
                f.write(raw)


@dataclass(frozen=True, slots=True)
class WrkResult:
    requests: int
    seconds: float
    p50_ms: float
    p99_ms: float
    errors: int  # connection errors and timeouts, plus non-2xx replies
    dry: int  # requests sent after the pool ran out (the result is then void)
    cpu_seconds: float  # wrk's own user + system time


def run_wrk(url: str, prefix: Path, threads: int, connections: int, seconds: float,
            workdir: Path) -> WrkResult:
    """Run wrk against `url` with the prepared pool; blocking (call it in a thread)."""
    script = workdir / "announce.lua"
    script.write_text(WRK_SCRIPT)
    cmd = ["wrk", "-t", str(threads), "-c", str(connections), "-d", f"{seconds:g}s",
           "--timeout", "10s", "-s", str(script), url, "--", str(prefix)]
    out_path = workdir / "wrk.out"
    with open(out_path, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    text = out_path.read_text(errors="replace")
    line = next((ln for ln in text.splitlines() if ln.startswith("WRKJSON ")), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"wrk failed (exit {proc.returncode}): {text[-1500:]}")
    r = json.loads(line.removeprefix("WRKJSON "))
    return WrkResult(r["requests"], r["duration_us"] / 1e6, r["p50_us"] / 1e3,
                     r["p99_us"] / 1e3, r["errors"] + r["status_errors"], r["dry"],
                     usage.ru_utime + usage.ru_stime)


async def send_pool(host: str, port: int, pool: list[bytes], connections: int) -> int:
    """Send every request of `pool` over `connections` keep-alive connections.

    Returns the number of non-200 replies.
    """
    queue = iter(pool)
    failures = 0

    async def worker() -> None:
        nonlocal failures
        reader, writer = await asyncio.open_connection(host, port)
        try:
            for raw in queue:
                writer.write(raw)
                if await _read_reply(reader) != 200:
                    failures += 1
        finally:
            writer.close()

    await asyncio.gather(*(worker() for _ in range(connections)))
    return failures


async def _read_reply(reader: asyncio.StreamReader) -> int:
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    await reader.readexactly(length)
    return status
