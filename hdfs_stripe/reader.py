"""Striped reads from HDFS: the I/O shell around `stripe.StripePlan`.

`StripeReader` owns one NameNode's WebHDFS client and knows, per file version,
its stripe plan (from GETFILEBLOCKLOCATIONS) and the DataNodes' HTTP addresses
(from the NameNode's JMX). `read(uri, version, offset, view)` reads a range
piece by piece, each piece from the replica the plan picks given what this
reader has in flight per DataNode, so concurrent callers spread over every
DataNode that holds the file.

Faults. A DataNode whose stream breaks, or that cannot be reached, is marked
down for `DOWN_FOR_S` and the read resumes at the offset it reached, on the
next replica of that block (the NameNode would keep redirecting to a dead
DataNode until it declares it dead). When every replica has failed the read
raises `HdfsError` naming the path and the nodes tried.

Before a file's first read and then before every read, the file's status is
compared with the version asked for (`naming.check_same`): a file replaced or
appended meanwhile raises `FileChanged` instead of returning its new bytes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from hdfs_stripe.naming import HdfsUri, Version, check_same
from hdfs_stripe.stripe import STRIPE_SIZE, Block, Piece, StripePlan
from hdfs_stripe.webhdfs import FileStatus, HdfsError, HdfsUnavailable, PartialRead, WebHdfs

log = logging.getLogger(__name__)

DOWN_FOR_S = 30.0  # a DataNode that failed a read is avoided this long


@dataclass(frozen=True, slots=True)
class Layout:
    version: Version
    plan: StripePlan


def version_of(status: FileStatus) -> Version:
    return Version(status.length, status.modification_time_ms, status.file_id)


class StripeReader:
    """Striped, replica-aware reads of one NameNode's files (see the module docstring)."""

    def __init__(self, hdfs: WebHdfs, stripe_size: int = STRIPE_SIZE) -> None:
        self.hdfs = hdfs
        self.stripe_size = stripe_size
        self.bytes_read = 0
        self._layouts: dict[tuple[str, Version], Layout] = {}
        self._layout_lock = asyncio.Lock()
        self._http: dict[str, str] = {}
        self._inflight: dict[str, int] = {}
        self._down: dict[str, float] = {}  # node -> monotonic time it may be tried again

    async def close(self) -> None:
        await self.hdfs.close()

    async def current(self, uri: HdfsUri) -> Version:
        status = await self.hdfs.status(uri.path)
        if status.type != "FILE":
            raise HdfsError(f"{uri} is a directory, not a file")
        return version_of(status)

    async def layout(self, uri: HdfsUri, version: Version) -> Layout:
        """The stripe plan of this version of the file (cached)."""
        key = (uri.path, version)
        async with self._layout_lock:
            if key not in self._layouts:
                check_same(uri, version, await self.current(uri))
                located = await self.hdfs.block_locations(uri.path, 0, version.length)
                blocks = [Block(b.offset, b.length, b.names) for b in located]
                plan = StripePlan(version.length, self.stripe_size, blocks)
                self._layouts[key] = Layout(version, plan)
        return self._layouts[key]

    async def read(self, uri: HdfsUri, version: Version, offset: int, view: memoryview,
                   check: bool = True, prefer: str | None = None) -> None:
        """Fill `view` with bytes [offset, offset + len(view)) of this version of the file,
        from DataNode `prefer` where it holds the bytes and is up."""
        layout = await self.layout(uri, version)
        if check:
            check_same(uri, version, await self.current(uri))
        for piece in layout.plan.pieces(offset, len(view)):
            lo = piece.offset - offset
            await self._read_piece(uri, layout.plan, piece, view[lo:lo + piece.length], prefer)

    async def _read_piece(self, uri: HdfsUri, plan: StripePlan, piece: Piece,
                          view: memoryview, prefer: str | None) -> None:
        failed: set[str] = set()
        at = piece.offset
        down = self.down_nodes()
        if prefer in piece.nodes and prefer not in down:
            node = prefer
        else:
            node = plan.choose(piece, self._inflight, down)
        while True:
            asked = len(view)
            self._inflight[node] = self._inflight.get(node, 0) + asked
            try:
                await self.hdfs.read_from(await self._http_of(node), uri.path, at, view)
                self.bytes_read += len(view)
                return
            except (PartialRead, HdfsUnavailable) as exc:
                done = exc.done if isinstance(exc, PartialRead) else 0
                self.bytes_read += done
                at, view = at + done, view[done:]
                failed.add(node)
                self._down[node] = time.monotonic() + DOWN_FOR_S
                log.warning("%s; trying another replica", exc)
            finally:
                self._inflight[node] -= asked
            nxt = plan.fallback(piece, frozenset(failed))
            if nxt is None:
                raise HdfsError(f"every replica of {uri} bytes {piece.offset}+{piece.length} "
                                f"failed ({', '.join(sorted(failed))})")
            node = nxt

    def in_flight(self) -> dict[str, int]:
        """Bytes being read per DataNode now."""
        return {node: n for node, n in self._inflight.items() if n}

    def down_nodes(self) -> frozenset[str]:
        """DataNodes that failed a read within DOWN_FOR_S."""
        now = time.monotonic()
        return frozenset(n for n, until in self._down.items() if until > now)

    async def _http_of(self, node: str) -> str:
        if node not in self._http:
            self._http = await self.hdfs.datanode_http()
        try:
            return self._http[node]
        except KeyError:
            raise HdfsUnavailable(f"DataNode {node} is not live according to the NameNode "
                                  f"at {self.hdfs.endpoint}") from None
