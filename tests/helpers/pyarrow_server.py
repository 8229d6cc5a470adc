"""A pyarrow (C++) Flight server, the reference peer for flightfeed's client."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.flight as fl

TOKEN = b"token-for-alice"
SCHEMA = pa.schema(
    [pa.field("id", pa.int64()), pa.field("name", pa.string())], metadata={"source": "pyarrow"}
)


def sample_table(rows: int = 1000) -> pa.Table:
    return pa.table(
        {"id": pa.array(range(rows), pa.int64()), "name": [f"n{i}" for i in range(rows)]},
        schema=SCHEMA,
    )


class ReferenceAuth(fl.ServerAuthHandler):  # type: ignore[misc]
    """Handshake: password in, token out. Calls without a token are anonymous."""

    def authenticate(self, outgoing: Any, incoming: Any) -> None:
        password = incoming.read()
        if password != b"secret":
            raise fl.FlightUnauthenticatedError("wrong password")
        outgoing.write(TOKEN)
        outgoing.write(b"welcome")

    def is_valid(self, token: bytes) -> str:
        if not token:
            return ""
        if token != TOKEN:
            raise fl.FlightUnauthenticatedError("invalid token")
        return "alice"


class ReferenceServer(fl.FlightServerBase):  # type: ignore[misc]
    """Serves every Flight RPC with fixed, checkable answers; stores DoPut uploads."""

    def __init__(self) -> None:
        super().__init__("grpc://127.0.0.1:0", auth_handler=ReferenceAuth())
        self.location = f"grpc://127.0.0.1:{self.port}"
        self.uploads: dict[bytes, tuple[pa.Schema, list[tuple[Any, bytes | None]]]] = {}
        self.lock = threading.Lock()

    def info(self, descriptor: fl.FlightDescriptor) -> fl.FlightInfo:
        endpoints = [
            fl.FlightEndpoint(b"t-0", [self.location]),
            fl.FlightEndpoint(
                b"t-1", [fl.Location("grpc://replica-a:1"), fl.Location("grpc://replica-b:2")]
            ),
        ]
        return fl.FlightInfo(SCHEMA, descriptor, endpoints, 1000, 12345, app_metadata=b"info-md")

    def list_flights(self, context: Any, criteria: bytes) -> Iterator[fl.FlightInfo]:
        for name in (b"alpha", b"beta"):
            yield self.info(fl.FlightDescriptor.for_command(name + b"|" + criteria))

    def get_flight_info(self, context: Any, descriptor: fl.FlightDescriptor) -> fl.FlightInfo:
        if descriptor.command == b"missing":
            raise fl.FlightServerError("no such flight")
        return self.info(descriptor)

    def get_schema(self, context: Any, descriptor: fl.FlightDescriptor) -> fl.SchemaResult:
        return fl.SchemaResult(SCHEMA)

    def do_get(self, context: Any, ticket: fl.Ticket) -> fl.FlightDataStream:
        key = ticket.ticket
        if key == b"table":
            return fl.RecordBatchStream(sample_table())
        if key == b"with-metadata":
            batches = sample_table().to_batches(max_chunksize=300)
            return fl.GeneratorStream(
                SCHEMA, ((b, pa.py_buffer(f"m{i}".encode())) for i, b in enumerate(batches))
            )
        with self.lock:
            upload = self.uploads.get(key)
        if upload is None:
            raise KeyError(f"unknown ticket {key!r}")
        schema, items = upload
        return fl.GeneratorStream(schema, ((b, m) for b, m in items if b is not None))

    def do_put(self, context: Any, descriptor: Any, reader: Any, writer: Any) -> None:
        if descriptor.command == b"reject":
            raise fl.FlightUnauthorizedError("uploads to 'reject' are not allowed")
        items: list[tuple[Any, bytes | None]] = []
        while True:
            try:
                chunk = reader.read_chunk()
            except StopIteration:
                break
            meta = None if chunk.app_metadata is None else chunk.app_metadata.to_pybytes()
            items.append((chunk.data, meta))
            rows = -1 if chunk.data is None else chunk.data.num_rows
            writer.write(pa.py_buffer(f"stored {len(items)} rows={rows}".encode()))
        with self.lock:
            self.uploads[descriptor.command or b"/".join(descriptor.path)] = (
                reader.schema,
                items,
            )

    def do_exchange(self, context: Any, descriptor: Any, reader: Any, writer: Any) -> None:
        """Echo each batch with a doubled `x` column; answer metadata with its upper case."""
        started = False
        while True:
            try:
                chunk = reader.read_chunk()
            except StopIteration:
                break
            meta = chunk.app_metadata
            if chunk.data is None:
                writer.write_metadata(pa.py_buffer(meta.to_pybytes().upper()))
                continue
            batch = chunk.data
            doubled = pa.record_batch([pc.multiply(batch.column("x"), 2)], names=["x2"])
            if not started:
                writer.begin(doubled.schema)
                started = True
            reply = pa.py_buffer(descriptor.command + b":" + (meta.to_pybytes() if meta else b""))
            writer.write_with_metadata(doubled, reply)

    def do_action(self, context: Any, action: fl.Action) -> Iterator[bytes]:
        if action.type == "count":
            n = int(action.body.to_pybytes())
            for i in range(n):
                yield str(i).encode()
        elif action.type == "whoami":
            yield context.peer_identity()
        elif action.type == "fail":
            raise fl.FlightInternalError("the action failed on purpose")
        else:
            raise NotImplementedError(action.type)

    def list_actions(self, context: Any) -> list[tuple[str, str]]:
        return [("count", "yields 0..n-1"), ("whoami", "the caller's identity")]
