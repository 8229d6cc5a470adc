"""Read several partition streams at once into one bounded stream.

A consumer asking for a partition range must read its partitions concurrently: with fanned-out
tasks, reading them one after another would leave the producer blocked on a full buffer of a
partition read later.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager

import anyio
import pyarrow as pa

from ..plan.base import closing

Tagged = tuple[int, pa.RecordBatch]


def _first_error(group: BaseExceptionGroup[BaseException]) -> BaseException:
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            return _first_error(exc)
        if not isinstance(exc, anyio.get_cancelled_exc_class()):
            return exc
    return group.exceptions[0]


async def _tag(partition: int, source: AsyncIterator[pa.RecordBatch]) -> AsyncIterator[Tagged]:
    async with closing(source) as stream:
        async for batch in stream:
            yield partition, batch


@asynccontextmanager
async def merged(
    sources: Mapping[int, AsyncIterator[pa.RecordBatch]], buffer: int
) -> AsyncIterator[AsyncIterator[Tagged]]:
    """(partition, batch) pairs from all sources, in arrival order; errors surface as raised.

    Leaving the block early stops every source.
    """
    if len(sources) == 1:
        ((partition, source),) = sources.items()
        tagged = _tag(partition, source)
        async with closing(tagged):
            yield tagged
        return

    send, receive = anyio.create_memory_object_stream[Tagged](buffer)

    async def pump(partition: int, source: AsyncIterator[pa.RecordBatch], out: object) -> None:
        async with out, closing(source) as stream:  # type: ignore[attr-defined]
            async for batch in stream:
                await out.send((partition, batch))  # type: ignore[attr-defined]

    try:
        async with anyio.create_task_group() as tg:
            async with send:
                for partition, source in sources.items():
                    tg.start_soon(pump, partition, source, send.clone())
            async with receive:
                yield receive
            tg.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        raise _first_error(group) from None
