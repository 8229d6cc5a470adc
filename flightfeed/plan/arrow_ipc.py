"""Arrow IPC in plans: written canonically, read from untrusted bytes defensively.

Reading validates every batch fully (Arrow's IPC reader trusts buffer contents otherwise) and
checks that every field name is UTF-8, so a hostile plan fails here with PlanDecodeError
instead of later, or in C++. Before Arrow reads anything, the size the stream decodes to (its
compressed buffers declare it, see ipcwire.py) is checked against a limit: a few kilobytes of
zstd must not become gigabytes.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from ..errors import FlightfeedError, PlanDecodeError, ResourceExhausted
from ..ipcwire import decoded_body_bytes


def write_ipc_stream(schema: pa.Schema, batches: Sequence[pa.RecordBatch]) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema) as writer:
        for batch in batches:
            writer.write_batch(batch)
    return bytes(sink.getvalue().to_pybytes())


def decoded_stream_bytes(data: bytes, what: str) -> int:
    """Bytes the stream's message bodies take once decoded, read from their headers only."""
    total = 0
    try:
        reader = pa.ipc.MessageReader.open_stream(pa.py_buffer(data))
        for message in reader:
            body = message.body
            total += decoded_body_bytes(message.metadata, body if body is not None else b"")
    except Exception as exc:  # untrusted bytes: every failure is a decode error
        raise PlanDecodeError(f"{what} is not valid Arrow IPC: {exc}") from exc
    return total


def read_ipc_stream(
    data: bytes, what: str, *, max_decoded_bytes: int | None
) -> tuple[pa.Schema, list[pa.RecordBatch]]:
    """Schema and batches of an IPC stream; PlanDecodeError naming `what` if anything is off,
    ResourceExhausted if it would decode to more than `max_decoded_bytes`."""
    if max_decoded_bytes is not None:
        decoded = decoded_stream_bytes(data, what)
        if decoded > max_decoded_bytes:
            raise ResourceExhausted(
                f"{what} decodes to {decoded} bytes, over the limit of {max_decoded_bytes}"
            )
    try:
        reader = pa.ipc.open_stream(pa.py_buffer(data))
        batches = list(reader)
        check_schema(reader.schema)
        for batch in batches:
            batch.validate(full=True)
            _ = batch.columns  # pyarrow has no Python class for some types (KeyError)
    except FlightfeedError:
        raise
    except Exception as exc:  # untrusted bytes: every failure is a decode error
        raise PlanDecodeError(f"{what} is not valid Arrow IPC: {exc}") from exc
    return reader.schema, batches


def read_ipc_schema(data: bytes, what: str) -> pa.Schema:
    try:
        schema = pa.ipc.read_schema(pa.py_buffer(data))
        check_schema(schema)
        _ = [pa.nulls(0, field.type) for field in schema]
    except Exception as exc:  # untrusted bytes: every failure is a decode error
        raise PlanDecodeError(f"{what} is not a valid Arrow IPC schema: {exc}") from exc
    return schema


def check_schema(schema: pa.Schema) -> None:
    """Raise UnicodeDecodeError (a ValueError) if any field name, nested ones too, is not UTF-8."""
    for field in schema:
        _check_field(field)


def _check_field(field: pa.Field) -> None:
    _ = field.name  # decodes the name: UnicodeDecodeError if it is not UTF-8
    _check_type(field.type)


def _check_type(type_: pa.DataType) -> None:
    t = pa.types
    if t.is_struct(type_) or t.is_union(type_):
        for i in range(type_.num_fields):
            _check_field(type_.field(i))
    elif t.is_map(type_):
        _check_field(type_.key_field)
        _check_field(type_.item_field)
    elif hasattr(type_, "value_field"):  # every list flavour, run-end encoded
        _check_field(type_.value_field)
    elif t.is_dictionary(type_):
        _check_type(type_.value_type)
    elif isinstance(type_, pa.ExtensionType | pa.BaseExtensionType):
        _check_type(type_.storage_type)
