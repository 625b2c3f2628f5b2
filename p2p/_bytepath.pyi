# Typed stubs of the C byte path (p2p/_bytepath.c); see p2p.bytepath for the contract.
from typing_extensions import Buffer

FILLED: int
DRAINED: int
CLOSED: int

class Xxh3:
    """An XXH3-128 hasher fed in parts, usable by `pull` without the GIL."""

    def __init__(self) -> None: ...
    def update(self, data: Buffer, /) -> None: ...
    def digest(self) -> bytes: ...

def pull(sock_fd: int, buffer: Buffer, taken: int, filled: int, stop: int, hasher: Xxh3,
         out_fd: int, out_offset: int, linger_ms: int, wake: int, lowat: int,
         /) -> tuple[int, int, int, int]: ...
