"""flightfeed's FlightClient against pyarrow's own (C++) Flight server: every RPC it offers."""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
import pyarrow as pa
import pytest
from grpclib.const import Status
from helpers.pyarrow_server import SCHEMA, TOKEN, ReferenceServer, sample_table

from flightfeed.errors import RemoteError
from flightfeed.flight import (
    FlightClient,
    FlightDescriptor,
    FlightInfo,
    command_descriptor,
    path_descriptor,
    schema_from_ipc,
)

pytestmark = pytest.mark.anyio


async def test_handshake_then_authenticated_call(pyarrow_server: ReferenceServer) -> None:
    async with FlightClient(pyarrow_server.location) as client:
        assert await client.handshake([b"secret"]) == [TOKEN, b"welcome"]
        identity = await client.do_action("whoami", metadata={"auth-token-bin": TOKEN})
        anonymous = await client.do_action("whoami")
    assert identity == [b"alice"]
    assert anonymous == [b""]


async def test_handshake_rejected(pyarrow_server: ReferenceServer) -> None:
    async with FlightClient(pyarrow_server.location) as client:
        with pytest.raises(RemoteError, match="wrong password") as info:
            await client.handshake([b"guess"])
        assert info.value.grpc_status == Status.UNAUTHENTICATED
        with pytest.raises(RemoteError, match="invalid token") as info:
            await client.do_action("whoami", metadata={"auth-token-bin": b"forged"})
        assert info.value.grpc_status == Status.UNAUTHENTICATED


def check_info(info: FlightInfo, descriptor: FlightDescriptor, location: str) -> None:
    assert schema_from_ipc(info.schema).equals(SCHEMA, check_metadata=True)
    assert info.flight_descriptor == descriptor
    assert info.total_records == 1000
    assert info.total_bytes == 12345
    assert info.app_metadata == b"info-md"
    first, second = info.endpoint
    assert first.ticket is not None
    assert first.ticket.ticket == b"t-0"
    assert [loc.uri for loc in first.location] == [location]
    assert second.ticket is not None
    assert second.ticket.ticket == b"t-1"
    assert [loc.uri for loc in second.location] == ["grpc://replica-a:1", "grpc://replica-b:2"]


async def test_get_flight_info(pyarrow_server: ReferenceServer) -> None:
    for descriptor in (command_descriptor(b"q\x00"), path_descriptor("a", "b")):
        async with FlightClient(pyarrow_server.location) as client:
            info = await client.get_flight_info(descriptor)
        check_info(info, descriptor, pyarrow_server.location)


async def test_get_flight_info_error(pyarrow_server: ReferenceServer) -> None:
    async with FlightClient(pyarrow_server.location) as client:
        with pytest.raises(RemoteError, match="no such flight") as info:
            await client.get_flight_info(command_descriptor(b"missing"))
    assert info.value.grpc_status == Status.UNKNOWN  # pyarrow's FlightServerError


async def test_list_flights(pyarrow_server: ReferenceServer) -> None:
    async with FlightClient(pyarrow_server.location) as client:
        infos = await client.list_flights(b"c1")
    assert len(infos) == 2
    for info, name in zip(infos, (b"alpha", b"beta"), strict=True):
        check_info(info, command_descriptor(name + b"|c1"), pyarrow_server.location)


async def test_poll_flight_info_unimplemented(pyarrow_server: ReferenceServer) -> None:
    """pyarrow's Python server cannot implement PollFlightInfo; its C++ base says so."""
    async with FlightClient(pyarrow_server.location) as client:
        with pytest.raises(RemoteError) as info:
            await client.poll_flight_info(command_descriptor(b"q"))
        assert info.value.grpc_status == Status.UNIMPLEMENTED
        assert await client.do_action("count", b"1") == [b"0"]


async def test_get_schema(pyarrow_server: ReferenceServer) -> None:
    async with FlightClient(pyarrow_server.location) as client:
        schema = await client.get_schema(path_descriptor("anything"))
    assert schema.equals(SCHEMA, check_metadata=True)


async def test_do_get(pyarrow_server: ReferenceServer) -> None:
    async with FlightClient(pyarrow_server.location) as client:
        got = await client.do_get(b"table").read_all()
        batches = [batch async for batch in client.do_get(b"table")]
    assert got.equals(sample_table())
    assert got.schema.equals(SCHEMA, check_metadata=True)
    assert pa.Table.from_batches(batches).equals(sample_table())


async def test_do_get_app_metadata(pyarrow_server: ReferenceServer) -> None:
    async with (
        FlightClient(pyarrow_server.location) as client,
        client.do_get(b"with-metadata") as reader,
    ):
        items = [item async for item in reader.with_metadata()]
    assert [meta for _, meta in items] == [b"m0", b"m1", b"m2", b"m3"]
    expected = sample_table().to_batches(max_chunksize=300)
    assert all(b is not None and b.equals(e) for (b, _), e in zip(items, expected, strict=True))


async def test_do_get_unknown_ticket(pyarrow_server: ReferenceServer) -> None:
    async with FlightClient(pyarrow_server.location) as client:
        with pytest.raises(RemoteError, match="unknown ticket") as info:
            await client.do_get(b"nope").read_all()
    assert info.value.grpc_status == Status.NOT_FOUND  # pyarrow maps KeyError to NOT_FOUND


async def _upload() -> AsyncIterator[tuple[pa.RecordBatch, bytes | None]]:
    for i, batch in enumerate(sample_table(2500).to_batches(max_chunksize=1000)):
        yield batch, (f"up-{i}".encode() if i != 1 else None)


async def test_do_put_with_put_results(pyarrow_server: ReferenceServer) -> None:
    descriptor = path_descriptor("dir", "file")
    async with FlightClient(pyarrow_server.location) as client:
        results = await client.do_put(descriptor, SCHEMA, _upload())
        back = await client.do_get(b"dir/file").read_all()
    assert results == [b"stored 1 rows=1000", b"stored 2 rows=1000", b"stored 3 rows=500"]
    schema, items = pyarrow_server.uploads[b"dir/file"]
    assert schema.equals(SCHEMA, check_metadata=True)
    assert [meta for _, meta in items] == [b"up-0", None, b"up-2"]
    assert back.equals(sample_table(2500))


async def test_do_put_plain_batches(pyarrow_server: ReferenceServer) -> None:
    async def batches() -> AsyncIterator[pa.RecordBatch]:
        for batch in sample_table(10).to_batches(max_chunksize=4):
            yield batch

    async with FlightClient(pyarrow_server.location) as client:
        results = await client.do_put(command_descriptor(b"plain"), SCHEMA, batches())
    assert len(results) == 3
    _, items = pyarrow_server.uploads[b"plain"]
    assert pa.Table.from_batches([b for b, _ in items]).equals(sample_table(10))


async def test_do_put_schema_only(pyarrow_server: ReferenceServer) -> None:
    async def nothing() -> AsyncIterator[pa.RecordBatch]:
        return
        yield  # pragma: no cover

    async with FlightClient(pyarrow_server.location) as client:
        assert await client.do_put(command_descriptor(b"empty"), SCHEMA, nothing()) == []
    schema, items = pyarrow_server.uploads[b"empty"]
    assert schema.equals(SCHEMA, check_metadata=True)
    assert items == []


async def test_do_put_rejected_by_the_server(pyarrow_server: ReferenceServer) -> None:
    """A failed DoPut raises the client's error type (not a task-group ExceptionGroup)."""
    async with FlightClient(pyarrow_server.location) as client:
        with pytest.raises(RemoteError, match="uploads to 'reject' are not allowed") as info:
            await client.do_put(command_descriptor(b"reject"), SCHEMA, _upload())
        assert info.value.grpc_status == Status.PERMISSION_DENIED
        assert await client.do_action("count", b"1") == [b"0"]  # the connection still works


async def test_do_exchange(pyarrow_server: ReferenceServer) -> None:
    schema = pa.schema([("x", pa.int32())])
    async with (
        FlightClient(pyarrow_server.location) as client,
        client.do_exchange(command_descriptor(b"ex")) as (writer, reader, done_writing),
    ):
        await writer.begin(schema)
        replies = []
        for i in range(3):
            batch = pa.record_batch([pa.array(range(i, i + 5), pa.int32())], schema=schema)
            await writer.write(batch, f"b{i}".encode())
            replies.append(await reader.next())  # the reply comes before the next write
        await writer.write_metadata(b"just metadata")
        replies.append(await reader.next())
        await done_writing()
        assert await reader.next() is None
    for i, reply in enumerate(replies[:3]):
        assert reply is not None
        batch, meta = reply
        assert batch is not None
        assert batch.column("x2").to_pylist() == [2 * v for v in range(i, i + 5)]
        assert meta == f"ex:b{i}".encode()
    assert replies[3] == (None, b"JUST METADATA")


async def test_do_action_multiple_results(pyarrow_server: ReferenceServer) -> None:
    async with FlightClient(pyarrow_server.location) as client:
        assert await client.do_action("count", b"4") == [b"0", b"1", b"2", b"3"]
        assert await client.do_action("count", b"0") == []
        with pytest.raises(RemoteError, match="the action failed on purpose") as info:
            await client.do_action("fail")
    assert info.value.grpc_status == Status.INTERNAL


async def test_list_actions(pyarrow_server: ReferenceServer) -> None:
    async with FlightClient(pyarrow_server.location) as client:
        actions = await client.list_actions()
    assert [(a.type, a.description) for a in actions] == [
        ("count", "yields 0..n-1"),
        ("whoami", "the caller's identity"),
    ]


async def test_many_concurrent_calls_on_one_connection(pyarrow_server: ReferenceServer) -> None:
    results: list[pa.Table] = []
    async with FlightClient(pyarrow_server.location) as client:

        async def fetch() -> None:
            results.append(await client.do_get(b"table").read_all())

        async with anyio.create_task_group() as tg:
            for _ in range(16):
                tg.start_soon(fetch)
    assert len(results) == 16
    assert all(t.equals(sample_table()) for t in results)
