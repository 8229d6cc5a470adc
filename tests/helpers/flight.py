"""Flight test plumbing: start flightfeed servers, drive pyarrow's blocking C++ client off-loop.

The flightfeed server runs on the test's event loop, so every call of pyarrow's C++ client
must run in a worker thread (`in_thread`), or the loop could never answer it.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio
import anyio.to_thread
import pyarrow as pa
import pyarrow.flight as fl

from flightfeed.errors import InvalidArgument, NotFound
from flightfeed.flight import (
    CallContext,
    FlightClient,
    FlightDataReader,
    FlightDataWriter,
    FlightDescriptor,
    FlightHandler,
    FlightServer,
    PutResultWriter,
    command_descriptor,
)

from .arrow_data import StreamCase, assert_stream_equal

T = TypeVar("T")
Received = list[tuple[pa.RecordBatch | None, bytes | None]]


async def in_thread(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run a blocking call (pyarrow's C++ Flight client) without blocking the event loop."""
    return await anyio.to_thread.run_sync(functools.partial(fn, *args, **kwargs))


@asynccontextmanager
async def running_server(handler: FlightHandler, **options: Any) -> AsyncIterator[str]:
    """A real FlightServer on 127.0.0.1, port 0; yields its grpc:// location."""
    async with FlightServer(handler, **options) as server:
        yield server.location


@contextmanager
def cpp_client(location: str, **options: Any) -> Iterator[fl.FlightClient]:
    client = fl.FlightClient(location, **options)
    try:
        yield client
    finally:
        client.close()


def descriptor_key(descriptor: FlightDescriptor | None) -> bytes:
    """The ticket a stored upload is served under: its command, or its path joined by '/'."""
    if descriptor is None:
        return b""
    return descriptor.cmd or "/".join(descriptor.path).encode()


def put_ack(index: int, batch: pa.RecordBatch | None, metadata: bytes | None) -> bytes:
    rows = -1 if batch is None else batch.num_rows
    return f"ack {index} rows={rows} meta=".encode() + (metadata or b"-")


@dataclass
class Stored:
    schema: pa.Schema
    items: Received
    options: Any = None
    descriptor: FlightDescriptor | None = None


class StoreHandler(FlightHandler):
    """Serves stored streams by ticket; DoPut stores uploads under their descriptor, acking
    every message with a PutResult; DoExchange echoes every message back."""

    def __init__(self) -> None:
        self.streams: dict[bytes, Stored] = {}
        self.gets_finished = 0

    def add(self, ticket: bytes, case: StreamCase) -> None:
        items: Received = list(zip(case.batches, case.metadata, strict=True))
        self.streams[ticket] = Stored(case.schema, items, case.options)

    def lookup(self, ticket: bytes) -> Stored:
        try:
            ticket.decode()
        except UnicodeDecodeError:
            raise InvalidArgument(f"malformed ticket {ticket[:16]!r}: not UTF-8") from None
        stored = self.streams.get(ticket)
        if stored is None:
            raise NotFound(f"no stream for ticket {ticket.decode()!r}")
        return stored

    async def do_get(self, ctx: CallContext, ticket: bytes, writer: FlightDataWriter) -> None:
        stored = self.lookup(ticket)
        try:
            await writer.begin(stored.schema, options=stored.options)
            for batch, metadata in stored.items:
                if batch is None:
                    assert metadata is not None
                    await writer.write_metadata(metadata)
                else:
                    await writer.write(batch, metadata)
        finally:
            self.gets_finished += 1

    async def do_put(
        self, ctx: CallContext, reader: FlightDataReader, results: PutResultWriter
    ) -> None:
        schema = await reader.read_schema()
        items: Received = []
        async for batch, metadata in reader.with_metadata():
            await results.write(put_ack(len(items), batch, metadata))
            items.append((batch, metadata))
        key = descriptor_key(reader.descriptor)
        self.streams[key] = Stored(schema, items, descriptor=reader.descriptor)

    async def do_exchange(
        self, ctx: CallContext, reader: FlightDataReader, writer: FlightDataWriter
    ) -> None:
        while True:
            item = await reader.next()
            if writer.schema is None and reader.schema is not None:
                await writer.begin(reader.schema)  # echo the schema as soon as it is known
            if item is None:
                return
            batch, metadata = item
            if batch is None:
                assert metadata is not None
                await writer.write_metadata(metadata)
            else:
                await writer.write(batch, metadata)


def cpp_read(reader: Any) -> tuple[pa.Schema, Received]:
    """Every message of a pyarrow FlightStreamReader, as (batch, app_metadata) pairs."""
    schema = reader.schema
    items: Received = []
    while True:
        try:
            chunk = reader.read_chunk()
        except StopIteration:
            return schema, items
        meta = chunk.app_metadata
        items.append((chunk.data, None if meta is None else meta.to_pybytes()))


def cpp_do_get(location: str, ticket: bytes) -> tuple[pa.Schema, Received]:
    with cpp_client(location) as client:
        return cpp_read(client.do_get(fl.Ticket(ticket)))


def cpp_do_put(location: str, descriptor: fl.FlightDescriptor, case: StreamCase) -> list[bytes]:
    """Upload a case with pyarrow's client, reading each PutResult before the next write."""
    options = fl.FlightCallOptions(write_options=case.options) if case.options else None
    acks: list[bytes] = []
    with cpp_client(location) as client:
        writer, results = client.do_put(descriptor, case.schema, options=options)
        for batch, metadata in zip(case.batches, case.metadata, strict=True):
            if metadata is None:
                writer.write_batch(batch)
            else:
                writer.write_with_metadata(batch, pa.py_buffer(metadata))
            acks.append(results.read().to_pybytes())
        writer.done_writing()
        writer.close()
    return acks


async def ff_do_get(location: str, ticket: bytes) -> tuple[pa.Schema, Received]:
    async with FlightClient(location) as client, client.do_get(ticket) as reader:
        items = [item async for item in reader.with_metadata()]
        if reader.schema is None:
            raise AssertionError("stream ended without a schema")
        return reader.schema, items


async def as_source(
    case: StreamCase,
) -> AsyncIterator[tuple[pa.RecordBatch, bytes | None]]:
    for batch, metadata in zip(case.batches, case.metadata, strict=True):
        yield batch, metadata


def expected_acks(case: StreamCase) -> list[bytes]:
    return [
        put_ack(i, batch, meta)
        for i, (batch, meta) in enumerate(zip(case.batches, case.metadata, strict=True))
    ]


async def doget_both_clients(case: StreamCase) -> None:
    """Serve `case`; pyarrow's C++ client and flightfeed's client must each read it intact."""
    store = StoreHandler()
    store.add(b"ticket", case)
    async with running_server(store) as location:
        schema, received = await in_thread(cpp_do_get, location, b"ticket")
        assert_stream_equal(case, schema, received)
        schema, received = await ff_do_get(location, b"ticket")
        assert_stream_equal(case, schema, received)


async def doput_both_clients(case: StreamCase) -> None:
    """Upload `case` with each client; the server must store it intact and ack every batch."""
    store = StoreHandler()
    async with running_server(store) as location:
        descriptor = fl.FlightDescriptor.for_command(b"from-cpp")
        assert await in_thread(cpp_do_put, location, descriptor, case) == expected_acks(case)
        stored = store.streams[b"from-cpp"]
        assert_stream_equal(case, stored.schema, stored.items)

        ff_descriptor = command_descriptor(b"from-ff")
        async with FlightClient(location) as client:
            acks = await client.do_put(ff_descriptor, case.schema, as_source(case))
        assert acks == expected_acks(case)
        stored = store.streams[descriptor_key(ff_descriptor)]
        assert stored.descriptor == ff_descriptor
        assert_stream_equal(case, stored.schema, stored.items)


async def assert_serves(location: str, handler: StoreHandler, *, ticket: bytes = b"ok") -> None:
    """A fresh client on a new connection still gets a normal DoGet from the server."""
    table = pa.table({"n": pa.array(range(1000), pa.int64()), "s": ["x"] * 1000})
    handler.add(ticket, StreamCase("ok", table.schema, table.to_batches(max_chunksize=300)))
    async with FlightClient(location) as client:
        got = await client.do_get(ticket).read_all()
    assert got.equals(table)


def batches_of(items: Sequence[tuple[pa.RecordBatch | None, bytes | None]]) -> list[Any]:
    return [batch for batch, _ in items if batch is not None]
