"""Bounded waits for the tests that drive real processes (not a test module)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

WAIT_S = 60.0
POLL_S = 0.05


async def until(check: Callable[[], Awaitable[bool]], what: str,
                timeout_s: float = WAIT_S) -> None:
    """Poll `check` until it holds; AssertionError naming `what` if it does not in time."""
    try:
        async with asyncio.timeout(timeout_s):
            while not await check():
                await asyncio.sleep(POLL_S)
    except TimeoutError:
        raise AssertionError(f"not within {timeout_s}s: {what}") from None
