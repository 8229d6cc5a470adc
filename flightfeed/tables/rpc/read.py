"""Read: a table's rows, streamed as ArrowPayloads of one IPC stream per batch.

Each response is written as views of the batch's own buffers inside protobuf framing (the data
is never copied on the way out), compressed only while that pays (payload.Compressor, on a
worker thread), and read and encoded a batch ahead of the sending. An error after the first
batch ends the stream with a response whose header carries it, as HoraeDB does.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from functools import partial
from typing import Final

import anyio
import pyarrow as pa

from ..._generated.common import ResponseHeader
from ..._generated.remote_engine import ReadRequest, ReadResponse
from ...concurrency import off_loop
from ...flight.codec import EncodedMessage, grpc_message
from ...flight.ipc import Buffer
from ...plan.base import closing
from ...plan.merge import prefetch
from ...protowire import encode_varint, field_key, len_field_header
from ..engine import TableEngine, TableRead
from ..headers import INTERNAL, error_header
from ..payload import Compressor, ipc_stream_pieces
from ..requests import deadline_seconds, predicate_bytes, table_name, table_read

# ReadResponse { header = 1; arrow = 2 }; ArrowPayload { record_batches = 1; compression = 2 }
_OK_HEADER_FIELD: Final = len_field_header(1, 0)
_ZSTD_FIELD: Final = field_key(2, 0) + encode_varint(1)

Send = Callable[[EncodedMessage], Awaitable[None]]
PREFETCH_RESPONSES: Final = 2
"""Responses read and encoded ahead of the one being sent."""


def read_response(
    pieces: Sequence[Buffer], size: int, *, compressed: bool = False
) -> EncodedMessage:
    """A ReadResponse with an ok header and one payload element (held as `pieces` of `size`
    bytes in all), as buffer views: protobuf framing around the pieces, no copy of them."""
    inner_tail = _ZSTD_FIELD if compressed else b""
    element_field = len_field_header(1, size)
    payload_size = len(element_field) + size + len(inner_tail)
    arrow_field = len_field_header(2, payload_size)
    head = _OK_HEADER_FIELD + arrow_field + element_field
    parts = (head, *pieces, inner_tail) if inner_tail else (head, *pieces)
    return grpc_message(parts, len(head) + size + len(inner_tail))


async def encoded_batches(
    batches: AsyncIterator[pa.RecordBatch], compressor: Compressor
) -> AsyncIterator[EncodedMessage]:
    """One ReadResponse per batch, a batch ahead of the sending (the next is read and encoded
    while this one goes out, by a task of its own, which also closes `batches`: the task that
    iterated them)."""
    encoded = prefetch(_encoded(batches, compressor), PREFETCH_RESPONSES)
    async with closing(encoded) as messages:
        async for message in messages:
            yield message


async def _encoded(
    batches: AsyncIterator[pa.RecordBatch], compressor: Compressor
) -> AsyncIterator[EncodedMessage]:
    """The IPC framing is written on the loop: views of the batch's buffers, ~25 us whatever
    the batch's size, where a thread hop each way would wait for a loop busy sending. zstd,
    when it is tried, runs on a worker thread."""
    async with closing(batches):
        async for batch in batches:
            pieces, size = ipc_stream_pieces(batch)
            packed = None
            if compressor.tries(size):
                packed = await anyio.to_thread.run_sync(compressor.compress_tried, pieces)
            if packed is None:
                yield read_response(pieces, size)
            else:
                yield read_response([packed], len(packed), compressed=True)


def response_message(response: ReadResponse) -> EncodedMessage:
    data = bytes(response)
    return grpc_message((data,), len(data))


async def serve_read(
    engine: TableEngine, request: ReadRequest, send: Send, compressor: Compressor
) -> None:
    """Runs the read to its end, its deadline, or its first error (sent as a header)."""
    read_request = request.read_request
    options = read_request.opts if read_request is not None else None
    timeout_ms = options.timeout_ms if options is not None else -1
    try:
        with anyio.fail_after(deadline_seconds(timeout_ms)):
            name = table_name(request.table)
            schema = engine.entry(name).schema
            # Predicates decode off the loop when large: an IN list of 100,000 values (780 KB)
            # held the loop 2.4 s.
            read: TableRead = await off_loop(
                partial(table_read, name, read_request),
                schema,
                nbytes=predicate_bytes(read_request),
            )
            async with closing(encoded_batches(engine.read(read), compressor)) as messages:
                async for message in messages:
                    await send(message)
    except TimeoutError:
        header = ResponseHeader(code=INTERNAL, error=f"Read timed out after {timeout_ms} ms")
        await send(response_message(ReadResponse(header=header)))
    except anyio.get_cancelled_exc_class():
        raise
    except Exception as exc:
        await send(response_message(ReadResponse(header=error_header(exc, "Read"))))


__all__ = ["encoded_batches", "read_response", "response_message", "serve_read"]
