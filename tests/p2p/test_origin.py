"""Origin adapters against a real HTTP server and real files; failures become OriginError."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from aiohttp import web

from p2p.origin import OriginError, OriginPool, Progress
from p2p.origin.server import OriginServer
from p2p.peer import listen_socket


@pytest.fixture
async def http_origin(tmp_path: Path):  # type: ignore[no-untyped-def]
    data = os.urandom(3 * 1024 * 1024 + 123)
    (tmp_path / "blob").write_bytes(data)
    server = OriginServer(tmp_path, rate_bytes_per_s=None)
    runner = web.AppRunner(server.app())
    await runner.setup()
    sock = listen_socket("127.0.0.1", 0)
    await web.SockSite(runner, sock).start()
    yield f"http://127.0.0.1:{sock.getsockname()[1]}", data, server
    await runner.cleanup()


async def test_http_range_reads_exact_bytes_and_are_counted(http_origin) -> None:  # type: ignore[no-untyped-def]
    url, data, server = http_origin
    pool = OriginPool(concurrency=2)
    try:
        buf = bytearray(1_000_000)
        await pool.for_url(f"{url}/blob").read_into(f"{url}/blob", 2_000_000, memoryview(buf))
        assert bytes(buf) == data[2_000_000:3_000_000]
        assert server.bytes_sent == 1_000_000
    finally:
        await pool.close()


async def test_http_reads_tell_their_progress_in_order(http_origin) -> None:  # type: ignore[no-untyped-def]
    url, data, _ = http_origin
    pool = OriginPool(concurrency=2)
    seen: list[tuple[int, bytes]] = []
    buf = bytearray(3 * 1024 * 1024)
    view = memoryview(buf)
    try:
        await pool.for_url(url).read_into(f"{url}/blob", 100, view,
                                          lambda n: seen.append((n, bytes(view[:n]))))
    finally:
        await pool.close()
    # Each report covers bytes already in place (what a relay may send at that moment).
    assert [n for n, _ in seen] == sorted({n for n, _ in seen}) and seen[-1][0] == len(buf)
    assert len(seen) > 1
    for n, prefix in seen:
        assert prefix == data[100:100 + n]


async def test_http_missing_file_and_short_file_are_origin_errors(http_origin) -> None:  # type: ignore[no-untyped-def]
    url, data, _ = http_origin
    pool = OriginPool(concurrency=2)
    try:
        with pytest.raises(OriginError, match="404"):
            await pool.for_url(url).read_into(f"{url}/nope", 0, memoryview(bytearray(10)))
        past_end = memoryview(bytearray(1000))
        with pytest.raises(OriginError):
            await pool.for_url(url).read_into(f"{url}/blob", len(data) - 10, past_end)
    finally:
        await pool.close()


async def test_unreachable_http_origin_is_an_origin_error() -> None:
    sock = listen_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now
    pool = OriginPool(concurrency=1)
    try:
        with pytest.raises(OriginError, match="unreachable"):
            await pool.for_url(f"http://127.0.0.1:{port}").read_into(
                f"http://127.0.0.1:{port}/x", 0, memoryview(bytearray(10)))
    finally:
        await pool.close()


async def test_file_origin_reads_and_reports_missing_files(tmp_path: Path) -> None:
    data = os.urandom(100_000)
    (tmp_path / "f").write_bytes(data)
    pool = OriginPool(concurrency=1)
    buf = bytearray(5000)
    await pool.for_url(f"file://{tmp_path}/f").read_into(f"file://{tmp_path}/f", 777,
                                                        memoryview(buf))
    assert bytes(buf) == data[777:5777]
    with pytest.raises(OriginError, match="cannot open"):
        await pool.for_url("file:///").read_into(f"file://{tmp_path}/missing", 0,
                                                 memoryview(bytearray(1)))
    with pytest.raises(OriginError, match="ends before"):
        await pool.for_url("file:///").read_into(f"file://{tmp_path}/f", 99_999,
                                                 memoryview(bytearray(10)))


def test_unknown_scheme_is_an_origin_error() -> None:
    with pytest.raises(OriginError, match="no origin adapter for 'ftp'"):
        OriginPool(concurrency=1).for_url("ftp://example/x")


async def test_concurrency_limit_holds(http_origin) -> None:  # type: ignore[no-untyped-def]
    url, _, _ = http_origin
    pool = OriginPool(concurrency=2)
    limited = pool.for_url(url)
    active, peak = 0, 0
    real = limited.origin.read_into

    async def counting(u: str, offset: int, view: memoryview, progress: Progress | None) -> None:
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        await asyncio.sleep(0.01)
        await real(u, offset, view, progress)
        active -= 1

    limited.origin.read_into = counting  # type: ignore[method-assign]
    try:
        await asyncio.gather(*(limited.read_into(f"{url}/blob", i * 1000,
                                                 memoryview(bytearray(1000))) for i in range(8)))
        assert peak == 2
    finally:
        await pool.close()
