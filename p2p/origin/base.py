"""The origin adapter interface."""

from __future__ import annotations

from typing import Protocol


class OriginError(Exception):
    """The origin could not deliver a range; the message says why and where."""


class Origin(Protocol):
    async def read_into(self, url: str, offset: int, view: memoryview) -> None:
        """Fill `view` with the bytes of `url` starting at `offset`, or raise OriginError."""
        ...

    async def close(self) -> None: ...
