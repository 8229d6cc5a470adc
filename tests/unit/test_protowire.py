"""Protobuf wire primitives and the hand-written FlightData parser."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flightfeed._generated.arrow.flight.protocol import FlightData
from flightfeed.errors import InvalidArgument
from flightfeed.flight import (
    FlightDescriptor,
    command_descriptor,
    decode_flight_data,
    path_descriptor,
)
from flightfeed.flight.codec import encode_flight_data
from flightfeed.protowire import (
    WIRE_I32,
    WIRE_I64,
    WIRE_LEN,
    WIRE_VARINT,
    decode_varint,
    encode_varint,
    field_key,
    len_field_header,
    skip_field,
)

U64 = 2**64 - 1


@pytest.mark.parametrize(
    ("value", "encoded"),
    [
        (0, b"\x00"),
        (1, b"\x01"),
        (127, b"\x7f"),
        (128, b"\x80\x01"),
        (300, b"\xac\x02"),
        (16383, b"\xff\x7f"),
        (16384, b"\x80\x80\x01"),
        (2**31 - 1, b"\xff\xff\xff\xff\x07"),
        (2**32, b"\x80\x80\x80\x80\x10"),
        (2**63 - 1, b"\xff" * 8 + b"\x7f"),
        (U64, b"\xff" * 9 + b"\x01"),
    ],
)
def test_varint_known_encodings(value: int, encoded: bytes) -> None:
    assert encode_varint(value) == encoded
    assert decode_varint(memoryview(encoded), 0) == (value, len(encoded))


@given(st.integers(0, U64), st.binary(max_size=4), st.binary(max_size=4))
def test_varint_roundtrip_at_any_position(value: int, before: bytes, after: bytes) -> None:
    data = memoryview(before + encode_varint(value) + after)
    assert decode_varint(data, len(before)) == (value, len(data) - len(after))


@given(st.integers(1, U64))
def test_truncated_varint_raises(value: int) -> None:
    encoded = encode_varint(value)
    for cut in range(len(encoded)):
        with pytest.raises(InvalidArgument, match="truncated protobuf varint"):
            decode_varint(memoryview(encoded[:cut]), 0)


def test_overlong_varint_raises() -> None:
    with pytest.raises(InvalidArgument, match="longer than 10 bytes"):
        decode_varint(memoryview(b"\x80" * 10 + b"\x01"), 0)


def test_non_minimal_varint_is_accepted() -> None:
    """Protobuf allows padded varints (0x80 0x00 is 0); decoders must accept them."""
    assert decode_varint(memoryview(b"\x81\x80\x80\x00"), 0) == (1, 4)


def test_field_key_and_length_header() -> None:
    assert field_key(1, WIRE_LEN) == b"\x0a"
    assert field_key(2, WIRE_LEN) == b"\x12"
    assert field_key(1000, WIRE_LEN) == b"\xc2\x3e"
    assert len_field_header(1000, 300) == b"\xc2\x3e\xac\x02"


@pytest.mark.parametrize(
    ("wire_type", "value", "size"),
    [
        (WIRE_VARINT, encode_varint(2**40), 6),
        (WIRE_I64, b"12345678", 8),
        (WIRE_LEN, b"\x03abc", 4),
        (WIRE_I32, b"1234", 4),
    ],
)
def test_skip_field_each_wire_type(wire_type: int, value: bytes, size: int) -> None:
    data = memoryview(b"xx" + value + b"tail")
    assert skip_field(data, 2, wire_type) == 2 + size
    with pytest.raises(InvalidArgument, match="truncated"):
        skip_field(memoryview(b"xx" + value[:-1]), 2, wire_type)


@pytest.mark.parametrize("wire_type", [3, 4, 6, 7])
def test_skip_field_rejects_groups_and_unknown_wire_types(wire_type: int) -> None:
    with pytest.raises(InvalidArgument, match="wire type"):
        skip_field(memoryview(b"\x00" * 16), 0, wire_type)


# --- decode_flight_data ------------------------------------------------------------------

descriptors = st.one_of(
    st.builds(command_descriptor, st.binary(max_size=20)),
    st.builds(lambda p: path_descriptor(*p), st.lists(st.text(max_size=8), max_size=3)),
)


@settings(max_examples=200)
@given(
    descriptor=st.one_of(st.none(), descriptors),
    header=st.binary(max_size=300),
    app_metadata=st.binary(max_size=300),
    body=st.binary(max_size=3000),
)
def test_decode_matches_protobuf_encoding(
    descriptor: FlightDescriptor | None, header: bytes, app_metadata: bytes, body: bytes
) -> None:
    """What the generated protobuf code encodes, the hand-written parser reads back."""
    message = FlightData(
        flight_descriptor=descriptor,
        data_header=header,
        app_metadata=app_metadata,
        data_body=body,
    )
    view = decode_flight_data(bytes(message))
    assert bytes(view.header) == header
    assert bytes(view.body) == body
    assert bytes(view.app_metadata or b"") == app_metadata
    if descriptor is None:
        assert view.descriptor is None
    else:
        assert view.descriptor is not None
        assert bytes(view.descriptor) == bytes(descriptor)


@settings(max_examples=200)
@given(
    header=st.binary(max_size=200),
    app_metadata=st.one_of(st.none(), st.binary(min_size=1, max_size=200)),
    body=st.binary(max_size=2000),
)
def test_encode_parses_with_protobuf(
    header: bytes, app_metadata: bytes | None, body: bytes
) -> None:
    """What the hand-written encoder writes, the generated protobuf code reads back."""
    message = encode_flight_data(
        header=header, body=[body] if body else [], body_length=len(body), app_metadata=app_metadata
    )
    payload = b"".join(message.parts)[5:]
    parsed = FlightData.parse(payload)
    # the encoder may append zero padding to the header to align the body
    assert parsed.data_header[: len(header)] == header
    assert parsed.data_header[len(header) :] == bytes(len(parsed.data_header) - len(header))
    assert parsed.data_body == body
    assert parsed.app_metadata == (app_metadata or b"")


unknown_fields = st.lists(
    st.one_of(
        st.builds(lambda n, v: field_key(n, WIRE_VARINT) + encode_varint(v),
                  st.integers(4, 999), st.integers(0, U64)),
        st.builds(lambda n, v: field_key(n, WIRE_I64) + v,
                  st.integers(4, 999), st.binary(min_size=8, max_size=8)),
        st.builds(lambda n, v: field_key(n, WIRE_I32) + v,
                  st.integers(4, 999), st.binary(min_size=4, max_size=4)),
        st.builds(lambda n, v: len_field_header(n, len(v)) + v,
                  st.integers(1001, 2**29 - 1), st.binary(max_size=20)),
        # known field numbers with the wrong wire type are unknown fields too
        st.builds(lambda n, v: field_key(n, WIRE_VARINT) + encode_varint(v),
                  st.sampled_from([1, 2, 3, 1000]), st.integers(0, 1000)),
    ),
    max_size=6,
)  # fmt: skip


@given(before=unknown_fields, between=unknown_fields, after=unknown_fields)
def test_unknown_fields_are_skipped(
    before: list[bytes], between: list[bytes], after: list[bytes]
) -> None:
    header = len_field_header(2, 5) + b"HEADR"
    body = len_field_header(1000, 4) + b"BODY"
    meta = len_field_header(3, 2) + b"md"
    payload = b"".join([*before, header, *between, meta, body, *after])
    view = decode_flight_data(payload)
    assert (bytes(view.header), bytes(view.body)) == (b"HEADR", b"BODY")
    assert view.app_metadata is not None
    assert bytes(view.app_metadata) == b"md"
    assert view.descriptor is None


def test_repeated_field_last_one_wins() -> None:
    payload = len_field_header(2, 1) + b"a" + len_field_header(2, 1) + b"b"
    assert bytes(decode_flight_data(payload).header) == b"b"


def test_empty_message_has_empty_fields() -> None:
    view = decode_flight_data(b"")
    assert (bytes(view.header), bytes(view.body)) == (b"", b"")
    assert view.app_metadata is None
    assert view.descriptor is None


def test_fields_are_views_not_copies() -> None:
    payload = bytearray(len_field_header(1000, 4) + b"BODY")
    view = decode_flight_data(memoryview(payload))
    payload[-4:] = b"XXXX"
    assert bytes(view.body) == b"XXXX"


@pytest.mark.parametrize(
    ("payload", "match"),
    [
        (len_field_header(2, 10) + b"short", "truncated FlightData: field 2 declares 10 bytes"),
        (len_field_header(1000, 2**20) + b"x", "field 1000 declares"),
        (len_field_header(3, 3), "field 3 declares 3 bytes, 0 remain"),
        (b"\x12", "truncated protobuf varint"),  # the length is missing
        (b"\x80", "truncated protobuf varint"),  # the key is truncated
        (field_key(9, WIRE_I64) + b"1234", "truncated protobuf field"),
        (field_key(9, WIRE_I32) + b"12", "truncated protobuf field"),
        (len_field_header(9, 5) + b"12", "truncated protobuf field"),
        (field_key(9, WIRE_VARINT) + b"\xff", "truncated protobuf varint"),
        (field_key(9, 3) + b"\x00", "wire type 3"),
    ],
)
def test_truncated_or_malformed_fields_raise(payload: bytes, match: str) -> None:
    with pytest.raises(InvalidArgument, match=match):
        decode_flight_data(payload)


@given(st.binary(max_size=64))
def test_arbitrary_bytes_either_parse_or_raise_invalid_argument(data: bytes) -> None:
    try:
        view = decode_flight_data(data)
    except InvalidArgument:
        return
    for field in (view.header, view.body, view.app_metadata, view.descriptor):
        assert field is None or len(field) <= len(data)
