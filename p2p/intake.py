"""The agent's incoming bytes: chunks from peers and from the origin, verified into the store.

The swarm decides what to ask of whom; the intake carries it out. A request's
answer comes as Pieces into a chunk-sized buffer (`p2p.relay.Parts`). A chunk
read from the origin, or one we announced to peers as pending (`relay_fetching`),
fills a `Filling` instead, which peers' relays read as it arrives. Whatever its
source, a chunk is verified and written by the store in a worker thread, and
only then counted, told to the swarm (`ChunkArrived`) and to the node core
(`stored`, which wakes readers): a byte that did not verify is never served
or read. With `movers` (the agent's `byte_movers`), a chunk from a peer is
received, hashed and written by one call per Piece in the node's byte-moving
threads (`p2p.bytepath.Workers`, `Spool.pull`; a relayed one by one call per
RELAY_STEP, so relays see it arrive). Every byte
asked for is paid for at the download limit first, and the chunk buffers are
reused (`p2p.session.BufferPool`).

The agent owns the sessions and hands the intake three callbacks: `feed` (an
event for a session's swarm), `stored` (a chunk of a session is in the store)
and `failed` (the session cannot go on, e.g. the store cannot write).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable

from p2p.bytepath import Pulled, Workers
from p2p.content import ContentId, PeerId
from p2p.link import Link
from p2p.metrics import AgentMetrics
from p2p.origin import OriginError, OriginPool
from p2p.peer import Puller, RateLimiter
from p2p.relay import Filling, PartKey, Parts
from p2p.session import BufferPool, Session
from p2p.spool import Spool, Streamer
from p2p.store import ChunkStore, CorruptChunk, StoreError, StoreFullError, UnknownContent
from p2p.swarm.events import ChunkArrived, ChunkFailed, Event
from p2p.units import MiB
from p2p.wire import Piece, RemoteProtocolError

log = logging.getLogger(__name__)

RELAY_STEP = 1 * MiB  # bytes per byte-mover call for a chunk peers relay while it arrives


class Intake:
    def __init__(self, store: ChunkStore, metrics: AgentMetrics, sessions: dict[ContentId, Session],
                 download: RateLimiter, origins: OriginPool, keep_buffers: int,
                 workers: Workers, *, movers: bool = False,
                 feed: Callable[[Session, Event], None],
                 stored: Callable[[Session, int], None],
                 failed: Callable[[Session, str], None]) -> None:
        self.store = store
        self.metrics = metrics
        self.sessions = sessions  # the agent's: read here, never changed
        self.download = download
        self.origins = origins
        self._buffers = BufferPool(keep_buffers)
        self._parts = Parts(self._buffers.take)
        self.workers = workers  # the node's byte movers (p2p.bytepath)
        self.movers = movers  # peers' chunks read by byte movers, not by the loop
        # Chunks from peers, written as they come: by movers (Spool) or the loop (Streamer).
        self._streams: dict[PartKey, Spool | Streamer] = {}
        self._feed, self._stored, self._failed = feed, stored, failed

    # ---- from peers ---------------------------------------------------------------

    def request(self, session: Session, link: Link, chunk: int) -> None:
        """Ask `link`'s peer for `chunk`; if we announced it as pending, peers may relay
        it from us while it arrives."""
        length = session.manifest.chunk_length(chunk)
        req = link.request(session.content, chunk, length, self.download)
        if session.swarm.relaying(chunk) and self.relay_source(session.content, chunk) is None:
            filling = session.filling[chunk] = Filling(self._buffers.take(length),
                                                       self._buffers.give)
            self._parts.expect((link.id, req), filling)

    async def on_piece(self, link: Link, msg: Piece, asked: tuple[ContentId, int] | None) -> bool:
        """Take one Piece (read or discard its payload); True once the request is answered
        in full (its last Piece)."""
        content = ContentId(msg.content)
        session = self.sessions.get(content)
        key = (link.id, msg.req)
        if asked is None or session is None or session.swarm.held(msg.chunk):
            self._wasted(self._drop(key) + msg.len)
            await link.conn.discard_payload(msg.len)
            return True
        try:
            view = self._parts.place(key, msg.off, msg.len,
                                     session.manifest.chunk_length(msg.chunk))
        except ValueError as exc:
            self._feed(session, ChunkArrived(msg.chunk, link.peer, ok=False))
            raise RemoteProtocolError(str(exc)) from None
        await self._receive(link, msg, key, session, view)  # paid for when asked
        if not self._parts.holds(key):  # cancelled while its payload came in
            self._wasted(msg.len)
            return True
        buf = self._parts.received(key, msg.len)
        if buf is None:
            return False  # more Pieces of a relay to come
        filling = self._parts.hand_over(key)
        commit = self._commit(self._streams.pop(key, None), buf)
        try:
            stored = await self._store_chunk(session, msg.chunk, buf, link.peer, commit)
        except asyncio.CancelledError:
            if filling is not None:
                filling.abandon()  # the store thread may still read the buffer
                self._filled(session, msg.chunk, filling, False)
            raise
        # Back to the pool only now: had this task been cancelled while the store
        # thread was writing from the buffer, the buffer must not be reused.
        if filling is None:
            self._buffers.give(buf)
        else:
            self._filled(session, msg.chunk, filling, stored)
        return True

    def _filled(self, session: Session, chunk: int, filling: Filling, stored: bool) -> None:
        """A chunk we relayed while it arrived is in: let its relays finish, or end them."""
        if stored:
            filling.verified()
        else:
            filling.failed("the chunk did not verify or could not be stored")
        if session.filling.get(chunk) is filling:
            del session.filling[chunk]
        filling.release()

    def relay_source(self, content: ContentId, chunk: int,
                     peer: PeerId | None = None) -> Filling | None:
        """The chunk as it arrives, if we are fetching it now (to relay to `peer`: never
        one that `peer` itself is sending us, or each would wait on the other)."""
        session = self.sessions.get(content)
        if session is None:
            return None
        filling = session.filling.get(chunk)
        if filling is not None and filling.failure is not None:
            del session.filling[chunk]  # its peer stopped sending it
            return None
        if filling is not None and peer is not None and session.swarm.relay_feeder(chunk) == peer:
            return None  # the peer sends it to us: answered "not held" (p2p.relay)
        return filling

    def drop(self, link_id: int, req: int) -> None:
        """Request `req` on the link ends unanswered (rejected, cancelled)."""
        self._wasted(self._drop((link_id, req)))

    def drop_link(self, link_id: int) -> None:
        """The link closed: its requests' partial chunks are wasted."""
        for key in [key for key in self._streams if key[0] == link_id]:
            self._streams.pop(key).abort()
        self._wasted(self._parts.drop_link(link_id))

    def _drop(self, key: PartKey) -> int:
        if (stream := self._streams.pop(key, None)) is not None:
            stream.abort()
        return self._parts.drop(key)

    async def _receive(self, link: Link, msg: Piece, key: PartKey, session: Session,
                       view: memoryview) -> None:
        """Read a Piece's payload into `view`: by a byte mover (`movers`), else by the
        loop with a Streamer writing it in worker threads; either writes it to the
        chunk's temp file as it comes, if the store can start one."""
        filling = self._parts.filling(key)  # peers may be relaying it already
        progress = None
        if self.movers:
            if filling is not None:
                progress = functools.partial(_advance, filling, None, msg.off)
            pull = self._puller(key, session, msg.chunk, msg.off)
            if pull is not None:
                await link.conn.recv_payload_pulled(view, pull, self.workers, progress,
                                                    None if filling is None else RELAY_STEP)
                return
        else:
            entry = self._streams.get(key) if msg.off else self._stream(key, session, msg.chunk)
            stream = entry if isinstance(entry, Streamer) else None
            if filling is not None or stream is not None:
                progress = functools.partial(_advance, filling, stream, msg.off)
        await link.conn.recv_payload_into(view, progress=progress)

    def _stream(self, key: PartKey, session: Session, chunk: int) -> Streamer | None:
        """A Streamer writing the chunk `key` brings as it arrives; None if the store cannot
        start it now (the whole chunk then goes through `put`, which says why)."""
        try:
            spool = Spool(self.store, session.content, chunk)
        except (StoreError, UnknownContent, IndexError):
            return None
        stream = self._streams[key] = Streamer(spool, self._parts.buffer(key))
        return stream

    def _commit(self, stream: Spool | Streamer | None,
                buf: bytearray) -> Callable[[], Awaitable[None]] | None:
        """How to verify and store the chunk `stream` wrote as it arrived (None: `put`)."""
        if isinstance(stream, Spool):
            return functools.partial(self.workers.run,
                                     functools.partial(stream.commit, memoryview(buf)))
        return None if stream is None else stream.commit

    def _puller(self, key: PartKey, session: Session, chunk: int, off: int) -> Puller | None:
        """The byte mover that writes the Piece at `off` of the chunk `key` brings into the
        store as it arrives (p2p.spool); None if the store cannot start it now, or the
        chunk's spool lost its place: the whole chunk then goes through `put`, which says
        why."""
        spool = self._streams.get(key)
        if off == 0 and spool is None:
            try:
                spool = self._streams[key] = Spool(self.store, session.content, chunk)
            except (StoreError, UnknownContent, IndexError):
                return None
        if not isinstance(spool, Spool) or spool.written != off:
            if spool is not None:
                self._streams.pop(key).abort()
            return None
        return functools.partial(_pull, spool, memoryview(self._parts.buffer(key)), off)

    def _wasted(self, nbytes: int) -> None:
        if nbytes:
            self.metrics.wasted_bytes.inc(nbytes)

    # ---- from the origin ------------------------------------------------------------

    async def fetch_origin(self, session: Session, chunk: int) -> None:
        """Read a chunk from the origin into a `Filling` that peers' relays read as it fills,
        then verify and store it."""
        length = session.manifest.chunk_length(chunk)
        log.debug("origin fetch %s/%d", session.content, chunk)
        filling = session.filling[chunk] = Filling(self._buffers.take(length),
                                                   self._buffers.give)
        stream = self._origin_stream(session, chunk, filling)
        try:
            if await self._read_origin(session, chunk, filling, stream):
                commit = None if stream is None else stream.commit
                if await self._store_chunk(session, chunk, filling.buf, None, commit):
                    filling.verified()
            elif stream is not None:
                stream.abort()
        except asyncio.CancelledError:
            filling.abandon()  # a worker thread (file read, store) may still use the buffer
            if stream is not None:
                stream.abort()
            raise
        finally:
            if session.filling.get(chunk) is filling:
                del session.filling[chunk]
            filling.failed("the chunk from the origin did not verify or could not be stored")
            filling.release()

    def _origin_stream(self, session: Session, chunk: int, filling: Filling) -> Streamer | None:
        """A chunk from the origin is written as it arrives too (origins never send a byte
        twice once a part has gone to relays: p2p.origin.OriginPool.read_into)."""
        try:
            return Streamer(Spool(self.store, session.content, chunk), filling.buf)
        except (StoreError, UnknownContent, IndexError):
            return None  # `put` at the end says why

    async def _read_origin(self, session: Session, chunk: int, filling: Filling,
                           stream: Streamer | None) -> bool:
        """Fill `filling` from the origin; False, and the swarm told, if that failed."""
        manifest = session.manifest
        progress = filling.advance if stream is None else functools.partial(
            _advance, filling, stream, 0)
        try:
            await self.download.acquire(filling.length)  # paid before asking, as for peers
            log.debug("origin read %s/%d", session.content, chunk)
            await self.origins.read_into(manifest.sources, manifest.chunk_offset(chunk),
                                         memoryview(filling.buf), progress)
        except OriginError as exc:
            log.warning("origin read of %s/%d failed: %s", session.content, chunk, exc)
            self.metrics.origin_errors.labels("definite" if exc.definite else "transient").inc()
            session.origin_tasks.pop(chunk, None)
            self._feed(session, ChunkFailed(chunk, None, str(exc), exc.definite))  # Withdraw...
            filling.failed(f"the origin read failed: {exc}")  # ... before relays' Rejects
            return False
        except Exception as exc:
            # A bug in an adapter must not leave the chunk "in flight" until the
            # origin time-out: report it loudly and let the swarm retry.
            log.exception("origin read of %s/%d crashed", session.content, chunk)
            session.origin_tasks.pop(chunk, None)
            self._feed(session, ChunkFailed(chunk, None, f"origin adapter crashed: {exc!r}"))
            filling.failed("the origin read failed")
            return False
        session.origin_tasks.pop(chunk, None)
        return True

    # ---- into the store ---------------------------------------------------------------

    async def _store_chunk(self, session: Session, chunk: int, data: bytearray,
                           source: PeerId | None,
                           commit: Callable[[], Awaitable[None]] | None = None) -> bool:
        """Verify and store a chunk (written already as it arrived, if `commit`: that
        verifies and stores it, as p2p.spool.Spool.commit), count its
        bytes, and tell the swarm; whether it is stored. Bytes are counted once verified,
        so the byte counters and `chunks_verified` agree at every moment (a relay cut
        short is wasted)."""
        try:
            if commit is None:
                await asyncio.to_thread(self.store.put, session.content, chunk,
                                        memoryview(data))
            else:
                await commit()
        except UnknownContent:
            return False  # the session failed or was evicted while the chunk was written
        except CorruptChunk:
            self.metrics.chunks_rejected.labels("origin" if source is None else "peer").inc()
            log.warning("chunk %s/%d from %s failed verification", session.content, chunk,
                        source or "the origin")
            self._feed(session, ChunkArrived(chunk, source, ok=False))
            return False
        except StoreError as exc:
            self.metrics.store_errors.labels(
                "full" if isinstance(exc, StoreFullError) else "error").inc()
            self._failed(session, str(exc))
            return False
        if self.sessions.get(session.content) is not session or session.failed is not None:
            return False
        self.metrics.chunks_verified.inc()
        log.debug("stored %s/%d from %s", session.content, chunk, source or "the origin")
        if source is None:
            session.origin_bytes += len(data)
            self.metrics.origin_bytes.inc(len(data))
        else:
            session.peer_bytes += len(data)
            self.metrics.peer_bytes.inc(len(data))
        self._feed(session, ChunkArrived(chunk, source, ok=True))
        self._stored(session, chunk)
        return True


def _advance(filling: Filling | None, stream: Streamer | None, offset: int,
             received: int) -> None:
    if filling is not None:
        filling.advance(offset + received)
    if stream is not None:
        stream.advance(offset + received)


def _pull(spool: Spool, chunk: memoryview, off: int, sock_fd: int, filled: int, stop: int,
          wake: int, lowat: int) -> Pulled:
    """A Piece's bytes `filled:stop` pulled into the chunk's buffer, at `off` in it."""
    pulled = spool.pull(sock_fd, chunk, off + filled, off + stop, wake=wake, lowat=lowat)
    return Pulled(pulled.filled - off, pulled.state, pulled.write_errno, pulled.lowat)
