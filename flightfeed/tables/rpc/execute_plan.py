"""ExecutePhysicalPlan: a flightfeed plan pushed down to the worker's tables, streamed back as
ReadResponses like a Read.

The plan travels in the request's oneof as `flightfeed` (field 100, our addition: its bytes do
not claim to be the DataFusion plan of field 2, which is refused) and is decoded by the
caller's session, which also resolves its functions. Its
TableScans read this worker's tables, with `ExecContext.default_catalog`/`default_schema` for
the parts they leave empty. `ExecContext` is honoured: `timeout_ms` bounds the whole call (the
wait for a slot too), `priority` orders the wait (PriorityGate), and `explain = Analyze` ends
the stream with the plan and its metrics as text (a MetricPayload) and as a typed
`flightfeed.v1.TaskMetrics` in the `flightfeed-metrics-bin` trailer.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import anyio
import pyarrow as pa

from ..._generated.common import ResponseHeader
from ..._generated.flightfeed.v1 import MetricsSet
from ..._generated.remote_engine import (
    ExecContext,
    ExecutePlanRequest,
    MetricPayload,
    QueryPriority,
    ReadResponse,
)
from ...concurrency import off_loop
from ...errors import InvalidArgument
from ...plan.base import ExecutionPlan, TaskContext, closing
from ...plan.display import format_plan
from ...plan.execution import open_task_context
from ...plan.memory import MemoryPool
from ...plan.merge import merge
from ...plan.metrics import MetricsRegistry, instrument, plan_metrics
from ...plan.metrics_wire import encode_task_metrics
from ...plan.table_source import TABLE_SOURCE_KEY
from ...session import Session
from ..engine import TableEngine
from ..headers import INTERNAL, OK_HEADER, error_header
from ..payload import Compressor
from ..priority import PriorityGate
from ..requests import deadline_seconds, table_name
from ..source import EngineTableSource
from .read import Send, encoded_batches, response_message

METRICS_TRAILER = "flightfeed-metrics-bin"


@dataclass
class PlanOutcome:
    """What the call leaves for its trailers: the typed metrics of an analyzed plan."""

    trailers: dict[str, bytes] = field(default_factory=dict)


async def serve_execute_plan(
    engine: TableEngine,
    request: ExecutePlanRequest,
    session: Callable[[], Awaitable[Session]],
    send: Send,
    *,
    gate: PriorityGate,
    memory: MemoryPool,
    compressor: Compressor,
) -> PlanOutcome:
    """Runs the plan to its end, its deadline, or its first error (sent as a header)."""
    context = request.context or ExecContext(timeout_ms=-1)
    what = f"ExecutePhysicalPlan {context.request_id}".rstrip()
    outcome = PlanOutcome()
    try:
        with anyio.fail_after(deadline_seconds(context.timeout_ms)):
            async with gate.slot(low=context.priority == QueryPriority.Low):
                built = await session()
                plan = await _decode(request, built)
                if request.table is not None and request.table.table:
                    engine.entry(table_name(request.table))  # 404 for a missing table
                analyze = context.explain is not None
                if analyze:
                    plan = instrument(plan, MetricsRegistry())
                source = EngineTableSource(
                    engine, catalog=context.default_catalog, schema=context.default_schema
                )
                async with open_task_context(built, memory_pool=memory) as ctx:
                    ctx.extensions[TABLE_SOURCE_KEY] = source
                    await _stream(plan, ctx, compressor, send)
                if analyze:
                    text = format_plan(plan, with_metrics=True)
                    metric = ReadResponse(header=OK_HEADER, metric=MetricPayload(metric=text))
                    await send(response_message(metric))
                    typed = encode_task_metrics(plan_metrics(plan), MetricsSet())
                    outcome.trailers[METRICS_TRAILER] = typed
    except TimeoutError:
        header = ResponseHeader(
            code=INTERNAL, error=f"{what} timed out after {context.timeout_ms} ms"
        )
        await send(response_message(ReadResponse(header=header)))
    except anyio.get_cancelled_exc_class():
        raise
    except Exception as exc:
        await send(response_message(ReadResponse(header=error_header(exc, what))))
    return outcome


async def _decode(request: ExecutePlanRequest, session: Session) -> ExecutionPlan:
    if request.datafusion:
        raise InvalidArgument(
            "DataFusion plans are not run here: send a flightfeed plan in the request's"
            " `flightfeed` field (100)"
        )
    data = request.flightfeed
    if not data:
        raise InvalidArgument("the request carries no plan (ExecutePlanRequest.flightfeed, 100)")
    return await off_loop(session.decode_plan, bytes(data), nbytes=len(data))


async def _stream(
    plan: ExecutionPlan, ctx: TaskContext, compressor: Compressor, send: Send
) -> None:
    async with closing(encoded_batches(_batches(plan, ctx), compressor)) as messages:
        async for message in messages:
            await send(message)


async def _batches(plan: ExecutionPlan, ctx: TaskContext) -> AsyncIterator[pa.RecordBatch]:
    sources = {p: plan.execute(p, ctx) for p in range(plan.output_partitions)}
    async with closing(merge(sources)) as stream:
        async for _, batch in stream:
            if batch.num_rows:
                yield batch


__all__ = ["METRICS_TRAILER", "PlanOutcome", "serve_execute_plan"]
