"""A tracker, an origin and N agents as separate processes on loopback.

Used by `bootseer demo`, `bootseer bench swarm` and the end-to-end tests, so
all three exercise the real command-line entry points and the real processes.
On a testbed (`p2p.testing.testbed`), the tracker and the origin run in its origin
namespace and agent `i` in node `i`'s, each bound to its namespace's address,
with the node's rack; the links' caps are then the testbed's.
Every child prints one JSON line when it is ready; we read it with a bounded
wait, and a child that dies first is reported with the tail of its stderr.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import signal
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from p2p import process
from p2p.agentclient import AgentClient
from p2p.content import CHUNK_SIZE, DEFAULT_DIGEST, ContentId, Manifest
from p2p.errors import UserError
from p2p.publish import manifest_of_file
from p2p.tracker_client import TrackerClient

if TYPE_CHECKING:  # a testbed is optional: load its shell only when one is used
    from p2p.testing.testbed.netns import Testbed

READY_TIMEOUT_S = 30.0


def bootseer_command() -> list[str]:
    exe = Path(sys.executable).parent / "bootseer"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "p2p"]


@dataclass
class Child:
    name: str
    proc: asyncio.subprocess.Process
    ready: dict[str, Any]
    stderr_path: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def peak_rss_mb(self) -> float:
        """VmHWM of the live process, in MB."""
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
        return 0.0

    def cpu_seconds(self) -> float:
        """User plus system CPU the live process has used so far, all its threads."""
        return process.cpu_seconds(self.pid)

    def cpu_split(self) -> tuple[float, float]:
        """(user, system) CPU seconds the live process has used so far, all its threads."""
        return process.cpu_split(self.pid)

    async def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> int:
        return await process.stop(self.proc, sig, timeout)


@dataclass
class AgentHandle:
    index: int
    child: Child
    api_socket: str
    store_dir: Path
    config_path: Path

    @property
    def peer(self) -> str:
        return str(self.child.ready["peer"])

    def client(self, timeout_s: float | None = None) -> AgentClient:
        return AgentClient(self.api_socket, timeout_s)


@dataclass
class LocalCluster:
    workdir: Path
    secret: bytes = field(default_factory=lambda: secrets.token_hex(32).encode())
    children: list[Child] = field(default_factory=list)
    tracker_url: str = ""
    origin_url: str = ""
    testbed: Testbed | None = None

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "BOOTSEER_SECRET": self.secret.decode()}

    async def spawn(self, name: str, args: Sequence[str],
                    env: dict[str, str] | None = None, netns: str | None = None) -> Child:
        """Start `bootseer ARGS` (in namespace `netns` if given) and wait for its ready line."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        stderr_path = self.workdir / f"{name}.log"
        argv = [*bootseer_command(), *args]
        if netns is not None:
            from p2p.testing.testbed.plan import in_namespace

            argv = in_namespace(netns, argv)
        with open(stderr_path, "ab") as err:
            proc = await asyncio.create_subprocess_exec(
                *argv, stdout=asyncio.subprocess.PIPE, stderr=err,
                env=env or self.env, start_new_session=True)
        assert proc.stdout is not None
        try:
            line = await asyncio.wait_for(proc.stdout.readline(), READY_TIMEOUT_S)
            ready = json.loads(line)
        except (TimeoutError, json.JSONDecodeError) as exc:
            with contextlib.suppress(ProcessLookupError):  # it may have died already
                proc.kill()
            await proc.wait()
            tail = stderr_path.read_text(errors="replace")[-2000:]
            raise UserError(f"{name} did not start ({type(exc).__name__}); its log:\n{tail}") \
                from exc
        child = Child(name, proc, ready, stderr_path)
        self.children.append(child)
        return child

    def _origin_side(self) -> tuple[list[str], str | None]:
        """(--host flags, namespace) for a server of the origin side."""
        if self.testbed is None:
            return [], None
        return ["--host", self.testbed.origin.ip], self.testbed.origin.netns

    async def start_tracker(self, *extra: str, name: str = "tracker") -> Child:
        host, netns = self._origin_side()
        child = await self.spawn(name, ["tracker", "--port", "0",
                                        "--state-dir", str(self.workdir / name),
                                        *host, *extra], netns=netns)
        self.tracker_url = child.ready["url"]
        return child

    async def start_replicas(self, redis_url: str, count: int, *extra: str) -> list[Child]:
        """`count` trackers sharing the Redis at `redis_url`; `tracker_url` lists them all."""
        children = [await self.start_tracker("--redis", redis_url, *extra, name=f"tracker{i}")
                    for i in range(count)]
        self.tracker_url = ",".join(c.ready["url"] for c in children)
        return children

    async def start_origin(self, root: Path, rate_mbps: float | None = None) -> Child:
        host, netns = self._origin_side()
        args = ["origin", str(root), "--port", "0", *host]
        if rate_mbps:
            args += ["--rate-mbps", str(rate_mbps)]
        child = await self.spawn("origin", args, netns=netns)
        self.origin_url = child.ready["url"]
        return child

    async def start_agent(self, index: int, rack: str, config: dict[str, Any] | None = None,
                          store_dir: Path | None = None, name: str | None = None) -> AgentHandle:
        name = name or f"agent{index}"
        store = store_dir or self.workdir / name / "store"
        sock = str(self.workdir / name / "api.sock")
        (self.workdir / name).mkdir(parents=True, exist_ok=True)
        cfg = self.workdir / name / "agent.toml"
        host, netns = "127.0.0.1", None
        if self.testbed is not None:  # its node `index`, in that node's rack
            node = self.testbed.nodes[index]
            host, netns, rack = node.ip, node.netns, f"rack{node.rack}"
        cfg.write_text(to_toml({"tracker": self.tracker_url, "host": host, "port": 0,
                                "rack": rack, "peer_id": name, "store_dir": str(store),
                                "api_socket": sock, **(config or {})}))
        child = await self.spawn(name, ["agent", "--config", str(cfg)], netns=netns)
        return AgentHandle(index, child, sock, store, cfg)

    async def publish(self, path: Path, chunk_size: int = CHUNK_SIZE,
                      origin: str | None = None, digest: str = DEFAULT_DIGEST) -> Manifest:
        manifest = await asyncio.to_thread(manifest_of_file, path, chunk_size,
                                           origin or f"{self.origin_url}/{path.name}", digest)
        async with TrackerClient(self.tracker_url, self.secret) as tracker:
            await tracker.put_manifest(manifest)
        return manifest

    async def origin_bytes(self) -> int:
        import aiohttp

        async with aiohttp.ClientSession() as http, http.get(f"{self.origin_url}/stats") as resp:
            return int((await resp.json())["bytes_sent"])

    async def stop(self) -> None:
        await asyncio.gather(*(c.stop() for c in reversed(self.children)),
                             return_exceptions=True)
        self.children.clear()



def write_random_file(path: Path, size: int, seed: int = 0) -> None:
    import random

    rng = random.Random(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        left = size
        while left:
            n = min(left, 8 << 20)
            f.write(rng.randbytes(n))
            left -= n


def to_toml(values: dict[str, Any]) -> str:
    """Flat keys and one level of tables: all the agent configs we write need."""
    lines, tables = [], []
    for key, value in values.items():
        if isinstance(value, dict):
            tables.append(f"\n[{key}]\n" + "".join(f"{k} = {_toml(v)}\n" for k, v in value.items()))
        elif value is not None:
            lines.append(f"{key} = {_toml(value)}\n")
    return "".join(lines) + "".join(tables)


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return json.dumps(str(value))


async def wait_all_complete(agents: Sequence[AgentHandle], content: ContentId,
                            timeout_s: float) -> dict[int, dict[str, Any]]:
    """Ask every agent to fetch `content`; results by agent index, errors included."""

    async def one(agent: AgentHandle) -> dict[str, Any]:
        async with agent.client(timeout_s) as client:
            return await client.ensure(content)

    results = await asyncio.gather(*(one(a) for a in agents), return_exceptions=True)
    return {a.index: (r if isinstance(r, dict) else {"error": str(r) or type(r).__name__})
            for a, r in zip(agents, results, strict=True)}
