"""The wire codec: round trips, and every way a peer can send garbage."""

from __future__ import annotations

import contextlib
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from p2p import wire
from p2p.content import MAX_CHUNK_SIZE
from p2p.wire import (
    MAX_HEADER,
    Auth,
    Bye,
    Cancel,
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
    Withdraw,
    decode,
    pack_bits,
    parse_header,
    parse_length,
    unpack_bits,
)

C = "c1-" + "ab" * 32  # a well-formed content id
NONCE = bytes(range(16))
MAC = bytes(range(32))

MESSAGES = [
    Hello(1, "node-a", "10.0.0.1:7000", "rack-1", NONCE),
    Hello(1, "node-a", "", "", NONCE),
    Hello(1, "node-a", "[::1]:7000", "r", NONCE),
    Challenge(1, "node-b", "10.0.0.2:7000", "rack-2", NONCE, MAC),
    Auth(MAC),
    Join(C, pack_bits([True, False, True]), (1, 7)),
    Join(C, b"", ()),
    Have(C, 0),
    Pending(C, 2**32 - 1),
    Withdraw(C, 5),
    Request(C, 3, 99),
    Request(C, 3, 99, -wire.MAX_DUE_MS),
    Request(C, 3, 99, 1500),
    Piece(C, 3, 99, 0, MAX_CHUNK_SIZE),
    Piece(C, 3, 99, MAX_CHUNK_SIZE - 1, 1),
    Reject(C, 3, 99, "not held"),
    Cancel(C, 3, 99),
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
    body = msgpack.unpackb(Have(C, 5).encode()[4:])
    assert body == {"t": "have", "content": C, "chunk": 5}


def test_piece_header_carries_no_payload() -> None:
    frame = Piece(C, 0, 1, 0, 4 << 20).encode()
    assert len(frame) < 128


def test_unknown_keys_are_ignored() -> None:
    assert decode(pack({"t": "have", "content": C, "chunk": 1, "future": [1, 2]})) == Have(C, 1)


@pytest.mark.parametrize(
    "frame",
    [
        b"\x00\x00\x00\x01\xc1",  # 0xc1 is never used in msgpack
        b"\x00\x00\x00\x02\x81\xa1",  # truncated map
        pack([1, 2, 3]),  # not a map
        pack({"t": "have", "content": C, "chunk": 1}) + b"\x00",  # frame longer than prefix
        pack({"t": "nope"}),
        pack({"content": C, "chunk": 1}),  # no type
        pack({"t": "have", "content": "c"}),  # missing field
        pack({"t": "have", "content": C, "chunk": "1"}),
        pack({"t": "have", "content": C, "chunk": True}),
        pack({"t": "have", "content": C, "chunk": 1.0}),
        pack({"t": "have", "content": C, "chunk": -1}),
        pack({"t": "have", "content": C, "chunk": 2**32}),
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
        pack({"t": "join", "content": C, "have": b"", "pending": [1, "2"]}),
        pack({"t": "join", "content": C, "have": b"", "pending": {"a": 1}}),
        pack({"t": "piece", "content": C, "chunk": 0, "req": 0, "len": MAX_CHUNK_SIZE + 1}),
        pack({"t": "piece", "content": C, "chunk": 0, "req": 0, "len": 0}),
        pack({"t": "bye", "reason": "x" * 2000}),
        pack({"t": "req", "content": C, "chunk": 0, "req": 1}),  # no due (protocol 3)
        pack({"t": "req", "content": C, "chunk": 0, "req": 1, "due_ms": 86_400_001}),
        pack({"t": "req", "content": C, "chunk": 0, "req": 1, "due_ms": 0.5}),
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
        lambda: Have(C, -1),
        lambda: Have("a/b", 1),
        lambda: Piece(C, 0, 0, 0, MAX_CHUNK_SIZE + 1),
        lambda: Piece(C, 0, 0, MAX_CHUNK_SIZE - 10, 11),  # past the largest chunk
        lambda: Piece(C, 0, 0, -1, 10),
        lambda: Hello(1, "a", "", "", b"short"),
        lambda: Join(C, b"", [1]),  # type: ignore[arg-type]
        lambda: Auth(b"x"),
        lambda: Join(C, bytes(MAX_HEADER), ()).encode(),  # fits the field, not the header
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


# ---- fuzzing: whatever a peer sends, the decoder's only complaint is RemoteProtocolError

FIELDS = sorted({name for cls in wire.MESSAGE_TYPES.values() for name in wire._FIELD_NAMES[cls]})
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=True), st.text(max_size=300), st.binary(max_size=300),
    st.sampled_from([C, "c1-" + "0" * 64, "x" * 257, "127.0.0.1:7000", "[::1]:0"]),
)  # fmt: skip
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=5)
                      | st.dictionaries(st.text(max_size=8), inner, max_size=5), max_leaves=20)
headers = st.dictionaries(
    st.one_of(st.sampled_from(["t", *FIELDS]), st.text(max_size=8), st.integers(-99, 99)),
    values, max_size=wire.MAX_FIELDS + 2,
) | st.builds(
    lambda kind, body: {**body, "t": kind},
    st.sampled_from(sorted(wire.MESSAGE_TYPES)),
    st.dictionaries(st.sampled_from(FIELDS), values, max_size=8),
) | st.builds(  # a valid message with a field or two changed
    lambda msg, changes: {**msgpack.unpackb(msg.encode()[4:]), **changes},
    st.sampled_from(MESSAGES),
    st.dictionaries(st.sampled_from(FIELDS), values, max_size=2),
)
FUZZ = settings(max_examples=300, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow])


def decode_stream(data: bytes) -> list[wire.Message]:
    """Frames from a byte stream as a receiver cuts them (payloads skipped)."""
    messages, pos = [], 0
    while pos + wire.PREFIX_SIZE <= len(data):
        n = parse_length(data[pos:pos + wire.PREFIX_SIZE])
        if pos + wire.PREFIX_SIZE + n > len(data):
            break
        msg = parse_header(data[pos + wire.PREFIX_SIZE:pos + wire.PREFIX_SIZE + n])
        messages.append(msg)
        pos += wire.PREFIX_SIZE + n + (msg.len if isinstance(msg, Piece) else 0)
    return messages


framed = st.lists(st.binary(max_size=300), max_size=8).map(
    lambda parts: b"".join(len(p).to_bytes(4, "big") + p for p in parts))  # well-cut garbage


@FUZZ
@given(st.one_of(st.binary(max_size=4096), framed))
def test_fuzz_any_byte_stream_is_decoded_or_the_peers_fault(data: bytes) -> None:
    with contextlib.suppress(RemoteProtocolError):
        decode_stream(data)


@FUZZ
@given(st.lists(headers, min_size=1, max_size=4))
def test_fuzz_any_msgpack_header_is_decoded_or_the_peers_fault(bodies: list[Any]) -> None:
    stream = b"".join(pack(body) for body in bodies)
    try:
        for msg in decode_stream(stream):
            assert isinstance(msg, wire.Message)
            assert decode(msg.encode()) == msg  # what we accept, we can say back
    except RemoteProtocolError:
        pass
