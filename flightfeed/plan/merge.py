"""Read several streams at once into one, with bounded buffering: the merge under Coalesce,
NetworkCoalesce and a worker's partition ranges.

Each source is pumped by its own task into a bounded buffer, tagged with its key. Pumps never
raise: a source's error is forwarded as an item and re-raised by the consumer outside the task
group, so a failure or an early close never cancels the consumer's task from under it.
Reading concurrently matters: with fanned-out producers, reading one source after the other
could leave the producer blocked on the full buffer of a source read later.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Generic, TypeVar

import anyio
from anyio.abc import ObjectSendStream

from .base import closing

K = TypeVar("K")
T = TypeVar("T")


class _Failure:
    """A source's error, travelling through the buffer to the consumer."""

    __slots__ = ("error",)

    def __init__(self, error: Exception) -> None:
        self.error = error


class _Pump(Generic[K, T]):
    def __init__(self, send: ObjectSendStream[tuple[K, T] | _Failure]) -> None:
        self.send = send

    async def run(self, key: K, source: AsyncIterator[T]) -> None:
        async with self.send:
            try:
                async with closing(source) as stream:
                    async for item in stream:
                        await self.send.send((key, item))
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                return  # the consumer is gone
            except Exception as exc:
                try:
                    await self.send.send(_Failure(exc))
                except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                    return


async def merge(
    sources: Mapping[K, AsyncIterator[T]],
    buffer_per_source: int = 2,
    *,
    pump_single: bool = False,
) -> AsyncIterator[tuple[K, T]]:
    """(key, item) pairs from every source, in arrival order; a source's error is raised.

    Close the result (`closing`) when leaving early: every source is then stopped and closed.
    A single source is read in the caller's task unless `pump_single` (see `prefetch`).
    """
    if len(sources) == 1 and not pump_single:
        ((key, only),) = sources.items()
        async with closing(only) as stream:
            async for value in stream:
                yield key, value
        return
    send, receive = anyio.create_memory_object_stream[tuple[K, T] | _Failure](
        max(1, len(sources) * buffer_per_source)
    )
    failure: Exception | None = None
    closed = False
    drained = False
    async with anyio.create_task_group() as tg, receive:
        for key, source in sources.items():
            tg.start_soon(_Pump[K, T](send.clone()).run, key, source)
        send.close()
        try:
            async for received in receive:
                if isinstance(received, _Failure):
                    failure = received.error
                    break
                try:
                    yield received
                except GeneratorExit:
                    closed = True
                    break
            else:
                drained = True  # every pump closed its end: none is left to stop
        finally:
            if not drained:
                tg.cancel_scope.cancel()
    if failure is not None and not closed:
        raise failure


async def prefetch(source: AsyncIterator[T], buffer: int) -> AsyncIterator[T]:
    """`source`'s items, pulled by a task of their own up to `buffer` items ahead of the
    consumer: producing the next overlaps with consuming this one. Close it (`closing`) when
    leaving early."""
    async with closing(merge({0: source}, buffer, pump_single=True)) as stream:
        async for _, item in stream:
            yield item
