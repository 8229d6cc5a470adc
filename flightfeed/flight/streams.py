"""Arrow streams over one gRPC call: write batches as FlightData, read them back.

Both sides of every Flight data RPC (DoGet, DoPut, DoExchange, ExecuteTask) use these two
classes, on either the server's or the client's grpclib stream.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pyarrow as pa
from grpclib.exceptions import StreamTerminatedError
from grpclib.protocol import Stream as H2Stream

from .._generated.arrow.flight.protocol import FlightDescriptor
from ..errors import Cancelled, InvalidArgument
from ..messages import parse_strict
from .codec import (
    DEFAULT_MAX_DECODED_SIZE,
    FlightDataDecoder,
    FlightDataEncoder,
    decode_flight_data,
    encode_flight_data,
)
from .wakeup import cancel_baseline, forget_wakeup_cancel
from .wire import DEFAULT_MAX_MESSAGE_SIZE, recv_raw_view, send_encoded


class FlightDataWriter:
    """Writes one Arrow stream as FlightData messages, zero-copy for batch bodies."""

    def __init__(self, stream: H2Stream, before_first_write: Any = None) -> None:
        self._stream = stream
        self._encoder: FlightDataEncoder | None = None
        self._before_first_write = before_first_write

    async def _ready(self) -> None:
        if self._before_first_write is not None:
            hook, self._before_first_write = self._before_first_write, None
            await hook()

    @property
    def schema(self) -> pa.Schema | None:
        return self._encoder.schema if self._encoder else None

    async def begin(
        self,
        schema: pa.Schema,
        descriptor: FlightDescriptor | None = None,
        options: pa.ipc.IpcWriteOptions | None = None,
    ) -> None:
        """Send the schema (with the descriptor, for the first message of a DoPut/DoExchange)."""
        if self._encoder is not None:
            raise RuntimeError("stream already started")
        await self._ready()
        self._encoder = FlightDataEncoder(schema, options)
        message = self._encoder.schema_message(bytes(descriptor) if descriptor else None)
        await send_encoded(self._stream, message)

    async def write(self, batch: pa.RecordBatch, app_metadata: bytes | None = None) -> None:
        """Send one record batch (and any dictionaries it needs first)."""
        if self._encoder is None:
            await self.begin(batch.schema)
        assert self._encoder is not None
        for message in self._encoder.encode(batch, app_metadata):
            await send_encoded(self._stream, message)

    async def write_table(self, table: pa.Table, max_chunksize: int | None = None) -> None:
        if self._encoder is None:
            await self.begin(table.schema)
        for batch in table.to_batches(max_chunksize):
            await self.write(batch)

    async def write_metadata(self, app_metadata: bytes) -> None:
        """A FlightData with only app_metadata (no batch)."""
        await self._ready()
        await send_encoded(self._stream, encode_flight_data(app_metadata=app_metadata))


class FlightDataReader:
    """Reads FlightData messages from a stream and yields (batch, app_metadata) pairs.

    `batch` is None for metadata-only messages. The descriptor of the first message (DoPut,
    DoExchange) is available as `descriptor` once the first message is read. A message may be
    `max_message_size` bytes on the wire and its batch `max_decoded_size` bytes decoded.
    """

    def __init__(
        self,
        stream: H2Stream,
        max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
        before_first_read: Any = None,
        guard: Any = None,
        at_end: Any = None,
        translate: Any = None,
        max_decoded_size: int | None = DEFAULT_MAX_DECODED_SIZE,
    ) -> None:
        self._stream = stream
        # Called once at end of stream (client side: read the status, so a failed call raises
        # at the read that reached the end, not later when the call is closed).
        self._at_end = at_end
        # Client side: turns grpclib's StreamTerminatedError into the call's FlightfeedError.
        self._translate = translate
        # grpclib interrupts waits inside a call's wrapper when the connection dies; raw reads
        # must wait inside it too, or a closed channel would leave them waiting forever.
        self._guard = guard
        self._decoder = FlightDataDecoder(max_decoded_size)
        self._max = max_message_size
        self._before_first_read = before_first_read
        self._first = True
        self._done = False
        self.descriptor: FlightDescriptor | None = None

    @property
    def schema(self) -> pa.Schema | None:
        return self._decoder.schema

    @property
    def finished(self) -> bool:
        """Whether the stream was read to its end."""
        return self._done

    async def read_schema(self) -> pa.Schema:
        """Read messages until the schema has arrived (the stream's first message)."""
        while self._decoder.schema is None:
            item = await self._next_message()
            if item is None:
                raise InvalidArgument("Flight stream ended before its schema")
            batch, metadata = item
            if batch is not None or metadata is not None:
                raise InvalidArgument("Flight stream sent data before its schema")
        return self._decoder.schema

    async def _next_message(self) -> tuple[pa.RecordBatch | None, bytes | None] | None:
        if self._done:
            return None
        if self._before_first_read is not None:
            hook, self._before_first_read = self._before_first_read, None
            await hook()
        if self._guard is not None:
            task, baseline = cancel_baseline()
            try:
                with self._guard:
                    data = await recv_raw_view(self._stream, self._max)
            except StreamTerminatedError as exc:
                forget_wakeup_cancel(self._guard, task, baseline)
                if self._translate is None:
                    raise Cancelled(f"stream terminated: {exc}") from None
                raise self._translate(exc) from None
        else:
            data = await recv_raw_view(self._stream, self._max)
        if data is None:
            self._done = True
            if self._at_end is not None:
                hook, self._at_end = self._at_end, None
                await hook()
            return None
        view = decode_flight_data(data)
        if self._first:
            self._first = False
            if view.descriptor is not None:
                self.descriptor = parse_strict(FlightDescriptor, bytes(view.descriptor))
        batch = self._decoder.feed(view)
        metadata = bytes(view.app_metadata) if view.app_metadata is not None else None
        return batch, metadata

    async def next(self) -> tuple[pa.RecordBatch | None, bytes | None] | None:
        """The next batch or metadata-only message; None at end of stream."""
        while True:
            item = await self._next_message()
            if item is None:
                return None
            batch, metadata = item
            if batch is not None or metadata is not None:
                return item

    def __aiter__(self) -> FlightDataReader:
        return self

    async def __anext__(self) -> pa.RecordBatch:
        """The next batch (metadata-only messages skipped). Not a generator: a reader left
        early has nothing for the garbage collector's event-loop task to close."""
        while (item := await self.next()) is not None:
            if item[0] is not None:
                return item[0]
        raise StopAsyncIteration

    async def with_metadata(self) -> AsyncIterator[tuple[pa.RecordBatch | None, bytes | None]]:
        """Every message, metadata-only ones included."""
        while (item := await self.next()) is not None:
            yield item

    async def read_all(self) -> pa.Table:
        batches = [batch async for batch in self]
        if self.schema is None:
            raise InvalidArgument("Flight stream ended before its schema")
        return pa.Table.from_batches(batches, schema=self.schema)
