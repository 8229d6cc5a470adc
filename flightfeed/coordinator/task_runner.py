"""Running one task: its CoordinatorChannel, its feed dispatcher, its metrics.

The channel carries the SetPlan, then the dispatcher's WorkUnitBatches: the first ones right
behind the plan, against the window the worker reported (GetWorkerInfo), the rest against the
credit grants the worker answers with. Finally the worker sends TaskMetrics. When the query is
cancelled the task gets a CancelTask before its channel closes, so the worker drops the task at
once, whatever it was doing. The channel is a WorkerChannel's: gRPC or in-process alike.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Final

import anyio
import betterproto2

from ..concurrency import closing
from ..errors import FeedError, FlightfeedError
from ..feeds import (
    DEFAULT_DELIVERY_LOG_BYTES,
    DEFAULT_DELIVERY_LOG_LIMIT,
    DEFAULT_LINGER_SECONDS,
    DEFAULT_MAX_BATCH_BYTES,
    DEFAULT_MAX_BATCH_UNITS,
    FeedDispatcher,
)
from ..plan.base import TaskContext
from ..plan.functions import PlanSession
from ..protocol import (
    ChannelClosed,
    PartitionsRead,
    SetPlanRequest,
    TaskChannel,
    TaskId,
    TaskMetrics,
    WorkUnitBatch,
    from_detail,
)
from ..protocol.channel_wire import EncodedTaskMetrics
from .metrics import ReportedMetrics
from .query import QueryRuntime, TaskRun

SEND_FAILURE_GRACE: Final = 1.0
"""After a failed send, how long to wait for the channel's status (the better error)."""


@dataclass(frozen=True)
class DispatchOptions:
    """How a task's dispatcher packs units (credits are granted by the worker)."""

    max_batch_units: int = DEFAULT_MAX_BATCH_UNITS
    max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES
    linger: float = DEFAULT_LINGER_SECONDS
    keep_delivery_log: bool = True
    delivery_log_limit: int = DEFAULT_DELIVERY_LOG_LIMIT
    delivery_log_bytes: int = DEFAULT_DELIVERY_LOG_BYTES


async def run_task(
    runtime: QueryRuntime,
    run: TaskRun,
    session: PlanSession,
    options: DispatchOptions,
    headers: Mapping[str, str] | None = None,
) -> None:
    """Run one task to its metrics; a failure goes to the runtime (and fails the query)."""
    error = await attempt_task(runtime, run, session, options, headers)
    if error is not None:
        runtime.fail(error, run.origin)


async def attempt_task(
    runtime: QueryRuntime,
    run: TaskRun,
    session: PlanSession,
    options: DispatchOptions,
    headers: Mapping[str, str] | None = None,
) -> Exception | None:
    """Run one attempt of a task to its metrics; its error, if it failed (the caller decides
    what that means: the query fails, or a held task moves to another worker)."""
    try:
        metrics = await _run(runtime, run, session, options, headers)
    except anyio.get_cancelled_exc_class():
        run.record.finish("cancelled")
        raise
    except Exception as exc:
        run.record.finish("failed")
        return exc
    run.record.finish("finished", metrics)
    return None


async def _run(
    runtime: QueryRuntime,
    run: TaskRun,
    session: PlanSession,
    options: DispatchOptions,
    headers: Mapping[str, str] | None,
) -> ReportedMetrics:
    channel: TaskChannel | None = None

    async def send(batch: WorkUnitBatch) -> None:
        assert channel is not None, "the dispatcher sends only once the worker granted credit"
        await channel.send_work_units(batch)

    set_plan = SetPlanRequest(
        task_key=run.key,
        task_count=run.stage.task_count,
        plan_proto=run.plan_proto,
        target_worker_url=run.worker_url,
        query_start_time_ns=runtime.start_ns,
        replayable=runtime.replayable,
    )
    dispatcher = None
    if run.task.feeds:
        ctx = TaskContext(
            session=session,
            task_number=run.task.task_number,
            task_count=run.stage.task_count,
        )
        dispatcher = FeedDispatcher(
            run.task.feeds,
            send,
            ctx,
            max_batch_units=options.max_batch_units,
            max_batch_bytes=options.max_batch_bytes,
            linger=options.linger,
            keep_log=options.keep_delivery_log,
            log_limit=options.delivery_log_limit,
            log_bytes=options.delivery_log_bytes,
            origin=TaskId.of(run.key).origin(),  # the provider runs here, not on the worker
            open_feed=runtime.replay.open if runtime.replay is not None else None,
            presumed_credits=run.feed_window,
        )
        set_plan.work_unit_feed_declarations = dispatcher.declarations()
        set_plan.presumed_credits = run.feed_window
        run.dispatcher = dispatcher
        run.record.attach(dispatcher)
    async with run.channel.open_task(set_plan, headers=headers) as opened:
        channel = run.channel_open = opened
        run.ready.set()
        if runtime.output_complete:  # opened after the coordinator's part ended
            await opened.release()
        try:
            return await _serve(opened, dispatcher, partial(_reads, runtime, run))
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True):
                await opened.cancel("query cancelled by the coordinator")
            raise


def _reads(runtime: QueryRuntime, run: TaskRun, read: PartitionsRead) -> None:
    if runtime.on_read is None:
        raise FlightfeedError("protocol violation: partitions read of a task that is not held")
    runtime.on_read(run, read.partitions, read.reading)


async def _serve(
    channel: TaskChannel,
    dispatcher: FeedDispatcher | None,
    on_read: Callable[[PartitionsRead], None],
) -> ReportedMetrics:
    """Dispatch units and apply grants until the task's metrics arrive."""
    metrics: ReportedMetrics | None = None
    failure: Exception | None = None
    send_failure: Exception | None = None
    async with anyio.create_task_group() as tg:
        with anyio.CancelScope() as reading:

            async def dispatch(dispatcher: FeedDispatcher) -> None:
                nonlocal send_failure
                try:
                    await dispatcher.run()
                except ChannelClosed:
                    return  # half-closed here (a held query released): its metrics come
                except Exception as exc:
                    send_failure = exc
                    # The channel's status usually says why a send failed: give it a moment.
                    reading.deadline = min(
                        reading.deadline, anyio.current_time() + SEND_FAILURE_GRACE
                    )

            if dispatcher is not None:
                tg.start_soon(dispatch, dispatcher)
            try:
                metrics = await _await_metrics(channel, dispatcher, on_read)
            except Exception as exc:
                failure = exc
        if dispatcher is not None:
            dispatcher.cancel()  # partitions the plan never read still wait for credit
        # (that ends the group's only task, if it still runs: the group exits without a cancel)
    if failure is not None:
        raise failure
    if metrics is None:
        assert send_failure is not None
        raise send_failure
    return metrics


async def _await_metrics(
    channel: TaskChannel,
    dispatcher: FeedDispatcher | None,
    on_read: Callable[[PartitionsRead], None],
) -> ReportedMetrics:
    async with closing(channel.messages()) as messages:
        async for message in messages:
            if isinstance(message, EncodedTaskMetrics):
                return message  # parsed when someone reads them (coordinator/metrics.py)
            kind, value = betterproto2.which_one_of(message, "inner")
            if kind == "partitions_read":
                on_read(value)
            elif kind == "feed_credits":
                if dispatcher is None:
                    raise FeedError("protocol violation: feed credits for a task without feeds")
                dispatcher.grant(value)
            elif kind == "task_metrics":
                metrics: TaskMetrics = value
                return metrics
            elif kind == "task_error":
                raise from_detail(value)
    raise FlightfeedError("the worker ended the task channel without the task's metrics")
