"""The event loop's shared helpers: `off_loop`, which every layer uses to move CPU work off it,
`read_ahead`, which runs a blocking source on a thread of its own, `Signal`, the wake-up
every layer uses to wait for a change, `one_at_a_time`, for a stream with several senders, and
`closing`, which closes an async stream in the task that read it, `cancelled_for_real`,
which tells a cancellation from a CancelledError a user's function raised itself, and
`require_asyncio`, which the servers and the coordinator call as they start.

A callback that runs long on the event loop stops every other stream the process serves, so
decoding a large plan or control message, say, runs on a worker thread; small inputs stay
inline, where a thread hop would cost more than the work (plan nodes use
flightfeed.plan.offload.run_compute, which also accounts the time to the node).
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from functools import partial
from typing import Any, Final, Generic, TypeVar, cast

import anyio
import anyio.to_thread

T = TypeVar("T")
A = TypeVar("A")

OFF_LOOP_THRESHOLD_BYTES: Final = 64 * 1024
"""Inputs at least this large are decoded or encoded on a worker thread."""


def require_asyncio(what: str) -> None:
    """RuntimeError naming `what` unless an asyncio loop (uvloop's too) runs this code: grpclib
    and h2's transports are asyncio's, and under anyio's trio backend a coordinator started,
    then every query failed with "no running event loop", its workers left out as broken."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        raise RuntimeError(
            f"{what} runs on asyncio (or uvloop): anyio.run(..., backend='asyncio'), not trio"
        ) from None


def cancelled_for_real() -> bool:
    """Whether the current task is being cancelled (by its cancel scope, its owner). A
    CancelledError raised while it is not is a user function's own (it awaited a future that
    something else cancelled): an error of that function, not a cancellation of the caller."""
    task = asyncio.current_task()
    return task is None or task.cancelling() > 0


async def off_loop(
    fn: Callable[[A], T], arg: A, *, nbytes: int, threshold: int = OFF_LOOP_THRESHOLD_BYTES
) -> T:
    """`fn(arg)` on a worker thread when `nbytes` reaches `threshold`, else inline."""
    if nbytes >= threshold:
        return await anyio.to_thread.run_sync(fn, arg)
    return fn(arg)


@asynccontextmanager
async def closing(stream: AsyncIterator[T]) -> AsyncIterator[AsyncIterator[T]]:
    """Close an async stream on exit (early break, return, error or cancellation), in this
    task. An async generator left unfinished is otherwise closed whenever it is collected,
    by a task the event loop starts for it: its `finally` blocks (a feed partition handed
    back, a call's status read) run late, on no one's watch, and each costs the loop a
    cross-thread wake-up (two a query, when the coordinator left its task channels' reads)."""
    try:
        yield stream
    finally:
        aclose = getattr(stream, "aclose", None)
        if aclose is not None:
            await aclose()


# -- read_ahead: a blocking source read ahead on a thread of its own ------------------------
#
# `anyio.to_thread.run_sync` per item makes every item two hand-offs between the event loop and
# a worker thread, and the thread waits for the loop to ask for the next one. A loop busy
# writing large responses (uvloop writes with the GIL held) then stalls the source more than
# its own work costs: a table Read spent ~4 ms a batch between DuckDB handing over a batch and
# starting on the next. `read_ahead` keeps one thread producing until `ahead` items wait for
# the consumer; the loop is woken once an item is there, and the thread never waits for it.

_END: Final = object()


class _Failure:
    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


class _Producer(Generic[T]):
    """The thread's side: items into the hand-off until the source ends, fails or is stopped."""

    def __init__(self, next_item: Callable[[], T | None], ahead: int) -> None:
        self.next_item = next_item
        self.handoff: queue.Queue[T | object] = queue.Queue(ahead)
        self.stopped = threading.Event()
        self.arrived = asyncio.Event()
        self._loop = asyncio.get_running_loop()

    def run(self) -> None:
        try:
            while not self.stopped.is_set():
                item = self.next_item()
                self._hand_over(_END if item is None else item)
                if item is None:
                    return
        except Exception as exc:
            self._hand_over(_Failure(exc))

    def _hand_over(self, item: object) -> None:
        self.handoff.put(item)  # blocks while `ahead` items wait: the consumer sets the pace
        self._loop.call_soon_threadsafe(self.arrived.set)

    def stop(self) -> None:
        """Stop after the item in progress (room is made, so its hand-over returns)."""
        self.stopped.set()
        while True:
            try:
                self.handoff.get_nowait()
            except queue.Empty:
                return


async def read_ahead(next_item: Callable[[], T | None], ahead: int) -> AsyncIterator[T]:
    """The items `next_item` returns (None at the end), produced on one worker thread up to
    `ahead` items before they are taken; its errors are raised here. Close it (`closing`) when
    leaving early: the thread stops after the item in progress, and is waited for."""
    producer = _Producer(next_item, ahead)
    failure: BaseException | None = None
    async with anyio.create_task_group() as tg:
        tg.start_soon(partial(anyio.to_thread.run_sync, producer.run, abandon_on_cancel=False))
        try:
            while True:
                try:
                    item = producer.handoff.get_nowait()
                except queue.Empty:
                    producer.arrived.clear()
                    if producer.handoff.empty():
                        await producer.arrived.wait()
                    continue
                if item is _END:
                    break
                if isinstance(item, _Failure):
                    failure = item.error  # raised outside the task group, as it was
                    break
                try:
                    yield cast(T, item)
                except GeneratorExit:
                    break  # closed early (a GeneratorExit must not reach the task group)
        finally:
            producer.stop()
    if failure is not None:
        raise failure


class Signal:
    """A wake-up that any number of notifiers send and waiters await: `wait` returns at the
    next `notify`. One Event per round, made only while someone waits, so notifying with
    nobody waiting (the hot path) costs an attribute check."""

    __slots__ = ("_event",)

    def __init__(self) -> None:
        self._event: anyio.Event | None = None  # (made on first wait: an Event needs a loop)

    def notify(self) -> None:
        if self._event is not None:
            self._event.set()
            self._event = None

    async def wait(self) -> None:
        if self._event is None:
            self._event = anyio.Event()
        await self._event.wait()


def one_at_a_time(
    send: Callable[[T], Awaitable[None]],
) -> Callable[[T], Coroutine[Any, Any, None]]:
    """`send` for several concurrent senders, one message at a time. grpclib writes a message
    in pieces of the peer's frame size and can wait between two pieces (while the transport is
    paused); another sender's message written in that gap would corrupt both on the wire."""
    lock = anyio.Lock(fast_acquire=True)  # (uncontended, no event-loop turn)

    async def send_one(message: T) -> None:
        async with lock:
            await send(message)

    return send_one
