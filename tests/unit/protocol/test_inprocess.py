"""The in-process WorkerChannel: messages, batches and errors pass as the objects themselves,
and leaving a call stops the worker's handler, as a reset stream would."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import contextmanager

import anyio
import pyarrow as pa
import pytest
from grpclib.const import Status

from flightfeed.errors import ExecutionError, NotFound, RemoteError
from flightfeed.protocol import (
    CoordinatorToWorkerMsg,
    ExecuteTaskRequest,
    GetWorkerInfoResponse,
    InProcessWorkerChannel,
    PartitionSink,
    SetPlanRequest,
    TaskKey,
    TaskMetrics,
    WorkerToCoordinatorMsg,
    WorkUnitBatch,
    execute_task_request,
    inprocess,
)

pytestmark = pytest.mark.anyio

KEY = TaskKey(query_id=b"\x01", stage_id=1)
BATCH = pa.record_batch({"x": [1, 2, 3]})


class Endpoint:
    """A worker endpoint that records what it is given and does what the test asks."""

    location = "inproc://test"

    def __init__(self) -> None:
        self.received: list[CoordinatorToWorkerMsg] = []
        self.headers: list[dict[str, str]] = []
        self.fail: Exception | None = None
        self.batches = 1
        self.ended = anyio.Event()
        self.cancelled = False

    def worker_info(self) -> GetWorkerInfoResponse:
        return GetWorkerInfoResponse(version="test")

    async def coordinator_channel(
        self,
        headers: dict[str, str],
        inbound: AsyncIterator[CoordinatorToWorkerMsg],
        send: Callable[[WorkerToCoordinatorMsg], Awaitable[None]],
        accepted: Callable[[], Awaitable[None]],
    ) -> None:
        self.headers.append(dict(headers))
        with self._watch():
            await accepted()
            async for message in inbound:
                self.received.append(message)
                if self.fail is not None:
                    raise self.fail
                if message.cancel_task is not None:
                    await send(WorkerToCoordinatorMsg(task_metrics=TaskMetrics()))
            await anyio.sleep_forever()  # a task that never ends by itself

    async def execute_task(
        self, headers: dict[str, str], request: ExecuteTaskRequest, sink: PartitionSink
    ) -> None:
        with self._watch():
            await sink.begin(BATCH.schema)
            for _ in range(self.batches):
                await sink.write(0, BATCH)
            if self.fail is not None:
                raise self.fail

    @contextmanager
    def _watch(self) -> Iterator[None]:
        try:
            yield
        except anyio.get_cancelled_exc_class():
            self.cancelled = True
            raise
        finally:
            self.ended.set()


@contextmanager
def registered(endpoint: Endpoint) -> Iterator[InProcessWorkerChannel]:
    location = inprocess.register(endpoint)  # type: ignore[arg-type]
    try:
        yield InProcessWorkerChannel(location, metadata={"x-tenant": "a", "x-bin": b"\x00"})
    finally:
        inprocess.unregister(location)


async def test_messages_arrive_as_the_very_objects_sent() -> None:
    endpoint = Endpoint()
    set_plan = SetPlanRequest(task_key=KEY, plan_proto=b"plan")
    batch = WorkUnitBatch()
    with registered(endpoint) as channel:
        async with channel.open_task(set_plan, headers={"x-query": "q"}) as task:
            await task.send_work_units(batch)
            await task.cancel("done")
            metrics = await task.wait_metrics()
    assert metrics == TaskMetrics()
    assert endpoint.received[0].set_plan_request is set_plan
    assert endpoint.received[1].work_unit_batch is batch
    assert endpoint.received[2].cancel_task is not None
    assert endpoint.headers == [{"x-tenant": "a", "x-query": "q"}]  # text headers only


async def test_leaving_the_channel_cancels_the_workers_handler() -> None:
    endpoint = Endpoint()
    with registered(endpoint) as channel:
        async with channel.open_task(SetPlanRequest(task_key=KEY)):
            pass
        with anyio.fail_after(5):
            await endpoint.ended.wait()
    assert endpoint.cancelled


@pytest.mark.parametrize(
    ("error", "expected", "error_type"),
    [(NotFound("no task"), NotFound, "NotFound"), (KeyError("k"), ExecutionError, "KeyError")],
)
async def test_a_handler_error_reaches_the_caller_as_the_error(
    error: Exception, expected: type[Exception], error_type: str
) -> None:
    endpoint = Endpoint()
    endpoint.fail = error
    with registered(endpoint) as channel:
        async with channel.open_task(SetPlanRequest(task_key=KEY)) as task:
            with pytest.raises(expected) as info:
                await task.wait_metrics()
    assert getattr(info.value, "error_type", "") == error_type


async def test_batches_arrive_as_the_very_objects_and_errors_after_them() -> None:
    endpoint = Endpoint()
    endpoint.batches = 3
    with registered(endpoint) as channel:
        async with channel.execute_task(execute_task_request(KEY, 0, 1)) as batches:
            received = [batch async for batch in batches]
        assert all(batch is BATCH for batch in received)
        assert len(received) == 3
        endpoint.fail = RuntimeError("node failed")
        got: list[pa.RecordBatch] = []

        async def read_all() -> None:
            async with channel.execute_task(execute_task_request(KEY, 0, 1)) as batches:
                async for batch in batches:
                    got.append(batch)  # noqa: PERF401 - keeps what arrived before the error

        with pytest.raises(ExecutionError, match="node failed"):
            await read_all()
        assert len(got) == 3


async def test_leaving_a_read_early_cancels_the_handler() -> None:
    endpoint = Endpoint()
    endpoint.batches = 1000  # more than the buffer holds
    with registered(endpoint) as channel:
        async with channel.execute_task(execute_task_request(KEY, 0, 1)) as batches:
            async for _ in batches:
                break
        with anyio.fail_after(5):
            await endpoint.ended.wait()
    assert endpoint.cancelled


async def test_a_worker_that_is_gone_is_unavailable() -> None:
    endpoint = Endpoint()
    with registered(endpoint) as channel:
        assert (await channel.worker_info()).version == "test"
    with pytest.raises(RemoteError, match="no in-process worker at inproc://") as info:
        await channel.worker_info()
    assert info.value.grpc_status == Status.UNAVAILABLE
