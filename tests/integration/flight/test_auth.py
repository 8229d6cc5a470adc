"""Bearer-token auth on a real worker: every call of every service on the port is refused
without a valid token (the matrix: each RPC the protocols declare, on a worker and on a served
coordinator; pyarrow's C++ client, flightfeed's clients, the WorkerService, the tables'
RemoteEngineService), Basic credentials get the token through Flight's Handshake,
workers and a coordinator send theirs to each other, and no token reaches a log line."""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from pathlib import Path

import anyio
import pyarrow as pa
import pyarrow.flight as fl
import pyarrow.parquet as pq
import pytest
from grpclib.client import Channel
from grpclib.const import Handler, Status
from grpclib.exceptions import GRPCError
from helpers.worker_process import worker_process

from flightfeed._generated.arrow.flight.protocol import FlightServiceBase
from flightfeed._generated.flightfeed.v1 import (
    GetWorkerInfoRequest,
    WorkerServiceBase,
    WorkerServiceStub,
)
from flightfeed._generated.remote_engine import (
    GetTableInfoRequest,
    RemoteEngineServiceBase,
    RemoteEngineServiceStub,
    TableIdentifier,
)
from flightfeed.cluster import serve
from flightfeed.coordinator import Catalog, Coordinator
from flightfeed.coordinator.resolver import StaticWorkerResolver
from flightfeed.errors import CredentialsRefused, FlightfeedError
from flightfeed.flight.auth import BearerTokens, bearer
from flightfeed.flight.client import FlightClient, parse_location
from flightfeed.flight.grpc import HANDSHAKE_PATH
from flightfeed.plan.aggregate import agg
from flightfeed.plan.builder import plan_from
from flightfeed.plan.expr import col
from flightfeed.plan.nodes import ParquetScan
from flightfeed.protocol.resolver import ChannelResolver
from flightfeed.session import Headers, Session, WorkerQueryContext
from flightfeed.worker import Worker, WorkerConfig

pytestmark = pytest.mark.anyio

TOKEN = "s3cret-token-for-tests"
AUTH = BearerTokens([TOKEN, "another-one"])


def options(token: str | None) -> fl.FlightCallOptions:
    headers = [(b"authorization", f"Bearer {token}".encode())] if token is not None else []
    return fl.FlightCallOptions(headers=headers)


def pyarrow_actions(location: str, token: str | None) -> list[str]:
    with fl.connect(location) as client:
        return [a.type for a in client.list_actions(options(token))]


async def test_pyarrow_needs_a_valid_token(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    async with Worker(config=WorkerConfig(auth=AUTH)) as worker:
        for token in (None, "wrong", TOKEN.upper()):
            with pytest.raises(fl.FlightUnauthenticatedError) as info:
                await anyio.to_thread.run_sync(pyarrow_actions, worker.location, token)
            assert "bearer token" in str(info.value)
        got = await anyio.to_thread.run_sync(pyarrow_actions, worker.location, TOKEN)
        assert "create_table" in got
        assert "another-one" not in str(info.value)
    assert TOKEN not in caplog.text
    refusals = [r.getMessage() for r in caplog.records if "refused a call to" in r.getMessage()]
    assert refusals  # each names who called (an operator looks for whose token is wrong)
    assert all(re.search(r" from 127\.0\.0\.1:\d+: ", line) for line in refusals), refusals


async def test_basic_credentials_get_the_token_by_handshake() -> None:
    async with Worker(config=WorkerConfig(auth=AUTH)) as worker:

        def handshake(password: str) -> list[str]:
            with fl.connect(worker.location) as client:
                name, value = client.authenticate_basic_token("anyone", password)
                call = fl.FlightCallOptions(headers=[(name, value)])
                return [a.type for a in client.list_actions(call)]

        assert "create_table" in await anyio.to_thread.run_sync(handshake, TOKEN)
        with pytest.raises(fl.FlightUnauthenticatedError):
            await anyio.to_thread.run_sync(handshake, "not-a-token")


async def test_a_password_read_with_its_line_break_gets_the_token(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """`open(token_file).read()` keeps the line break: the token was accepted, then sending it
    back failed INTERNAL with the token, line break and all, in the error and the log."""
    caplog.set_level(logging.DEBUG)

    def only_alice(headers: Sequence[tuple[str, str]]) -> bool:
        return ("x-user", "alice") in headers

    async with Worker(config=WorkerConfig(auth=AUTH)) as worker:

        def handshake(password: str) -> tuple[bytes, bytes]:
            with fl.connect(worker.location) as client:
                name, value = client.authenticate_basic_token("anyone", password)
                return name, value

        for password in (f"{TOKEN}\n", f"{TOKEN}\r\n", f"\t{TOKEN} "):
            got = await anyio.to_thread.run_sync(handshake, password)
            assert got == (b"authorization", f"Bearer {TOKEN}".encode())
    async with Worker(config=WorkerConfig(auth=only_alice)) as worker:
        with pytest.raises(fl.FlightUnauthenticatedError) as info:
            # accepted by the headers, but no header could carry the token back
            await anyio.to_thread.run_sync(handshake, f"{TOKEN}\nsecond line")
        assert TOKEN not in str(info.value)
    assert TOKEN not in caplog.text


async def test_every_service_on_the_port_is_guarded(tmp_path: Path) -> None:
    config = WorkerConfig(auth=AUTH, data_dir=str(tmp_path))
    async with Worker(config=config) as worker:
        host, port = parse_location(worker.location)
        channel = Channel(host, port)
        try:
            with pytest.raises(GRPCError) as info:
                await WorkerServiceStub(channel).get_worker_info(GetWorkerInfoRequest())
            assert info.value.status is Status.UNAUTHENTICATED
            request = GetTableInfoRequest(table=TableIdentifier(table="t"))
            with pytest.raises(GRPCError) as info:
                await RemoteEngineServiceStub(channel).get_table_info(request)
            assert info.value.status is Status.UNAUTHENTICATED
            info_reply = await WorkerServiceStub(channel).get_worker_info(
                GetWorkerInfoRequest(), metadata=bearer(TOKEN)
            )
            assert info_reply.version
        finally:
            channel.close()
        async with FlightClient(worker.location) as client:
            with pytest.raises(FlightfeedError, match="bearer token"):
                await client.list_actions()
        async with FlightClient(worker.location, metadata=bearer(TOKEN)) as client:
            assert "create_table" in [a.type for a in await client.list_actions()]


SERVICES = (FlightServiceBase, WorkerServiceBase, RemoteEngineServiceBase)
"""Every service a worker serves on its port, as its protocol declares it (generated code)."""


async def answer(channel: Channel, path: str, handler: Handler, token: str | None) -> Status:
    """The status a call with an empty request gets (OK when it is served without error)."""
    metadata = bearer(token) if token is not None else None
    try:
        with anyio.fail_after(10):
            async with channel.request(
                path,
                handler.cardinality,
                handler.request_type,
                handler.reply_type,
                metadata=metadata,
            ) as stream:
                await stream.send_message(handler.request_type(), end=True)
                while await stream.recv_message() is not None:
                    pass
    except GRPCError as exc:
        return exc.status
    return Status.OK


async def test_every_rpc_of_every_service_needs_the_token(tmp_path: Path) -> None:
    """The matrix: without a token or with a wrong one, UNAUTHENTICATED; with the right one,
    served (whatever it then says of an empty request). Handshake takes Basic credentials
    instead: test_basic_credentials_get_the_token_by_handshake."""
    config = WorkerConfig(auth=AUTH, data_dir=str(tmp_path))
    async with Worker(config=config) as worker:
        host, port = parse_location(worker.location)
        channel = Channel(host, port)
        try:
            paths = [
                (path, handler)
                for service in SERVICES
                for path, handler in service().__mapping__().items()
                if path != HANDSHAKE_PATH
            ]
            assert len(paths) == 19
            await assert_guarded(channel, paths)
        finally:
            channel.close()


async def test_every_rpc_of_the_coordinators_service_needs_the_token() -> None:
    async with serve(Catalog(), local_workers=1, auth=AUTH, worker_token=TOKEN) as cluster:
        host, port = parse_location(cluster.location)
        channel = Channel(host, port)
        try:
            paths = [
                (path, handler)
                for path, handler in FlightServiceBase().__mapping__().items()
                if path != HANDSHAKE_PATH
            ]
            await assert_guarded(channel, paths)
        finally:
            channel.close()


async def assert_guarded(channel: Channel, paths: Sequence[tuple[str, Handler]]) -> None:
    for path, handler in paths:
        for token in (None, "wrong", TOKEN.upper()):
            status = await answer(channel, path, handler, token)
            assert status is Status.UNAUTHENTICATED, (path, token)
        status = await answer(channel, path, handler, TOKEN)
        assert status is not Status.UNAUTHENTICATED, path


async def test_a_callable_decides_from_the_headers() -> None:
    def only_alice(headers: Sequence[tuple[str, str]]) -> bool:
        return ("x-user", "alice") in headers

    async with Worker(config=WorkerConfig(auth=only_alice)) as worker:
        async with FlightClient(worker.location, metadata={"x-user": "alice"}) as client:
            assert await client.list_actions()
        async with FlightClient(worker.location, metadata={"x-user": "bob"}) as client:
            with pytest.raises(FlightfeedError, match="bearer token"):
                await client.list_actions()


async def test_workers_and_coordinator_send_their_tokens(tmp_path: Path) -> None:
    rows = pa.table({"k": pa.array([i % 5 for i in range(500)]), "v": pa.array(range(500))})
    pq.write_table(rows, tmp_path / "rows.parquet", row_group_size=100)
    scan = ParquetScan.from_paths(str(tmp_path / "rows.parquet"), partitions=4)
    plan = plan_from(scan).aggregate([(col("k"), "k")], [agg("sum", col("v"), name="s")]).plan
    roots = (str(tmp_path),)

    async def run(peer_token: str | None, coordinator_token: str | None) -> pa.Table:
        config = WorkerConfig(auth=AUTH, peer_token=peer_token, parquet_roots=roots)
        async with Worker(config=config) as first, Worker(config=config) as second:
            resolver = StaticWorkerResolver([first.location, second.location])
            metadata = bearer(coordinator_token) if coordinator_token else None
            channels = ChannelResolver(metadata=metadata)
            async with Coordinator(resolver, channels=channels) as coordinator:
                return await coordinator.collect(plan)

    got = await run(TOKEN, TOKEN)
    expected = rows.group_by("k").aggregate([("v", "sum")])
    assert sorted(zip(got["k"].to_pylist(), got["s"].to_pylist(), strict=True)) == sorted(
        zip(expected["k"].to_pylist(), expected["v_sum"].to_pylist(), strict=True)
    )
    # A worker that refuses a caller's token is named, FAILED_PRECONDITION (a deployment's
    # tokens do not match): it was INTERNAL with a traceback, "did not answer GetWorkerInfo",
    # and a peer's refusal named the worker that called (found by a probe).
    refused = (
        r"grpc://127\.0\.0\.1:\d+ refused this caller's credentials \(UNAUTHENTICATED: .*bearer"
    )
    with pytest.raises(CredentialsRefused, match=refused):
        await run(TOKEN, None)  # the coordinator sends none
    with pytest.raises(CredentialsRefused, match=refused):
        await run(None, TOKEN)  # the workers' shuffle reads carry none


async def test_session_builders_never_see_the_callers_token(tmp_path: Path) -> None:
    """The worker handed the token it had checked to its session builder, and the headers'
    repr showed it: a builder that logs its headers logged the token (found by a probe)."""
    pq.write_table(pa.table({"v": pa.array(range(10))}), tmp_path / "rows.parquet")
    scan = ParquetScan.from_paths(str(tmp_path / "rows.parquet"), partitions=1)
    seen: list[Headers] = []

    async def build(ctx: WorkerQueryContext) -> Session:
        seen.append(ctx.headers)
        return ctx.builder.build()

    config = WorkerConfig(auth=AUTH, parquet_roots=(str(tmp_path),))
    async with Worker(config=config, session_builder=build) as worker:
        channels = ChannelResolver(metadata=bearer(TOKEN))
        resolver = StaticWorkerResolver([worker.location])
        async with Coordinator(resolver, channels=channels) as coordinator:
            rows = await coordinator.collect(scan, headers={"x-tenant": "blue"})
    assert rows.num_rows == 10
    assert seen
    for headers in seen:
        assert headers.get("x-tenant") == "blue"
        assert "authorization" not in headers
        assert TOKEN not in repr(headers)
    shown = repr(Headers([("authorization", f"Bearer {TOKEN}"), ("x-tenant", "blue")]))
    assert TOKEN not in shown
    assert "x-tenant" in shown


def test_the_worker_command_requires_a_token(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text(f"# tokens\n{TOKEN}\n\nanother-one\n")
    with worker_process("--auth-token-file", str(tokens)) as (_, location):
        with pytest.raises(fl.FlightUnauthenticatedError):
            pyarrow_actions(location, None)
        assert "create_table" in pyarrow_actions(location, "another-one")


async def test_local_workers_check_the_coordinators_tokens() -> None:
    async with serve(Catalog(), local_workers=1, auth=AUTH, worker_token=TOKEN) as cluster:
        (worker,) = cluster.workers
        with pytest.raises(fl.FlightUnauthenticatedError):
            await anyio.to_thread.run_sync(pyarrow_actions, worker.location, None)
        assert "create_table" in await anyio.to_thread.run_sync(
            pyarrow_actions, worker.location, "another-one"
        )
    with pytest.raises(FlightfeedError, match="give worker_token, the token the coordinator"):
        async with serve(Catalog(), local_workers=1, auth=AUTH):
            pass
