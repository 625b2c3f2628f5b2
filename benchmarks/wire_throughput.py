"""Single-stream throughput of the peer wire path, uvloop against the stdlib loop.

A sender process streams `--bytes` of Piece frames over loopback with
PeerConnection.send_piece (os.sendfile from a page-cached source file); this
process receives them with recv + recv_payload_into into one reused buffer and
os.pwrite()s each payload into an output file, as the agent does. Both loops
run side by side in one invocation, alternating, `--rounds` times each (after
`--warmup` uncounted rounds: the first writes of a run are the noisiest); the
median of each is printed as one JSON line (GB/s = 1e9 bytes per second),
with their ratio, which is the figure to compare across machines. The CPU
seconds per GiB of the receiver and the sender (user + system, medians) are
printed too: unlike wall-clock rates, they barely move when other work
shares the machine.

    python benchmarks/wire_throughput.py [--bytes N] [--piece N] [--rounds N] [--warmup N]
                                         [--dir DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import uvloop

from p2p.content import PeerId
from p2p.peer import PeerInfo, Timeouts, accept, connect, listen_socket
from p2p.units import GiB, MiB
from p2p.wire import Piece

LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "stdlib": asyncio.new_event_loop,
    "uvloop": uvloop.new_event_loop,
}
SOURCE_BYTES = 64 * MiB
TIMEOUTS = Timeouts(handshake_s=30.0)


async def send(port: int, source: Path, total: int, piece: int, secret: bytes) -> None:
    me = PeerInfo(PeerId("bench-sender"), "", "")
    conn = await connect(f"127.0.0.1:{port}", me, secret, TIMEOUTS)
    fd = os.open(source, os.O_RDONLY)
    began = time.process_time()
    try:
        for index, offset in enumerate(range(0, total, piece)):
            length = min(piece, total - offset)
            await conn.send_piece("bench", index, index, fd, offset % SOURCE_BYTES, length)
    finally:
        os.close(fd)
    print(time.process_time() - began, flush=True)  # CPU seconds, for the receiver to report
    await conn.bye("done")


async def receive(loop_name: str, args: argparse.Namespace, source: Path, out: Path,
                  secret: bytes) -> tuple[float, float, float]:
    """(wall, receiver CPU, sender CPU) seconds from the first piece to the last write."""
    loop = asyncio.get_running_loop()
    me = PeerInfo(PeerId("bench-receiver"), "", "")
    with listen_socket("127.0.0.1", 0) as listener:
        sender = subprocess.Popen(
            [sys.executable, __file__, "--send", str(listener.getsockname()[1]),
             "--loop", loop_name, "--bytes", str(args.bytes), "--piece", str(args.piece),
             "--source", str(source)],
            env={**os.environ, "BENCH_SECRET": secret.hex()}, stdout=subprocess.PIPE)
        sock, _ = await loop.sock_accept(listener)
    conn = await accept(sock, me, secret, TIMEOUTS)
    buf = memoryview(bytearray(args.piece))
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    received, began, cpu = 0, 0.0, 0.0
    try:
        while received < args.bytes:
            msg = await conn.recv()
            assert isinstance(msg, Piece), msg
            if not began:
                began, cpu = time.perf_counter(), time.process_time()
            view = buf[:msg.len]
            await conn.recv_payload_into(view)
            os.pwrite(fd, view, received)
            received += msg.len
        elapsed, cpu = time.perf_counter() - began, time.process_time() - cpu
    finally:
        os.close(fd)
        conn.close()
        sender_out, _ = sender.communicate(timeout=60)
        if sender.returncode:
            raise SystemExit(f"sender failed with status {sender.returncode}")
    return elapsed, cpu, float(sender_out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bytes", type=int, default=1 * GiB)
    parser.add_argument("--piece", type=int, default=4 * MiB)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1, help="uncounted rounds first")
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()))
    parser.add_argument("--send", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--loop", choices=sorted(LOOPS), help=argparse.SUPPRESS)
    parser.add_argument("--source", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.send:
        with asyncio.Runner(loop_factory=LOOPS[args.loop]) as runner:
            runner.run(send(args.send, args.source, args.bytes, args.piece,
                            bytes.fromhex(os.environ["BENCH_SECRET"])))
        return
    secret = secrets.token_bytes(32)
    rates: dict[str, list[float]] = {name: [] for name in LOOPS}
    cpu: dict[str, list[tuple[float, float]]] = {name: [] for name in LOOPS}
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        source, out = Path(tmp) / "source", Path(tmp) / "out"
        with open(source, "wb") as f:
            f.write(os.urandom(SOURCE_BYTES))
            os.fsync(f.fileno())  # no writeback of it competing with the first round
        for round_ in range(args.warmup + args.rounds):
            for name, factory in LOOPS.items():
                with asyncio.Runner(loop_factory=factory) as runner:
                    seconds, recv_cpu, send_cpu = runner.run(
                        receive(name, args, source, out, secret))
                out.unlink()
                if round_ >= args.warmup:
                    rates[name].append(args.bytes / seconds / 1e9)
                    cpu[name].append((recv_cpu, send_cpu))
    uv, std = statistics.median(rates["uvloop"]), statistics.median(rates["stdlib"])
    per_gib = args.bytes / GiB
    report = {
        "uvloop_gbps": round(uv, 3), "stdlib_gbps": round(std, 3),
        "uvloop_over_stdlib": round(uv / std, 3), "unit": "GB/s (1e9 bytes/s), median",
        "bytes": args.bytes, "piece_bytes": args.piece, "rounds": args.rounds,
        "load_average": round(os.getloadavg()[0], 2),
    }
    for name in LOOPS:
        report[f"{name}_rounds_gbps"] = [round(r, 3) for r in rates[name]]
        for side, i in (("recv", 0), ("send", 1)):
            used = statistics.median(c[i] for c in cpu[name]) / per_gib
            report[f"{name}_{side}_cpu_s_per_gib"] = round(used, 3)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
