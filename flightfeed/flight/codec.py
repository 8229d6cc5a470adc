"""FlightData ⇄ RecordBatch, without FlightData objects on the data path.

`FlightDataEncoder` turns record batches into gRPC messages given as lists of buffer views:
a few protobuf header bytes written around Arrow's own body buffers. `decode_flight_data`
parses a received FlightData into memoryview fields, and `FlightDataDecoder` turns those
back into record batches with Arrow C++ (dictionaries included). A compressed batch is sized
from the lengths its buffers declare before Arrow decompresses it: a few kilobytes of zstd can
declare gigabytes.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import pyarrow as pa

from ..errors import InvalidArgument, ResourceExhausted
from ..ipcwire import decoded_body_bytes
from ..protowire import WIRE_LEN, decode_varint, len_field_header, skip_field
from .ipc import CONTINUATION, Buffer, IpcMessageFeed, IpcMessageSplitter, MessageKind, peek_message

FIELD_DESCRIPTOR = 1
FIELD_DATA_HEADER = 2
FIELD_APP_METADATA = 3
FIELD_DATA_BODY = 1000
_GRPC_PREFIX = struct.Struct(">BI")
_I32 = struct.Struct("<i")
DEFAULT_MAX_DECODED_SIZE = 2 * 1024 * 1024 * 1024
"""Bytes one FlightData batch may decode to: 4x the default max message size, room for a
well-compressed 512 MiB message, and a bound on what a decompression bomb allocates."""


@dataclass(frozen=True)
class EncodedMessage:
    """A length-prefixed gRPC message as buffer views; `nbytes` includes the 5-byte prefix."""

    parts: tuple[Buffer, ...]
    nbytes: int


def grpc_message(parts: Sequence[Buffer], payload_length: int) -> EncodedMessage:
    """Prefix protobuf payload parts with gRPC's (uncompressed flag, length) header."""
    return EncodedMessage((_GRPC_PREFIX.pack(0, payload_length), *parts), payload_length + 5)


def encode_flight_data(
    header: bytes | memoryview = b"",
    body: Sequence[Buffer] = (),
    body_length: int = 0,
    app_metadata: bytes | None = None,
    descriptor: bytes | None = None,
) -> EncodedMessage:
    """FlightData as views: header fields are new bytes, body buffers are passed through."""
    parts: list[Buffer] = []
    if descriptor:
        parts += (len_field_header(FIELD_DESCRIPTOR, len(descriptor)), descriptor)
    tail: list[Buffer] = []
    if app_metadata:
        tail += (len_field_header(FIELD_APP_METADATA, len(app_metadata)), app_metadata)
    if body_length:
        tail.append(len_field_header(FIELD_DATA_BODY, body_length))
    if len(header):
        if body_length:
            header = _pad_header_to_align_body(header, sum(len(p) for p in (*parts, *tail)))
        parts += (len_field_header(FIELD_DATA_HEADER, len(header)), header)
    parts += tail
    length = sum(len(p) for p in parts) + body_length
    return grpc_message((*parts, *body) if body_length else parts, length)


def _pad_header_to_align_body(header: bytes | memoryview, other_bytes: int) -> bytes | memoryview:
    """Append a few zero bytes to the flatbuffer header so the body starts 8-byte aligned.

    Receivers (pyarrow's C++ client, our decoder) slice body buffers straight out of the
    received message, so the body's offset in the payload decides the buffers' alignment;
    Acero and SIMD kernels want 8. Flatbuffer readers ignore trailing bytes.
    """
    for pad in range(16):  # 16: a varint growing by a byte can skip one residue
        size = len(header) + pad
        offset = other_bytes + len(len_field_header(FIELD_DATA_HEADER, size)) + size
        if offset % 8 == 0:
            return bytes(header) + bytes(pad) if pad else header
    raise AssertionError("unreachable: some padding in 0..7 aligns the body")


SMALL_MESSAGE_BYTES = 64 * 1024
"""Batches up to this size (in streams without dictionaries) are written and read by one
Arrow call each, through a copy; larger ones go through Arrow's stream writer and reader,
whose bodies are views of the batch's own memory and of the received message."""


def _has_dictionary(type_: pa.DataType) -> bool:
    """Whether a column of `type_` carries dictionaries: in itself, a child, or the storage of
    an extension type (whose own `num_fields` is 0)."""
    if pa.types.is_dictionary(type_):
        return True
    if isinstance(type_, pa.BaseExtensionType):
        return _has_dictionary(type_.storage_type)
    return any(_has_dictionary(type_.field(i).type) for i in range(type_.num_fields))


def _encapsulated(header: memoryview, body: memoryview) -> pa.Buffer:
    """One encapsulated IPC message (continuation, length, padded header, body), copied into
    one buffer: for small messages only."""
    padding = -len(header) % 8
    prefix = CONTINUATION + _I32.pack(len(header) + padding)
    return pa.py_buffer(b"".join((prefix, header, bytes(padding), body)))


class FlightDataEncoder:
    """Encodes one Arrow stream (schema, then batches) into FlightData gRPC messages.

    The schema message goes out with the first batch (or on `schema_message()`); replacement
    and delta dictionaries are emitted by Arrow's stream writer before the batch using them.
    A small batch without dictionaries is serialized in one call instead: the stream writer
    hands every piece of a message to Python (`IpcMessageSplitter.write`), ~38 us for a
    one-row batch against ~3.
    """

    def __init__(self, schema: pa.Schema, options: pa.ipc.IpcWriteOptions | None = None) -> None:
        self.schema = schema
        self._options = options
        self._sink = IpcMessageSplitter()
        self._writer: pa.ipc.RecordBatchStreamWriter | None = None  # made on first use
        self._schema_sent = False
        self._serializable = options is None and not any(
            _has_dictionary(field.type) for field in schema
        )

    def schema_message(self, descriptor: bytes | None = None) -> EncodedMessage:
        """The stream's first message: the encapsulated schema."""
        if self._schema_sent:
            raise RuntimeError("schema already encoded")
        self._schema_sent = True
        header = pa.ipc.read_message(self.schema.serialize()).metadata
        return encode_flight_data(header=header, descriptor=descriptor)

    def encode(
        self, batch: pa.RecordBatch, app_metadata: bytes | None = None
    ) -> list[EncodedMessage]:
        """Messages for one batch: schema (if not yet sent), dictionaries, then the batch."""
        out: list[EncodedMessage] = []
        if not self._schema_sent:
            out.append(self.schema_message())
        if not batch.schema.equals(self.schema):
            raise InvalidArgument(
                f"batch schema differs from stream schema:\n{batch.schema}\nvs\n{self.schema}"
            )
        if self._serializable and batch.get_total_buffer_size() <= SMALL_MESSAGE_BYTES:
            message = pa.ipc.read_message(batch.serialize())
            body = message.body
            out.append(
                encode_flight_data(
                    header=message.metadata.to_pybytes(),
                    body=[body] if body.size else [],
                    body_length=body.size,
                    app_metadata=app_metadata,
                )
            )
            return out
        if self._writer is None:
            self._writer = pa.ipc.new_stream(self._sink, self.schema, options=self._options)
        self._writer.write_batch(batch)
        messages = self._sink.take()
        for message in messages:
            kind, _ = peek_message(message.header)
            if kind == MessageKind.SCHEMA:
                continue  # Arrow's own copy of the schema message; ours went first
            is_batch = kind == MessageKind.RECORD_BATCH
            out.append(
                encode_flight_data(
                    header=message.header,
                    body=message.body,
                    body_length=message.body_length,
                    app_metadata=app_metadata if is_batch else None,
                )
            )
        return out


@dataclass(frozen=True)
class FlightDataView:
    """The fields of one received FlightData, as views into the received bytes."""

    descriptor: memoryview | None
    header: memoryview
    app_metadata: memoryview | None
    body: memoryview


_EMPTY = memoryview(b"")


def decode_flight_data(data: bytes | memoryview) -> FlightDataView:
    """Parse FlightData fields without copying; unknown fields are skipped."""
    buf = memoryview(data)
    pos = 0
    end = len(buf)
    descriptor: memoryview | None = None
    header = _EMPTY
    app_metadata: memoryview | None = None
    body = _EMPTY
    while pos < end:
        key, pos = decode_varint(buf, pos)
        number, wire_type = key >> 3, key & 7
        if wire_type != WIRE_LEN or number not in (1, 2, 3, 1000):
            pos = skip_field(buf, pos, wire_type)
            continue
        length, pos = decode_varint(buf, pos)
        if pos + length > end:
            raise InvalidArgument(
                f"truncated FlightData: field {number} declares {length} bytes, {end - pos} remain"
            )
        value = buf[pos : pos + length]
        pos += length
        if number == FIELD_DATA_HEADER:
            header = value
        elif number == FIELD_DATA_BODY:
            body = value
        elif number == FIELD_APP_METADATA:
            app_metadata = value
        else:
            descriptor = value
    return FlightDataView(descriptor, header, app_metadata, body)


_ALIGNED: Final = pa.ipc.IpcReadOptions(ensure_alignment=pa.ipc.Alignment.DataTypeSpecific)
"""A large body is read where it arrived (not copied), at whatever offset its protobuf framing
left it: a buffer not aligned for its type is copied to one that is. Acero warns on every
unaligned input ("could lead to crashes or poor performance") and DuckDB scans Arrow tables
through it: each large DoPut from pyarrow's client printed three such warnings."""


class FlightDataDecoder:
    """Turns a stream of FlightData views back into record batches.

    The first data message must carry the schema. Messages with only app_metadata are allowed
    anywhere (they yield no batch). Any inconsistency raises InvalidArgument, never a hang; a
    batch that would decode to more than `max_decoded_size` bytes raises ResourceExhausted
    before anything is decompressed.

    A schema without dictionaries needs no reader state: its small batches are read in one
    Arrow call each (the stream reader pulls every piece of a message through Python reads,
    ~48 us for a schema and a one-row batch against ~7), its large ones by a stream reader
    opened when the first comes (their bodies are not copied).
    """

    def __init__(self, max_decoded_size: int | None = DEFAULT_MAX_DECODED_SIZE) -> None:
        self.max_decoded_size = max_decoded_size
        self._feed = IpcMessageFeed()
        self._reader: pa.ipc.RecordBatchStreamReader | None = None
        self._schema_header: bytes | None = None  # a plain stream's, for a reader opened later
        self.schema: pa.Schema | None = None

    def feed(self, message: FlightDataView) -> pa.RecordBatch | None:
        """Consume one message; return the batch it completes, if any."""
        if not len(message.header):
            if len(message.body):
                raise InvalidArgument("FlightData has a body but no data_header")
            return None
        kind, body_length = peek_message(message.header)
        if body_length != len(message.body):
            raise InvalidArgument(
                f"FlightData body is {len(message.body)} bytes, its header declares {body_length}"
            )
        try:
            if kind == MessageKind.SCHEMA:
                self._read_schema(message)
                return None
            if self.schema is None:
                raise InvalidArgument(
                    f"FlightData stream must start with a schema, got message kind {kind}"
                )
            if kind in (MessageKind.DICTIONARY_BATCH, MessageKind.RECORD_BATCH):
                self._check_decoded_size(message)
            if kind == MessageKind.DICTIONARY_BATCH:
                if self._schema_header is not None:
                    raise InvalidArgument(
                        "FlightData stream sent a dictionary batch; its schema has no"
                        " dictionary fields"
                    )
                self._feed.push(message.header, message.body)
                return None
            if kind == MessageKind.RECORD_BATCH:
                batch = self._read_batch(message)
                batch.validate()  # O(columns): buffers must fit the schema before kernels run
                return batch
        except (pa.ArrowInvalid, pa.ArrowIOError, pa.ArrowNotImplementedError, OSError) as exc:
            raise InvalidArgument(f"invalid Arrow IPC message in FlightData: {exc}") from None
        except StopIteration:
            raise InvalidArgument("FlightData stream ended inside a message") from None
        raise InvalidArgument(f"unsupported Arrow IPC message kind {kind} in FlightData")

    def _read_schema(self, message: FlightDataView) -> None:
        if self.schema is not None:
            raise InvalidArgument("FlightData stream sent a second schema")
        schema = pa.ipc.read_schema(_encapsulated(message.header, message.body))
        if any(_has_dictionary(field.type) for field in schema):
            self._feed.push(message.header, message.body)
            self._reader = pa.ipc.open_stream(self._feed, options=_ALIGNED)
            self.schema = self._reader.schema
        else:
            self._schema_header = bytes(message.header)
            self.schema = schema

    def _read_batch(self, message: FlightDataView) -> pa.RecordBatch:
        if self._schema_header is not None and len(message.body) <= SMALL_MESSAGE_BYTES:
            ipc = pa.ipc.read_message(_encapsulated(message.header, message.body))
            return pa.ipc.read_record_batch(ipc, self.schema)
        if self._reader is None:  # a plain stream's first large batch
            assert self._schema_header is not None
            self._feed.push(memoryview(self._schema_header), memoryview(b""))
            self._reader = pa.ipc.open_stream(self._feed, options=_ALIGNED)
        self._feed.push(message.header, message.body)
        batch = self._reader.read_next_batch()
        if self._feed.pending:
            raise InvalidArgument("FlightData record batch has trailing bytes")
        return batch

    def _check_decoded_size(self, message: FlightDataView) -> None:
        limit = self.max_decoded_size
        if limit is None:
            return
        decoded = decoded_body_bytes(message.header, message.body)
        if decoded > limit:
            raise ResourceExhausted(
                f"FlightData batch decodes to {decoded} bytes, over the limit of {limit}"
                " (max_decoded_size)"
            )
