"""The agent's upload gate: slots handed out in the core's order, and never lost."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

from p2p.config import AgentConfig, load_agent_config
from p2p.configfile import ConfigError
from p2p.link import UploadGate


async def test_a_freed_slot_goes_to_the_peer_furthest_behind() -> None:
    gate, order = UploadGate(1, "neediest_first"), []
    release = asyncio.Event()

    async def send(name: str, rank: int) -> None:
        async with gate.slot(rank):
            order.append(name)
            await release.wait()

    first = asyncio.create_task(send("first", 10))
    await asyncio.sleep(0)
    others = [asyncio.create_task(send(n, r)) for n, r in (("ahead", 90), ("behind", 1))]
    await asyncio.sleep(0)
    release.set()
    await asyncio.gather(first, *others)
    assert order == ["first", "behind", "ahead"]


def one_slot() -> tuple[asyncio.Event, Callable[[], Coroutine[Any, Any, None]]]:
    """A one-slot FIFO gate, and a sender that holds the slot until the event is set."""
    gate, hold = UploadGate(1, "fifo"), asyncio.Event()

    async def send() -> None:
        async with gate.slot(0):
            await hold.wait()

    return hold, send


async def test_a_waiter_cancelled_before_or_after_its_grant_loses_no_slot() -> None:
    hold, send = one_slot()
    owner = asyncio.create_task(send())
    await asyncio.sleep(0)
    waiting, granted_late = asyncio.create_task(send()), asyncio.create_task(send())
    await asyncio.sleep(0)
    waiting.cancel()  # still waiting: it withdraws
    hold.set()
    await asyncio.sleep(0)
    await owner  # its slot goes to granted_late, cancelled before it could run
    granted_late.cancel()
    await asyncio.gather(waiting, granted_late, return_exceptions=True)
    async with asyncio.timeout(5):  # the slot came back: a new sender gets it
        await send()


def test_an_unknown_upload_order_is_a_config_error_naming_the_key(tmp_path: Path) -> None:
    bad = tmp_path / "agent.toml"
    bad.write_text('upload_order = "lifo"\n')
    with pytest.raises(ConfigError, match="upload_order 'lifo'"):
        load_agent_config(str(bad), {})
    assert AgentConfig().upload_order == "earliest_due"


def test_the_line_rate_of_the_due_defaults_to_the_download_cap_and_must_be_positive(
        tmp_path: Path) -> None:
    assert AgentConfig().line_Bps == 25e9 / 8
    assert AgentConfig(download_mbps=50).line_Bps == 50e6
    assert AgentConfig(download_mbps=50, line_mbps=1250).line_Bps == 1250e6
    bad = tmp_path / "agent.toml"
    bad.write_text("line_mbps = 0\n")
    with pytest.raises(ConfigError, match="line_mbps must be positive"):
        load_agent_config(str(bad), {})


async def test_a_slot_freed_while_the_next_waiter_is_being_cancelled_goes_on() -> None:
    hold, send = one_slot()
    owner = asyncio.create_task(send())
    await asyncio.sleep(0)
    doomed, next_one = asyncio.create_task(send()), asyncio.create_task(send())
    await asyncio.sleep(0)
    hold.set()  # the owner will free its slot...
    doomed.cancel()  # ...after this waiter was cancelled, before it could withdraw
    async with asyncio.timeout(5):
        await owner
        await next_one  # the slot skipped the cancelled waiter
    assert doomed.cancelled()
