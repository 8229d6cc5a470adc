"""Arrow IPC message headers read from untrusted bytes, without pyarrow and without trusting
any offset or count in them.

Arrow's IPC reader believes a compressed buffer's declared length and allocates it before it
decompresses: a few kilobytes of zstd can ask for gigabytes. The declared sizes sit in each
compressed buffer's 8-byte prefix, located by the header's `buffers` vector, so the total a
message decodes to is known, and checked, before Arrow sees it. pyarrow exposes neither the
header's fields nor a capped memory pool, hence this small hand-written flatbuffer reader.
"""

from __future__ import annotations

import struct
from enum import IntEnum
from typing import Final

from .errors import InvalidArgument

_U16 = struct.Struct("<H")
_I32 = struct.Struct("<i")
_U32 = struct.Struct("<I")
_I64 = struct.Struct("<q")
_BUFFER = struct.Struct("<qq")  # Buffer struct of Schema.fbs: offset, length
# Message table of Message.fbs (a union takes two slots: type, then value).
_MESSAGE_HEADER_TYPE: Final = 1
_MESSAGE_HEADER: Final = 2
_MESSAGE_BODY_LENGTH: Final = 3
_RECORD_BATCH_BUFFERS: Final = 2
_RECORD_BATCH_COMPRESSION: Final = 3
_DICTIONARY_BATCH_DATA: Final = 1
_UNCOMPRESSED: Final = -1
"""A compressed body's buffer prefix meaning "stored as is" (Arrow's BodyCompression)."""


class MessageKind(IntEnum):
    """`MessageHeader` union tags of Message.fbs."""

    SCHEMA = 1
    DICTIONARY_BATCH = 2
    RECORD_BATCH = 3
    TENSOR = 4
    SPARSE_TENSOR = 5


def _malformed(detail: str) -> InvalidArgument:
    return InvalidArgument(f"malformed IPC message header: {detail}")


def flatbuffer_field(buf: memoryview, table: int, index: int) -> int:
    """Absolute position of field `index` of the table at `table`, or 0 when absent."""
    if table < 0 or table + 4 > len(buf):
        raise _malformed("table out of bounds")
    vtable = table - _I32.unpack_from(buf, table)[0]
    if vtable < 0 or vtable + 4 > len(buf):
        raise _malformed("vtable out of bounds")
    vtable_length = _U16.unpack_from(buf, vtable)[0]
    slot = 4 + 2 * index
    if slot + 2 > vtable_length or vtable + slot + 2 > len(buf):
        return 0
    offset = _U16.unpack_from(buf, vtable + slot)[0]
    return table + offset if offset else 0


def _referenced(buf: memoryview, position: int) -> int:
    """The table or vector a uoffset field at `position` points to."""
    if position + 4 > len(buf):
        raise _malformed("offset out of bounds")
    target: int = position + _U32.unpack_from(buf, position)[0]
    if target + 4 > len(buf):
        raise _malformed("reference out of bounds")
    return target


def peek_message(header: memoryview | bytes) -> tuple[int, int]:
    """(MessageHeader kind, bodyLength) of a Message flatbuffer, with bounds checks."""
    buf = memoryview(header)
    try:
        table = _referenced(buf, 0) if len(buf) >= 4 else -1
        if table < 0:
            raise _malformed("root out of bounds")
        kind_pos = flatbuffer_field(buf, table, _MESSAGE_HEADER_TYPE)
        kind = buf[kind_pos] if kind_pos else 0
        length_pos = flatbuffer_field(buf, table, _MESSAGE_BODY_LENGTH)
        body_length = _I64.unpack_from(buf, length_pos)[0] if length_pos else 0
    except (struct.error, IndexError) as exc:
        raise _malformed(str(exc)) from None
    if body_length < 0:
        raise _malformed("negative body length")
    return kind, body_length


def decoded_body_bytes(header: memoryview | bytes, body: memoryview | bytes) -> int:
    """Bytes the message's body takes once decoded: its own size, or for a compressed record
    or dictionary batch the sum of the sizes its buffers declare."""
    buf = memoryview(header)
    try:
        root = _referenced(buf, 0)
        kind_pos = flatbuffer_field(buf, root, _MESSAGE_HEADER_TYPE)
        kind = buf[kind_pos] if kind_pos else 0
        if kind not in (MessageKind.RECORD_BATCH, MessageKind.DICTIONARY_BATCH):
            return len(body)
        header_pos = flatbuffer_field(buf, root, _MESSAGE_HEADER)
        if not header_pos:
            return len(body)
        batch = _referenced(buf, header_pos)
        if kind == MessageKind.DICTIONARY_BATCH:
            data_pos = flatbuffer_field(buf, batch, _DICTIONARY_BATCH_DATA)
            if not data_pos:
                return len(body)
            batch = _referenced(buf, data_pos)
        if not flatbuffer_field(buf, batch, _RECORD_BATCH_COMPRESSION):
            return len(body)
        buffers_pos = flatbuffer_field(buf, batch, _RECORD_BATCH_BUFFERS)
        return _declared_sizes(buf, _referenced(buf, buffers_pos), body) if buffers_pos else 0
    except (struct.error, IndexError) as exc:
        raise _malformed(str(exc)) from None


def _declared_sizes(buf: memoryview, vector: int, body: memoryview | bytes) -> int:
    count = _U32.unpack_from(buf, vector)[0]
    if vector + 4 + count * _BUFFER.size > len(buf):
        raise _malformed(f"{count} buffers do not fit in the header")
    view = memoryview(body)
    total = 0
    for i in range(count):
        offset, length = _BUFFER.unpack_from(buf, vector + 4 + i * _BUFFER.size)
        if length == 0:
            continue
        if offset < 0 or length < 8 or offset + length > len(view):
            raise _malformed(f"buffer {i} [{offset}, +{length}) is outside the body")
        declared = _I64.unpack_from(view, offset)[0]
        if declared < _UNCOMPRESSED:
            raise _malformed(f"buffer {i} declares {declared} bytes")
        total += length - 8 if declared == _UNCOMPRESSED else declared
    return total
