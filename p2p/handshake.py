"""The wire handshake and the identity checks that go with it.

Theory of operation. Both sides prove the cluster secret (p2p.auth), and the
server also checks *who* the client claims to be. A node's identity is the
address it is seen at: a peer id is only a name, so every claim is held
against what the socket shows.

- Server side: the client's claimed listen address, if it names a host, must
  name the host the connection comes from; and if we already know an address
  for the claimed peer id (the tracker handed it out), the connection must
  come from that host too. Either mismatch is an `IdentityError`: a node that
  holds the secret and claims to be someone else.
- Client side: the peer id the server proves must be the one we meant to
  dial. If it is not, and we know the proven id at another host, the server
  claims to be someone else (`IdentityError`); otherwise the address was
  stale (`WrongPeer`, not an attack). The address it claims must name the
  host we reached (`IdentityError`).

The checks run after the MACs: only a node that holds the secret can make an
identity claim worth checking, and the peer ids the MACs cover are the ones
checked. Hosts are compared as normalized IP addresses (`normal_ip`); a
claimed host that is a name is resolved. An empty or unspecified host
("", 0.0.0.0, ::) makes no claim: such a node does not serve peers.

This module holds no socket: it drives a `PeerConnection`'s send and recv.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from p2p import wire
from p2p.auth import AuthError, check_handshake_mac, handshake_mac
from p2p.content import PeerId
from p2p.wire import RemoteProtocolError, normal_ip

if TYPE_CHECKING:
    from p2p.peer import PeerConnection

AUTH_FAILED = "auth failed"
_M = TypeVar("_M", wire.Hello, wire.Challenge, wire.Auth)
KnownHost = Callable[[PeerId], str | None]  # the host we know a peer id at, if any


class IdentityError(RemoteProtocolError):
    """The peer holds the secret but claims an identity its address does not bear out."""


class WrongPeer(Exception):
    """The node we reached is not the peer we dialed (a stale address)."""


@dataclass(frozen=True, slots=True)
class PeerInfo:
    """Who a node is on the wire: its id, where it listens ("host:port"), its rack."""

    peer: PeerId
    addr: str
    rack: str


def is_specific(host: str) -> bool:
    """Whether `host` names one host (not empty, not 0.0.0.0 or ::)."""
    if not host:
        return False
    try:
        return not ipaddress.ip_address(host.strip("[]")).is_unspecified
    except ValueError:
        return True  # a name


def addr_host(addr: str) -> str:
    """The host of "host:port" ("" when `addr` is empty or malformed)."""
    try:
        return wire.split_addr(addr)[0] if addr else ""
    except ValueError:
        return ""


async def host_ips(host: str) -> set[str]:
    """The normalized IPs `host` stands for (itself if it is one; resolved otherwise)."""
    if _is_ip(host.strip("[]")):
        return {normal_ip(host)}
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return set()
    return {normal_ip(str(info[4][0])) for info in infos}


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


async def check_claim(who: str, claimed_addr: str, seen_ip: str) -> None:
    """IdentityError unless the host of `claimed_addr` (if it names one) is `seen_ip`."""
    host = addr_host(claimed_addr)
    if is_specific(host) and seen_ip not in await host_ips(host):
        raise IdentityError(f"{who} claims to listen at {claimed_addr} but connects "
                            f"from {seen_ip}")


async def client_handshake(conn: PeerConnection, me: PeerInfo, secret: bytes,
                           expect: PeerId | None, known_host: KnownHost | None) -> PeerInfo:
    """Run the client side; the server's PeerInfo. See the module docstring for checks."""
    nonce = os.urandom(wire.NONCE_SIZE)
    await conn.send(wire.Hello(wire.PROTOCOL_VERSION, me.peer, me.addr, me.rack, nonce))
    reply = await _expect(conn, wire.Challenge)
    await _check_version(conn, reply.version)
    await _check_mac(conn, handshake_mac(secret, "server", reply.nonce, nonce, reply.peer,
                                         me.peer), reply.mac, reply.peer)
    await conn.send(wire.Auth(handshake_mac(secret, "client", nonce, reply.nonce, me.peer,
                                            reply.peer)))
    who = f"peer {reply.peer!r}"
    if expect is not None and reply.peer != expect:
        await _check_known(conn, who, PeerId(reply.peer), known_host)
        raise WrongPeer(f"dialed {expect} at {conn.peername}, reached {reply.peer!r}")
    await check_claim(who, reply.addr, conn.remote_ip)
    return PeerInfo(PeerId(reply.peer), reply.addr, reply.rack)


async def server_handshake(conn: PeerConnection, me: PeerInfo, secret: bytes,
                           known_host: KnownHost | None) -> PeerInfo:
    """Run the server side; the client's PeerInfo. See the module docstring for checks."""
    hello = await _expect(conn, wire.Hello)
    await _check_version(conn, hello.version)
    nonce = os.urandom(wire.NONCE_SIZE)
    await conn.send(wire.Challenge(
        wire.PROTOCOL_VERSION, me.peer, me.addr, me.rack, nonce,
        handshake_mac(secret, "server", nonce, hello.nonce, me.peer, hello.peer)))
    auth = await _expect(conn, wire.Auth)
    await _check_mac(conn, handshake_mac(secret, "client", hello.nonce, nonce, hello.peer,
                                         me.peer), auth.mac, hello.peer)
    try:
        await _check_client(conn, hello, known_host)
    except IdentityError as exc:
        await conn.bye(str(exc)[:wire.MAX_REASON])
        raise
    return PeerInfo(PeerId(hello.peer), hello.addr, hello.rack)


async def _check_client(conn: PeerConnection, hello: wire.Hello,
                        known_host: KnownHost | None) -> None:
    who = f"peer {hello.peer!r}"
    await check_claim(who, hello.addr, conn.remote_ip)
    await _check_known(conn, who, PeerId(hello.peer), known_host)


async def _check_known(conn: PeerConnection, who: str, peer: PeerId,
                       known_host: KnownHost | None) -> None:
    """IdentityError if we know `peer` at a host other than the one on this connection."""
    known = known_host(peer) if known_host is not None else None
    if known is not None and is_specific(known) and conn.remote_ip not in await host_ips(known):
        raise IdentityError(f"{who} is known at {known} but is on a connection "
                            f"with {conn.remote_ip}")


async def _expect(conn: PeerConnection, kind: type[_M]) -> _M:
    msg = await conn.recv()
    if isinstance(msg, wire.Bye):
        error = AuthError if msg.reason == AUTH_FAILED else RemoteProtocolError
        raise error(f"{conn.peername} ended the handshake: {msg.reason}")
    if not isinstance(msg, kind):
        raise RemoteProtocolError(f"expected {kind.TYPE} in the handshake, got {msg.TYPE}")
    return msg


async def _check_version(conn: PeerConnection, version: int) -> None:
    if version != wire.PROTOCOL_VERSION:
        await conn.bye(f"unsupported protocol version {version}; "
                       f"I speak {wire.PROTOCOL_VERSION}")
        raise RemoteProtocolError(f"{conn.peername} speaks protocol version {version}")


async def _check_mac(conn: PeerConnection, expected: bytes, got: bytes, peer: str) -> None:
    try:
        check_handshake_mac(expected, got)
    except AuthError:
        await conn.bye(AUTH_FAILED)
        raise AuthError(
            f"peer {peer!r} at {conn.peername} failed the cluster-secret handshake; "
            "check that both nodes use the same cluster secret") from None
