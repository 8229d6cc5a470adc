"""Bad input gets a clear gRPC status and message, and the server keeps serving.

Every test ends by checking that the same server still answers a normal DoGet to a fresh
client. Malformed wire data is sent with a raw grpclib call, bypassing the FlightData codec.
"""

from __future__ import annotations

import re
import struct
from collections.abc import AsyncIterator, Sequence
from typing import Any

import anyio
import grpclib.client
import numpy as np
import pyarrow as pa
import pyarrow.flight as fl
import pytest
from grpclib.const import Cardinality, Status
from grpclib.exceptions import GRPCError
from helpers.arrow_data import StreamCase
from helpers.flight import StoreHandler, assert_serves, cpp_client, in_thread, running_server
from helpers.raw_h2 import RawH2Client, grpc_message

from flightfeed._generated.arrow.flight.protocol import FlightInfo, PutResult, Result
from flightfeed._generated.flightfeed.v1 import ErrorCode, ErrorDetail
from flightfeed.errors import (
    ExecutionError,
    FlightfeedError,
    InvalidArgument,
    NotFound,
    RemoteError,
    ResourceExhausted,
    Unimplemented,
)
from flightfeed.flight import (
    Action,
    CallContext,
    FlightClient,
    FlightDataEncoder,
    FlightDataWriter,
    FlightDescriptor,
    command_descriptor,
    decode_flight_data,
    parse_location,
    path_descriptor,
)
from flightfeed.flight.codec import FlightDataDecoder, FlightDataView, encode_flight_data
from flightfeed.flight.grpc import GrpcChannel, RawBytes
from flightfeed.flight.internals import mark_request_ended, raw_stream
from flightfeed.protocol import ERROR_TRAILER, TYPED_ERRORS
from flightfeed.protowire import len_field_header

pytestmark = pytest.mark.anyio
SERVICE = "/arrow.flight.protocol.FlightService/"
BIG = pa.record_batch({"x": pa.array(np.arange(65_536, dtype=np.int64))})  # 512 KiB


class BadInputHandler(StoreHandler):
    """The store, plus handlers that fail on purpose and an endless stream."""

    def __init__(self) -> None:
        super().__init__()
        self.finished: dict[bytes, anyio.Event] = {}

    def watch(self, ticket: bytes) -> anyio.Event:
        """An event set when the DoGet of `ticket` has left the handler, however it ended."""
        self.finished[ticket] = anyio.Event()
        return self.finished[ticket]

    async def get_flight_info(self, ctx: CallContext, descriptor: FlightDescriptor) -> FlightInfo:
        return FlightInfo(flight_descriptor=descriptor, total_records=len(descriptor.path))

    async def do_action(self, ctx: CallContext, action: Action) -> AsyncIterator[bytes]:
        if action.type == "crash":
            yield b"partial"
            raise KeyError("missing key 'k'")
        if action.type == "echo-missing":  # a name from the request, echoed in the message
            raise NotFound(f"no table {action.body.decode()}")
        yield action.body

    async def do_get(self, ctx: CallContext, ticket: bytes, writer: FlightDataWriter) -> None:
        try:
            if ticket == b"boom":
                raise ValueError("boom 42")
            if ticket == b"boom-after-2":
                await writer.write(BIG.slice(0, 10), b"one")
                await writer.write(BIG.slice(10, 10), b"two")
                raise RuntimeError("failed after 2 batches")
            if ticket.startswith(b"endless"):
                while True:
                    await writer.write(BIG)
            if ticket == b"big":
                await writer.write(BIG)
                return
            await super().do_get(ctx, ticket, writer)
        finally:
            if ticket in self.finished:
                self.finished[ticket].set()


@pytest.fixture
def handler() -> BadInputHandler:
    return BadInputHandler()


async def raw_call(
    location: str,
    method: str,
    messages: Sequence[bytes] = (),
    *,
    cardinality: Cardinality = Cardinality.STREAM_STREAM,
    reply_type: type = PutResult,
    raw: bytes | None = None,
) -> tuple[GRPCError, dict[str, Any]]:
    """Send raw gRPC messages (or raw DATA bytes) and return the error the call ends with."""
    host, port = parse_location(location)
    channel = GrpcChannel(host, port)
    stream: grpclib.client.Stream[Any, Any]
    try:
        async with channel.request(SERVICE + method, cardinality, RawBytes, reply_type) as stream:
            await stream.send_request()
            if raw is not None:
                await raw_stream(stream).send_data(raw, end_stream=True)
                mark_request_ended(stream)
            for i, message in enumerate(messages):
                await stream.send_message(RawBytes(message), end=i == len(messages) - 1)
            with pytest.raises(GRPCError) as info:
                async for _ in stream:
                    pass
            return info.value, dict(stream.trailing_metadata or {})
    finally:
        channel.close()


def error_code(trailers: dict[str, Any]) -> ErrorCode:
    """The typed error code flightfeed put in the trailer."""
    return ErrorDetail.parse(trailers[ERROR_TRAILER]).code


def payload(message: Any) -> bytes:
    """The protobuf payload of an EncodedMessage (without the gRPC prefix)."""
    return b"".join(bytes(memoryview(p)) for p in message.parts)[5:]


SCHEMA = pa.schema([("x", pa.int64())])


def schema_payload() -> bytes:
    return payload(FlightDataEncoder(SCHEMA).schema_message(bytes(command_descriptor(b"up"))))


def batch_payload(batch: pa.RecordBatch | None = None) -> bytes:
    batch = BIG.slice(0, 100) if batch is None else batch
    messages = FlightDataEncoder(batch.schema).encode(batch)
    return payload(messages[-1])


def out_of_bounds_header() -> bytes:
    """A Message flatbuffer whose header-type field points past the end of the buffer."""
    buf = bytearray(24)
    struct.pack_into("<I", buf, 0, 16)
    struct.pack_into("<HHHH", buf, 4, 10, 4, 0, 200)
    struct.pack_into("<i", buf, 16, 12)
    return bytes(buf)


@pytest.mark.parametrize(
    ("messages", "match"),
    [
        ([b"\xff\xff\xff"], "truncated protobuf varint"),
        ([len_field_header(2, 100) + b"short"], "truncated FlightData: field 2 declares 100"),
        ([b"\x0f" + b"x" * 8], "unsupported protobuf wire type 7"),
        ([len_field_header(2, 8) + bytes(8)], "must start with a schema, got message kind 0"),
        ([len_field_header(2, 3) + b"abc"], "malformed IPC message header"),
        (
            [len_field_header(2, 24) + out_of_bounds_header()],
            "malformed IPC message header",
        ),
        (
            [schema_payload(), len_field_header(2, 40) + bytes(4) + b"\xff" * 36],
            "unsupported Arrow IPC message kind 0",
        ),
        ([schema_payload(), schema_payload()], "second schema"),
        ([len_field_header(1000, 4) + b"body"], "body but no data_header"),
    ],
    ids=[
        "garbage-varint",
        "truncated-field",
        "bad-wire-type",
        "zero-header",
        "short-header",
        "header-offset-out-of-bounds",
        "garbage-after-schema",
        "two-schemas",
        "body-without-header",
    ],
)
@pytest.mark.parametrize(("method", "reply_type"), [("DoPut", PutResult), ("DoExchange", RawBytes)])
async def test_malformed_flightdata(
    handler: BadInputHandler, messages: list[bytes], match: str, method: str, reply_type: type
) -> None:
    async with running_server(handler, errors=TYPED_ERRORS) as location:
        error, trailers = await raw_call(location, method, messages, reply_type=reply_type)
        assert error.status == Status.INVALID_ARGUMENT, error.message
        assert re.search(match, error.message or ""), error.message
        assert error_code(trailers) == ErrorCode.INVALID_ARGUMENT
        await assert_serves(location, handler)


@pytest.mark.parametrize(
    "batch",
    [
        pa.record_batch({"s": ["a", "b"]}),  # too few bytes for an int64 column
        pa.record_batch({"x": pa.array([1, 2], pa.int32())}),  # int32 body under an int64 schema
    ],
    ids=["string-batch", "int32-batch"],
)
async def test_batch_that_does_not_match_the_schema_is_rejected(
    handler: BadInputHandler, batch: pa.RecordBatch
) -> None:
    """A record batch whose buffers do not fit the stream schema must not reach the handler
    as an invalid array (Arrow kernels could read out of bounds): INVALID_ARGUMENT."""
    async with running_server(handler, errors=TYPED_ERRORS) as location:
        error, trailers = await raw_call(
            location, "DoPut", [schema_payload(), batch_payload(batch)]
        )
        assert error.status == Status.INVALID_ARGUMENT, error.message
        assert error_code(trailers) == ErrorCode.INVALID_ARGUMENT
        assert b"up" not in handler.streams
        await assert_serves(location, handler)


@pytest.mark.parametrize("delta", [-8, -1, 1, 8], ids=["8-short", "1-short", "1-long", "8-long"])
async def test_body_length_disagrees_with_header(handler: BadInputHandler, delta: int) -> None:
    view_header, body = _batch_parts()
    body = body[:delta] if delta < 0 else body + bytes(delta)
    message = payload(encode_flight_data(header=view_header, body=[body], body_length=len(body)))
    async with running_server(handler, errors=TYPED_ERRORS) as location:
        error, _ = await raw_call(location, "DoPut", [schema_payload(), message])
        assert error.status == Status.INVALID_ARGUMENT
        expected = len(body) - delta
        assert error.message == (
            f"FlightData body is {len(body)} bytes, its header declares {expected}"
        )
        await assert_serves(location, handler)


def _batch_parts() -> tuple[bytes, bytes]:
    view = decode_flight_data(batch_payload())
    return bytes(view.header), bytes(view.body)


async def test_stream_starting_with_a_record_batch(handler: BadInputHandler) -> None:
    async with running_server(handler, errors=TYPED_ERRORS) as location:
        error, trailers = await raw_call(location, "DoPut", [batch_payload(), schema_payload()])
        assert error.status == Status.INVALID_ARGUMENT
        assert error.message == ("FlightData stream must start with a schema, got message kind 3")
        assert error_code(trailers) == ErrorCode.INVALID_ARGUMENT
        await assert_serves(location, handler)


async def test_doput_stream_without_any_message(handler: BadInputHandler) -> None:
    async with running_server(handler, errors=TYPED_ERRORS) as location:
        error, _ = await raw_call(location, "DoPut", raw=b"")
        assert error.status == Status.INVALID_ARGUMENT
        assert error.message == "Flight stream ended before its schema"
        await assert_serves(location, handler)


# --- tickets and request messages ------------------------------------------------------


@pytest.mark.parametrize(
    ("ticket", "status", "error", "cpp_error", "message"),
    [
        (b"\xff\xfe garbage", Status.INVALID_ARGUMENT, InvalidArgument, pa.ArrowInvalid,
         "malformed ticket b'\\xff\\xfe garbage': not UTF-8"),
        (b"no-such-ticket", Status.NOT_FOUND, NotFound, pa.ArrowKeyError,
         "no stream for ticket 'no-such-ticket'"),
    ],
    ids=["malformed", "unknown"],
)  # fmt: skip
async def test_bad_ticket_in_doget(
    handler: BadInputHandler,
    ticket: bytes,
    status: Status,
    error: type[FlightfeedError],
    cpp_error: type[Exception],
    message: str,
) -> None:
    async with running_server(handler, errors=TYPED_ERRORS) as location:
        async with FlightClient(location, errors=TYPED_ERRORS) as client:
            with pytest.raises(error) as info:
                await client.do_get(ticket).read_all()
        assert type(info.value) is error
        assert info.value.message == message
        assert info.value.status == status

        def cpp_call() -> None:
            with cpp_client(location) as client:
                client.do_get(fl.Ticket(ticket)).read_all()

        with pytest.raises(cpp_error, match=re.escape(message)):
            await in_thread(cpp_call)
        await assert_serves(location, handler)


@pytest.mark.parametrize(
    "body",
    [b"\xff\xff\xff\xff", b"garbage!", b"\x0a\x05ab", b"\x0b", b"\x12\x80"],
    ids=["varint-overflow", "text", "truncated-field", "group-start", "truncated-length"],
)
@pytest.mark.parametrize(
    ("method", "cardinality", "reply_type"),
    [
        ("GetFlightInfo", Cardinality.UNARY_UNARY, FlightInfo),
        ("DoGet", Cardinality.UNARY_STREAM, RawBytes),
        ("DoAction", Cardinality.UNARY_STREAM, Result),
    ],
    ids=["GetFlightInfo", "DoGet", "DoAction"],
)
async def test_non_protobuf_request_body(
    handler: BadInputHandler, body: bytes, method: str, cardinality: Cardinality, reply_type: type
) -> None:
    """A request that is not a valid protobuf message must not reach the handler as some
    default-valued message: INVALID_ARGUMENT, "malformed request message"."""
    async with running_server(handler, errors=TYPED_ERRORS) as location:
        error, trailers = await raw_call(
            location, method, [body], cardinality=cardinality, reply_type=reply_type
        )
        assert error.status == Status.INVALID_ARGUMENT, error.message
        assert (error.message or "").startswith("malformed request message"), error.message
        assert error_code(trailers) == ErrorCode.INVALID_ARGUMENT
        await assert_serves(location, handler)


# --- truncated and oversized messages ----------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        (struct.pack(">BI", 0, 1000) + b"x" * 10, "truncated gRPC message"),
        # Large enough for a buffer of its own (message_buffer.py), which is given up.
        (struct.pack(">BI", 0, 1 << 20) + b"x" * 100_000, "truncated gRPC message"),
        (b"\x00\x00\x00", "truncated gRPC message"),
        (struct.pack(">BI", 1, 4) + b"abcd", "compressed gRPC messages are not supported"),
    ],
    ids=["body-cut", "placed-body-cut", "prefix-cut", "compressed-flag"],
)
async def test_truncated_grpc_frames_in_doput(
    handler: BadInputHandler, raw: bytes, match: str
) -> None:
    async with running_server(handler, errors=TYPED_ERRORS) as location:
        error, trailers = await raw_call(location, "DoPut", raw=raw)
        assert error.status == Status.INVALID_ARGUMENT
        assert match in (error.message or "")
        assert error_code(trailers) == ErrorCode.INVALID_ARGUMENT
        await assert_serves(location, handler)


async def test_truncated_grpc_frame_in_unary_request(handler: BadInputHandler) -> None:
    async with running_server(handler, errors=TYPED_ERRORS) as location:
        error, _ = await raw_call(
            location,
            "GetFlightInfo",
            raw=struct.pack(">BI", 0, 100) + b"\x0a\x01x",
            cardinality=Cardinality.UNARY_UNARY,
            reply_type=FlightInfo,
        )
        assert error.status == Status.INVALID_ARGUMENT
        assert (error.message or "").startswith("malformed request message")
        await assert_serves(location, handler)


async def test_oversized_doput_message(handler: BadInputHandler) -> None:
    async with running_server(handler, errors=TYPED_ERRORS, max_message_size=64 * 1024) as location:
        error, trailers = await raw_call(location, "DoPut", [schema_payload(), batch_payload(BIG)])
        assert error.status == Status.RESOURCE_EXHAUSTED
        assert error.message == (
            f"gRPC message of {len(batch_payload(BIG))} bytes exceeds the limit of 65536 bytes"
        )
        assert error_code(trailers) == ErrorCode.RESOURCE_EXHAUSTED

        def cpp_call() -> None:
            with cpp_client(location) as client:
                writer, _ = client.do_put(fl.FlightDescriptor.for_command(b"big"), BIG.schema)
                writer.write_batch(BIG)
                writer.close()

        with pytest.raises(pa.ArrowException, match="exceeds the limit of 65536 bytes"):
            await in_thread(cpp_call)
        await assert_serves(location, handler)


async def test_oversized_doput_through_flightfeed_client(handler: BadInputHandler) -> None:
    async def batches() -> AsyncIterator[pa.RecordBatch]:
        yield BIG

    async with running_server(handler, errors=TYPED_ERRORS, max_message_size=64 * 1024) as location:
        async with FlightClient(location, errors=TYPED_ERRORS) as client:
            with pytest.raises(ResourceExhausted, match="exceeds the limit of 65536 bytes"):
                await client.do_put(command_descriptor(b"big"), BIG.schema, batches())
        await assert_serves(location, handler)


ZEROS = pa.record_batch({"z": pa.array(np.zeros(1 << 20, dtype=np.int64))})  # 8 MiB


async def test_compressed_doput_batch_over_the_decoded_limit(handler: BadInputHandler) -> None:
    """8 MiB of zeros compress to kilobytes: the message passes the wire limit, and the batch
    is refused on the sizes its buffers declare, before Arrow decompresses it."""
    async with running_server(handler, errors=TYPED_ERRORS, max_decoded_size=1 << 20) as location:

        def cpp_put(batch: pa.RecordBatch) -> None:
            options = fl.FlightCallOptions(write_options=pa.ipc.IpcWriteOptions(compression="zstd"))
            with cpp_client(location) as client:
                descriptor = fl.FlightDescriptor.for_command(b"zeros")
                writer, _ = client.do_put(descriptor, batch.schema, options=options)
                writer.write_batch(batch)
                writer.close()

        with pytest.raises(
            pa.ArrowException, match="FlightData batch decodes to 8388608 bytes, over the limit"
        ):
            await in_thread(cpp_put, ZEROS)
        await in_thread(cpp_put, ZEROS.slice(0, 1000))  # under the limit: stored
        assert handler.streams[b"zeros"].items[0][0] == ZEROS.slice(0, 1000)
        await assert_serves(location, handler)


def test_a_decompression_bomb_is_refused_before_it_is_decompressed() -> None:
    """A compressed buffer declaring 1 TiB: Arrow would try to allocate it."""
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression="zstd")
    with pa.ipc.new_stream(sink, ZEROS.schema, options=options) as writer:
        writer.write_batch(ZEROS)
    schema_message, batch_message = list(pa.ipc.MessageReader.open_stream(sink.getvalue()))
    body = bytearray(batch_message.body.to_pybytes())
    # The batch has a validity buffer (empty: no nulls) and a data buffer; the data buffer is
    # the only one with bytes, and its first 8 bytes declare its decompressed length.
    assert struct.unpack_from("<q", body, 0)[0] == 8 << 20
    struct.pack_into("<q", body, 0, 1 << 40)
    decoder = FlightDataDecoder()
    empty = memoryview(b"")
    decoder.feed(
        FlightDataView(None, memoryview(schema_message.metadata.to_pybytes()), None, empty)
    )
    bomb = FlightDataView(
        None, memoryview(batch_message.metadata.to_pybytes()), None, memoryview(bytes(body))
    )
    with pytest.raises(ResourceExhausted, match="decodes to 1099511627776 bytes"):
        decoder.feed(bomb)


async def test_oversized_control_message(handler: BadInputHandler) -> None:
    """The limit covers every request, not only FlightData: a 1 MiB descriptor is refused."""
    descriptor = bytes(path_descriptor("x" * (1 << 20)))
    async with running_server(handler, errors=TYPED_ERRORS, max_message_size=64 * 1024) as location:
        error, _ = await raw_call(
            location, "GetFlightInfo", [descriptor],
            cardinality=Cardinality.UNARY_UNARY, reply_type=FlightInfo,
        )  # fmt: skip
        assert error.status == Status.RESOURCE_EXHAUSTED, error.message
        await assert_serves(location, handler)


async def test_oversized_message_for_the_client(handler: BadInputHandler) -> None:
    """The client's own limit: the DoGet fails locally and the server handler is released."""
    finished = handler.watch(b"big")
    async with running_server(handler, errors=TYPED_ERRORS) as location:
        async with FlightClient(location, max_message_size=1024) as client:
            with pytest.raises(ResourceExhausted, match="exceeds the limit of 1024 bytes"):
                await client.do_get(b"big").read_all()
        with anyio.fail_after(30):
            await finished.wait()
        await assert_serves(location, handler)


# --- handler failures ----------------------------------------------------------------------


async def test_exception_in_handler(handler: BadInputHandler) -> None:
    async with running_server(handler, errors=TYPED_ERRORS) as location:
        error, trailers = await raw_call(
            location, "DoGet", [b"\x0a\x04boom"],
            cardinality=Cardinality.UNARY_STREAM, reply_type=RawBytes,
        )  # fmt: skip
        assert error.status == Status.INTERNAL
        assert error.message == "ValueError: boom 42"
        assert error_code(trailers) == ErrorCode.EXECUTION

        async with FlightClient(location, errors=TYPED_ERRORS) as client:
            with pytest.raises(ExecutionError) as info:
                await client.do_get(b"boom").read_all()
        assert info.value.message == "boom 42"
        assert info.value.error_type == "ValueError"

        def cpp_call() -> None:
            with cpp_client(location) as client:
                client.do_get(fl.Ticket(b"boom")).read_all()

        with pytest.raises(fl.FlightInternalError, match="ValueError: boom 42"):
            await in_thread(cpp_call)
        await assert_serves(location, handler)


async def test_plain_errors_give_status_and_message_only(handler: BadInputHandler) -> None:
    """Without the typed mapping, clients see what any gRPC client sees: the status, and a
    message naming the original exception's class."""
    async with running_server(handler) as location:
        error, trailers = await raw_call(
            location, "DoGet", [b"\x0a\x04boom"],
            cardinality=Cardinality.UNARY_STREAM, reply_type=RawBytes,
        )  # fmt: skip
        assert (error.status, error.message) == (Status.INTERNAL, "ValueError: boom 42")
        assert ERROR_TRAILER not in trailers
        async with FlightClient(location) as client:
            with pytest.raises(RemoteError) as info:
                await client.do_get(b"boom").read_all()
        assert info.value.grpc_status == Status.INTERNAL
        assert info.value.message == "ValueError: boom 42"
        await assert_serves(location, handler)


async def test_exception_after_some_batches(handler: BadInputHandler) -> None:
    async with running_server(handler, errors=TYPED_ERRORS) as location:
        received: list[tuple[Any, bytes | None]] = []

        async def read_all(client: FlightClient) -> None:
            async with client.do_get(b"boom-after-2") as reader:
                async for item in reader.with_metadata():  # keep what arrived before the error
                    received.append(item)  # noqa: PERF401

        async with FlightClient(location, errors=TYPED_ERRORS) as client:
            with pytest.raises(ExecutionError, match="failed after 2 batches") as info:
                await read_all(client)
        assert info.value.error_type == "RuntimeError"
        assert [meta for _, meta in received] == [b"one", b"two"]

        metas: list[bytes] = []

        def cpp_read_all() -> None:
            with cpp_client(location) as client:
                reader = client.do_get(fl.Ticket(b"boom-after-2"))
                while True:
                    metas.append(reader.read_chunk().app_metadata.to_pybytes())

        with pytest.raises(fl.FlightInternalError, match="failed after 2 batches"):
            await in_thread(cpp_read_all)
        assert metas == [b"one", b"two"]
        await assert_serves(location, handler)


async def test_exception_in_streaming_action(handler: BadInputHandler) -> None:
    async with running_server(handler, errors=TYPED_ERRORS) as location:
        async with FlightClient(location, errors=TYPED_ERRORS) as client:
            with pytest.raises(ExecutionError, match="missing key 'k'") as info:
                await client.do_action("crash")
        assert info.value.error_type == "KeyError"
        await assert_serves(location, handler)


async def test_a_message_ending_in_a_space_is_a_valid_http2_answer() -> None:
    """HTTP/2 makes a header value with a space at either end malformed (RFC 9113, 8.2.1), and
    a strict client (h2 with its checks on, as a raw client here) failed the connection over a
    grpc-message ending in one. The status arrives, the spaces at its ends dropped, to a strict
    client, to flightfeed's and to pyarrow's C++ client."""
    handler = BadInputHandler()
    async with running_server(handler) as location:
        strict = await RawH2Client.connect(*parse_location(location))
        try:
            answer = await strict.call(
                SERVICE + "DoAction",
                [grpc_message(bytes(Action(type="echo-missing", body=b" cpu ")))],
            )
        finally:
            await strict.aclose()
        assert (answer.status, answer.message) == (Status.NOT_FOUND.value, "no table  cpu")
        async with FlightClient(location) as client:
            with pytest.raises(RemoteError, match=r"no table  cpu$") as info:
                await client.do_action("echo-missing", b" cpu ")
            assert info.value.grpc_status is Status.NOT_FOUND

        def with_cpp() -> str:
            with cpp_client(location) as cpp, pytest.raises(pa.ArrowKeyError) as raised:
                list(cpp.do_action(fl.Action("echo-missing", b" cpu ")))
            return str(raised.value).split(". gRPC")[0]

        assert (await in_thread(with_cpp)).endswith("with message: no table  cpu")
        await assert_serves(location, handler)


async def test_unimplemented_rpc_keeps_its_error_class() -> None:
    """Unimplemented raised by a handler arrives as Unimplemented at a flightfeed client."""
    handler = BadInputHandler()
    async with running_server(handler, errors=TYPED_ERRORS) as location:
        async with FlightClient(location, errors=TYPED_ERRORS) as client:
            with pytest.raises(Unimplemented, match="ListFlights is not implemented"):
                await client.list_flights()
        await assert_serves(location, handler)


@pytest.mark.parametrize(
    "path",
    [
        SERVICE + "NoSuchMethod",
        "/no.such.Service/Method",
        "/arrow.flight.protocol.FlightService",
    ],
)
async def test_unknown_method_path(handler: BadInputHandler, path: str) -> None:
    """UNIMPLEMENTED, for gRPC's C-core client and for grpclib (flightfeed's client) alike."""
    grpc = pytest.importorskip("grpc")
    async with running_server(handler, errors=TYPED_ERRORS) as location:

        def core_call() -> tuple[Any, str]:
            with grpc.insecure_channel(location.removeprefix("grpc://")) as channel:
                call = channel.unary_unary(path)
                with pytest.raises(grpc.RpcError) as info:
                    call(b"", timeout=30)
                return info.value.code(), info.value.details()

        code, _ = await in_thread(core_call)
        assert code == grpc.StatusCode.UNIMPLEMENTED

        host, port = parse_location(location)
        channel = GrpcChannel(host, port)

        async def grpclib_call() -> None:
            async with channel.request(path, Cardinality.UNARY_UNARY, RawBytes, RawBytes) as call:
                await call.send_message(RawBytes(b""), end=True)
                await call.recv_message()

        try:
            with pytest.raises(GRPCError) as info:
                await grpclib_call()
        finally:
            channel.close()
        assert info.value.status == Status.UNIMPLEMENTED, info.value.message
        await assert_serves(location, handler)


# --- clients that go away ----------------------------------------------------------------


async def test_client_disconnects_mid_doget_while_another_completes(
    handler: BadInputHandler,
) -> None:
    finished = handler.watch(b"endless-1")
    async with running_server(handler, errors=TYPED_ERRORS) as location:
        client = FlightClient(location, errors=TYPED_ERRORS)
        async with client.do_get(b"endless-1") as reader:
            assert await reader.next() is not None
            await assert_serves(location, handler, ticket=b"during")  # another client
            await client.close()  # drop the connection mid-stream
        with anyio.fail_after(30):
            await finished.wait()  # the server's handler was released
        await assert_serves(location, handler)


async def test_cpp_client_cancels_mid_doget(handler: BadInputHandler) -> None:
    cancelled = handler.watch(b"endless-cancel")
    closed = handler.watch(b"endless-close")
    async with running_server(handler, errors=TYPED_ERRORS) as location:

        def cpp_call(ticket: bytes, cancel: bool) -> None:
            with cpp_client(location) as client:
                reader = client.do_get(fl.Ticket(ticket))
                reader.read_chunk()
                if cancel:
                    reader.cancel()

        await in_thread(cpp_call, b"endless-cancel", True)
        await in_thread(cpp_call, b"endless-close", False)
        with anyio.fail_after(30):
            await cancelled.wait()
            await closed.wait()
        await assert_serves(location, handler)


async def test_leaving_a_doget_early_releases_the_server(handler: BadInputHandler) -> None:
    """Leaving `async with client.do_get(...)` before the end cancels the call instead of
    waiting for a stream that never ends; the connection stays usable."""
    finished = handler.watch(b"endless-early")
    async with (
        running_server(handler, errors=TYPED_ERRORS) as location,
        FlightClient(location, errors=TYPED_ERRORS) as client,
    ):
        with anyio.fail_after(5):  # guards a hang, not a timing assertion
            async with client.do_get(b"endless-early") as reader:
                assert await reader.next() is not None
        with anyio.fail_after(30):
            await finished.wait()
        table = pa.table({"a": [1, 2, 3]})
        handler.add(b"again", StreamCase("again", table.schema, table.to_batches()))
        assert (await client.do_get(b"again").read_all()).equals(table)
        await assert_serves(location, handler)


async def test_breaking_out_of_doget_iteration_releases_the_server(
    handler: BadInputHandler,
) -> None:
    finished = handler.watch(b"endless-iter")
    async with (
        running_server(handler, errors=TYPED_ERRORS) as location,
        FlightClient(location, errors=TYPED_ERRORS) as client,
    ):
        batches = client.do_get(b"endless-iter").__aiter__()
        assert (await batches.__anext__()).num_rows == BIG.num_rows
        await batches.aclose()  # type: ignore[attr-defined]
        with anyio.fail_after(30):
            await finished.wait()
        await assert_serves(location, handler)


async def test_client_closed_while_reading_raises_a_flightfeed_error(
    handler: BadInputHandler,
) -> None:
    """Closing a client under a running DoGet fails the read with a FlightfeedError (instead
    of an AttributeError from grpclib, or a read that waits forever)."""
    async with running_server(handler, errors=TYPED_ERRORS) as location:
        client = FlightClient(location, errors=TYPED_ERRORS)

        async def close_while_reading() -> None:
            async with client.do_get(b"endless-closed") as reader:
                assert await reader.next() is not None
                await client.close()
                while await reader.next() is not None:
                    pass

        with anyio.fail_after(5), pytest.raises(FlightfeedError):  # fail_after guards a hang
            await close_while_reading()
        await assert_serves(location, handler)


async def test_server_close_reaches_a_client_mid_stream() -> None:
    """Closing a server ends its connections: a client mid-DoGet gets an error, not a hang."""
    from helpers.flight import StoreHandler

    from flightfeed.flight import FlightServer

    class Endless(StoreHandler):
        async def do_get(self, ctx: CallContext, ticket: bytes, writer: FlightDataWriter) -> None:
            batch = pa.record_batch({"x": pa.array(range(1000))})
            while True:
                await writer.write(batch)

    server = FlightServer(Endless())
    await server.start()
    try:
        async with FlightClient(server.location) as client, client.do_get(b"x") as reader:
            assert await reader.next() is not None
            await server.close()
            with anyio.fail_after(10), pytest.raises(FlightfeedError, match="Connection lost"):
                await _drain(reader)
    finally:
        await server.close()


async def _drain(reader: Any) -> None:
    while await reader.next() is not None:
        pass
