"""The stripe plan: a file's byte ranges as stripes, and stripes as reads from DataNodes.

Theory of operation
-------------------
A checkpoint file in HDFS is stored as blocks (128 MiB by default), each on
`replication` DataNodes. A reader that follows the file from the start reads
one block at a time from one DataNode: its speed is one disk's. Bootseer cuts
the file into *stripes* of `stripe_size` bytes (the swarm content's chunks, so
a stripe is also the unit peers exchange and verify) and reads many stripes at
once, each from a DataNode that holds it, so every DataNode holding the file
serves in parallel.

`StripePlan(size, stripe_size, blocks)` takes the file's size and its block
locations (offset, length, replica names, as GETFILEBLOCKLOCATIONS gives
them) and answers:

- `stripes[i]`: the stripe's byte range and its *pieces*: a stripe that
  crosses a block boundary has one piece per block, since different blocks
  live on different DataNodes;
- `for_range(offset, length)`: the stripes holding a byte range;
- `assign(indices, load)`: for each piece of those stripes, the replica to
  read it from: the least-loaded one, counting bytes already assigned (the
  caller passes what is in flight), ties broken by a rotation of the replica
  list by stripe index, so equal loads still spread evenly and the answer is
  the same on every run; then reads move off the most loaded node while that
  lowers the maximum (greedy in file order alone leaves one node with more);
- `fallback(piece, failed)`: the next replica to try once some have failed.

`Schedule` turns one `assign` of a whole file into a queue per DataNode, for
a reader that reads many stripes (the first reader, indexing). Reading in file
order with a window of stripes in flight keeps only the replicas of the block
under the window busy (64 MiB blocks, 8 MiB stripes, 8 in flight: two
DataNodes of three); a queue per DataNode, each with its own readers, keeps
every DataNode holding the file busy from start to end. A DataNode whose
queue runs dry takes the last stripe it holds every piece of from the longest
queue that has one, so a slow DataNode's tail moves to an idle one.

`ReadAhead` decides how far to read ahead of a sequential reader: the window
doubles while reads follow each other (up to `max_stripes`) and collapses to
nothing on a seek, so a random reader does not pay for bytes it will not use.

This module does no I/O, reads no clock and uses no randomness: the shells
(the indexer, the origin adapter, the file object) carry out what it decides.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from p2p.content import chunks_for_range
from p2p.errors import UserError
from p2p.units import MiB

# 8 MiB: big enough that a WebHDFS request's fixed cost (a redirect-free OPEN to the
# DataNode, a few ms) is under 5 % of a capped DataNode's transfer time, small enough
# that 3 DataNodes x several readers have many stripes in flight for a 1 GiB file.
STRIPE_SIZE = 8 * MiB


class PlanError(UserError, ValueError):
    """Block locations that do not describe the file (gaps, overlaps, wrong total)."""


@dataclass(frozen=True, slots=True)
class Block:
    offset: int
    length: int
    nodes: tuple[str, ...]  # replicas, "ip:xfer_port"


@dataclass(frozen=True, slots=True)
class Piece:
    """Bytes of one stripe that lie in one block."""

    offset: int
    length: int
    nodes: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Stripe:
    index: int
    offset: int
    length: int
    pieces: tuple[Piece, ...]


@dataclass(frozen=True, slots=True)
class Read:
    """Read `piece` of stripe `stripe` from DataNode `node`."""

    stripe: int
    piece: Piece
    node: str


class StripePlan:
    """A file's stripes and where to read them (see the module docstring)."""

    def __init__(self, size: int, stripe_size: int, blocks: Sequence[Block]) -> None:
        if stripe_size <= 0 or size < 0:
            raise PlanError(f"stripe size {stripe_size} and file size {size} must be positive")
        _check_blocks(size, blocks)
        self.size = size
        self.stripe_size = stripe_size
        self.blocks = tuple(blocks)
        self.stripes = tuple(self._stripe(i) for i in range(-(-size // stripe_size)))

    def _stripe(self, index: int) -> Stripe:
        start = index * self.stripe_size
        end = min(start + self.stripe_size, self.size)
        pieces = []
        for block in self.blocks:
            lo, hi = max(start, block.offset), min(end, block.offset + block.length)
            if lo < hi:
                pieces.append(Piece(lo, hi - lo, block.nodes))
        return Stripe(index, start, end - start, tuple(pieces))

    def for_range(self, offset: int, length: int) -> range:
        """The stripes that hold bytes [offset, offset + length) (stripes are chunks)."""
        return chunks_for_range(self.size, self.stripe_size, offset, length)

    def pieces(self, offset: int, length: int) -> list[Piece]:
        """The pieces covering exactly [offset, offset + length), in order."""
        out = []
        for index in self.for_range(offset, length):
            for piece in self.stripes[index].pieces:
                lo = max(piece.offset, offset)
                hi = min(piece.offset + piece.length, offset + length)
                if lo < hi:
                    out.append(Piece(lo, hi - lo, piece.nodes))
        return out

    def assign(self, indices: Sequence[int], load: Mapping[str, int] | None = None,
               avoid: frozenset[str] = frozenset()) -> list[Read]:
        """A replica for every piece of the stripes `indices`, least-loaded first.

        `load` is bytes already in flight per node; `avoid` are nodes known to be down
        (used only if a piece has no other replica)."""
        bytes_on = dict(load or {})
        reads = []
        for index in indices:
            for piece in self.stripes[index].pieces:
                node = self.choose(piece, bytes_on, avoid, index)
                bytes_on[node] = bytes_on.get(node, 0) + piece.length
                reads.append(Read(index, piece, node))
        return _rebalance(reads, bytes_on, avoid)

    @staticmethod
    def choose(piece: Piece, bytes_on: Mapping[str, int], avoid: frozenset[str] = frozenset(),
               index: int = 0) -> str:
        """The least-loaded replica of `piece` not in `avoid` (any, if all are), ties
        broken by the replica order rotated by `index`."""
        if not piece.nodes:
            raise PlanError(f"bytes {piece.offset}+{piece.length} have no replica")
        n = len(piece.nodes)
        rotated = [piece.nodes[(index + k) % n] for k in range(n)]
        usable = [node for node in rotated if node not in avoid] or rotated
        return min(usable, key=lambda node: bytes_on.get(node, 0))

    @staticmethod
    def fallback(piece: Piece, failed: frozenset[str]) -> str | None:
        """A replica of `piece` not in `failed`, or None once all have failed."""
        return next((node for node in piece.nodes if node not in failed), None)


def _rebalance(reads: list[Read], bytes_on: dict[str, int],
               avoid: frozenset[str]) -> list[Read]:
    """Greedy assignment in file order can leave one node with the most: move reads
    off the most loaded node while that lowers the maximum (each move strictly does,
    so this ends)."""
    while True:
        top = max(bytes_on, key=lambda node: (bytes_on[node], node))
        move = None
        for i, read in enumerate(reads):
            if read.node != top:
                continue
            for other in read.piece.nodes:
                if other not in avoid and bytes_on.get(other, 0) + read.piece.length < \
                        bytes_on[top]:
                    move = (i, other)
                    break
            if move:
                break
        if move is None:
            return reads
        i, other = move
        read = reads[i]
        bytes_on[top] -= read.piece.length
        bytes_on[other] = bytes_on.get(other, 0) + read.piece.length
        reads[i] = Read(read.stripe, read.piece, other)


def _check_blocks(size: int, blocks: Sequence[Block]) -> None:
    at = 0
    for block in blocks:
        if block.offset != at or block.length <= 0:
            raise PlanError(f"block at {block.offset} (+{block.length}) does not follow the "
                            f"previous one, which ends at {at}")
        at += block.length
    if at != size:
        raise PlanError(f"blocks cover {at} bytes of a {size}-byte file")


class Schedule:
    """Which stripe each DataNode's readers take next (see the module docstring)."""

    def __init__(self, plan: StripePlan, indices: Sequence[int],
                 avoid: frozenset[str] = frozenset()) -> None:
        self.plan = plan
        owner: dict[int, tuple[int, str]] = {}  # stripe -> (its largest piece, node)
        for read in plan.assign(indices, avoid=avoid):
            if read.piece.length > owner.get(read.stripe, (0, ""))[0]:
                owner[read.stripe] = (read.piece.length, read.node)
        self._queues: dict[str, deque[int]] = {}
        for index in indices:
            self._queues.setdefault(owner[index][1], deque()).append(index)

    def nodes(self) -> list[str]:
        """The DataNodes that have stripes to read, in name order."""
        return sorted(self._queues)

    def next_for(self, node: str) -> int | None:
        """The stripe `node`'s next reader takes (its own, else one it can steal), or None."""
        own = self._queues.get(node)
        if own:
            return own.popleft()
        for queue in sorted(self._queues.values(), key=len, reverse=True):
            for k in range(len(queue) - 1, -1, -1):
                if self._holds(node, queue[k]):
                    index = queue[k]
                    del queue[k]
                    return index
        return None

    def _holds(self, node: str, index: int) -> bool:
        return all(node in piece.nodes for piece in self.plan.stripes[index].pieces)


class ReadAhead:
    """How many stripes to read ahead of a sequential reader (see the module docstring)."""

    def __init__(self, plan_stripes: int, first: int = 2, max_stripes: int = 16) -> None:
        self.stripes = plan_stripes
        self.first = first
        self.max_stripes = max_stripes
        self._next_offset: int | None = None
        self._window = 0
        self._queued_to = 0  # stripes below this were already asked for

    def on_read(self, offset: int, length: int, stripe_size: int) -> list[int]:
        """A read of [offset, offset + length) happened; the stripes to prefetch now."""
        sequential = offset == self._next_offset
        self._next_offset = offset + length
        if not sequential:
            self._window = 0
            self._queued_to = 0
            return []
        self._window = min(max(self._window * 2, self.first), self.max_stripes)
        current = (offset + length) // stripe_size
        start = max(current + 1, self._queued_to)
        end = min(current + 1 + self._window, self.stripes)
        self._queued_to = max(self._queued_to, end)
        return list(range(start, end))
