"""CoordinatorChannel: one bidirectional channel per task, in three steps.

- open: the first message must be a SetPlanRequest; the task's session is built from the
  request headers and its plan decoded (off the event loop when large). Nothing is registered
  yet, so a bad request leaves no state behind. Work units the coordinator sent behind the
  plan against presumed credits wait in the stream meanwhile.
- run: the task is registered and lives as long as the channel: control messages (work units,
  cancellation) flow in, feed credits flow out, and its producers run in the channel's task
  group, so closing the channel, a CancelTask or the idle TTL stops everything it started.
- report: once every output partition was read or dropped, TaskMetrics go back. A replayable
  task (SetPlanRequest.replayable) instead reports each partition read to its end, serves
  re-reads, and reports its metrics when the coordinator half-closes the channel.

Transport-neutral: `inbound` and `send` are the gRPC stream or an in-process memory stream.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Final

import anyio
import betterproto2

from ..._generated.flightfeed.v1 import (
    CoordinatorToWorkerMsg,
    PartitionsRead,
    SetPlanRequest,
    WorkerToCoordinatorMsg,
)
from ...concurrency import off_loop
from ...errors import (
    Cancelled,
    FlightfeedError,
    InvalidArgument,
    ResourceExhausted,
    as_flightfeed_error,
)
from ...feeds import FEED_INBOX_KEY, FeedInbox
from ...feeds.inbox import check_presumed_credits
from ...plan.base import ExecutionPlan
from ...plan.metrics_wire import encode_task_metrics
from ...plan.stage_input import STAGE_READER_KEY
from ...plan.table_source import TABLE_SOURCE_KEY
from ...protocol.channel import Headers, Send
from ...protocol.channel_wire import EncodedTaskMetrics
from ...protocol.keys import TaskId, task_id
from ...session import Session
from ...tables.source import EngineTableSource
from ..sessions import build_session
from ..stage_reader import WorkerStageReader
from ..state import WorkerState
from ..task import Task

PLAN_DECODE = "plan decode"


@dataclass(frozen=True, eq=False)
class OpenedTask:
    """A validated SetPlan with its session, plan and feed inbox, not yet registered."""

    key: TaskId
    request: SetPlanRequest
    session: Session
    plan: ExecutionPlan
    inbox: FeedInbox | None


async def coordinator_channel(
    state: WorkerState,
    headers: Headers,
    inbound: AsyncIterator[CoordinatorToWorkerMsg],
    send: Send,
    accepted: Callable[[], Awaitable[None]],
) -> None:
    opened = await open_task(state, headers, await _first_message(inbound))
    task = await run_task(state, opened, inbound, send, accepted)
    if task.failure is not None:
        raise task.failure.locate(task.origin)
    if task.cancel_reason is not None:
        raise Cancelled(f"task {task.key} {_outcome(task)}", origin=task.origin)


async def _first_message(inbound: AsyncIterator[CoordinatorToWorkerMsg]) -> SetPlanRequest:
    try:
        message = await anext(inbound)
    except StopAsyncIteration:
        raise InvalidArgument("CoordinatorChannel closed before its SetPlanRequest") from None
    except InvalidArgument as exc:
        raise InvalidArgument(f"malformed CoordinatorChannel message: {exc.message}") from None
    except FlightfeedError:  # e.g. ResourceExhausted for an oversized message
        raise
    except Exception as exc:
        raise InvalidArgument(f"malformed CoordinatorChannel message: {exc}") from None
    kind = betterproto2.which_one_of(message, "inner")[0] or "an empty message"
    if kind != "set_plan_request":
        raise InvalidArgument(f"CoordinatorChannel must start with a SetPlanRequest, got {kind}")
    request: SetPlanRequest = message.set_plan_request
    return request


# -- open -------------------------------------------------------------------------------------


def check_feed_declarations(request: SetPlanRequest, limit: int) -> None:
    """Refuse more feed partitions than a task may hold, before any queue is built for them."""
    declared = sum(d.partitions for d in request.work_unit_feed_declarations)
    if declared > limit:
        raise ResourceExhausted(
            f"the task declares {declared} work-unit feed partitions; a task may declare at most"
            f" {limit} (WorkerConfig.max_feed_partitions)"
        )


async def open_task(state: WorkerState, headers: Headers, request: SetPlanRequest) -> OpenedTask:
    """Check the request, build the session and decode the plan; registers nothing. A refusal
    is left for the task's readers to find (TaskRegistry.refused)."""
    key = task_id(request.task_key)
    with state.registry.opening(key):
        try:
            return await _open_task(state, headers, request, key)
        except Exception as exc:
            state.registry.refused(key, as_flightfeed_error(exc))
            raise


async def _open_task(
    state: WorkerState, headers: Headers, request: SetPlanRequest, key: TaskId
) -> OpenedTask:
    state.registry.check_capacity(key)
    origin = key.origin(state.location)
    check_feed_declarations(request, state.config.max_feed_partitions)
    check_presumed_credits(request.presumed_credits)
    session = await build_session(state, headers, request.task_key, origin)
    inbox = (
        FeedInbox.from_declarations(
            request.work_unit_feed_declarations,
            # A coordinator that learned a larger window (before this worker restarted with a
            # smaller one) sent that many units already: they are taken, not refused, and the
            # task's memory budget still bounds their bytes.
            credits=max(state.config.feed_credits, request.presumed_credits),
            presumed=request.presumed_credits,
            replay_limit=state.config.replay_limit if request.replayable else None,
        )
        if request.work_unit_feed_declarations
        else None
    )
    try:
        plan = await off_loop(
            session.decode_plan, request.plan_proto, nbytes=len(request.plan_proto)
        )
    except Exception as exc:
        raise as_flightfeed_error(exc, PLAN_DECODE).locate(origin) from exc
    state.registry.check_capacity(key)  # again: other tasks may have come in meanwhile
    return OpenedTask(key, request, session, plan, inbox)


# -- run --------------------------------------------------------------------------------------

CHANNEL_CLOSED: Final = "coordinator channel closed"


async def run_task(
    state: WorkerState,
    opened: OpenedTask,
    inbound: AsyncIterator[CoordinatorToWorkerMsg],
    send: Send,
    accepted: Callable[[], Awaitable[None]],
) -> Task:
    """Register the task and serve its channel until it is done or cancelled."""
    inbox = opened.inbox
    async with anyio.create_task_group() as tg:
        task = Task(
            opened.key,
            opened.plan,
            opened.session,
            tg,
            worker_url=opened.request.target_worker_url or state.location,
            task_count=opened.request.task_count,
            query_start_ns=opened.request.query_start_time_ns,
            consumer_buffer=state.config.consumer_buffer_batches,
            max_fanout_outputs=state.config.max_fanout_outputs,
            fanout_claim_timeout=state.config.fanout_claim_timeout,
            replayable=opened.request.replayable,
            memory=state.memory.task(str(opened.key), opened.session.memory_budget_bytes),
        )
        task.ctx.extensions[STAGE_READER_KEY] = WorkerStageReader(state, task.worker_url)
        if state.tables is not None:
            task.ctx.extensions[TABLE_SOURCE_KEY] = EngineTableSource(state.tables)
        if inbox is not None:
            task.ctx.extensions[FEED_INBOX_KEY] = inbox
            inbox.reserve_from(task.ctx.memory.reservation("feed inbox"))
        try:
            task.reserve_plan_data()
            state.registry.add(task)
        except BaseException as exc:
            task.ctx.memory.close()
            if isinstance(exc, Exception):
                state.registry.refused(task.key, as_flightfeed_error(exc))
            raise
        try:
            await accepted()
            tg.start_soon(_watch_control, inbound, task, inbox)
            if inbox is not None:
                tg.start_soon(_forward_credits, send, inbox, task)
            if task.replayable:
                tg.start_soon(_forward_reads, send, task)
            await task.done.wait()
            if task.cancel_reason is None:
                with _ending_the_task_if_gone(task):
                    await send(report(task, inbox))
        finally:
            if inbox is not None:  # (its readers learn why: "ended" alone left them guessing)
                ending = _outcome(task, unless_done=CHANNEL_CLOSED)
                inbox.fail(Cancelled(f"task {task.key} ended ({ending})"))
            if not task.done.is_set():
                task.cancel(CHANNEL_CLOSED)
            state.registry.remove(task, _outcome(task))
            tg.cancel_scope.cancel()
            task.ctx.memory.close()
    return task


@contextmanager
def _ending_the_task_if_gone(task: Task) -> Iterator[None]:
    """A send on a channel its caller reset (Cancelled: a coordinator that cancelled the query
    before grpclib cancels this call) ends the task as a closed channel does; raised, it failed
    the senders' task group, and the call was answered INTERNAL with a traceback."""
    try:
        yield
    except Cancelled:
        task.cancel(CHANNEL_CLOSED)


async def _watch_control(
    inbound: AsyncIterator[CoordinatorToWorkerMsg], task: Task, inbox: FeedInbox | None
) -> None:
    """Apply control messages; a broken channel or protocol ends the task."""
    try:
        await _control_messages(inbound, task, inbox)
    except anyio.get_cancelled_exc_class():
        raise
    except ResourceExhausted as exc:  # the units did not fit the task's memory
        if inbox is not None:
            inbox.fail(exc)
        task.cancel(str(exc), failure=exc)
    except Exception as exc:
        if inbox is not None:
            inbox.fail(exc)
        task.cancel(f"coordinator channel failed: {exc}")


async def _control_messages(
    inbound: AsyncIterator[CoordinatorToWorkerMsg], task: Task, inbox: FeedInbox | None
) -> None:
    """Messages after SetPlan. Their end is fine: the coordinator may half-close."""
    async for message in inbound:
        kind = betterproto2.which_one_of(message, "inner")[0]
        if kind == "work_unit_batch":
            if inbox is None:
                raise InvalidArgument(f"task {task.key} declared no work-unit feeds")
            inbox.deliver(message.work_unit_batch)  # never blocks: bounded by the credits
        elif kind == "cancel_task":
            task.cancel(f"cancelled by coordinator: {message.cancel_task.reason or 'no reason'}")
            return
        elif kind == "release_task":
            task.unneeded()
        elif kind == "set_plan_request":
            raise InvalidArgument(f"task {task.key} already has a plan")
        else:
            raise InvalidArgument(f"unexpected CoordinatorChannel message {kind or 'empty'}")
    if task.replayable:
        task.finish()  # half-closed: the coordinator released the task
    if inbox is not None:
        inbox.sender_done()  # half-closed: no more units can come for unfinished partitions


async def _forward_reads(send: Send, task: Task) -> None:
    """A replayable task's partitions read to their end, and how many are being read, told to
    the coordinator as they change (a held query is not released while it is read)."""
    told_reading = 0
    with _ending_the_task_if_gone(task):
        while True:
            await task.reads_changed.wait()
            reads, reading = task.take_reads(), task.reading
            if reads or reading != told_reading:
                told_reading = reading
                read = PartitionsRead(partitions=reads, reading=reading)
                await send(WorkerToCoordinatorMsg(partitions_read=read))


async def _forward_credits(send: Send, inbox: FeedInbox, task: Task) -> None:
    """Credits the task's consumers free up go back to the coordinator as they are granted."""
    with _ending_the_task_if_gone(task):
        async for credits in inbox.credit_grants:
            await send(WorkerToCoordinatorMsg(feed_credits=credits))


# -- report -----------------------------------------------------------------------------------


def report(task: Task, inbox: FeedInbox | None) -> EncodedTaskMetrics:
    """The finished task's metrics: its plan nodes', its own and its feeds' (wire-ready)."""
    feed_metrics = b""
    if inbox is not None:
        inbox.close()
        feed_metrics = inbox.encoded_metrics()
    encoded = encode_task_metrics(task.metrics.pre_order(), task.task_metrics(), feed_metrics)
    return EncodedTaskMetrics(encoded)


def _outcome(task: Task, unless_done: str | None = None) -> str:
    """How the task ended, as its tombstone tells late requests (`unless_done`: the reason it
    is about to be cancelled for, if it has not ended yet)."""
    if task.cancel_reason is not None:
        return f"cancelled: {task.cancel_reason}"
    if unless_done is not None and not task.done.is_set():
        return f"cancelled: {unless_done}"
    if task.replayable:  # (a held query's task ends only so)
        return "released by its coordinator"
    return "finished"
