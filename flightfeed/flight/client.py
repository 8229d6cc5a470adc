"""An asyncio Flight client on grpclib, speaking to any Flight server.

Data calls read and write FlightData through the same zero-copy codec as the server. A failed
call raises the FlightfeedError the client's ErrorMapping makes of its status: RemoteError with
the status by default; with flightfeed.protocol.TYPED_ERRORS, the very error a flightfeed
server raised (class, message, origin).
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import AsyncIterable, AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager, suppress
from functools import partial
from types import TracebackType
from typing import Any, Self, TypeVar
from urllib.parse import urlparse

import anyio
import anyio.lowlevel
import grpclib.client
import pyarrow as pa
from grpclib.const import Cardinality, Status
from grpclib.exceptions import GRPCError, StreamTerminatedError
from grpclib.metadata import decode_metadata
from h2.exceptions import StreamClosedError

from .._generated.arrow.flight.protocol import (
    Action,
    ActionType,
    Criteria,
    Empty,
    FlightDescriptor,
    FlightDescriptorDescriptorType,
    FlightInfo,
    HandshakeRequest,
    HandshakeResponse,
    PollInfo,
    PutResult,
    Result,
    SchemaResult,
    Ticket,
)
from ..errors import FlightfeedError, InvalidArgument, RemoteError
from .codec import DEFAULT_MAX_DECODED_SIZE
from .errors import PLAIN_ERRORS, ErrorMapping
from .grpc import GrpcChannel, RawBytes
from .internals import (
    call_wrapper,
    mark_request_ended,
    raw_status,
    raw_stream,
    raw_trailing_headers,
    request_ended,
)
from .keepalive import KeepalivePolicy
from .request_headers import call_metadata
from .schema import schema_from_ipc
from .streams import FlightDataReader, FlightDataWriter
from .tls import TLS_SCHEME, ClientTls, is_tls_location
from .wakeup import forget_wakeup_cancel as _forget
from .wire import DEFAULT_MAX_MESSAGE_SIZE

T = TypeVar("T")

SERVICE = "/arrow.flight.protocol.FlightService/"
_SURFACED: weakref.WeakSet[Any] = weakref.WeakSet()
"""Calls whose error status was already raised where their stream was read, so leaving the
call does not raise it a second time."""
Metadata = Mapping[str, str | bytes]
BatchSource = AsyncIterable[pa.RecordBatch] | AsyncIterable[tuple[pa.RecordBatch, bytes | None]]


def parse_location(location: str) -> tuple[str, int]:
    """`grpc://host:port` (or grpc+tcp://, grpc+tls://, or bare host:port) → (host, port)."""
    want = "want grpc://host:port or grpc+tls://host:port"
    try:
        url = urlparse(location if "://" in location else f"grpc://{location}")
        port = url.port
    except ValueError as exc:  # a port not a number or past 65535, a bracket left open
        raise InvalidArgument(f"unsupported Flight location {location!r} ({exc}): {want}") from None
    if url.scheme not in ("grpc", "grpc+tcp", TLS_SCHEME) or not url.hostname or port is None:
        raise InvalidArgument(f"unsupported Flight location {location!r}: {want}")
    try:
        url.hostname.encode("idna")  # (what connecting does: it would fail there, unnamed)
    except UnicodeError:
        raise InvalidArgument(
            f"unsupported Flight location {location!r}: {url.hostname!r} is not a host name"
            " (a label is empty or longer than 63 characters)"
        ) from None
    return url.hostname, port


def path_descriptor(*path: str) -> FlightDescriptor:
    return FlightDescriptor(type=FlightDescriptorDescriptorType.PATH, path=list(path))


def command_descriptor(command: bytes) -> FlightDescriptor:
    return FlightDescriptor(type=FlightDescriptorDescriptorType.CMD, cmd=command)


def _trailers(stream: Any) -> Any:
    """Trailing metadata of a failed call, also when grpclib raised before recording it
    (a reset stream: the status comes from the raw trailers or trailers-only headers)."""
    recorded = getattr(stream, "trailing_metadata", None)
    if recorded is not None or stream is None:
        return recorded
    raw = raw_trailing_headers(stream)
    return decode_metadata(raw) if raw else None


async def cancel_if_unfinished(stream: Any, reader: FlightDataReader) -> None:
    """After a reader was left before its end: reset the stream so the server stops, instead
    of waiting for trailers it will not send. (On an exception grpclib resets it itself.)"""
    if reader.finished:
        return
    with anyio.CancelScope(shield=True), suppress(StreamTerminatedError, StreamClosedError):
        await stream.cancel()  # a dead connection needs no reset


def status_error(
    stream: grpclib.client.Stream[Any, Any], exc: GRPCError, errors: ErrorMapping
) -> FlightfeedError:
    """The FlightfeedError for a failed call's status, marked as surfaced so the call's
    exit does not raise it a second time."""
    _SURFACED.add(stream)
    return errors.error(exc.status, exc.message, _trailers(stream))


def call_error(stream: Any, exc: BaseException, errors: ErrorMapping) -> FlightfeedError:
    """The FlightfeedError for a failed call. A reset stream still reports the status the
    server sent before resetting (grpclib servers reset after error trailers)."""
    if isinstance(exc, GRPCError):
        return status_error(stream, exc, errors)
    sent = raw_status(stream) if stream is not None else None
    if sent is not None:
        return status_error(stream, GRPCError(*sent), errors)
    return RemoteError(str(exc) or type(exc).__name__, grpc_status=Status.UNAVAILABLE)


def status_checker(stream: grpclib.client.Stream[Any, Any], errors: ErrorMapping) -> Any:
    """An end-of-stream hook that raises the call's error status as a FlightfeedError."""

    async def check() -> None:
        if not request_ended(stream):
            # The server ended the call while we could still send (it refused a stream
            # midway): its status is the answer, and grpclib would refuse to read it.
            mark_request_ended(stream)
        try:
            await stream.recv_trailing_metadata()
        except GRPCError as exc:
            raise status_error(stream, exc, errors) from None

    return check


def forget_wakeup_cancel(stream: Any, task: Any, baseline: int) -> None:
    """See flight/wakeup.py: undo grpclib's wake-up cancel on this call's task."""
    _forget(call_wrapper(stream) if stream is not None else None, task, baseline)


def call_reader(
    stream: grpclib.client.Stream[Any, Any],
    max_message_size: int,
    errors: ErrorMapping,
    max_decoded_size: int | None = DEFAULT_MAX_DECODED_SIZE,
) -> FlightDataReader:
    """A reader of the FlightData a client call receives, surfacing the call's status as the
    FlightfeedError `errors` makes of it."""
    return FlightDataReader(
        raw_stream(stream),
        max_message_size,
        before_first_read=stream.recv_initial_metadata,
        guard=call_wrapper(stream),
        at_end=status_checker(stream, errors),
        translate=partial(call_error, stream, errors=errors),
        max_decoded_size=max_decoded_size,
    )


class DoGetCall:
    """A DoGet in flight: iterate it for batches, or `async with` it for the reader."""

    def __init__(self, client: FlightClient, ticket: bytes, metadata: Metadata | None) -> None:
        self._client = client
        self._ticket = ticket
        self._metadata = metadata
        self._context: Any = None
        self._stream: grpclib.client.Stream[Any, Any] | None = None
        self._reader: FlightDataReader | None = None

    async def __aenter__(self) -> FlightDataReader:
        self._context = self._client._call(
            "DoGet", Cardinality.UNARY_STREAM, Ticket, RawBytes, self._metadata
        )
        stream = await self._context.__aenter__()
        self._stream = stream
        await stream.send_message(Ticket(ticket=self._ticket), end=True)
        client = self._client
        self._reader = call_reader(
            stream, client.max_message_size, client.errors, client.max_decoded_size
        )
        return self._reader

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        if exc is None and self._stream is not None and self._reader is not None:
            await cancel_if_unfinished(self._stream, self._reader)
        result: bool | None = await self._context.__aexit__(exc_type, exc, tb)
        return result

    def __aiter__(self) -> AsyncIterator[pa.RecordBatch]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[pa.RecordBatch]:
        async with self as reader:
            async for batch in reader:
                yield batch

    async def read_all(self) -> pa.Table:
        async with self as reader:
            return await reader.read_all()


async def received(stream: AsyncIterator[T]) -> list[T]:
    """Every message of a stream, cancellable between any two. Under uvloop, a stream whose
    next message has always arrived by the time the task is cancelled never parks it on a
    pending future, and anyio delivers a cancellation only to a task so parked: a client that
    left a server streaming results fast (a DoAction under a cancelled scope) kept reading
    them, for as long as the server sent."""
    replies: list[T] = []
    async for reply in stream:
        replies.append(reply)
        await anyio.lowlevel.checkpoint_if_cancelled()
    return replies


class FlightClient:
    """Async client for one Flight server: any number of concurrent calls, over one HTTP/2
    connection while they fit the server's stream limit and a pool of them beyond it.

    `keepalive` pings a connection whose calls have gone quiet and fails those calls when the
    server stopped answering (off by default, as in gRPC: grpc-core servers limit pings).
    `errors` makes a FlightfeedError of a failed call's status (see errors.py).
    """

    def __init__(
        self,
        location: str,
        *,
        metadata: Metadata | None = None,
        max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
        timeout: float | None = None,
        keepalive: KeepalivePolicy | None = None,
        errors: ErrorMapping = PLAIN_ERRORS,
        max_decoded_size: int | None = DEFAULT_MAX_DECODED_SIZE,
        tls: ClientTls | None = None,
    ) -> None:
        """A `grpc+tls://` location is reached over TLS, checked against `tls.root_ca` (the
        system's roots without one) and presenting `tls`'s client certificate if it has one."""
        self.location = location
        self.host, self.port = parse_location(location)
        context = (tls or ClientTls()).context() if is_tls_location(location) else None
        self.metadata = call_metadata(metadata or {})
        self.max_message_size = max_message_size
        self.max_decoded_size = max_decoded_size
        self.timeout = timeout
        self.errors = errors
        self._channel = GrpcChannel(self.host, self.port, keepalive=keepalive, ssl=context)

    @property
    def connections(self) -> int:
        """HTTP/2 connections open to the server: one, plus one more for every
        SETTINGS_MAX_CONCURRENT_STREAMS calls open at once (see pool.py)."""
        return len(self._channel.connections)

    @property
    def received_in_place(self) -> tuple[int, int]:
        """Messages, and their bytes, the open connections received straight into buffers of
        their own: large FlightData messages are (see flight/message_buffer.py)."""
        return self._channel.received_in_place()

    async def close(self) -> None:
        self._channel.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _merged(self, metadata: Metadata | None) -> dict[str, str | bytes]:
        if not metadata:
            return dict(self.metadata)  # (a call's own: grpclib's events may change it)
        return {**self.metadata, **call_metadata(metadata)}

    @asynccontextmanager
    async def _call(
        self,
        method: str,
        cardinality: Cardinality,
        request_type: type,
        reply_type: type,
        metadata: Metadata | None,
        path: str = SERVICE,
    ) -> AsyncIterator[grpclib.client.Stream[Any, Any]]:
        """A grpclib call whose failures surface as FlightfeedErrors."""
        stream: grpclib.client.Stream[Any, Any] | None = None
        task = asyncio.current_task()
        baseline = task.cancelling() if task is not None else 0
        try:
            async with self._channel.request(
                path + method,
                cardinality,
                request_type,
                reply_type,
                timeout=self.timeout,
                metadata=self._merged(metadata),
            ) as stream:
                yield stream
        except (GRPCError, StreamTerminatedError) as exc:
            forget_wakeup_cancel(stream, task, baseline)
            if stream is not None and stream in _SURFACED:
                return  # the caller already got this status where it read the stream's end
            error = call_error(stream, exc, self.errors)
            if isinstance(error, RemoteError) and isinstance(exc, StreamTerminatedError):
                # (the server closed the connection: a TLS or mTLS refusal, a GOAWAY)
                error = RemoteError(
                    f"{method}: the connection to {self.location} was lost: {error.message}",
                    grpc_status=error.grpc_status,
                )
            raise error from None
        except (ConnectionError, OSError) as exc:
            raise RemoteError(
                f"{method}: cannot reach {self.location}: {exc}", grpc_status=Status.UNAVAILABLE
            ) from None

    async def _unary(
        self, method: str, request: Any, reply_type: type, metadata: Metadata | None
    ) -> Any:
        async with self._call(
            method, Cardinality.UNARY_UNARY, type(request), reply_type, metadata
        ) as stream:
            await stream.send_message(request, end=True)
            reply = await stream.recv_message()
        if reply is None:
            raise RemoteError(f"{method}: no reply", grpc_status=Status.INTERNAL)
        return reply

    async def _server_stream(
        self, method: str, request: Any, reply_type: type, metadata: Metadata | None
    ) -> list[Any]:
        async with self._call(
            method, Cardinality.UNARY_STREAM, type(request), reply_type, metadata
        ) as stream:
            await stream.send_message(request, end=True)
            return await received(stream)

    # --- RPCs -------------------------------------------------------------------------------

    async def handshake(
        self, payloads: Sequence[bytes] = (b"",), *, metadata: Metadata | None = None
    ) -> list[bytes]:
        """Send handshake payloads, return the server's payloads."""
        async with self._call(
            "Handshake", Cardinality.STREAM_STREAM, HandshakeRequest, HandshakeResponse, metadata
        ) as stream:
            for payload in payloads:
                await stream.send_message(HandshakeRequest(payload=payload))
            await stream.end()
            replies: list[HandshakeResponse] = await received(stream)
        return [reply.payload for reply in replies]

    async def list_flights(
        self, criteria: bytes = b"", *, metadata: Metadata | None = None
    ) -> list[FlightInfo]:
        return await self._server_stream(
            "ListFlights", Criteria(expression=criteria), FlightInfo, metadata
        )

    async def get_flight_info(
        self, descriptor: FlightDescriptor, *, metadata: Metadata | None = None
    ) -> FlightInfo:
        info: FlightInfo = await self._unary("GetFlightInfo", descriptor, FlightInfo, metadata)
        return info

    async def poll_flight_info(
        self, descriptor: FlightDescriptor, *, metadata: Metadata | None = None
    ) -> PollInfo:
        info: PollInfo = await self._unary("PollFlightInfo", descriptor, PollInfo, metadata)
        return info

    async def get_schema(
        self, descriptor: FlightDescriptor, *, metadata: Metadata | None = None
    ) -> pa.Schema:
        result: SchemaResult = await self._unary("GetSchema", descriptor, SchemaResult, metadata)
        return schema_from_ipc(result.schema)

    def do_get(self, ticket: bytes, *, metadata: Metadata | None = None) -> DoGetCall:
        """`async for batch in client.do_get(t)`, or `async with client.do_get(t) as reader`."""
        return DoGetCall(self, ticket, metadata)

    async def do_put(
        self,
        descriptor: FlightDescriptor,
        schema: pa.Schema,
        batches: BatchSource,
        *,
        metadata: Metadata | None = None,
    ) -> list[bytes]:
        """Upload batches (optionally paired with app_metadata); return the PutResults."""
        results: list[bytes] = []
        async with self._call(
            "DoPut", Cardinality.STREAM_STREAM, RawBytes, PutResult, metadata
        ) as stream:
            await stream.send_request()
            writer = FlightDataWriter(raw_stream(stream))

            async def upload() -> None:
                await writer.begin(schema, descriptor)
                async for item in batches:
                    if isinstance(item, tuple):
                        await writer.write(item[0], item[1])
                    else:
                        await writer.write(item)
                await stream.end()

            async def collect() -> None:
                results.extend([result.app_metadata async for result in stream])

            try:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(upload)
                    tg.start_soon(collect)
            except BaseExceptionGroup as group:
                # The server's status is the error; a failed upload is its consequence.
                raise _root_cause(group) from None
        return results

    @asynccontextmanager
    async def do_exchange(
        self,
        descriptor: FlightDescriptor,
        *,
        metadata: Metadata | None = None,
    ) -> AsyncIterator[tuple[FlightDataWriter, FlightDataReader, Any]]:
        """Open a DoExchange: yields (writer, reader, done_writing) — call done_writing() to
        half-close. The descriptor goes with the first message the writer sends."""
        async with self._call(
            "DoExchange", Cardinality.STREAM_STREAM, RawBytes, RawBytes, metadata
        ) as stream:
            await stream.send_request()
            writer = _DescriptorWriter(raw_stream(stream), descriptor)
            reader = FlightDataReader(
                raw_stream(stream),
                self.max_message_size,
                before_first_read=stream.recv_initial_metadata,
                guard=call_wrapper(stream),
                max_decoded_size=self.max_decoded_size,
            )
            yield writer, reader, stream.end
            if not request_ended(stream):
                await stream.end()

    async def do_action(
        self, action_type: str, body: bytes = b"", *, metadata: Metadata | None = None
    ) -> list[bytes]:
        results: list[Result] = await self._server_stream(
            "DoAction", Action(type=action_type, body=body), Result, metadata
        )
        return [result.body for result in results]

    async def list_actions(self, *, metadata: Metadata | None = None) -> list[ActionType]:
        return await self._server_stream("ListActions", Empty(), ActionType, metadata)


def _root_cause(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The error to report from a failed upload/collect pair: the server's status first."""
    leaves: list[BaseException] = []
    stack: list[BaseException] = [group]
    while stack:
        exc = stack.pop()
        if isinstance(exc, BaseExceptionGroup):
            stack.extend(exc.exceptions)
        else:
            leaves.append(exc)
    for exc in leaves:
        if isinstance(exc, GRPCError):
            return exc
    return leaves[0] if leaves else group


class _DescriptorWriter(FlightDataWriter):
    """A writer whose first message carries the exchange's descriptor."""

    def __init__(self, stream: Any, descriptor: FlightDescriptor) -> None:
        super().__init__(stream)
        self._descriptor: FlightDescriptor | None = descriptor

    async def begin(
        self,
        schema: pa.Schema,
        descriptor: FlightDescriptor | None = None,
        options: pa.ipc.IpcWriteOptions | None = None,
    ) -> None:
        first, self._descriptor = self._descriptor, None
        await super().begin(schema, descriptor or first, options)


__all__ = [
    "DoGetCall",
    "FlightClient",
    "FlightfeedError",
    "command_descriptor",
    "parse_location",
    "path_descriptor",
]
