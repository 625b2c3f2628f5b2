"""The peer wire protocol: frames, messages and their codec (sans-IO).

Theory of operation. A connection carries frames. A frame is a 4-byte
big-endian header length N (1 <= N <= MAX_HEADER), then N bytes holding one
msgpack map (the header), then, for a PIECE only, exactly `header["len"]` raw
payload bytes: bytes `off` to `off + len` of the chunk. A chunk the sender holds
goes out in one Piece; one it is still fetching from the origin (a relay,
p2p.relay) in several, in order, the last only once the sender has verified the
whole chunk. Chunk bytes are never packed into msgpack: the sender can hand
them to the kernel with sendfile and the receiver can read them straight into
its own buffer.

Every header map has a short type name under "t" and one key per field of the
message's dataclass, spelled as the field is. Keys a message does not know are
ignored (room to grow without a version bump); missing keys, wrong types and
out-of-range values are errors.

A connection opens with a handshake, always in this order:

    client -> server  Hello      version, peer id, listen addr, rack, nonce
    server -> client  Challenge  the same about the server + the server's MAC
    client -> server  Auth       the client's MAC

(see p2p.auth.handshake_mac for what each MAC covers). Either side that sees a
bad MAC sends `Bye("auth failed")` and hangs up. After that, both sides speak
freely: Join, Have, Pending, Withdraw, Request, Piece, Reject, Cancel, Bye. A Request is
answered with the Pieces of the whole chunk or a Reject (a relay whose origin
fetch fails ends with a Reject after some Pieces), unless a Cancel for it
arrives while it is still queued or relayed: then the rest is not sent (the
asker has forgotten it).

This module is the trust boundary for bytes from peers. `parse_length` and
`parse_header` bound every size and turn every decode failure, whatever its
kind, into RemoteProtocolError (the peer's fault). Building a message with bad
fields raises LocalProtocolError (our own bug). It does no I/O: p2p.peer moves
the bytes.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any, ClassVar

import msgpack

from p2p.content import MAX_CHUNK_SIZE, ManifestError, check_content_id
from p2p.units import KiB

PROTOCOL_VERSION = 4  # 2: Cancel, Withdraw; 3: Piece.off (relays); 4: Request.due_ms
PREFIX_SIZE = 4
MAX_HEADER = 64 * KiB
NONCE_SIZE = 16
MAC_SIZE = 32  # HMAC-SHA256
MAX_NAME = 256  # peer ids, content ids, addresses, racks
MAX_REASON = 1024
MAX_INDEX = 2**32 - 1  # chunk indices and request ids
MAX_FIELDS = 16  # keys in one header map
MAX_DUE_MS = 86_400_000  # a day either way


class RemoteProtocolError(Exception):
    """The peer broke the protocol: malformed, oversized or out-of-order data."""


class LocalProtocolError(Exception):
    """We tried to send something the protocol does not allow (a bug on our side)."""


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _check_uint(name: str, value: object, hi: int, lo: int = 0) -> None:
    if type(value) is not int or not lo <= value <= hi:
        raise LocalProtocolError(f"{name} must be an int in {lo}..{hi}, got {_show(value)}")


def _check_str(name: str, value: object, max_len: int = MAX_NAME, min_len: int = 0) -> None:
    if type(value) is not str or not min_len <= len(value) <= max_len:
        raise LocalProtocolError(
            f"{name} must be a string of {min_len}..{max_len} characters, got {_show(value)}"
        )


def _check_bytes(name: str, value: object, lo: int, hi: int) -> None:
    if type(value) is not bytes or not lo <= len(value) <= hi:
        raise LocalProtocolError(f"{name} must be {lo}..{hi} bytes, got {_show(value)}")


def _check_content(value: object) -> None:
    try:
        check_content_id(value)
    except ManifestError as exc:
        raise LocalProtocolError(str(exc)) from None


def _check_who(version: object, peer: object, addr: object, rack: object,
               nonce: object) -> None:
    _check_uint("version", version, 0xFFFF)
    _check_str("peer", peer, min_len=1)
    _check_addr(addr)
    _check_str("rack", rack)
    _check_bytes("nonce", nonce, NONCE_SIZE, NONCE_SIZE)


def _check_ref(content: object, chunk: object, req: object = 0) -> None:
    _check_content(content)
    _check_uint("chunk", chunk, MAX_INDEX)
    _check_uint("req", req, MAX_INDEX)


def split_addr(addr: str) -> tuple[str, int]:
    """("host", port) from "host:port" or "[v6]:port"; ValueError if malformed."""
    host, sep, port_text = addr.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"address {addr!r} is not host:port")
    return host, int(port_text)


def normal_ip(host: str) -> str:
    """`host` as a canonical IP string (IPv4-mapped IPv6 as IPv4); unchanged if not an IP."""
    try:
        ip = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return host
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return str(ip)


def _check_addr(value: object) -> None:
    """A listen address "host:port", or "" for a node that does not serve peers."""
    _check_str("addr", value)
    if value:
        try:
            split_addr(str(value))
        except ValueError as exc:
            raise LocalProtocolError(str(exc)) from None


class _Codec:
    """Shared encode for the message dataclasses; each declares its type name."""

    __slots__ = ()
    TYPE: ClassVar[str]

    def encode(self) -> bytes:
        """The frame header: 4-byte length, then the msgpack map (no payload)."""
        body: dict[str, Any] = {"t": self.TYPE}
        for name in _FIELD_NAMES[type(self)]:
            body[name] = getattr(self, name)
        packed: bytes = msgpack.packb(body, use_bin_type=True)
        if len(packed) > MAX_HEADER:
            raise LocalProtocolError(f"{self.TYPE} header of {len(packed)} bytes > {MAX_HEADER}")
        return len(packed).to_bytes(PREFIX_SIZE, "big") + packed


@dataclass(frozen=True, slots=True)
class Hello(_Codec):
    """Client's first message: who it is, where it listens for peers, its nonce."""

    TYPE: ClassVar[str] = "hello"
    version: int
    peer: str
    addr: str
    rack: str
    nonce: bytes

    def __post_init__(self) -> None:
        _check_who(self.version, self.peer, self.addr, self.rack, self.nonce)


@dataclass(frozen=True, slots=True)
class Challenge(_Codec):
    """Server's reply to Hello: who it is, its nonce, and its proof of the secret.

    mac = handshake_mac(secret, "server", server_nonce, client_nonce,
    server_peer, client_peer).
    """

    TYPE: ClassVar[str] = "chal"
    version: int
    peer: str
    addr: str
    rack: str
    nonce: bytes
    mac: bytes

    def __post_init__(self) -> None:
        _check_who(self.version, self.peer, self.addr, self.rack, self.nonce)
        _check_bytes("mac", self.mac, MAC_SIZE, MAC_SIZE)


@dataclass(frozen=True, slots=True)
class Auth(_Codec):
    """Client's proof of the secret: handshake_mac(secret, "client", client_nonce,
    server_nonce, client_peer, server_peer)."""

    TYPE: ClassVar[str] = "auth"
    mac: bytes

    def __post_init__(self) -> None:
        _check_bytes("mac", self.mac, MAC_SIZE, MAC_SIZE)


@dataclass(frozen=True, slots=True)
class Join(_Codec):
    """I am in the swarm for `content`; `have` is the bitfield of chunks I hold
    (see pack_bits) and `pending` the chunks I am fetching from the origin now."""

    TYPE: ClassVar[str] = "join"
    content: str
    have: bytes
    pending: tuple[int, ...]

    def __post_init__(self) -> None:
        _check_content(self.content)
        _check_bytes("have", self.have, 0, MAX_HEADER)
        if type(self.pending) is not tuple:
            raise LocalProtocolError(f"pending must be a tuple, got {_show(self.pending)}")
        for chunk in self.pending:
            _check_uint("pending chunk", chunk, MAX_INDEX)


@dataclass(frozen=True, slots=True)
class Have(_Codec):
    """I now hold (verified) chunk `chunk` of `content`."""

    TYPE: ClassVar[str] = "have"
    content: str
    chunk: int

    def __post_init__(self) -> None:
        _check_ref(self.content, self.chunk)


@dataclass(frozen=True, slots=True)
class Pending(_Codec):
    """I started fetching chunk `chunk` of `content` from the origin."""

    TYPE: ClassVar[str] = "pend"
    content: str
    chunk: int

    def __post_init__(self) -> None:
        _check_ref(self.content, self.chunk)


@dataclass(frozen=True, slots=True)
class Withdraw(_Codec):
    """I no longer fetch `chunk` of `content` from the origin (I sent Pending for it)."""

    TYPE: ClassVar[str] = "withdraw"
    content: str
    chunk: int

    def __post_init__(self) -> None:
        _check_ref(self.content, self.chunk)


@dataclass(frozen=True, slots=True)
class Request(_Codec):
    """Send me chunk `chunk` of `content`; `req` is my id for this request. `due_ms` is
    my node's due (p2p.swarm.node.Node.due) less the time of sending, in ms: negative
    when I am behind my line rate. The sender's upload order may use it."""

    TYPE: ClassVar[str] = "req"
    content: str
    chunk: int
    req: int
    due_ms: int = 0

    def __post_init__(self) -> None:
        _check_ref(self.content, self.chunk, self.req)
        _check_uint("due_ms", self.due_ms, MAX_DUE_MS, -MAX_DUE_MS)


@dataclass(frozen=True, slots=True)
class Piece(_Codec):
    """Answer to Request `req`: bytes `off` to `off + len` of the chunk, as the `len` raw
    payload bytes that follow this header."""

    TYPE: ClassVar[str] = "piece"
    content: str
    chunk: int
    req: int
    off: int
    len: int

    def __post_init__(self) -> None:
        _check_ref(self.content, self.chunk, self.req)
        _check_uint("off", self.off, MAX_CHUNK_SIZE - 1)
        _check_uint("len", self.len, MAX_CHUNK_SIZE - self.off, lo=1)


@dataclass(frozen=True, slots=True)
class Reject(_Codec):
    """I will not serve Request `req` (chunk not held, overloaded, ...): `reason`."""

    TYPE: ClassVar[str] = "rej"
    content: str
    chunk: int
    req: int
    reason: str

    def __post_init__(self) -> None:
        _check_ref(self.content, self.chunk, self.req)
        _check_str("reason", self.reason, MAX_REASON)


@dataclass(frozen=True, slots=True)
class Cancel(_Codec):
    """Never mind Request `req` (for chunk `chunk` of `content`): skip it if not started."""

    TYPE: ClassVar[str] = "cancel"
    content: str
    chunk: int
    req: int

    def __post_init__(self) -> None:
        _check_ref(self.content, self.chunk, self.req)


@dataclass(frozen=True, slots=True)
class Bye(_Codec):
    """I am hanging up, and why."""

    TYPE: ClassVar[str] = "bye"
    reason: str

    def __post_init__(self) -> None:
        _check_str("reason", self.reason, MAX_REASON)


Message = (Hello | Challenge | Auth | Join | Have | Pending | Withdraw | Request | Piece | Reject
           | Cancel | Bye)
MESSAGE_TYPES: dict[str, type[Message]] = {
    cls.TYPE: cls for cls in (Hello, Challenge, Auth, Join, Have, Pending, Withdraw, Request,
                              Piece, Reject, Cancel, Bye)
}
_FIELD_NAMES: dict[type, tuple[str, ...]] = {
    cls: tuple(f.name for f in fields(cls)) for cls in MESSAGE_TYPES.values()
}


def parse_length(prefix: bytes | bytearray | memoryview) -> int:
    """The header length N from the 4-byte prefix; RemoteProtocolError unless 1..MAX_HEADER."""
    if len(prefix) != PREFIX_SIZE:
        raise RemoteProtocolError(f"length prefix must be {PREFIX_SIZE} bytes")
    n = int.from_bytes(prefix, "big")
    if not 1 <= n <= MAX_HEADER:
        raise RemoteProtocolError(f"header length {n} outside 1..{MAX_HEADER}")
    return n


def parse_header(raw: bytes | bytearray | memoryview) -> Message:
    """The message in the N header bytes that follow the prefix (prefix not included).

    Any failure (bad msgpack, trailing bytes, sizes over the limits, unknown
    type, missing field, wrong type or range) is a RemoteProtocolError.
    """
    if not 1 <= len(raw) <= MAX_HEADER:
        raise RemoteProtocolError(f"header length {len(raw)} outside 1..{MAX_HEADER}")
    try:
        body = msgpack.unpackb(
            raw, raw=False, strict_map_key=True, max_bin_len=MAX_HEADER,
            max_str_len=MAX_HEADER, max_array_len=MAX_HEADER, max_map_len=MAX_FIELDS,
            max_ext_len=0,
        )  # fmt: skip
    except Exception as exc:  # msgpack raises many kinds; all mean "the peer sent garbage"
        raise RemoteProtocolError(f"undecodable header: {exc!r}") from exc
    if not isinstance(body, dict):
        raise RemoteProtocolError(f"header is a {type(body).__name__}, not a map")
    kind = body.get("t")
    cls = MESSAGE_TYPES.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise RemoteProtocolError(f"unknown message type {_show(kind)}")
    try:
        values = {name: body[name] for name in _FIELD_NAMES[cls]}
    except KeyError as exc:
        raise RemoteProtocolError(f"{kind} message lacks field {exc}") from None
    if type(values.get("pending")) is list:
        values["pending"] = tuple(values["pending"])
    try:
        return cls(**values)
    except LocalProtocolError as exc:
        raise RemoteProtocolError(f"bad {kind} message: {exc}") from None


def decode(frame: bytes | bytearray | memoryview) -> Message:
    """The message in one whole header frame (prefix + map, no payload)."""
    n = parse_length(frame[:PREFIX_SIZE])
    if len(frame) != PREFIX_SIZE + n:
        raise RemoteProtocolError(f"frame of {len(frame)} bytes, prefix says {PREFIX_SIZE + n}")
    return parse_header(frame[PREFIX_SIZE:])


def pack_bits(bits: Sequence[bool]) -> bytes:
    """Bitfield: bit i is chunk i, most significant bit first, zero padding at the end."""
    if not bits:
        return b""
    size = (len(bits) + 7) // 8
    text = "".join("1" if bit else "0" for bit in bits).ljust(size * 8, "0")
    return int(text, 2).to_bytes(size, "big")


def unpack_bits(data: bytes, n: int) -> list[bool]:
    """The `n` flags in a bitfield from a peer; RemoteProtocolError on a wrong length
    or on padding bits that are set."""
    size = (n + 7) // 8
    if len(data) != size:
        raise RemoteProtocolError(f"bitfield of {len(data)} bytes for {n} chunks (want {size})")
    if not data:
        return []
    text = format(int.from_bytes(data, "big"), f"0{size * 8}b")
    if "1" in text[n:]:
        raise RemoteProtocolError("bitfield has padding bits set")
    return [c == "1" for c in text[:n]]
