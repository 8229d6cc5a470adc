"""The CoordinatorChannel's frequent worker messages, FeedCredits and PartitionsRead, encoded
and decoded by hand.

A worker sends credits all through a task, and betterproto2 spends tens of microseconds
building or parsing each few-byte message (a byte-at-a-time reader and per-field defaults
looked up under `warnings.catch_warnings`). These do it in a few. Decoding is as strict as
`flightfeed.messages.parse_strict`: tags, wire types checked against the schema, lengths
within their message, InvalidArgument naming the field. TaskMetrics are kept as they came
(EncodedTaskMetrics) and parsed, as strictly, when first read. Anything else (errors, or a
message of an unusual shape) goes through the generic strict parse.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, TypeAlias

import betterproto2

from .._generated.flightfeed.v1 import (
    FeedCredits,
    PartitionCredit,
    PartitionsRead,
    TaskMetrics,
    WorkerToCoordinatorMsg,
)
from ..errors import InvalidArgument
from ..flight.grpc import parse_message
from ..messages import parse_strict
from ..protoencode import encode_message
from ..protowire import (
    WIRE_I32,
    WIRE_I64,
    WIRE_LEN,
    WIRE_VARINT,
    decode_varint,
    encode_varint,
    skip_field,
)

_NAME: Final = "WorkerToCoordinatorMsg"
_U64: Final = (1 << 64) - 1
_U32: Final = (1 << 32) - 1
_TASK_METRICS: Final = 0x0A  # WorkerToCoordinatorMsg.task_metrics: field 1, length-delimited
_FEED_CREDITS: Final = 0x12  # WorkerToCoordinatorMsg.feed_credits: field 2, length-delimited
_PARTITIONS_READ: Final = 0x22  # WorkerToCoordinatorMsg.partitions_read: field 4
_WIRE_NAMES: Final = {
    WIRE_VARINT: "a varint",
    WIRE_I64: "a 64-bit value",
    WIRE_LEN: "a length-delimited value",
    WIRE_I32: "a 32-bit value",
}
# Per message: field number → (field name, proto type), for naming a misplaced field.
_CREDITS_FIELDS: Final = {1: ("credits", "a message")}
_CREDIT_FIELDS: Final = {
    1: ("id", "bytes"),
    2: ("partition", "uint64"),
    3: ("credits", "uint64"),
    4: ("finished", "bool"),
}
_READ_FIELDS: Final = {1: ("partitions", "uint64"), 2: ("reading", "uint32")}


@dataclass(frozen=True, slots=True)
class EncodedTaskMetrics:
    """A worker's TaskMetrics as they came off the channel, parsed when first read.

    Nothing on a query's path reads them (operators, EXPLAIN ANALYZE and tests do, through the
    coordinator's metrics store), and building their hundred-odd messages per task was a tenth
    of a busy coordinator's CPU. They are held to the channel's message size limit.
    """

    data: bytes

    def decode(self) -> TaskMetrics:
        """The metrics; InvalidArgument naming the field if the worker sent malformed ones."""
        return parse_strict(TaskMetrics, self.data)


WorkerMessage: TypeAlias = WorkerToCoordinatorMsg | EncodedTaskMetrics
"""What a task channel yields: TaskMetrics arrive encoded (from a worker over the network) or
as a WorkerToCoordinatorMsg (from one in this process)."""


def task_metrics_of(message: WorkerMessage) -> TaskMetrics | EncodedTaskMetrics | None:
    """The task's metrics, if `message` carries them."""
    if isinstance(message, EncodedTaskMetrics):
        return message
    return message.task_metrics


# -- encode ------------------------------------------------------------------------------------


def encode_worker_message(message: WorkerMessage) -> bytes:
    """The message's wire form, byte for byte what betterproto2 writes."""
    if isinstance(message, EncodedTaskMetrics):
        return _len_field(_TASK_METRICS, message.data)
    kind, value = betterproto2.which_one_of(message, "inner")
    if kind == "feed_credits":
        return _len_field(_FEED_CREDITS, _encode_credits(value))
    if kind == "partitions_read":
        return _len_field(_PARTITIONS_READ, _encode_reads(value))
    return encode_message(message)


def _encode_credits(message: FeedCredits) -> bytes:
    out = bytearray()
    for credit in message.credits:
        body = bytearray()
        if credit.id:
            body += b"\x0a" + _varint(len(credit.id)) + credit.id
        if credit.partition:
            body += b"\x10" + _varint(credit.partition)
        if credit.credits:
            body += b"\x18" + _varint(credit.credits)
        if credit.finished:
            body += b"\x20\x01"
        out += b"\x0a" + _varint(len(body)) + body
    return bytes(out)


def _encode_reads(message: PartitionsRead) -> bytes:
    out = b""
    if message.partitions:
        packed = b"".join(_varint(partition) for partition in message.partitions)
        out = _len_field(0x0A, packed)
    if message.reading:
        out += b"\x10" + _varint(message.reading)
    return out


def _len_field(tag: int, payload: bytes) -> bytes:
    return bytes((tag,)) + _varint(len(payload)) + payload


def _varint(value: int) -> bytes:
    if value < 0 or value > _U64:
        raise ValueError(f"{value} does not fit a uint64")
    return encode_varint(value)


# -- decode ------------------------------------------------------------------------------------


def decode_worker_message(data: bytes, max_message_size: int) -> WorkerMessage:
    """A WorkerToCoordinatorMsg from untrusted bytes: FeedCredits and PartitionsRead by hand,
    TaskMetrics left encoded, anything else through the generic strict parse (size limit
    included)."""
    if len(data) <= max_message_size and len(data) >= 2 and data[0] == _TASK_METRICS:
        encoded = _encoded_metrics(data)
        if encoded is not None:
            return encoded
    if (
        len(data) <= max_message_size
        and len(data) >= 2
        and data[0] in (_FEED_CREDITS, _PARTITIONS_READ)
    ):
        try:
            fast = _decode_fast(memoryview(data))
        except _MisplacedField as exc:  # names the field's whole path already
            raise InvalidArgument(exc.message) from None
        except IndexError:  # an inline read past the buffer
            raise InvalidArgument(f"{_NAME}: truncated protobuf message") from None
        except InvalidArgument as exc:
            raise InvalidArgument(f"{_NAME}: {exc.message}") from None
        if fast is not None:
            return fast
    return parse_message(data, WorkerToCoordinatorMsg, max_message_size)


def _encoded_metrics(data: bytes) -> EncodedTaskMetrics | None:
    """The TaskMetrics, still encoded, if they are all the message holds."""
    try:
        length, pos = _read_varint(memoryview(data), 1)
    except (IndexError, InvalidArgument):
        return None  # the generic parse says what is wrong
    if pos + length != len(data):
        return None
    return EncodedTaskMetrics(data[pos:])


def _decode_fast(buf: memoryview) -> WorkerToCoordinatorMsg | None:
    """The message if it is exactly one FeedCredits or PartitionsRead, else None."""
    length, pos = _read_varint(buf, 1)
    end = pos + length
    if end != len(buf):
        return None  # more fields, or truncated: the generic parse says which
    if buf[0] == _FEED_CREDITS:
        return WorkerToCoordinatorMsg(feed_credits=_decode_credits(buf, pos, end))
    return WorkerToCoordinatorMsg(partitions_read=_decode_reads(buf, pos, end))


def _decode_credits(buf: memoryview, pos: int, end: int) -> FeedCredits:
    credits: list[PartitionCredit] = []
    while pos < end:
        key, pos = _read_varint(buf, pos)
        if key == 0x0A:
            length, pos = _read_varint(buf, pos)
            stop = pos + length
            if stop > end:
                raise InvalidArgument("truncated field 1 of feed_credits")
            credits.append(_decode_credit(buf, pos, stop))
            pos = stop
        else:
            pos = _other_field(buf, pos, key, end, "feed_credits", _CREDITS_FIELDS)
    return FeedCredits(credits=credits)


def _decode_credit(buf: memoryview, pos: int, end: int) -> PartitionCredit:
    feed_id, partition, credits, finished = b"", 0, 0, False
    while pos < end:
        key, pos = _read_varint(buf, pos)
        if key == 0x0A:
            length, pos = _read_varint(buf, pos)
            feed_id = bytes(buf[pos : pos + length])
            pos += length
        elif key == 0x10:
            partition, pos = _read_varint(buf, pos)
            partition &= _U64
        elif key == 0x18:
            credits, pos = _read_varint(buf, pos)
            credits &= _U64
        elif key == 0x20:
            value, pos = _read_varint(buf, pos)
            finished = value > 0
        else:
            pos = _other_field(buf, pos, key, end, "feed_credits.credits", _CREDIT_FIELDS)
        if pos > end:
            raise InvalidArgument(f"truncated field {key >> 3} of feed_credits.credits")
    return PartitionCredit(id=feed_id, partition=partition, credits=credits, finished=finished)


def _decode_reads(buf: memoryview, pos: int, end: int) -> PartitionsRead:
    partitions: list[int] = []
    reading = 0
    while pos < end:
        key, pos = _read_varint(buf, pos)
        if key == 0x10:
            reading, pos = _read_varint(buf, pos)
            reading &= _U32
        elif key == 0x08:  # one partition
            value, pos = _read_varint(buf, pos)
            partitions.append(value & _U64)
        elif key == 0x0A:  # packed partitions
            length, pos = _read_varint(buf, pos)
            stop = pos + length
            if stop > end:
                raise InvalidArgument("truncated field 1 of partitions_read")
            while pos < stop:
                value, pos = _read_varint(buf, pos)
                partitions.append(value & _U64)
            if pos > stop:
                raise InvalidArgument("truncated packed partitions_read.partitions")
        else:
            pos = _other_field(buf, pos, key, end, "partitions_read", _READ_FIELDS)
        if pos > end:
            raise InvalidArgument(f"truncated field {key >> 3} of partitions_read")
    return PartitionsRead(partitions=partitions, reading=reading)


def _other_field(
    buf: memoryview, pos: int, key: int, end: int, path: str, known: dict[int, tuple[str, str]]
) -> int:
    """Past a field the fast decoders do not read: a known one with the wrong wire type is
    refused naming it; an unknown one must be well-formed."""
    number, wire_type = key >> 3, key & 7
    if number == 0:
        raise InvalidArgument("malformed protobuf: field number 0")
    field = known.get(number)
    if field is not None:
        got = _WIRE_NAMES.get(wire_type, f"wire type {wire_type}")
        raise _MisplacedField(f"{_NAME}.{path}.{field[0]} should be {field[1]}, got {got}")
    pos = skip_field(buf, pos, wire_type)
    if pos > end:
        raise InvalidArgument(f"truncated field {number} of {path}")
    return pos


class _MisplacedField(InvalidArgument):
    """A known field with the wrong wire type (raised as a plain InvalidArgument)."""


def _read_varint(buf: memoryview, pos: int) -> tuple[int, int]:
    byte = buf[pos]
    if byte < 0x80:
        return byte, pos + 1
    return decode_varint(buf, pos)


__all__ = [
    "EncodedTaskMetrics",
    "WorkerMessage",
    "decode_worker_message",
    "encode_worker_message",
    "task_metrics_of",
]
