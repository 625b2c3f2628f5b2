"""A real HDFS on loopback for tests and benchmarks: Hadoop's MiniDFSCluster.

The Java side is one launcher class (`minicluster/src/main/java/bootseer/Launcher.java`)
and a pom.xml that names Hadoop's jars. `make setup` resolves them with Maven into
the local Maven cache (~/.m2) and writes their classpath to
`minicluster/target/classpath.txt` (`prepare` does the same on first use). The
launcher is compiled with `javac` next to it when its source is newer than the class.

`MiniHdfs.start` runs the launcher as a child process (one JVM: a NameNode on
127.0.0.1 and N DataNodes, each on a loopback address of its own, 127.0.1.1,
127.0.1.2, ..., WebHDFS on, ports chosen by the kernel) and waits for its one
JSON "ready" line: the NameNode's RPC and HTTP ports and, per DataNode, its
address, data-transfer port (what GETFILEBLOCKLOCATIONS names) and HTTP port
(what WebHDFS reads go to). An address per DataNode is what makes a read sent
to a DataNode come from that DataNode's own replica (Launcher.java says why).
`read_cap_bps` caps every DataNode's reads as a disk-bound DataNode's would be:
the launcher puts a pacer in the place of the read throttler that
`dfs.datanode.data.read.bandwidthPerSec` installs, because Hadoop's throttler
lets an idle DataNode burst (Launcher.java's `DiskPacer` says by how much).
`stop_datanode` stops one DataNode (by data-transfer port) while the rest serve;
`stop` ends the JVM (closing its stdin is its signal to shut down). With
`own_jvms`, every DataNode runs in a JVM of its own, so `kill_datanode` can
SIGKILL one: the crash of a real DataNode host, not a clean stop.

Anything missing (java, javac, mvn, the jars) is a `MiniClusterError` that names
the Debian package or the command that provides it: tests fail with it, they do
not skip.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from p2p.process import ToolMissing, require_tool

HERE = Path(__file__).resolve().parent / "minicluster"
SOURCE = HERE / "src" / "main" / "java" / "bootseer" / "Launcher.java"
RESOURCES = HERE / "src" / "main" / "resources"
TARGET = HERE / "target"
CLASSES = TARGET / "classes"
CLASSPATH_FILE = TARGET / "classpath.txt"
SYSTEM_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
TRUST_TOOL = HERE / "tools" / "PemTrustStore.java"
TRUST_PASSWORD = "bootseer"  # a trust store holds public certificates only
READY_TIMEOUT_S = 120.0
MAVEN_TIMEOUT_S = 900.0
# Jersey's JAXB (WebHDFS's JSON) defines classes through reflection, which Java 17
# refuses unless java.lang is opened: without it every WebHDFS call answers 500.
JVM_FLAGS = ("-Xmx2g", "--add-opens", "java.base/java.lang=ALL-UNNAMED")


class MiniClusterError(Exception):
    """The mini cluster cannot be built or started; the message says what is missing."""


def _tool(name: str, package: str) -> str:
    try:
        return require_tool(name, package)
    except ToolMissing as exc:
        raise MiniClusterError(str(exc)) from None


def resolve_jars() -> None:
    """Fetch Hadoop's jars into the Maven cache and write their classpath (slow once:
    about 135 MB; a no-op while the classpath file is newer than the pom)."""
    pom = HERE / "pom.xml"
    if CLASSPATH_FILE.exists() and CLASSPATH_FILE.stat().st_mtime >= pom.stat().st_mtime:
        return
    mvn = _tool("mvn", "maven")
    result = subprocess.run(
        [mvn, "-q", "-B", "-f", str(pom), "dependency:build-classpath",
         f"-Dmdep.outputFile={CLASSPATH_FILE}"],
        capture_output=True, text=True, check=False, timeout=MAVEN_TIMEOUT_S,
        env={**os.environ, "MAVEN_OPTS": _system_trust_options()})
    if result.returncode != 0 or not CLASSPATH_FILE.exists():
        raise MiniClusterError("Maven could not fetch Hadoop's mini cluster jars (is the "
                               "package registry reachable?):\n"
                               f"{(result.stdout + result.stderr)[-2000:]}")


def _system_trust_options() -> str:
    """JVM options that make Maven trust the system's CA bundle (see PemTrustStore.java);
    empty if the system has no bundle, so Java's own trust store applies."""
    if not SYSTEM_CA_BUNDLE.is_file():
        return os.environ.get("MAVEN_OPTS", "")
    store = TARGET / "system-trust.p12"
    if not store.exists() or store.stat().st_mtime < SYSTEM_CA_BUNDLE.stat().st_mtime:
        TARGET.mkdir(parents=True, exist_ok=True)
        java = _tool("java", "openjdk-17-jdk-headless")
        result = subprocess.run([java, str(TRUST_TOOL), str(SYSTEM_CA_BUNDLE), str(store),
                                 TRUST_PASSWORD], capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise MiniClusterError(f"cannot turn {SYSTEM_CA_BUNDLE} into a Java trust store:\n"
                                   f"{result.stderr[-2000:]}")
    return " ".join([os.environ.get("MAVEN_OPTS", ""), f"-Djavax.net.ssl.trustStore={store}",
                     "-Djavax.net.ssl.trustStoreType=PKCS12",
                     f"-Djavax.net.ssl.trustStorePassword={TRUST_PASSWORD}"]).strip()


def prepare() -> str:
    """The launcher's full classpath, building what is missing (jars, the class)."""
    resolve_jars()
    classfile = CLASSES / "bootseer" / "Launcher.class"
    jars = CLASSPATH_FILE.read_text().strip()
    if not classfile.exists() or classfile.stat().st_mtime < SOURCE.stat().st_mtime:
        javac = _tool("javac", "openjdk-17-jdk-headless")
        CLASSES.mkdir(parents=True, exist_ok=True)
        result = subprocess.run([javac, "-d", str(CLASSES), "-cp", jars, str(SOURCE)],
                                capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise MiniClusterError(f"javac failed on {SOURCE}:\n{result.stderr[-2000:]}")
    for item in RESOURCES.iterdir():
        shutil.copy2(item, CLASSES / item.name)
    return f"{CLASSES}:{jars}"


def _loopback_hosts(path: Path) -> Path:
    """A hosts file for the cluster's JVM alone: this machine's name and localhost on
    loopback. Hadoop resolves the local host name at start (HTTP server principals) and
    fails where the name is in no resolver (a container, a chroot); the cluster only ever
    talks to 127.0.0.1, so it needs no other name."""
    path.write_text(f"127.0.0.1 localhost {socket.gethostname()}\n::1 localhost\n")
    return path


@dataclass(frozen=True, slots=True)
class DataNode:
    host: str  # a loopback address of its own (see Launcher.java)
    xfer_port: int  # data transfer: how the NameNode names it in block locations
    http_port: int  # WebHDFS reads


class MiniHdfs:
    """A running mini cluster (see the module docstring)."""

    def __init__(self, proc: asyncio.subprocess.Process, ready: dict[str, Any],
                 log_path: Path, launcher: list[str], host: str = "127.0.0.1") -> None:
        self.proc = proc
        self._launcher = launcher  # java, its flags and class path, the launcher class
        self.host = host  # where WebHDFS answers
        self.log_path = log_path
        self.rpc_port = int(ready["namenode_rpc"])
        self.http_port = int(ready["namenode_http"])
        self.datanodes = [DataNode(d["host"], int(d["xfer"]), int(d["http"]))
                          for d in ready["datanodes"]]
        self._own_jvms: dict[int, asyncio.subprocess.Process] = {}  # xfer port -> its JVM

    @property
    def http_url(self) -> str:
        """The NameNode's WebHDFS endpoint."""
        return f"http://{self.host}:{self.http_port}"

    def uri(self, path: str) -> str:
        """An hdfs:// URI of `path` on this cluster (the NameNode's HTTP port: the one the
        WebHDFS client talks to)."""
        return f"hdfs://{self.host}:{self.http_port}/{path.lstrip('/')}"

    @classmethod
    async def start(cls, workdir: Path, datanodes: int = 3, read_cap_bps: int = 0,
                    block_size: int = 0, host: str | None = None,
                    own_jvms: bool = False) -> MiniHdfs:
        """Start a cluster with its data under `workdir`; MiniClusterError if it cannot.
        With `host`, WebHDFS (the NameNode's and every DataNode's) answers on that address
        instead of loopback: for clients in a testbed's namespaces. With `own_jvms`, each
        DataNode runs in a JVM of its own (`kill_datanode` then kills it with SIGKILL)."""
        cluster = await cls._start(workdir, 0 if own_jvms else datanodes, read_cap_bps,
                                   block_size, host)
        if own_jvms:
            try:
                for index in range(datanodes):
                    await cluster._start_datanode(workdir, index, read_cap_bps)
            except BaseException:
                await cluster.stop()
                raise
        return cluster

    @classmethod
    async def _start(cls, workdir: Path, datanodes: int, read_cap_bps: int, block_size: int,
                     host: str | None) -> MiniHdfs:
        java = _tool("java", "openjdk-17-jdk-headless")
        classpath = await asyncio.to_thread(prepare)
        workdir.mkdir(parents=True, exist_ok=True)
        log_path = workdir / "minicluster.log"
        hosts = _loopback_hosts(workdir / "hosts")
        tmp = workdir / "tmp"  # Jetty's work directories: not left behind in /tmp
        tmp.mkdir(exist_ok=True)
        launcher = [java, *JVM_FLAGS, f"-Djdk.net.hosts.file={hosts}",
                    f"-Djava.io.tmpdir={tmp}", "-cp", classpath, "bootseer.Launcher"]
        with open(log_path, "ab") as err:
            proc = await asyncio.create_subprocess_exec(
                *launcher, str(workdir / "dfs"),
                str(datanodes), str(read_cap_bps), str(block_size),
                *([",".join([host] * (datanodes + 1))] if host else []),
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=err,
                start_new_session=True)
        try:
            ready = await asyncio.wait_for(cls._next_event(proc), READY_TIMEOUT_S)
        except (TimeoutError, MiniClusterError) as exc:
            await _end(proc)
            tail = log_path.read_text(errors="replace")[-3000:]
            raise MiniClusterError(f"the HDFS mini cluster did not start ({exc or 'timeout'}); "
                                   f"its log ({log_path}):\n{tail}") from None
        return cls(proc, ready, log_path, launcher, host or "127.0.0.1")

    @staticmethod
    async def _next_event(proc: asyncio.subprocess.Process) -> dict[str, Any]:
        assert proc.stdout is not None
        while line := await proc.stdout.readline():
            if line.startswith(b"{"):
                event: dict[str, Any] = json.loads(line)
                return event
        raise MiniClusterError("the launcher exited")

    async def _start_datanode(self, workdir: Path, index: int, read_cap_bps: int) -> None:
        """DataNode `index` in a JVM of its own, joined to this cluster's NameNode."""
        log_path = workdir / f"datanode-{index}.log"
        with open(log_path, "ab") as err:
            proc = await asyncio.create_subprocess_exec(
                *self._launcher, "--datanode", str(workdir / "dfs"), str(self.rpc_port),
                str(index), str(read_cap_bps),
                stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=err,
                start_new_session=True)
        try:
            ready = await asyncio.wait_for(self._next_event(proc), READY_TIMEOUT_S)
        except (TimeoutError, MiniClusterError) as exc:
            proc.kill()
            await proc.wait()
            tail = log_path.read_text(errors="replace")[-3000:]
            raise MiniClusterError(f"DataNode {index} did not start ({exc or 'timeout'}); its "
                                   f"log ({log_path}):\n{tail}") from None
        node = DataNode(ready["host"], int(ready["xfer"]), int(ready["http"]))
        self.datanodes.append(node)
        self._own_jvms[node.xfer_port] = proc

    async def kill_datanode(self, xfer_port: int) -> None:
        """SIGKILL the JVM of the DataNode with this data-transfer port (`own_jvms` only):
        no goodbye to the NameNode, connections cut mid-stream, as a crashed host."""
        proc = self._own_jvms.pop(xfer_port, None)
        if proc is None:
            raise MiniClusterError(f"no DataNode of its own JVM has transfer port {xfer_port}")
        proc.kill()
        await proc.wait()

    async def stop_datanode(self, xfer_port: int) -> None:
        """Stop the DataNode with this data-transfer port; the others keep serving."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"stop-datanode {xfer_port}\n".encode())
        await self.proc.stdin.drain()
        reply = await asyncio.wait_for(self._next_event(self.proc), 60.0)
        if not reply.get("found"):
            raise MiniClusterError(f"no DataNode with transfer port {xfer_port}")

    async def stop(self) -> None:
        for proc in self._own_jvms.values():
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
        self._own_jvms.clear()
        await _end(self.proc)

    async def __aenter__(self) -> MiniHdfs:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


async def write_spread(client: Any, path: str, data: bytes, replication: int,
                       block_size: int) -> None:
    """Write `data` as `path` with its blocks spread over the DataNodes.

    A WebHDFS CREATE is written by the DFSClient inside the DataNode the NameNode
    redirects it to, and HDFS puts the first replica of every block on the writer's
    own DataNode: one node would hold the whole file. Writing each block as a file of its own (each
    CREATE lands on some DataNode) and concatenating them (CONCAT moves blocks, it
    copies nothing) places blocks as writers on other hosts would see them placed."""
    parts = []
    for i, at in enumerate(range(0, len(data), block_size)):
        part = f"{path}.part{i}"
        await client.create(part, data[at:at + block_size], replication, block_size)
        parts.append(part)
    if len(parts) > 1:
        await client.concat(parts[0], parts[1:])
    await client.rename(parts[0], path)


async def _end(proc: asyncio.subprocess.Process, timeout_s: float = 30.0) -> None:
    """Close stdin (the launcher's cue to shut down), then SIGTERM, then SIGKILL."""
    if proc.stdin is not None:
        proc.stdin.close()
    try:
        await asyncio.wait_for(proc.wait(), timeout_s / 2)
        return
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
    try:
        await asyncio.wait_for(proc.wait(), timeout_s / 2)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
