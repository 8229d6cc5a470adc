"""pyarrow's C++ Flight client against a flightfeed server: every FlightService RPC.

The server runs on the test's event loop; each blocking C++ call runs in a worker thread.
"""

from __future__ import annotations

import datetime
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.flight as fl
import pytest
from helpers.arrow_data import StreamCase
from helpers.flight import (
    StoreHandler,
    cpp_client,
    cpp_read,
    descriptor_key,
    in_thread,
    put_ack,
    running_server,
)

from flightfeed._generated.arrow.flight.protocol import PollInfo
from flightfeed.errors import NotFound
from flightfeed.flight import (
    Action,
    ActionType,
    CallContext,
    FlightDataReader,
    FlightDataWriter,
    FlightDescriptor,
    FlightEndpoint,
    FlightHandler,
    FlightInfo,
    HandshakeRequest,
    HandshakeResponse,
    Location,
    Ticket,
    command_descriptor,
    schema_to_ipc,
)

SCHEMA = pa.schema(
    [pa.field("x", pa.int64()), pa.field("name", pa.string(), metadata={"k": "v"})],
    metadata={"table": "interop"},
)
EXPIRES = datetime.datetime(2031, 5, 4, 3, 2, 1, 123456, tzinfo=datetime.UTC)
pytestmark = pytest.mark.anyio


def table(rows: int, start: int = 0) -> pa.Table:
    return pa.table(
        {
            "x": pa.array(range(start, start + rows), pa.int64()),
            "name": [f"r{i}" for i in range(rows)],
        },
        schema=SCHEMA,
    )


def make_info(descriptor: FlightDescriptor, records: int) -> FlightInfo:
    return FlightInfo(
        schema=schema_to_ipc(SCHEMA),
        flight_descriptor=descriptor,
        endpoint=[
            FlightEndpoint(
                ticket=Ticket(ticket=b"part-0"),
                location=[Location(uri="grpc://node-a:8000"), Location(uri="grpc+tcp://node-b:9")],
                expiration_time=EXPIRES,
                app_metadata=b"endpoint-0",
            ),
            FlightEndpoint(ticket=Ticket(ticket=b"part-\x00\xff"), location=[]),
        ],
        total_records=records,
        total_bytes=records * 16,
        ordered=True,
        app_metadata=b"info-metadata",
    )


class InteropHandler(StoreHandler):
    """The store, plus fixed answers for the control RPCs and a transforming exchange."""

    def __init__(self) -> None:
        super().__init__()
        self.handshakes: list[bytes] = []
        self.add(b"numbers", StreamCase("numbers", SCHEMA, table(1000).to_batches(300),
                                        [b"m0", None, b"m2", b"\x00m3"]))  # fmt: skip

    async def handshake(
        self, ctx: CallContext, requests: AsyncIterator[HandshakeRequest]
    ) -> AsyncIterator[HandshakeResponse]:
        async for request in requests:
            self.handshakes.append(request.payload)
            yield HandshakeResponse(payload=b"token-for-" + request.payload)

    async def list_flights(self, ctx: CallContext, criteria: bytes) -> AsyncIterator[FlightInfo]:
        for i, name in enumerate((b"first", b"second", b"third")):
            yield make_info(command_descriptor(name + b"?" + criteria), 100 * i)

    async def get_flight_info(self, ctx: CallContext, descriptor: FlightDescriptor) -> FlightInfo:
        if descriptor.path == ["missing"]:
            raise NotFound("no flight at path 'missing'")
        return make_info(descriptor, 1000)

    async def get_schema(self, ctx: CallContext, descriptor: FlightDescriptor) -> pa.Schema:
        return SCHEMA

    async def do_exchange(
        self, ctx: CallContext, reader: FlightDataReader, writer: FlightDataWriter
    ) -> None:
        """Each batch comes back with x doubled; metadata comes back tagged with the command."""
        async for batch, metadata in reader.with_metadata():
            assert reader.descriptor is not None
            tag = reader.descriptor.cmd + b":"
            if batch is None:
                await writer.write_metadata(tag + (metadata or b""))
                continue
            doubled = pa.record_batch(
                [pc.multiply(batch.column("x"), 2), batch.column("name")],
                schema=SCHEMA,
            )
            await writer.write(doubled, tag + (metadata or b"none"))

    async def do_action(self, ctx: CallContext, action: Action) -> AsyncIterator[bytes]:
        if action.type == "count":
            for i in range(int(action.body)):
                yield f"result {i}".encode()
            yield b"done"
        elif action.type == "headers":
            yield (ctx.header("auth-token-bin") or "").encode("latin-1")
            yield (ctx.header("x-custom-header") or "").encode()
        elif action.type != "empty":
            raise NotFound(f"unknown action {action.type!r}")

    async def list_actions(self, ctx: CallContext) -> Sequence[ActionType]:
        return [
            ActionType(type="count", description="yields `body` results"),
            ActionType(type="headers", description="echoes request headers"),
            ActionType(type="empty", description=""),
        ]


class TokenAuth(fl.ClientAuthHandler):  # type: ignore[misc]
    def __init__(self, name: bytes) -> None:
        super().__init__()
        self.name = name
        self.token = b""

    def authenticate(self, outgoing: Any, incoming: Any) -> None:
        outgoing.write(self.name)
        self.token = incoming.read()

    def get_token(self) -> bytes:
        return self.token


def check_info(info: Any, descriptor: fl.FlightDescriptor, records: int) -> None:
    assert info.schema.equals(SCHEMA, check_metadata=True)
    assert info.descriptor == descriptor
    assert info.total_records == records
    assert info.total_bytes == records * 16
    assert info.ordered is True
    assert info.app_metadata == b"info-metadata"
    first, second = info.endpoints
    assert first.ticket.ticket == b"part-0"
    assert [loc.uri for loc in first.locations] == [b"grpc://node-a:8000", b"grpc+tcp://node-b:9"]
    assert first.app_metadata == b"endpoint-0"
    assert first.expiration_time is not None
    assert first.expiration_time.as_py() == EXPIRES
    assert second.ticket.ticket == b"part-\x00\xff"
    assert second.locations == []
    assert second.expiration_time is None


@pytest.fixture
def handler() -> InteropHandler:
    return InteropHandler()


async def test_handshake_and_token_header(handler: InteropHandler) -> None:
    async with running_server(handler) as location:

        def call() -> list[bytes]:
            with cpp_client(location) as client:
                auth = TokenAuth(b"alice")
                client.authenticate(auth)
                assert auth.token == b"token-for-alice"
                return [r.body.to_pybytes() for r in client.do_action(fl.Action("headers", b""))]

        token, custom = await in_thread(call)
    assert handler.handshakes == [b"alice"]
    assert token == b"token-for-alice"  # the C++ client sends it as auth-token-bin
    assert custom == b""


async def test_call_headers_reach_the_handler(handler: InteropHandler) -> None:
    async with running_server(handler) as location:

        def call() -> list[bytes]:
            options = fl.FlightCallOptions(headers=[(b"x-custom-header", b"hello")])
            with cpp_client(location) as client:
                results = client.do_action(fl.Action("headers", b""), options=options)
                return [r.body.to_pybytes() for r in results]

        assert await in_thread(call) == [b"", b"hello"]


async def test_list_flights(handler: InteropHandler) -> None:
    async with running_server(handler) as location:

        def call() -> list[Any]:
            with cpp_client(location) as client:
                return list(client.list_flights(b"crit\x00eria"))

        infos = await in_thread(call)
    assert len(infos) == 3
    for i, (info, name) in enumerate(zip(infos, (b"first", b"second", b"third"), strict=True)):
        check_info(info, fl.FlightDescriptor.for_command(name + b"?crit\x00eria"), 100 * i)


@pytest.mark.parametrize(
    "descriptor",
    [
        fl.FlightDescriptor.for_command(b"SELECT \x00\xff"),
        fl.FlightDescriptor.for_path("a", "b/c", "é"),
    ],
    ids=["command", "path"],
)
async def test_get_flight_info(handler: InteropHandler, descriptor: fl.FlightDescriptor) -> None:
    async with running_server(handler) as location:

        def call() -> Any:
            with cpp_client(location) as client:
                return client.get_flight_info(descriptor)

        check_info(await in_thread(call), descriptor, 1000)


async def test_get_flight_info_not_found(handler: InteropHandler) -> None:
    async with running_server(handler) as location:

        def call() -> None:
            with cpp_client(location) as client:
                client.get_flight_info(fl.FlightDescriptor.for_path("missing"))

        with pytest.raises(pa.ArrowKeyError, match="no flight at path 'missing'"):
            await in_thread(call)


async def test_poll_flight_info_with_grpc_core_client(handler: InteropHandler) -> None:
    """pyarrow 26 does not expose PollFlightInfo; gRPC's C-core client stands in for it."""
    grpc = pytest.importorskip("grpc")
    descriptor = command_descriptor(b"poll me")
    async with running_server(handler) as location:

        def call() -> PollInfo:
            with grpc.insecure_channel(location.removeprefix("grpc://")) as channel:
                poll = channel.unary_unary(
                    "/arrow.flight.protocol.FlightService/PollFlightInfo",
                    request_serializer=bytes,
                    response_deserializer=PollInfo.parse,
                )
                result: PollInfo = poll(descriptor, timeout=30)
                return result

        result = await in_thread(call)
    assert result.progress == 1.0
    assert result.info == make_info(descriptor, 1000)
    assert result.flight_descriptor is None  # complete: nothing left to poll


async def test_get_schema(handler: InteropHandler) -> None:
    async with running_server(handler) as location:

        def call() -> pa.Schema:
            with cpp_client(location) as client:
                return client.get_schema(fl.FlightDescriptor.for_path("x")).schema

        schema = await in_thread(call)
    assert schema.equals(SCHEMA, check_metadata=True)


async def test_do_get_batches_and_app_metadata(handler: InteropHandler) -> None:
    async with running_server(handler) as location:

        def call() -> tuple[pa.Schema, Any]:
            with cpp_client(location) as client:
                return cpp_read(client.do_get(fl.Ticket(b"numbers")))

        schema, items = await in_thread(call)
    assert schema.equals(SCHEMA, check_metadata=True)
    expected = table(1000).to_batches(300)
    assert [b.num_rows for b, _ in items] == [300, 300, 300, 100]
    assert all(got.equals(want) for (got, _), want in zip(items, expected, strict=True))
    assert [meta for _, meta in items] == [b"m0", None, b"m2", b"\x00m3"]
    assert handler.gets_finished == 1


async def test_do_get_read_all_many_batches(handler: InteropHandler) -> None:
    data = table(50_000)
    handler.add(b"many", StreamCase("many", SCHEMA, data.to_batches(max_chunksize=97)))
    async with running_server(handler) as location:

        def call() -> pa.Table:
            with cpp_client(location) as client:
                return client.do_get(fl.Ticket(b"many")).read_all()

        assert (await in_thread(call)).equals(data)


async def test_do_put_with_put_results(handler: InteropHandler) -> None:
    batches = table(1000).to_batches(max_chunksize=400)
    descriptor = fl.FlightDescriptor.for_path("uploads", "one")
    async with running_server(handler) as location:

        def call() -> list[bytes]:
            acks = []
            with cpp_client(location) as client:
                writer, results = client.do_put(descriptor, SCHEMA)
                for i, batch in enumerate(batches):
                    writer.write_with_metadata(batch, pa.py_buffer(f"put-{i}".encode()))
                    acks.append(results.read().to_pybytes())  # one PutResult per message
                writer.write_metadata(pa.py_buffer(b"trailer"))
                acks.append(results.read().to_pybytes())
                writer.done_writing()
                writer.close()
            return acks

        acks = await in_thread(call)
    assert acks == [
        *(put_ack(i, b, f"put-{i}".encode()) for i, b in enumerate(batches)),
        put_ack(len(batches), None, b"trailer"),
    ]
    stored = handler.streams[b"uploads/one"]
    assert stored.descriptor is not None
    assert stored.descriptor.path == ["uploads", "one"]
    assert stored.schema.equals(SCHEMA, check_metadata=True)
    got = [b for b, _ in stored.items if b is not None]
    assert pa.Table.from_batches(got).equals(table(1000))
    assert [m for _, m in stored.items] == [b"put-0", b"put-1", b"put-2", b"trailer"]


async def test_do_put_then_do_get_same_data(handler: InteropHandler) -> None:
    descriptor = fl.FlightDescriptor.for_command(b"roundtrip")
    data = table(5000)
    async with running_server(handler) as location:

        def call() -> pa.Table:
            with cpp_client(location) as client:
                writer, _ = client.do_put(descriptor, SCHEMA)
                writer.write_table(data, max_chunksize=1234)
                writer.close()
                return client.do_get(fl.Ticket(descriptor_key(command_descriptor(b"roundtrip"))))\
                    .read_all()  # fmt: skip

        assert (await in_thread(call)).equals(data)


async def test_do_exchange_transforms_batches_and_metadata(handler: InteropHandler) -> None:
    batches = table(900).to_batches(max_chunksize=300)
    async with running_server(handler) as location:

        def call() -> list[tuple[Any, bytes | None]]:
            replies: list[tuple[Any, bytes | None]] = []
            with cpp_client(location) as client:
                writer, reader = client.do_exchange(fl.FlightDescriptor.for_command(b"dbl"))
                writer.write_metadata(pa.py_buffer(b"hello"))  # before the schema
                chunk = reader.read_chunk()
                replies.append((chunk.data, chunk.app_metadata.to_pybytes()))
                writer.begin(SCHEMA)
                for i, batch in enumerate(batches):
                    if i == 1:
                        writer.write_batch(batch)
                    else:
                        writer.write_with_metadata(batch, pa.py_buffer(f"b{i}".encode()))
                    chunk = reader.read_chunk()  # the reply arrives before the next write
                    replies.append((chunk.data, chunk.app_metadata.to_pybytes()))
                writer.done_writing()
                with pytest.raises(StopIteration):
                    reader.read_chunk()
                writer.close()
            return replies

        replies = await in_thread(call)
    assert replies[0] == (None, b"dbl:hello")
    assert [meta for _, meta in replies[1:]] == [b"dbl:b0", b"dbl:none", b"dbl:b2"]
    for (got, _), batch in zip(replies[1:], batches, strict=True):
        assert got.schema.equals(SCHEMA, check_metadata=True)
        assert got.column("x").to_pylist() == [2 * v for v in batch.column("x").to_pylist()]
        assert got.column("name").equals(batch.column("name"))


async def test_do_action_multiple_results(handler: InteropHandler) -> None:
    async with running_server(handler) as location:

        def call(action: str, body: bytes) -> list[bytes]:
            with cpp_client(location) as client:
                return [r.body.to_pybytes() for r in client.do_action(fl.Action(action, body))]

        assert await in_thread(call, "count", b"3") == [
            b"result 0",
            b"result 1",
            b"result 2",
            b"done",
        ]
        assert await in_thread(call, "count", b"0") == [b"done"]
        assert await in_thread(call, "empty", b"") == []
        with pytest.raises(pa.ArrowKeyError, match="unknown action 'nope'"):
            await in_thread(call, "nope", b"")


async def test_list_actions(handler: InteropHandler) -> None:
    async with running_server(handler) as location:

        def call() -> list[tuple[str, str]]:
            with cpp_client(location) as client:
                return [(a.type, a.description) for a in client.list_actions()]

        assert await in_thread(call) == [
            ("count", "yields `body` results"),
            ("headers", "echoes request headers"),
            ("empty", ""),
        ]


async def test_unimplemented_rpcs_by_default() -> None:
    """A bare FlightHandler answers UNIMPLEMENTED for what it does not override."""
    async with running_server(FlightHandler()) as location:

        def call() -> list[str]:
            errors = []
            with cpp_client(location) as client:
                for rpc in (
                    lambda: client.do_get(fl.Ticket(b"t")).read_all(),
                    lambda: list(client.list_flights()),
                    lambda: client.get_flight_info(fl.FlightDescriptor.for_path("p")),
                    lambda: client.get_schema(fl.FlightDescriptor.for_path("p")),
                    lambda: list(client.do_action(fl.Action("a", b""))),
                ):
                    with pytest.raises(pa.ArrowNotImplementedError) as info:
                        rpc()
                    errors.append(str(info.value))
                assert list(client.list_actions()) == []
            return errors

        errors = await in_thread(call)
    assert "DoGet is not implemented" in errors[0]
    assert "ListFlights is not implemented" in errors[1]
    assert "GetFlightInfo is not implemented" in errors[2]
    assert "GetSchema is not implemented" in errors[3]
    assert "unknown action type 'a'" in errors[4]
