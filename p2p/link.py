"""One authenticated connection to a peer, shared by every content we swarm on.

A link runs two tasks: a reader that turns frames into calls on its owner
(the agent), and an uploader that serves the peer's requests one at a time
from the chunk store with zero-copy sendfile under the node's upload limit.
The node's `UploadGate` bounds how many pieces go out at once across all
links (a new chunk then reaches its first downloaders at the full upload
rate, and they can relay it sooner than if every requester got a thin
share), and picks which waiting piece goes next: by default the one for the
peer furthest behind its line rate (`p2p.swarm.uploads`, the same core the
simulator runs). Our Requests carry our node's due for that, stamped when
the download budget lets them go out; a peer's due is kept on our clock. A
peer that lies about its due (the wire bounds it to a day) moves its own
requests up our queue, no more: it still has one piece at a time per link.
A request for a chunk we are still fetching from the origin is relayed
(p2p.relay): a task beside the uploader sends its bytes as they arrive, in
several Pieces, each under the same limit and slots.
Requests we send are numbered per link, so a piece is matched to exactly the
request that asked for it. A request we no longer need (an end-game duplicate
another peer answered first) is withdrawn: not sent if it is still waiting for
download budget (and the budget it reserved comes back; so is one that timed out
before it went out), else followed by a Cancel, which the peer honours if the
request is still in its queue; a piece that comes anyway is read and dropped
(counted as wasted).

A request is answered with a Piece or a Reject, never with silence unless
the peer cancelled it first: an index outside the content, a chunk not held,
or any store error while opening it is a Reject with the reason (store errors
are logged too), and the uploader goes on with the next request.

Every failure of the peer (bad frame, slow drip, closed socket) ends the
link; the owner hears about it once, first through `link_ending` (while the
link can still say where the peer is) and then through `link_closed`. A bug
in either task is logged with its traceback and ends the link too: a link
never lives on with a dead task.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import os
from collections.abc import AsyncIterator, Coroutine
from typing import Any, Protocol

from p2p.content import ContentId, PeerId
from p2p.peer import ConnectionClosed, PeerConnection, RateLimiter
from p2p.relay import Filling, RelayFailed, relay
from p2p.store import ChunkStore, DamagedChunk, MissingChunk
from p2p.swarm.links import LinkId
from p2p.swarm.uploads import UploadSlots
from p2p.wire import (
    Bye,
    Cancel,
    Have,
    Join,
    LocalProtocolError,
    Message,
    Pending,
    Piece,
    Reject,
    RemoteProtocolError,
    Request,
    Withdraw,
)

log = logging.getLogger(__name__)
MAX_QUEUED_UPLOADS = 64  # requests a peer may have waiting at our side


def _now_ms() -> int:
    """Our clock for dues (p2p.swarm.uploads), in ms: the loop's, as the node core's."""
    return round(asyncio.get_running_loop().time() * 1000)


class UploadGate:
    """The asyncio shell of `UploadSlots`: `async with gate.slot(rank)` sends one piece."""

    def __init__(self, slots: int, order: str) -> None:
        self._core: UploadSlots[int] = UploadSlots(slots, order)
        self._waiters: dict[int, asyncio.Future[None]] = {}
        self._keys = itertools.count()

    @contextlib.asynccontextmanager
    async def slot(self, rank: int) -> AsyncIterator[None]:
        key = next(self._keys)
        if not self._core.ask(key, rank):
            granted = asyncio.get_running_loop().create_future()
            self._waiters[key] = granted
            try:
                await granted
            except asyncio.CancelledError:
                if granted.done() and not granted.cancelled():
                    self._release()  # granted, then cancelled before it could run
                else:
                    self._waiters.pop(key, None)
                    self._core.withdraw(key)
                raise
        try:
            yield
        finally:
            self._release()

    def _release(self) -> None:
        while (nxt := self._core.done()) is not None:
            granted = self._waiters.pop(nxt)
            if not granted.done():
                granted.set_result(None)
                return
            # Its task was cancelled and has not run to withdraw yet: pass the slot on.


class LinkOwner(Protocol):
    def on_join(self, link: Link, msg: Join) -> None: ...
    def on_have(self, link: Link, msg: Have | Pending | Withdraw) -> None: ...
    async def on_piece(self, link: Link, msg: Piece,
                       asked: tuple[ContentId, int] | None) -> bool:
        """Take one Piece (read or discard its payload); True once the request is
        answered in full (its last Piece)."""
        ...

    def relay_source(self, content: ContentId, chunk: int, peer: PeerId) -> Filling | None:
        """The chunk as it arrives, if we are fetching it now, to relay to `peer`: never
        one that `peer` itself is sending us (each would wait on the other)."""
        ...

    def on_reject(self, link: Link, content: ContentId, chunk: int, req: int,
                  reason: str) -> None: ...
    def on_served(self, nbytes: int) -> None: ...
    def on_relayed(self, result: str) -> None: ...
    def on_cancelled(self) -> None: ...
    def chunk_count(self, content: ContentId) -> int | None: ...
    def upload_rank(self, peer: PeerId, content: ContentId, due_ms: int) -> int:
        """The rank in our upload slots of `peer`'s request for `content` whose due is
        `due_ms` on our clock (p2p.swarm.uploads.request_rank)."""
        ...

    def request_due_ms(self) -> int:
        """Our node's due less now, in ms: what our next Request carries."""
        ...

    def link_ending(self, link: Link, reason: str, hostile: bool) -> None: ...
    def link_closed(self, link: Link, reason: str, hostile: bool) -> None: ...


class Link:
    def __init__(self, conn: PeerConnection, link_id: LinkId, owner: LinkOwner,
                 store: ChunkStore, upload: RateLimiter, upload_slots: UploadGate) -> None:
        self.conn = conn
        self.id = link_id  # how the node core (p2p.swarm.links) names it
        self.peer: PeerId = conn.remote.peer
        self._owner = owner
        self._store = store
        self._upload = upload
        self._upload_slots = upload_slots
        self._next_req = 1
        self._asked: dict[int, tuple[ContentId, int]] = {}
        self._by_chunk: dict[tuple[ContentId, int], int] = {}
        self._sent: set[int] = set()  # our requests on the wire, not answered yet
        # ... and those still waiting for download budget: bytes reserved, and where from
        self._paced: dict[int, tuple[int, RateLimiter]] = {}
        # The peer's requests, each with its due in ms on our clock (p2p.swarm.uploads).
        self._uploads: asyncio.Queue[tuple[Request, int]] = asyncio.Queue()
        self._queued: set[int] = set()  # the peer's requests in _uploads, by its ids
        self._withdrawn: set[int] = set()  # ... of which it cancelled these
        self._tasks: list[asyncio.Task[None]] = []
        self._relays: set[asyncio.Task[None]] = set()  # the peer's requests we relay
        self._closed = False

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._supervised(self._read_loop()),
                                           name=f"read {self.peer}"),
                       asyncio.create_task(self._supervised(self._upload_loop()),
                                           name=f"upload {self.peer}")]

    async def _supervised(self, loop: Coroutine[Any, Any, None]) -> None:
        try:
            await loop
        except Exception as exc:  # a bug here: say so loudly, and end the link
            log.exception("link to %s failed", self.peer)
            self.close(f"internal error: {exc!r}")

    @property
    def closed(self) -> bool:
        return self._closed

    # ---- sending --------------------------------------------------------------

    def send_soon(self, msg: Message) -> None:
        """Queue a header-only message; failures close the link."""
        if not self._closed:
            asyncio.get_running_loop().create_task(self._send(msg))

    async def _send(self, msg: Message) -> None:
        try:
            await self.conn.send(msg)
        except (OSError, ConnectionClosed, RemoteProtocolError) as exc:
            self.close(f"send failed: {exc}")

    def request(self, content: ContentId, chunk: int, nbytes: int,
                download: RateLimiter) -> int:
        """Ask for a chunk once the node's download budget has room for it; the request's id.

        The download cap is enforced here, on requests, not by reading slowly:
        a receiver that throttles its socket stalls the sender's upload slot,
        and with caps on both sides a swarm then runs well below either cap.
        """
        req = self._next_req
        self._next_req += 1
        self._asked[req] = (content, chunk)
        self._by_chunk[(content, chunk)] = req
        if not self._closed:
            self._paced[req] = (nbytes, download)
            asyncio.get_running_loop().create_task(
                self._paced_request(Request(content=content, chunk=chunk, req=req),
                                    download.reserve(nbytes)))
        return req

    async def _paced_request(self, msg: Request, wait: float) -> None:
        if wait > 0:
            await asyncio.sleep(wait)
        if self._paced.pop(msg.req, None) is not None:  # not cancelled while waiting
            self._sent.add(msg.req)
            await self._send(dataclasses.replace(msg, due_ms=self._owner.request_due_ms()))

    def cancel(self, content: ContentId, chunk: int, if_unsent: bool = False) -> int | None:
        """Forget a request: if it still waits for download budget, it never goes out
        and its budget comes back; if it went out, ask the peer to skip it. Its piece,
        if it still comes, is dropped unread. `if_unsent`: only a request not sent yet
        (one that went out stays asked). Returns the forgotten request's id, if any."""
        req = self._by_chunk.get((content, chunk))
        if req is None or (if_unsent and req not in self._paced):
            return None
        del self._by_chunk[(content, chunk)]
        self._asked.pop(req, None)
        self._refund(req)
        if req in self._sent:
            self._sent.discard(req)
            self.send_soon(Cancel(content=content, chunk=chunk, req=req))
        return req

    # ---- loops ----------------------------------------------------------------

    async def _read_loop(self) -> None:
        reason, hostile = "closed", False
        try:
            while True:
                msg = await self.conn.recv()
                await self._dispatch(msg)
        except ConnectionClosed:
            reason = "peer closed the connection"
        except RemoteProtocolError as exc:
            reason, hostile = f"protocol error: {exc}", True
            log.warning("dropping peer %s: %s", self.peer, exc)
        except OSError as exc:
            reason = f"connection error: {exc.strerror or exc}"
        self.close(reason, hostile)

    async def _dispatch(self, msg: Message) -> None:
        match msg:
            case Join():
                self._owner.on_join(self, msg)
            case Have() | Pending() | Withdraw():
                self._owner.on_have(self, msg)
            case Request():
                if self._uploads.qsize() + len(self._relays) >= MAX_QUEUED_UPLOADS:
                    raise RemoteProtocolError(f"more than {MAX_QUEUED_UPLOADS} queued requests")
                self._uploads.put_nowait((msg, _now_ms() + msg.due_ms))
                self._queued.add(msg.req)
            case Cancel():
                if msg.req in self._queued:  # else it is being sent, or was: too late
                    self._withdrawn.add(msg.req)
            case Piece():
                asked = self._asked.get(msg.req)
                if asked is not None and asked != (msg.content, msg.chunk):
                    raise RemoteProtocolError(f"piece for request {msg.req} names "
                                              f"{msg.content}/{msg.chunk}, not {asked}")
                if await self._owner.on_piece(self, msg, asked):
                    self._answered(msg.req)
            case Reject():
                self._answered(msg.req)
                self._owner.on_reject(self, ContentId(msg.content), msg.chunk, msg.req,
                                      msg.reason)
            case Bye():
                raise ConnectionClosed(f"peer said bye: {msg.reason}")
            case _:
                raise RemoteProtocolError(f"unexpected {type(msg).__name__} after handshake")

    def _answered(self, req: int) -> None:
        """Our request `req` is answered (its last Piece, or a Reject): forget it."""
        self._sent.discard(req)
        asked = self._asked.pop(req, None)
        if asked is not None:
            self._by_chunk.pop(asked, None)

    async def _upload_loop(self) -> None:
        while not self._closed:
            req, due_ms = await self._uploads.get()
            if self._withdrawn_now(req, final=False):
                continue
            content = ContentId(req.content)
            rank = self._owner.upload_rank(self.peer, content, due_ms)
            filling = self._owner.relay_source(content, req.chunk, self.peer)
            if filling is not None:  # still arriving from the origin: relay it beside us
                task = asyncio.create_task(
                    self._supervised(self._relay(req, rank, filling.acquire())),
                    name=f"relay {self.peer}")
                self._relays.add(task)
                task.add_done_callback(self._relays.discard)
                continue
            opened = await self._open(content, req.chunk)
            if isinstance(opened, str):
                self._queued.discard(req.req)
                await self._send(Reject(content=content, chunk=req.chunk, req=req.req,
                                        reason=opened))
            else:
                await self._send_chunk(req, rank, *opened)

    def _withdrawn_now(self, req: Request, final: bool) -> bool:
        """Whether the peer cancelled `req` (then it is skipped, and counted). After the
        `final` ask, just before its piece goes out, a Cancel for it comes too late."""
        if req.req in self._withdrawn:
            self._withdrawn.discard(req.req)
            self._queued.discard(req.req)
            self._owner.on_cancelled()
            return True
        if final:
            self._queued.discard(req.req)
        return False

    async def _open(self, content: ContentId, chunk: int) -> tuple[int, int] | str:
        """(fd, length) of the chunk to send, checked against its manifest unless its file
        is unchanged since its last check, or why it cannot be served."""
        count = self._owner.chunk_count(content)
        if count is None:
            return "not held"
        if not 0 <= chunk < count:
            return f"no chunk {chunk} in a content of {count} chunks"
        try:
            # Unchanged since it was written or last checked: serve it at once. Else
            # hash it again, in a worker thread (a cold read must not stall the loop).
            opened = self._store.open_cached(content, chunk)
            if opened is not None:
                return opened
            return await asyncio.to_thread(self._store.open_verified, content, chunk)
        except DamagedChunk:  # already deleted, logged, counted and refetched by the store
            return "failed verification here"
        except (MissingChunk, KeyError):
            return "not held"
        except Exception as exc:  # any store failure: refuse this request, serve the next
            log.exception("cannot serve %s/%d to %s", content, chunk, self.peer)
            return f"store error: {exc}"[:200]

    async def _send_chunk(self, req: Request, rank: int, fd: int, length: int) -> None:
        content = ContentId(req.content)
        try:
            async with self._upload_slots.slot(rank):
                if self._withdrawn_now(req, final=True):
                    return  # (the fd is closed below)
                await self.conn.send_piece(content, req.chunk, req.req, fd, 0, length,
                                           self._upload)
            self._owner.on_served(length)
        except LocalProtocolError as exc:  # the file is shorter than the chunk
            log.warning("cannot serve %s/%d to %s: %s", content, req.chunk, self.peer, exc)
            if self.conn.closed:  # part of the piece went out: the stream is lost
                self.close(f"upload failed: {exc}")
            else:
                await self._send(Reject(content=content, chunk=req.chunk, req=req.req,
                                        reason="chunk unreadable here"))
        except (OSError, ConnectionClosed, RemoteProtocolError) as exc:
            self.close(f"upload failed: {exc}")
        finally:
            os.close(fd)

    async def _relay(self, req: Request, rank: int, filling: Filling) -> None:
        content = ContentId(req.content)

        async def send(off: int, data: memoryview) -> None:
            async with self._upload_slots.slot(rank):
                await self.conn.send_piece_bytes(content, req.chunk, req.req, off, data,
                                                 self._upload)

        try:
            if await relay(filling, send, lambda: not self._withdrawn_now(req, final=False)):
                self._queued.discard(req.req)
                self._withdrawn.discard(req.req)  # a Cancel during the last part: too late
                self._owner.on_served(filling.length)
                self._owner.on_relayed("sent")
            else:
                self._owner.on_relayed("cancelled")
        except RelayFailed as exc:
            self._owner.on_relayed("ended")
            if not self._withdrawn_now(req, final=True):
                await self._send(Reject(content=content, chunk=req.chunk, req=req.req,
                                        reason=f"relay ended: {exc}"))
        except (OSError, ConnectionClosed, RemoteProtocolError) as exc:
            self.close(f"upload failed: {exc}")

    def _refund(self, req: int) -> None:
        if (paced := self._paced.pop(req, None)) is not None:
            nbytes, download = paced
            download.refund(nbytes)

    def close(self, reason: str, hostile: bool = False) -> None:
        if self._closed:
            return
        self._closed = True
        for req in list(self._paced):  # never sent: the node may spend that budget elsewhere
            self._refund(req)
        current = asyncio.current_task()
        for task in [*self._tasks, *self._relays]:
            if task is not current:
                task.cancel()
        with contextlib.suppress(Exception):
            self.conn.close()
        self._owner.link_ending(self, reason, hostile)
        self._owner.link_closed(self, reason, hostile)
