"""Schema bytes as Flight carries them (FlightInfo.schema, SchemaResult.schema)."""

from __future__ import annotations

import pyarrow as pa

from ..errors import InvalidArgument


def schema_to_ipc(schema: pa.Schema) -> bytes:
    """Encapsulated IPC Schema message: continuation, length, flatbuffer."""
    data: bytes = schema.serialize().to_pybytes()
    return data


def schema_from_ipc(data: bytes) -> pa.Schema:
    """Parse an encapsulated IPC Schema message, with a clear error for anything else."""
    if not data:
        raise InvalidArgument("empty schema bytes")
    try:
        return pa.ipc.read_schema(pa.py_buffer(data))
    except (pa.ArrowInvalid, pa.ArrowIOError, OSError) as exc:
        raise InvalidArgument(f"invalid IPC schema: {exc}") from None
