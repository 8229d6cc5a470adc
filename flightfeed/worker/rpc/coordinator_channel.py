"""CoordinatorChannel: one bidirectional stream per task.

The first message must be a SetPlanRequest. The worker builds the task's session from the
request headers, decodes the plan and registers the task; the channel then carries control
messages (work units, cancellation) in and TaskMetrics out. The task lives as long as this
handler: its producers run in the handler's task group, so closing the channel, a CancelTask
or the idle TTL stops everything the task started.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anyio
import betterproto2
import grpclib.server

from ..._generated.flightfeed.v1 import (
    CoordinatorToWorkerMsg,
    SetPlanRequest,
    TaskMetrics,
    WorkerToCoordinatorMsg,
)
from ...errors import Cancelled, InvalidArgument, PlanDecodeError
from ...feeds import FEED_INBOX_KEY, FeedInbox
from ...flight.server import CallContext
from ...session import Headers, WorkerQueryContext
from ..keys import task_id
from ..task import Task

if TYPE_CHECKING:
    from ..server import Worker


def request_headers(ctx: CallContext) -> Headers:
    """The call's text headers for the session builder (binary `-bin` values are skipped)."""
    items = ctx.headers.items() if hasattr(ctx.headers, "items") else ()
    return Headers([(k, v) for k, v in items if isinstance(v, str)])


async def _first_message(stream: grpclib.server.Stream[Any, Any]) -> SetPlanRequest:
    try:
        message = await stream.recv_message()
    except Exception as exc:
        raise InvalidArgument(f"malformed CoordinatorChannel message: {exc}") from None
    if message is None:
        raise InvalidArgument("CoordinatorChannel closed before its SetPlanRequest")
    kind = betterproto2.which_one_of(message, "inner")[0] or "an empty message"
    if kind != "set_plan_request":
        raise InvalidArgument(f"CoordinatorChannel must start with a SetPlanRequest, got {kind}")
    request: SetPlanRequest = message.set_plan_request
    return request


async def _control_messages(
    stream: grpclib.server.Stream[Any, Any], task: Task, inbox: FeedInbox | None
) -> None:
    """Messages after SetPlan. End of stream is fine: the coordinator may half-close."""
    async for message in stream:
        assert isinstance(message, CoordinatorToWorkerMsg)
        kind = betterproto2.which_one_of(message, "inner")[0]
        if kind == "work_unit_batch":
            if inbox is None:
                raise InvalidArgument(f"task {task.key} declared no work-unit feeds")
            inbox.deliver(message.work_unit_batch)  # never blocks: bounded by the credits
        elif kind == "cancel_task":
            task.cancel(f"cancelled by coordinator: {message.cancel_task.reason or 'no reason'}")
            return
        elif kind == "set_plan_request":
            raise InvalidArgument(f"task {task.key} already has a plan")
        else:
            raise InvalidArgument(f"unexpected CoordinatorChannel message {kind or 'empty'}")
    if inbox is not None:
        inbox.sender_done()  # half-closed: no more units can come for unfinished partitions


async def _forward_credits(stream: grpclib.server.Stream[Any, Any], inbox: FeedInbox) -> None:
    """Credits the task's consumers free up go back to the coordinator as they are granted."""
    async for credits in inbox.credit_grants:
        await stream.send_message(WorkerToCoordinatorMsg(feed_credits=credits))


async def coordinator_channel(
    worker: Worker, stream: grpclib.server.Stream[Any, Any], ctx: CallContext
) -> None:
    request = await _first_message(stream)
    key = task_id(request.task_key)
    worker.registry.check_capacity(key)
    query_context = WorkerQueryContext(headers=request_headers(ctx), task_key=request.task_key)
    session = await worker.session_builder.build(query_context)
    inbox = (
        FeedInbox.from_declarations(
            request.work_unit_feed_declarations, credits=worker.config.feed_credits
        )
        if request.work_unit_feed_declarations
        else None
    )
    try:
        plan = session.decode_plan(request.plan_proto)
    except PlanDecodeError as error:
        origin = key.origin(worker.location)
        raise PlanDecodeError(f"task {key}: {error.message}", origin=origin) from None
    worker_url = request.target_worker_url or worker.location
    outcome = "finished"
    async with anyio.create_task_group() as tg:
        task = Task(
            key,
            plan,
            session,
            tg,
            worker_url=worker_url,
            task_count=request.task_count,
            query_start_ns=request.query_start_time_ns,
            consumer_buffer=worker.config.consumer_buffer_batches,
        )
        if inbox is not None:
            task.ctx.extensions[FEED_INBOX_KEY] = inbox
        worker.registry.add(task)
        try:
            await stream.send_initial_metadata()

            async def watch_control() -> None:
                try:
                    await _control_messages(stream, task, inbox)
                except Exception as exc:  # a broken channel or protocol ends the task
                    if inbox is not None:
                        inbox.fail(exc)
                    task.cancel(f"coordinator channel failed: {exc}")

            tg.start_soon(watch_control)
            if inbox is not None:
                tg.start_soon(_forward_credits, stream, inbox)
            await task.done.wait()
            if task.cancel_reason is None:
                task_metrics = task.task_metrics()
                if inbox is not None:
                    inbox.close()
                    task_metrics.metrics.extend(inbox.to_metrics())
                metrics = TaskMetrics(
                    pre_order_plan_metrics=task.metrics.to_proto(),
                    task_metrics=task_metrics,
                )
                await stream.send_message(WorkerToCoordinatorMsg(task_metrics=metrics))
            else:
                outcome = f"cancelled: {task.cancel_reason}"
        finally:
            if inbox is not None:
                inbox.fail(Cancelled(f"task {key} ended"))
            if task.cancel_reason is None and not task.done.is_set():
                task.cancel("coordinator channel closed")
                outcome = "cancelled: coordinator channel closed"
            worker.registry.remove(task, outcome)
            tg.cancel_scope.cancel()
    if task.cancel_reason is not None:
        raise Cancelled(f"task {key} {outcome}", origin=task.origin)
