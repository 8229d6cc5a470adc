"""Protobuf wire primitives, over memoryviews.

FlightData is the one message flightfeed encodes and decodes by hand: building a betterproto2
object would copy every record batch body, while these helpers only write a few header bytes
around the body views and parse fields as memoryview slices. Untrusted messages are checked
with them before betterproto2 parses them: their wire format, and how deeply plans nest.
"""

from __future__ import annotations

from typing import Final

from .errors import InvalidArgument

WIRE_VARINT: Final = 0
WIRE_I64: Final = 1
WIRE_LEN: Final = 2
WIRE_I32: Final = 5


def encode_varint(value: int) -> bytes:
    """Unsigned LEB128 varint."""
    if value < 0x80:
        return bytes((value,))
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def field_key(field_number: int, wire_type: int) -> bytes:
    """The tag that starts a field."""
    return encode_varint((field_number << 3) | wire_type)


def len_field_header(field_number: int, length: int) -> bytes:
    """Tag and length of a length-delimited field; the payload follows separately."""
    return field_key(field_number, WIRE_LEN) + encode_varint(length)


def decode_varint(buf: memoryview, pos: int) -> tuple[int, int]:
    """Decode a varint at `pos`; return (value, next position)."""
    result = 0
    shift = 0
    end = len(buf)
    while True:
        if pos >= end:
            raise InvalidArgument("truncated protobuf varint")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
        if shift >= 64:
            raise InvalidArgument("protobuf varint longer than 10 bytes")


def skip_field(buf: memoryview, pos: int, wire_type: int) -> int:
    """Position after the value of a field we do not use."""
    if wire_type == WIRE_VARINT:
        return decode_varint(buf, pos)[1]
    if wire_type == WIRE_I64:
        pos += 8
    elif wire_type == WIRE_LEN:
        length, pos = decode_varint(buf, pos)
        pos += length
    elif wire_type == WIRE_I32:
        pos += 4
    else:
        raise InvalidArgument(f"unsupported protobuf wire type {wire_type}")
    if pos > len(buf):
        raise InvalidArgument("truncated protobuf field")
    return pos


def check_wire_format(data: bytes | memoryview) -> None:
    """Raise InvalidArgument unless `data` is well-formed protobuf wire format.

    betterproto2 parses leniently (garbage often decodes to a default message), so requests
    are checked first: valid tags and wire types (no groups), varints of at most 10 bytes,
    lengths within the buffer.
    """
    buf = memoryview(data)
    pos = 0
    end = len(buf)
    while pos < end:
        key, pos = decode_varint(buf, pos)
        number, wire_type = key >> 3, key & 7
        if number == 0:
            raise InvalidArgument("malformed protobuf: field number 0")
        if wire_type not in (WIRE_VARINT, WIRE_I64, WIRE_LEN, WIRE_I32):
            raise InvalidArgument(f"malformed protobuf: wire type {wire_type} in field {number}")
        pos = skip_field(buf, pos, wire_type)
