"""A live `flightfeed worker` process against hostile clients: what a client declares is
checked before memory is spent on it, the answer is a precise status, and the worker keeps
serving everyone else."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator

import anyio
import pyarrow as pa
import pytest
from anyio.abc import SocketStream
from grpclib.const import Status
from helpers.raw_h2 import CallAnswer, RawH2Client, grpc_message
from helpers.worker_plans import broadcast_request, new_key, set_plan
from helpers.worker_process import resident_bytes, worker_log, worker_process

from flightfeed._generated.flightfeed.v1 import (
    CoordinatorToWorkerMsg,
    SetPlanRequest,
    SetPlanRequestWorkUnitFeedDeclaration,
    TaskKey,
)
from flightfeed.errors import Cancelled, RemoteError
from flightfeed.flight.client import parse_location
from flightfeed.plan import MemoryScan
from flightfeed.protocol import WorkerClient

FLIGHT = "/arrow.flight.protocol.FlightService/"
WORKER = "/flightfeed.v1.WorkerService/"
MiB = 1 << 20


@pytest.fixture(scope="module")
def live_worker() -> Iterator[tuple[subprocess.Popen[str], str]]:
    with worker_process() as running:
        yield running


async def declare_and_send(location: str, path: str, declared: int, body: int) -> CallAnswer:
    """A call whose gRPC prefix declares `declared` bytes, followed by up to `body` bytes that
    the worker should never take in."""
    client = await RawH2Client.connect(*parse_location(location))
    try:
        chunk = bytes(MiB)
        return await client.call(path, [grpc_message(b"", declared), *[chunk] * (body // MiB)])
    finally:
        await client.aclose()


@pytest.mark.anyio
@pytest.mark.parametrize(
    "path",
    [
        WORKER + "GetWorkerInfo",
        WORKER + "CoordinatorChannel",
        WORKER + "ExecuteTask",
        FLIGHT + "DoGet",
        FLIGHT + "GetFlightInfo",
        FLIGHT + "DoAction",
    ],
    ids=lambda path: path.rsplit("/", 1)[-1],
)
async def test_a_declared_length_is_checked_before_the_body_is_buffered(
    live_worker: tuple[subprocess.Popen[str], str], path: str
) -> None:
    proc, location = live_worker
    before = resident_bytes(proc.pid)
    answer = await declare_and_send(location, path, declared=(1 << 32) - 1, body=256 * MiB)
    assert answer.status == Status.RESOURCE_EXHAUSTED.value, answer
    assert f"gRPC message of {(1 << 32) - 1} bytes exceeds the limit" in answer.message
    # Before the check moved to the prefix, each such call grew the worker by ~280 MB.
    assert resident_bytes(proc.pid) - before < 48 * MiB
    async with WorkerClient(location) as client:  # the worker serves others meanwhile
        assert (await client.worker_info()).version


def test_bad_timeouts_get_precise_statuses_and_no_tracebacks() -> None:
    """Synchronous: it reads the worker's log once the worker has stopped."""
    values = ("1n", "abc", "123456789S", "-1S")

    async def calls(location: str) -> dict[str, CallAnswer]:
        answers = {}
        for value in values:
            client = await RawH2Client.connect(*parse_location(location))
            try:
                answers[value] = await client.call(
                    WORKER + "GetWorkerInfo", [grpc_message(b"")], headers=[("grpc-timeout", value)]
                )
            finally:
                await client.aclose()
        async with WorkerClient(location) as served:
            assert (await served.worker_info()).version
        return answers

    with worker_process() as (proc, location):
        answers = anyio.run(calls, location)
        proc.terminate()
        proc.wait(timeout=30)
        log = worker_log(proc)
    # grpclib alone answered UNKNOWN to all four, and logged a traceback for "1n" on every call.
    assert answers["1n"].status == Status.DEADLINE_EXCEEDED.value
    for value in values[1:]:
        assert answers[value].status == Status.INVALID_ARGUMENT.value, answers[value]
        assert f"invalid grpc-timeout header {value!r}" in answers[value].message
    assert "Traceback" not in log, log


async def _silent_connections(location: str, count: int) -> list[SocketStream]:
    host, port = parse_location(location)
    return [await anyio.connect_tcp(host, port) for _ in range(count)]


async def _closed_by_peer(connection: SocketStream) -> bool:
    """Whether the worker closes this connection (reading its SETTINGS first)."""
    try:
        with anyio.fail_after(10):
            while await connection.receive():
                pass
    except (anyio.EndOfStream, anyio.BrokenResourceError, ConnectionError):
        return True
    return True


def test_connections_that_never_speak_http2_are_closed() -> None:
    """1,100 such connections locked a worker under a 1,024-descriptor limit out for good."""

    async def scenario(location: str) -> None:
        silent = await _silent_connections(location, 50)
        try:
            with anyio.fail_after(20):
                closed = [await _closed_by_peer(connection) for connection in silent]
            assert all(closed)
            async with WorkerClient(location) as served:
                assert (await served.worker_info()).version
        finally:
            for connection in silent:
                await connection.aclose()

    with worker_process("--handshake-timeout", "0.5") as (_, location):
        anyio.run(scenario, location)


def test_beyond_max_connections_new_ones_are_refused_and_open_ones_served() -> None:
    async def scenario(location: str) -> None:
        clients = [await RawH2Client.connect(*parse_location(location)) for _ in range(4)]
        try:
            (extra,) = await _silent_connections(location, 1)
            with anyio.fail_after(5):
                assert await _closed_by_peer(extra)
            # flightfeed's own client says what happened (it failed with an AttributeError).
            # Under load the refusal can land after the client sent its preface: then it is the
            # call's connection that is lost, still a RemoteError and never an AttributeError.
            refused_message = f"cannot reach {location}: the server closed|Connection lost"
            with pytest.raises(RemoteError, match=refused_message):
                async with WorkerClient(location) as refused:
                    await refused.worker_info()
            for client in clients:  # the four admitted keep being served
                answer = await client.call(WORKER + "GetWorkerInfo", [grpc_message(b"")])
                assert answer.status == Status.OK.value, answer
        finally:
            for client in clients:
                await client.aclose()
        async with WorkerClient(location) as served:  # their slots are free again
            assert (await served.worker_info()).version

    with worker_process("--max-connections", "4") as (_, location):
        anyio.run(scenario, location)


@pytest.mark.anyio
async def test_a_task_declaring_too_many_feed_partitions_is_refused_before_allocating(
    live_worker: tuple[subprocess.Popen[str], str],
) -> None:
    """65,536 declared partitions took 2.1 GB and froze the loop for seconds; the limit (4,096
    by default) is checked on the declaration, and partitions no unit reached cost little."""
    proc, location = live_worker
    declaration = SetPlanRequestWorkUnitFeedDeclaration(id=uuid.uuid4().bytes, partitions=1 << 16)
    message = CoordinatorToWorkerMsg(
        set_plan_request=SetPlanRequest(
            task_key=TaskKey(query_id=uuid.uuid4().bytes, stage_id=1, task_number=0),
            task_count=1,
            work_unit_feed_declarations=[declaration],
        )
    )
    before = resident_bytes(proc.pid)
    client = await RawH2Client.connect(*parse_location(location))
    try:
        answer = await client.call(
            WORKER + "CoordinatorChannel", [grpc_message(bytes(message))], end=False
        )
    finally:
        await client.aclose()
    assert answer.status == Status.RESOURCE_EXHAUSTED.value, answer
    assert "declares 65536 work-unit feed partitions" in answer.message
    assert "at most 4096" in answer.message
    assert resident_bytes(proc.pid) - before < 48 * MiB
    async with WorkerClient(location) as served:
        assert (await served.worker_info()).version


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("path", "body", "named"),
    [
        (WORKER + "ExecuteTask", b"\x08\x05", "ExecuteTaskRequest.task_key should be a message"),
        (FLIGHT + "DoGet", b"\x08\x05", "Ticket.ticket should be bytes"),
        (FLIGHT + "DoAction", b"\x08\x01", "Action.type should be string"),
        (
            WORKER + "CoordinatorChannel",
            b"\x08\x01",
            "CoordinatorToWorkerMsg.set_plan_request should be a message",
        ),
    ],
    ids=["execute-task", "do-get", "do-action", "coordinator-channel"],
)
async def test_fields_of_the_wrong_wire_type_are_invalid_arguments_naming_the_field(
    live_worker: tuple[subprocess.Popen[str], str], path: str, body: bytes, named: str
) -> None:
    """They were INTERNAL with Python's own text ("AttributeError: 'int' object has no
    attribute 'query_id'")."""
    _, location = live_worker
    client = await RawH2Client.connect(*parse_location(location))
    try:
        answer = await client.call(path, [grpc_message(body)], end=not path.endswith("Channel"))
    finally:
        await client.aclose()
    assert answer.status == Status.INVALID_ARGUMENT.value, answer
    assert named in answer.message


def test_an_output_nobody_claims_is_dropped_and_the_others_finish() -> None:
    """A broadcast output that no consumer claimed blocked the other outputs forever: now it
    is dropped after the claim timeout, the others get every row, and a late claim is told."""
    plan = MemoryScan.from_table(pa.table({"k": list(range(50_000))}), batch_rows=1000)

    async def scenario(location: str) -> None:
        key = new_key()
        async with WorkerClient(location) as client, client.open_task(set_plan(plan, key)):
            tables: dict[int, pa.Table] = {}

            async def consume(index: int) -> None:
                async with client.execute_task(broadcast_request(key, index, 3)) as reader:
                    tables[index] = await reader.read_all()

            with anyio.fail_after(30):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(consume, 0)
                    tg.start_soon(consume, 1)
            assert [tables[i].num_rows for i in (0, 1)] == [50_000, 50_000]
            with pytest.raises(Cancelled, match="output 2 was not opened within 1s"):
                await consume(2)

    with worker_process("--fanout-claim-timeout", "1") as (_, location):
        anyio.run(scenario, location)
