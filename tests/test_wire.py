"""The wire codec: round trips, and every way a peer can send garbage."""

from __future__ import annotations

import msgpack
import pytest

from p2p import wire
from p2p.content import MAX_CHUNK_SIZE
from p2p.wire import (
    MAX_HEADER,
    Auth,
    Bye,
    Challenge,
    Have,
    Hello,
    Join,
    LocalProtocolError,
    Pending,
    Piece,
    Reject,
    RemoteProtocolError,
    Request,
    decode,
    pack_bits,
    parse_header,
    parse_length,
    unpack_bits,
)

NONCE = bytes(range(16))
MAC = bytes(range(32))

MESSAGES = [
    Hello(1, "node-a", "10.0.0.1:7000", "rack-1", NONCE),
    Hello(1, "node-a", "", "", NONCE),
    Hello(1, "node-a", "[::1]:7000", "r", NONCE),
    Challenge(1, "node-b", "10.0.0.2:7000", "rack-2", NONCE, MAC),
    Auth(MAC),
    Join("x3-abc-10", pack_bits([True, False, True]), (1, 7)),
    Join("c", b"", ()),
    Have("c", 0),
    Pending("c", 2**32 - 1),
    Request("c", 3, 99),
    Piece("c", 3, 99, MAX_CHUNK_SIZE),
    Reject("c", 3, 99, "not held"),
    Bye("shutting down"),
]


def pack(body: object) -> bytes:
    raw: bytes = msgpack.packb(body, use_bin_type=True)
    return len(raw).to_bytes(4, "big") + raw


@pytest.mark.parametrize("msg", MESSAGES, ids=lambda m: type(m).__name__)
def test_round_trip(msg: wire.Message) -> None:
    frame = msg.encode()
    assert parse_length(frame[:4]) == len(frame) - 4
    assert parse_header(frame[4:]) == msg
    assert decode(frame) == msg
    assert decode(bytearray(frame)) == msg


def test_header_is_a_short_typed_map() -> None:
    body = msgpack.unpackb(Have("c", 5).encode()[4:])
    assert body == {"t": "have", "content": "c", "chunk": 5}


def test_piece_header_carries_no_payload() -> None:
    frame = Piece("c", 0, 1, 4 << 20).encode()
    assert len(frame) < 64


def test_unknown_keys_are_ignored() -> None:
    assert decode(pack({"t": "have", "content": "c", "chunk": 1, "future": [1, 2]})) == Have("c", 1)


@pytest.mark.parametrize(
    "frame",
    [
        b"\x00\x00\x00\x01\xc1",  # 0xc1 is never used in msgpack
        b"\x00\x00\x00\x02\x81\xa1",  # truncated map
        pack([1, 2, 3]),  # not a map
        pack({"t": "have", "content": "c", "chunk": 1}) + b"\x00",  # frame longer than prefix
        pack({"t": "nope"}),
        pack({"content": "c", "chunk": 1}),  # no type
        pack({"t": "have", "content": "c"}),  # missing field
        pack({"t": "have", "content": "c", "chunk": "1"}),
        pack({"t": "have", "content": "c", "chunk": True}),
        pack({"t": "have", "content": "c", "chunk": 1.0}),
        pack({"t": "have", "content": "c", "chunk": -1}),
        pack({"t": "have", "content": "c", "chunk": 2**32}),
        pack({"t": "have", "content": b"c", "chunk": 1}),
        pack({"t": "have", "content": "", "chunk": 1}),
        pack({"t": "have", "content": "../etc", "chunk": 1}),
        pack({"t": "have", "content": "..", "chunk": 1}),
        pack({"t": "have", "content": "c" * 300, "chunk": 1}),
        pack({"t": "auth", "mac": MAC[:31]}),
        pack({"t": "auth", "mac": "x" * 32}),
        pack({"t": "hello", "version": 1, "peer": "a", "addr": "nohostport", "rack": "",
              "nonce": NONCE}),
        pack({"t": "hello", "version": 1, "peer": "a", "addr": "h:99999", "rack": "",
              "nonce": NONCE}),
        pack({"t": "hello", "version": 1, "peer": "", "addr": "", "rack": "", "nonce": NONCE}),
        pack({"t": "hello", "version": 1, "peer": "a", "addr": "", "rack": "", "nonce": b"x"}),
        pack({"t": "join", "content": "c", "have": b"", "pending": [1, "2"]}),
        pack({"t": "join", "content": "c", "have": b"", "pending": {"a": 1}}),
        pack({"t": "piece", "content": "c", "chunk": 0, "req": 0, "len": MAX_CHUNK_SIZE + 1}),
        pack({"t": "piece", "content": "c", "chunk": 0, "req": 0, "len": 0}),
        pack({"t": "bye", "reason": "x" * 2000}),
        pack({1: "have"}),  # int keys
        b"\x00\x00\x00\x03\xa2\xff\xfe",  # invalid utf-8 string
        b"\x00\x00\x00\x06\xc7\x01\x05abc",  # ext type
    ],
)
def test_malformed_headers_are_the_peers_fault(frame: bytes) -> None:
    with pytest.raises(RemoteProtocolError):
        decode(frame)


def test_deep_nesting_is_the_peers_fault() -> None:
    with pytest.raises(RemoteProtocolError):
        parse_header(b"\x91" * 5000 + b"\x00")


def test_oversized_lengths_are_rejected() -> None:
    with pytest.raises(RemoteProtocolError):
        parse_length(b"\xff\xff\xff\xff")
    with pytest.raises(RemoteProtocolError):
        parse_length((MAX_HEADER + 1).to_bytes(4, "big"))
    with pytest.raises(RemoteProtocolError):
        parse_length(b"\x00\x00\x00\x00")
    assert parse_length(MAX_HEADER.to_bytes(4, "big")) == MAX_HEADER
    with pytest.raises(RemoteProtocolError):
        parse_header(bytes(MAX_HEADER + 1))


def test_huge_string_inside_the_limit_is_bounded_by_the_field_check() -> None:
    frame = pack({"t": "bye", "reason": "x" * (MAX_HEADER - 100)})
    with pytest.raises(RemoteProtocolError, match="reason"):
        decode(frame)


@pytest.mark.parametrize(
    "build",
    [
        lambda: Have("c", -1),
        lambda: Have("a/b", 1),
        lambda: Piece("c", 0, 0, MAX_CHUNK_SIZE + 1),
        lambda: Hello(1, "a", "", "", b"short"),
        lambda: Join("c", b"", [1]),  # type: ignore[arg-type]
        lambda: Auth(b"x"),
        lambda: Join("c", bytes(MAX_HEADER), ()).encode(),  # fits the field, not the header
    ],
)
def test_building_a_bad_message_is_our_fault(build: object) -> None:
    with pytest.raises(LocalProtocolError):
        build()  # type: ignore[operator]


def test_split_addr() -> None:
    assert wire.split_addr("127.0.0.1:80") == ("127.0.0.1", 80)
    assert wire.split_addr("[::1]:80") == ("::1", 80)
    for bad in ("host", ":80", "host:", "host:0", "host:x"):
        with pytest.raises(ValueError):
            wire.split_addr(bad)


@pytest.mark.parametrize("text", ["", "1", "0", "10110011", "101100111", "1" * 17, "0" * 64])
def test_bitfield_round_trip(text: str) -> None:
    bits = [c == "1" for c in text]
    packed = pack_bits(bits)
    assert len(packed) == (len(bits) + 7) // 8
    assert unpack_bits(packed, len(bits)) == bits


def test_bitfield_is_msb_first() -> None:
    assert pack_bits([True, False, False, False, False, False, False, False, True]) == b"\x80\x80"


def test_bitfield_rejects_wrong_length_and_set_padding() -> None:
    with pytest.raises(RemoteProtocolError):
        unpack_bits(b"\xff", 9)
    with pytest.raises(RemoteProtocolError):
        unpack_bits(b"\xff\x00", 8)
    with pytest.raises(RemoteProtocolError):
        unpack_bits(b"\x01", 7)  # bit 7 is padding
    assert unpack_bits(b"\xfe", 7) == [True] * 7
