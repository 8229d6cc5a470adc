"""CoordinatorChannel without a transport: open (session, plan), run, report; and errors that
say which part failed."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import anyio
import numpy as np
import pyarrow as pa
import pytest
from anyio.streams.memory import MemoryObjectSendStream

from flightfeed.concurrency import OFF_LOOP_THRESHOLD_BYTES
from flightfeed.errors import (
    Cancelled,
    ExecutionError,
    FlightfeedError,
    InvalidArgument,
    PlanDecodeError,
)
from flightfeed.plan import ExecutionPlan, MemoryScan, encode_plan
from flightfeed.protocol import (
    CancelTask,
    CoordinatorToWorkerMsg,
    SetPlanRequest,
    TaskId,
    TaskKey,
    WorkUnitBatch,
    execute_task_request,
)
from flightfeed.protocol.channel_wire import EncodedTaskMetrics, WorkerMessage, task_metrics_of
from flightfeed.session import Session, SessionStateBuilder, WorkerQueryContext
from flightfeed.worker import WorkerConfig
from flightfeed.worker.registry import TaskRegistry
from flightfeed.worker.rpc.coordinator_channel import coordinator_channel
from flightfeed.worker.rpc.execute_task import execute_task
from flightfeed.worker.server import resolve_session_builder
from flightfeed.worker.state import WorkerState

pytestmark = pytest.mark.anyio

KEY = TaskKey(query_id=b"\x07" * 16, stage_id=1, task_number=0)
LOCATION = "inproc://unit-worker"


@dataclass(frozen=True, eq=False)
class RecordingSession(Session):
    """Notes the thread each plan is decoded on."""

    decoded_on: list[int] | None = None

    def decode_plan(self, data: bytes) -> ExecutionPlan:
        assert self.decoded_on is not None
        self.decoded_on.append(threading.get_ident())
        return super().decode_plan(data)


def state(builder: object = None) -> WorkerState:
    config = WorkerConfig()
    return WorkerState(config, TaskRegistry(config), resolve_session_builder(builder), LOCATION)


def set_plan(plan: ExecutionPlan | None = None, data: bytes | None = None) -> SetPlanRequest:
    plan = plan or MemoryScan.from_table(pa.table({"x": [1, 2, 3]}), 2)
    proto = data if data is not None else encode_plan(plan, SessionStateBuilder().codecs)
    return SetPlanRequest(task_key=KEY, task_count=1, plan_proto=proto)


class Channel:
    """The caller's side of a channel run in this task group."""

    def __init__(self, inbound: MemoryObjectSendStream[CoordinatorToWorkerMsg]) -> None:
        self.inbound = inbound
        self.sent: list[WorkerMessage] = []
        self.error: BaseException | None = None
        self.done = anyio.Event()

    async def send(self, message: WorkerMessage) -> None:
        self.sent.append(message)


@asynccontextmanager
async def channel(worker: WorkerState, *first: CoordinatorToWorkerMsg) -> AsyncIterator[Channel]:
    send, receive = anyio.create_memory_object_stream[CoordinatorToWorkerMsg](16)
    found = Channel(send)

    async def accepted() -> None:
        return None

    async def run() -> None:
        try:
            async with receive:
                await coordinator_channel(worker, {}, receive.__aiter__(), found.send, accepted)
        except Exception as exc:
            found.error = exc
        finally:
            found.done.set()

    async with send, anyio.create_task_group() as tg:
        for message in first:
            await send.send(message)
        tg.start_soon(run)
        yield found
        tg.cancel_scope.cancel()


async def failure(worker: WorkerState, *first: CoordinatorToWorkerMsg) -> BaseException:
    async with channel(worker, *first) as found:
        with anyio.fail_after(10):
            await found.done.wait()
    assert found.error is not None
    assert len(worker.registry) == 0
    return found.error


async def test_a_failing_session_builder_is_named_with_the_original_class() -> None:
    async def build(ctx: WorkerQueryContext) -> Session:
        raise KeyError("XYZ")

    error = await failure(state(build), CoordinatorToWorkerMsg(set_plan_request=set_plan()))
    assert isinstance(error, ExecutionError)
    assert error.message == "session builder failed: 'XYZ'"
    assert error.error_type == "KeyError"
    assert error.origin is not None
    assert (error.origin.component, error.origin.worker_url) == ("session builder", LOCATION)
    assert error.origin.query_id == KEY.query_id


async def test_an_undecodable_plan_is_named_as_such() -> None:
    message = CoordinatorToWorkerMsg(set_plan_request=set_plan(data=b"\xff\xff\xff"))
    error = await failure(state(), message)
    assert isinstance(error, PlanDecodeError)
    assert error.message.startswith("plan decode failed: ")
    assert error.origin is not None
    assert error.origin.component == "plan decode"


@pytest.mark.parametrize(
    ("first", "message"),
    [
        ((), "closed before its SetPlanRequest"),
        (
            (CoordinatorToWorkerMsg(work_unit_batch=WorkUnitBatch()),),
            "must start with a SetPlanRequest, got work_unit_batch",
        ),
    ],
)
async def test_the_first_message_must_be_a_set_plan(
    first: tuple[CoordinatorToWorkerMsg, ...], message: str
) -> None:
    send, receive = anyio.create_memory_object_stream[CoordinatorToWorkerMsg](4)
    for item in first:
        send.send_nowait(item)
    send.close()

    async def noop(*_: object) -> None:
        return None

    with pytest.raises(InvalidArgument, match=message):
        await coordinator_channel(state(), {}, receive.__aiter__(), noop, noop)


@pytest.mark.parametrize("large", [False, True])
async def test_large_plans_are_decoded_off_the_event_loop(large: bool) -> None:
    decoded_on: list[int] = []

    async def build(ctx: WorkerQueryContext) -> Session:
        return RecordingSession(decoded_on=decoded_on)

    rows = OFF_LOOP_THRESHOLD_BYTES // 8 * 2 if large else 10
    table = pa.table({"x": np.arange(rows, dtype=np.int64)})
    message = CoordinatorToWorkerMsg(set_plan_request=set_plan(MemoryScan.from_table(table)))
    worker = state(build)
    async with channel(worker, message):
        with anyio.fail_after(10):
            while not len(worker.registry):
                await worker.registry.changed()
    assert len(decoded_on) == 1
    assert (decoded_on[0] != threading.get_ident()) is large


class ListSink:
    def __init__(self) -> None:
        self.batches: list[tuple[int, pa.RecordBatch]] = []

    async def begin(self, schema: pa.Schema) -> None:
        return None

    async def write(self, partition: int, batch: pa.RecordBatch) -> None:
        self.batches.append((partition, batch))


async def test_a_task_runs_reports_its_metrics_and_leaves_a_tombstone() -> None:
    worker = state()
    async with channel(worker, CoordinatorToWorkerMsg(set_plan_request=set_plan())) as found:
        sink = ListSink()
        with anyio.fail_after(10):
            await execute_task(worker, execute_task_request(KEY, 0, 2), sink)
            await found.done.wait()
    assert found.error is None
    assert sorted(p for p, _ in sink.batches) == [0, 1]
    (reported,) = found.sent
    metrics = task_metrics_of(reported)
    assert isinstance(metrics, EncodedTaskMetrics)  # wire-ready, written by metrics_wire
    root = metrics.decode().pre_order_plan_metrics[0].metrics
    rows = sum(m.output_rows.value for m in root if m.output_rows is not None)
    assert rows == sum(batch.num_rows for _, batch in sink.batches)
    assert len(worker.registry) == 0
    with pytest.raises(FlightfeedError, match="no longer on this worker: finished"):
        await worker.registry.wait_for(TaskId.of(KEY))


async def test_cancel_task_ends_the_task_and_says_why() -> None:
    worker = state()
    cancel = CoordinatorToWorkerMsg(cancel_task=CancelTask(reason="caller left"))
    error = await failure(worker, CoordinatorToWorkerMsg(set_plan_request=set_plan()), cancel)
    assert isinstance(error, Cancelled)
    assert "cancelled by coordinator: caller left" in error.message
    with pytest.raises(FlightfeedError, match="cancelled by coordinator: caller left"):
        await worker.registry.wait_for(TaskId.of(KEY))
