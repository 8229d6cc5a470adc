"""A dispatcher wired to an inbox through an in-memory channel, as a CoordinatorChannel is.

Batches go one way and credits the other, both through bounded memory streams and both as
serialized CoordinatorToWorkerMsg / WorkerToCoordinatorMsg bytes, so the wire form is exercised
(credits through the hand-written codec the gRPC channel uses).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
from anyio.abc import TaskGroup

from flightfeed._generated.flightfeed.v1 import (
    CoordinatorToWorkerMsg,
    WorkerToCoordinatorMsg,
    WorkUnitBatch,
)
from flightfeed.feeds import FeedAssignment, FeedDispatcher, FeedInbox
from flightfeed.plan import BUILTINS, TaskContext
from flightfeed.protocol.channel_wire import (
    EncodedTaskMetrics,
    decode_worker_message,
    encode_worker_message,
)
from flightfeed.testing.feeds import Waiters


def task_context() -> TaskContext:
    return TaskContext(session=BUILTINS)


@dataclass
class Link:
    dispatcher: FeedDispatcher
    inbox: FeedInbox
    tg: TaskGroup
    batches: list[int] = field(default_factory=list)
    """Units per delivered batch."""
    observe: Callable[[FeedInbox], None] | None = None
    waiters: Waiters = field(default_factory=Waiters)
    """Re-checked after every delivery and every grant."""


@asynccontextmanager
async def feed_link(
    feeds: Mapping[bytes, FeedAssignment],
    *,
    credits: int = 64,
    presumed: int = 0,
    channel_buffer: int = 2,
    observe: Callable[[FeedInbox], None] | None = None,
    **dispatcher_options: Any,
) -> AsyncIterator[Link]:
    """Run dispatcher and inbox joined by bounded in-memory streams; cancel all on exit.

    `observe(inbox)` runs after every delivery (for invariants such as bounded buffers).
    `presumed`: credits the dispatcher starts with, as SetPlanRequest.presumed_credits says.
    """
    declared = [(fid, len(a.partitions)) for fid, a in feeds.items()]
    inbox = FeedInbox(declared, credits=credits, presumed=presumed)
    to_worker_send, to_worker_recv = anyio.create_memory_object_stream[bytes](channel_buffer)
    to_coord_send, to_coord_recv = anyio.create_memory_object_stream[bytes](channel_buffer)

    async def send(batch: WorkUnitBatch) -> None:
        await to_worker_send.send(bytes(CoordinatorToWorkerMsg(work_unit_batch=batch)))

    dispatcher = FeedDispatcher(
        feeds, send, task_context(), presumed_credits=presumed, **dispatcher_options
    )

    async with anyio.create_task_group() as tg:
        link = Link(dispatcher, inbox, tg, observe=observe)

        async def worker_receive() -> None:
            async with to_worker_recv:
                async for raw in to_worker_recv:
                    batch = CoordinatorToWorkerMsg.parse(raw).work_unit_batch
                    link.batches.append(len(batch.batch) + _packed_count(batch))
                    inbox.deliver(batch)
                    if link.observe is not None:
                        link.observe(inbox)
                    link.waiters.check()

        async def worker_credits() -> None:
            async with to_coord_send:
                async for credits in inbox.credit_grants:
                    message = WorkerToCoordinatorMsg(feed_credits=credits)
                    await to_coord_send.send(encode_worker_message(message))

        async def coordinator_receive() -> None:
            async with to_coord_recv:
                async for raw in to_coord_recv:
                    message = decode_worker_message(raw, 1 << 20)
                    assert not isinstance(message, EncodedTaskMetrics)  # credits, here
                    dispatcher.grant(message.feed_credits)
                    link.waiters.check()

        tg.start_soon(worker_receive)
        tg.start_soon(worker_credits)
        tg.start_soon(coordinator_receive)
        tg.start_soon(dispatcher.run)
        try:
            yield link
        finally:
            tg.cancel_scope.cancel()


def _packed_count(batch: WorkUnitBatch) -> int:
    return len(batch.packed.body_ends) // 4 if batch.packed is not None else 0
