"""The worker runtime with real workers on port 0: tasks, heads, sessions, errors, lifecycle."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import pyarrow as pa
import pyarrow.flight as fl
import pytest
from grpclib.const import Cardinality
from helpers.worker_plans import (
    TABLE,
    ExplodingNode,
    broadcast_request,
    header_session_builder,
    new_key,
    none_request,
    repartition_request,
    scan,
    set_plan,
    sorted_by_k,
    tag_udf,
)

from flightfeed._generated.flightfeed.v1 import (
    CoordinatorToWorkerMsg,
    ExecuteTaskRequest,
    FlightAppMetadata,
    MetricsSet,
)
from flightfeed.errors import (
    Cancelled,
    Conflict,
    ExecutionError,
    FlightfeedError,
    InvalidArgument,
    NotFound,
    PlanDecodeError,
    ResourceExhausted,
    UnknownUdfError,
)
from flightfeed.flight.grpc import RawBytes
from flightfeed.flight.streams import FlightDataReader
from flightfeed.plan import MemoryScan, Projection, call, col, partition_ids
from flightfeed.plan.functions import BUILTINS
from flightfeed.protocol import TYPED_ERRORS, GrpcTaskChannel, WorkerClient
from flightfeed.session import Session, SessionStateBuilder, WorkerQueryContext
from flightfeed.testing import start_workers
from flightfeed.worker import Worker, WorkerConfig

pytestmark = pytest.mark.anyio
FAST = WorkerConfig(plan_wait_timeout=0.5, idle_ttl=30.0)


@asynccontextmanager
async def one_worker(config: WorkerConfig = FAST) -> AsyncIterator[tuple[Worker, WorkerClient]]:
    async with (
        start_workers(1, session_builder=header_session_builder, config=config) as (w,),
        WorkerClient(w.location) as client,
    ):
        yield w, client


def cpp_read(location: str, request: ExecuteTaskRequest) -> tuple[pa.Table, set[int]]:
    """pyarrow's C++ Flight client: DoGet with the ExecuteTaskRequest as ticket."""
    client = fl.connect(location)
    try:
        reader = client.do_get(fl.Ticket(bytes(request)))
        batches, partitions = [], set()
        while True:
            try:
                chunk = reader.read_chunk()
            except StopIteration:
                break
            batches.append(chunk.data)
            partitions.add(FlightAppMetadata.parse(chunk.app_metadata.to_pybytes()).partition)
        return pa.Table.from_batches(batches, schema=reader.schema), partitions
    finally:
        client.close()


async def read(client: WorkerClient, request: ExecuteTaskRequest) -> pa.Table:
    async with client.execute_task(request) as reader:
        return await reader.read_all()


async def drain(reader: FlightDataReader) -> None:
    while await reader.next() is not None:
        pass


def output_rows(metrics: MetricsSet) -> int:
    return sum(m.output_rows.value for m in metrics.metrics if m.output_rows is not None)


async def test_cpp_client_runs_none_head_ranges() -> None:
    async with one_worker() as (worker, client):
        key = new_key()
        async with client.open_task(set_plan(scan(4), key)) as channel:
            first, parts_a = await anyio.to_thread.run_sync(
                cpp_read, worker.location, none_request(key, 0, 3)
            )
            second, parts_b = await anyio.to_thread.run_sync(
                cpp_read, worker.location, none_request(key, 3, 4)
            )
            metrics = await channel.wait_metrics()
        assert parts_a == {0, 1, 2}
        assert parts_b == {3}
        assert sorted_by_k(pa.concat_tables([first, second])).equals(TABLE)
        assert output_rows(metrics.pre_order_plan_metrics[0]) == TABLE.num_rows
        assert len(worker.registry) == 0


async def test_cpp_client_repartition_covers_output_exactly_once() -> None:
    outputs = 3
    async with one_worker() as (worker, client):
        key = new_key()
        async with client.open_task(set_plan(scan(4), key)) as channel:
            results: dict[int, pa.Table] = {}

            async def consume(index: int) -> None:
                table, parts = await anyio.to_thread.run_sync(
                    cpp_read, worker.location, repartition_request(key, index, outputs)
                )
                assert parts <= {index}
                results[index] = table

            async with anyio.create_task_group() as tg:
                for index in range(outputs):
                    tg.start_soon(consume, index)
            metrics = await channel.wait_metrics()
    union = pa.concat_tables(results.values())
    assert union.num_rows == TABLE.num_rows
    assert sorted_by_k(union).equals(TABLE)  # every row exactly once
    for index, table in results.items():  # each consumer got exactly its hash bucket
        ids = partition_ids(table.combine_chunks().to_batches()[0], [col("k")], outputs, BUILTINS)
        assert set(ids.tolist()) == {index}
    assert output_rows(metrics.pre_order_plan_metrics[0]) == TABLE.num_rows  # ran once


async def test_cpp_client_broadcast_gives_everyone_everything() -> None:
    outputs = 3
    async with one_worker() as (worker, client):
        key = new_key()
        async with client.open_task(set_plan(scan(4), key)) as channel:
            tables: list[pa.Table] = []

            async def consume(index: int) -> None:
                table, _ = await anyio.to_thread.run_sync(
                    cpp_read, worker.location, broadcast_request(key, index, outputs)
                )
                tables.append(table)

            async with anyio.create_task_group() as tg:
                for index in range(outputs):
                    tg.start_soon(consume, index)
            metrics = await channel.wait_metrics()
    assert len(tables) == outputs
    for table in tables:
        assert sorted_by_k(table).equals(TABLE)
    assert output_rows(metrics.pre_order_plan_metrics[0]) == TABLE.num_rows  # ran once


@pytest.mark.parametrize("head", ["broadcast", "repartition"])
async def test_fifty_concurrent_consumers_on_one_task(head: str) -> None:
    consumers = 50
    async with one_worker() as (worker, client):
        key = new_key()
        async with client.open_task(set_plan(scan(8), key)) as channel:
            tables: dict[int, pa.Table] = {}

            async def consume(index: int) -> None:
                make = broadcast_request if head == "broadcast" else repartition_request
                tables[index] = await read(client, make(key, index, consumers))

            async with anyio.create_task_group() as tg:
                for index in range(consumers):
                    tg.start_soon(consume, index)
            metrics = await channel.wait_metrics()
        assert len(tables) == consumers
        if head == "broadcast":
            assert all(sorted_by_k(t).equals(TABLE) for t in tables.values())
        else:
            assert sorted_by_k(pa.concat_tables(tables.values())).equals(TABLE)
        assert output_rows(metrics.pre_order_plan_metrics[0]) == TABLE.num_rows
        assert len(worker.registry) == 0


async def test_headers_choose_udfs_per_request() -> None:
    # Both sides name the UDF "tag"; each worker session implements it from its headers.
    planning = SessionStateBuilder().with_scalar_udf(tag_udf("planning")).build()
    plan = Projection(scan(2), [call("tag", col("k"))], ["tagged"], functions=planning)
    async with one_worker() as (_, client):
        results = {}
        for tag in ("red", "blue"):
            key = new_key()
            async with client.open_task(set_plan(plan, key), headers={"x-tag": tag}) as channel:
                results[tag] = await read(client, none_request(key, 0, 2))
                await channel.wait_metrics()
    assert sorted(results["red"].column("tagged").to_pylist())[0].startswith("red:")
    assert sorted(results["blue"].column("tagged").to_pylist())[0].startswith("blue:")


async def test_unknown_udf_fails_with_its_name() -> None:
    planning = SessionStateBuilder().with_scalar_udf(tag_udf("x")).build()
    plan = Projection(scan(1), [call("tag", col("k"))], ["tagged"], functions=planning)
    async with one_worker() as (worker, client):
        key = new_key()
        with pytest.raises(UnknownUdfError, match="tag"):
            async with client.open_task(set_plan(plan, key)) as channel:  # no x-tag header
                await channel.wait_metrics()
        assert len(worker.registry) == 0
        await assert_serves(client)


async def test_user_node_error_keeps_message_type_and_origin() -> None:
    plan = ExplodingNode(scan(2), "the node blew up")
    async with one_worker() as (worker, client):
        key = new_key()
        async with client.open_task(set_plan(plan, key)) as channel:
            with pytest.raises(ExecutionError) as info:
                await read(client, none_request(key, 0, 1))
            error = info.value
            assert error.message == "the node blew up"
            assert error.error_type == "ValueError"
            assert error.origin is not None
            assert error.origin.worker_url == worker.location
            assert error.origin.query_id == key.query_id
            with pytest.raises(fl.FlightInternalError, match="the node blew up"):
                await anyio.to_thread.run_sync(cpp_read, worker.location, none_request(key, 1, 2))
            await channel.wait_metrics()  # metrics still come back after failed partitions


async def assert_serves(client: WorkerClient) -> None:
    """The worker still runs a normal task after bad input."""
    key = new_key()
    async with client.open_task(set_plan(scan(1), key)) as channel:
        assert sorted_by_k(await read(client, none_request(key, 0, 1))).equals(TABLE)
        await channel.wait_metrics()


async def test_bad_input_unknown_task_key() -> None:
    async with one_worker() as (_, client):
        with pytest.raises(NotFound, match="no plan for task"):
            await read(client, none_request(new_key(), 0, 1))
        await assert_serves(client)


async def test_bad_input_empty_task_key() -> None:
    async with one_worker() as (_, client):
        request = none_request(new_key(), 0, 1)
        request.task_key.query_id = b""
        with pytest.raises(InvalidArgument, match="query_id is empty"):
            await read(client, request)
        await assert_serves(client)


async def test_execute_task_waits_for_a_late_plan() -> None:
    async with one_worker() as (_, client):
        key = new_key()
        result: list[pa.Table] = []
        async with anyio.create_task_group() as tg:

            async def early_consumer() -> None:
                result.append(await read(client, none_request(key, 0, 1)))

            tg.start_soon(early_consumer)
            await anyio.wait_all_tasks_blocked()
            async with client.open_task(set_plan(scan(1), key)) as channel:
                await channel.wait_metrics()
        assert sorted_by_k(result[0]).equals(TABLE)


async def test_bad_input_set_plan_never_comes() -> None:
    async with one_worker(WorkerConfig(plan_wait_timeout=0.2)) as (_, client):
        with anyio.fail_after(10), pytest.raises(NotFound, match=r"within 0\.2s"):
            await read(client, none_request(new_key(), 0, 1))
        await assert_serves(client)


@pytest.mark.parametrize("builds", [True, False], ids=["built", "refused"])
async def test_readers_wait_while_a_slow_session_builder_runs(builds: bool) -> None:
    """A session builder slower than the plan wait: its readers were told "no plan arrived
    ... (unknown task, or its SetPlan never came)" while the SetPlan was being opened."""
    release = anyio.Event()
    started = anyio.Event()

    async def slow_builder(ctx: WorkerQueryContext) -> Session:
        first = not started.is_set()
        started.set()
        await release.wait()
        if first and not builds:
            raise RuntimeError("no credentials for this query")
        return await header_session_builder(ctx)

    config = WorkerConfig(plan_wait_timeout=0.2, idle_ttl=30.0)
    async with (
        start_workers(1, session_builder=slow_builder, config=config) as (worker,),
        WorkerClient(worker.location) as client,
    ):
        key = new_key()
        got: list[pa.Table | BaseException] = []

        async def run_task() -> None:
            with contextlib.suppress(FlightfeedError):
                async with client.open_task(set_plan(scan(2), key)) as channel:
                    await channel.wait_metrics()

        async def reader() -> None:
            try:
                got.append(await read(client, none_request(key, 0, 2)))
            except FlightfeedError as exc:
                got.append(exc)

        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                tg.start_soon(run_task)
                await started.wait()
                tg.start_soon(reader)
                await anyio.sleep(0.6)  # the reader waits past the 0.2 s plan wait
                release.set()
        (outcome,) = got
        if builds:
            assert isinstance(outcome, pa.Table)
            assert sorted_by_k(outcome).equals(TABLE)
        else:
            assert isinstance(outcome, FlightfeedError)
            assert "no credentials for this query" in str(outcome)
        assert worker.registry.waiting == 0
        await assert_serves(client)


async def test_bad_input_undecodable_plan() -> None:
    async with one_worker() as (worker, client):
        request = set_plan(scan(1), new_key())
        request.plan_proto = b"\xff\x00 definitely not a plan"
        with pytest.raises(PlanDecodeError):
            async with client.open_task(request) as channel:
                await channel.wait_metrics()
        assert len(worker.registry) == 0
        await assert_serves(client)


@pytest.mark.parametrize(("start", "end"), [(0, 5), (3, 3), (4, 2), (7, 9)])
async def test_bad_input_partition_range_out_of_bounds(start: int, end: int) -> None:
    async with one_worker() as (_, client):
        key = new_key()
        async with client.open_task(set_plan(scan(4), key)) as channel:
            with pytest.raises(InvalidArgument, match="out of bounds"):
                await read(client, none_request(key, start, end))
            await read(client, none_request(key, 0, 4))
            await channel.wait_metrics()
        await assert_serves(client)


async def test_bad_input_channel_without_set_plan() -> None:
    async def channel_starting_with_cancel(client: WorkerClient) -> None:
        async with client._call(  # a raw channel whose first message is a CancelTask
            "CoordinatorChannel",
            Cardinality.STREAM_STREAM,
            CoordinatorToWorkerMsg,
            RawBytes,  # GrpcTaskChannel decodes the worker's messages itself
            None,
            path="/flightfeed.v1.WorkerService/",
        ) as stream:
            channel = GrpcTaskChannel(stream, TYPED_ERRORS)
            await channel.cancel("hello")
            await channel.wait_metrics()

    async with one_worker() as (worker, client):
        with pytest.raises(InvalidArgument, match="must start with a SetPlanRequest, got cancel"):
            await channel_starting_with_cancel(client)
        assert len(worker.registry) == 0
        await assert_serves(client)


async def test_partitions_cannot_be_claimed_twice() -> None:
    async with one_worker() as (_, client):
        key = new_key()
        async with client.open_task(set_plan(scan(2), key)) as channel:
            await read(client, none_request(key, 0, 1))
            with pytest.raises(Conflict, match="already requested"):  # FAILED_PRECONDITION
                await read(client, none_request(key, 0, 1))
            await read(client, none_request(key, 1, 2))
            await channel.wait_metrics()


async def test_state_gone_after_completion() -> None:
    async with one_worker() as (worker, client):
        key = new_key()
        async with client.open_task(set_plan(scan(2), key)) as channel:
            await read(client, none_request(key, 0, 2))
            await channel.wait_metrics()
        assert len(worker.registry) == 0
        with pytest.raises(NotFound, match="no longer on this worker: finished"):
            await read(client, none_request(key, 0, 1))


async def test_state_gone_after_cancellation_and_consumers_fail() -> None:
    async with one_worker() as (worker, client):
        key = new_key()
        plan = scan(2)
        async with client.open_task(set_plan(plan, key)) as channel:
            async with client.execute_task(broadcast_request(key, 0, 2)) as reader:
                assert await reader.next() is not None  # consumer 0 is mid-stream;
                # consumer 1 never comes, so the producer blocks on its buffer
                await channel.cancel("user pressed stop")
                with anyio.fail_after(10), pytest.raises(FlightfeedError):
                    await drain(reader)
            with anyio.fail_after(10), pytest.raises(Cancelled, match="user pressed stop"):
                await channel.wait_metrics()
        assert len(worker.registry) == 0
        with pytest.raises(NotFound, match="cancelled"):
            await read(client, broadcast_request(key, 1, 2))


async def test_state_gone_after_idle_ttl() -> None:
    async with one_worker(WorkerConfig(idle_ttl=0.2)) as (worker, client):
        key = new_key()
        async with client.open_task(set_plan(scan(2), key)) as channel:
            with anyio.fail_after(10), pytest.raises(Cancelled, match="idle TTL"):
                await channel.wait_metrics()
        assert len(worker.registry) == 0


async def test_state_gone_when_coordinator_channel_drops() -> None:
    async with one_worker() as (worker, _):
        key = new_key()
        async with (
            WorkerClient(worker.location) as doomed,
            doomed.open_task(set_plan(scan(2), key)),
        ):
            with anyio.fail_after(10):
                while not len(worker.registry):  # the SetPlan is on its way
                    await worker.registry.changed()
            assert len(worker.registry) == 1
            await doomed.close()
        with anyio.fail_after(10):
            while len(worker.registry):
                await worker.registry.changed()
        assert len(worker.registry) == 0


async def test_metrics_arrive_when_a_consumer_leaves_early() -> None:
    # Large enough that the HTTP/2 windows and socket buffers cannot hold all of it.
    rows = 400_000
    wide = pa.table({"k": pa.array(range(rows), pa.int64()), "pad": pa.array([b"x" * 64] * rows)})
    plan = MemoryScan.from_table(wide, 2, batch_rows=1_000)
    async with one_worker() as (_, client):
        key = new_key()
        async with client.open_task(set_plan(plan, key)) as channel:
            async with client.execute_task(none_request(key, 0, 2)) as reader:
                assert await reader.next() is not None  # leave after one batch
            with anyio.fail_after(10):
                metrics = await channel.wait_metrics()
        produced = output_rows(metrics.pre_order_plan_metrics[0])
        assert 0 < produced < rows


async def test_broadcast_consumer_leaving_early_does_not_break_the_others() -> None:
    outputs = 3
    async with one_worker() as (_, client):
        key = new_key()
        async with client.open_task(set_plan(scan(4), key)) as channel:
            tables: dict[int, pa.Table] = {}

            async def quitter() -> None:
                async with client.execute_task(broadcast_request(key, 0, outputs)) as reader:
                    assert await reader.next() is not None  # one batch, then disconnect

            async def stayer(index: int) -> None:
                tables[index] = await read(client, broadcast_request(key, index, outputs))

            async with anyio.create_task_group() as tg:
                tg.start_soon(quitter)
                for index in (1, 2):
                    tg.start_soon(stayer, index)
            metrics = await channel.wait_metrics()
        assert sorted(tables) == [1, 2]
        for table in tables.values():
            assert sorted_by_k(table).equals(TABLE)  # nothing lost or duplicated
        assert output_rows(metrics.pre_order_plan_metrics[0]) == TABLE.num_rows


@pytest.mark.parametrize("head", ["broadcast", "repartition"])
async def test_a_fan_out_beyond_the_workers_limit_is_refused(head: str) -> None:
    """A broadcast head asking for 65,536 outputs streamed 45 GB from a small plan before."""
    config = WorkerConfig(plan_wait_timeout=0.5, idle_ttl=30.0, max_fanout_outputs=8)
    make = broadcast_request if head == "broadcast" else repartition_request
    async with one_worker(config) as (_, client):
        key = new_key()
        async with client.open_task(set_plan(scan(2), key)) as channel:
            with pytest.raises(ResourceExhausted, match=f"a {head} head asks for 9 outputs"):
                await read(client, make(key, 0, 9))
            rows = [0] * 8  # within the limit: every consumer reads its output

            async def consume(index: int) -> None:
                rows[index] = (await read(client, make(key, index, 8))).num_rows

            with anyio.fail_after(30):
                async with anyio.create_task_group() as consumers:
                    for index in range(8):
                        consumers.start_soon(consume, index)
            assert sum(rows) == TABLE.num_rows * (8 if head == "broadcast" else 1)
            await channel.cancel("done")
