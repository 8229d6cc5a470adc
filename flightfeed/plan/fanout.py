"""One producer run fanned out to N bounded outputs: the engine under Repartition and the
worker's repartition and broadcast heads.

Every output is a memory object stream of `buffer` items, also before its reader arrives, so
the producer waits on a full output instead of buffering without bound (a "wait only while no
output is empty" gate lets an unread output grow without limit). The price: read the outputs
concurrently (merge does); reading them one after the other can leave the producer blocked on
the full buffer of an output read later.

A reader that leaves drops only its own output; once every output is closed the producer is
cancelled. The producer never raises into the task group it runs in: a reader gets the items
sent before the producer ended, then the end of its output, or the producer's error.

An output nobody opens within `claim_timeout` of the first open is dropped, so it cannot hold
the producer (and every other output) forever; opening it later fails, naming the timeout.
Buffered items are reserved from the task's memory (`memory`) from send to receive.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from functools import partial
from typing import Generic, TypeAlias, TypeVar

import anyio
import pyarrow as pa
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from ..errors import Cancelled, InvalidArgument
from .base import ExecutionPlan, TaskContext, closing
from .expr import Expr
from .functions import FunctionRegistry
from .hash_partition import hash_partition
from .memory import MemoryReservation, batch_nbytes
from .offload import run_compute

T = TypeVar("T")

Split: TypeAlias = Callable[[pa.RecordBatch], Sequence[pa.RecordBatch | None]]
"""One batch cut into one piece per output; None sends nothing to that output."""


class FanoutSender(Generic[T]):
    """The producer's handle on the outputs."""

    def __init__(
        self,
        streams: list[MemoryObjectSendStream[tuple[T, int]] | None],
        memory: MemoryReservation | None = None,
    ) -> None:
        self._streams = streams  # shared with the Fanout, which clears an output's entry
        self._memory = memory

    @property
    def outputs(self) -> int:
        return len(self._streams)

    async def send(self, output: int, item: T, nbytes: int = 0) -> bool:
        """Put `item` in one output, waiting while it is full; `nbytes` of it are reserved
        until its reader takes it.

        False when that output's reader has left: the item is discarded, and never waited for.
        """
        stream = self._streams[output]
        if stream is None:
            return False
        if self._memory is not None:
            self._memory.grow(nbytes)
        try:
            await stream.send((item, nbytes))
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            self._streams[output] = None
            self._release(nbytes)
            return False
        except BaseException:
            self._release(nbytes)
            raise
        return True

    def _release(self, nbytes: int) -> None:
        if self._memory is not None:
            self._memory.shrink(nbytes)


Producer: TypeAlias = Callable[[FanoutSender[T]], Awaitable[None]]


class Fanout(Generic[T]):
    """One run of `produce`, started by the first `open`, fanned out to `outputs` outputs.

    Each output holds at most `buffer` items. The producer runs in `background`; it is
    cancelled when every output is closed, and its error (the first one of an exception group)
    is raised by every reader after the items buffered before it. A producer cancelled from
    outside ends every output with Cancelled, so no reader mistakes a cut-off run for the end.
    """

    def __init__(
        self,
        outputs: int,
        buffer: int,
        produce: Producer[T],
        background: TaskGroup,
        *,
        name: str = "fanout",
        claim_timeout: float | None = None,
        memory: MemoryReservation | None = None,
    ) -> None:
        if outputs < 1 or buffer < 0:
            raise InvalidArgument(f"{name}: needs outputs >= 1 and buffer >= 0")
        if claim_timeout is not None and claim_timeout <= 0:
            raise InvalidArgument(f"{name}: claim_timeout must be positive")
        self.name = name
        self.outputs = outputs
        self.error: Exception | None = None
        self._produce = produce
        self._background = background
        self._claim_timeout = claim_timeout
        self._memory = memory
        streams = [anyio.create_memory_object_stream[tuple[T, int]](buffer) for _ in range(outputs)]
        self._all_sends = [send for send, _ in streams]
        self._sends: list[MemoryObjectSendStream[tuple[T, int]] | None] = list(self._all_sends)
        self._receives = [receive for _, receive in streams]
        self._opened: set[int] = set()
        self._closed: set[int] = set()
        self._expired: set[int] = set()
        self._all_opened = anyio.Event()
        self._scope = anyio.CancelScope()

    def open(self, output: int) -> FanoutOutput[T]:
        """The reader of one output; close it (`closing`) when leaving early."""
        if not 0 <= output < self.outputs:
            raise InvalidArgument(f"{self.name}: no output {output} of {self.outputs}")
        if output in self._expired:
            raise Cancelled(
                f"{self.name}: output {output} was not opened within {self._claim_timeout:g}s"
                " of the first one, and was dropped so the other outputs could go on"
            )
        if output in self._opened:
            raise InvalidArgument(f"{self.name}: output {output} was already opened")
        first = not self._opened
        self._opened.add(output)
        if len(self._opened) == self.outputs:
            self._all_opened.set()
        if first:
            self._background.start_soon(self._run, name=f"{self.name} producer")
            if self._claim_timeout is not None and self.outputs > 1:
                self._background.start_soon(self._expire_unclaimed, name=f"{self.name} claims")
        return FanoutOutput(self, output, self._receives[output])

    async def _expire_unclaimed(self) -> None:
        """Drop the outputs nobody opened in time (their buffers would stall the producer)."""
        assert self._claim_timeout is not None
        with anyio.move_on_after(self._claim_timeout):
            await self._all_opened.wait()
            return
        for output in range(self.outputs):
            if output not in self._opened:
                self._expired.add(output)
                self._drain(output)
                self._receives[output].close()
                self._leave(output)

    def _drain(self, output: int) -> None:
        """Free an output's buffered items (a closed memory stream keeps its buffer)."""
        receive = self._receives[output]
        while True:
            try:
                _, nbytes = receive.receive_nowait()
            except (anyio.EndOfStream, anyio.WouldBlock, anyio.ClosedResourceError):
                break
            if self._memory is not None:
                self._memory.shrink(nbytes)

    def _leave(self, output: int) -> None:
        self._sends[output] = None
        self._all_sends[output].close()  # a send waiting on it gives up its item
        self._closed.add(output)
        if len(self._closed) == self.outputs:
            self._scope.cancel()  # nobody is left to read

    async def _run(self) -> None:
        error: Exception | None = Cancelled(f"{self.name}: the producer was cancelled")
        try:
            with self._scope:
                await self._produce(FanoutSender(self._sends, self._memory))
            error = None  # finished, or stopped because every reader left
        except Exception as exc:
            error = exc
            while isinstance(error, ExceptionGroup) and error.exceptions:
                error = error.exceptions[0]
        finally:
            self.error = error
            for send in self._all_sends:
                send.close()


class FanoutOutput(AsyncIterator[T]):
    """One output's reader: its items, then its end or the producer's error."""

    def __init__(
        self, fanout: Fanout[T], index: int, receive: MemoryObjectReceiveStream[tuple[T, int]]
    ) -> None:
        self._fanout = fanout
        self._index = index
        self._receive = receive
        self._closed = False

    async def __anext__(self) -> T:
        if self._closed:
            raise StopAsyncIteration
        try:
            item, nbytes = await self._receive.receive()
        except anyio.EndOfStream:
            pass
        else:
            memory = self._fanout._memory
            if memory is not None:
                memory.shrink(nbytes)
            return item
        self._close()
        if self._fanout.error is not None:
            raise self._fanout.error
        raise StopAsyncIteration

    async def aclose(self) -> None:
        self._close()

    def _close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._fanout._leave(self._index)
        self._fanout._drain(self._index)
        self._receive.close()


def hash_split(keys: Sequence[Expr], count: int, functions: FunctionRegistry) -> Split:
    """Split by key hash into `count` pieces (see hash_partition.py); empty pieces are None."""

    def split(batch: pa.RecordBatch) -> list[pa.RecordBatch | None]:
        pieces = hash_partition(batch, keys, count, functions)
        return [piece if piece.num_rows else None for piece in pieces]

    return split


def split_producer(plan: ExecutionPlan, ctx: TaskContext, split: Split) -> Producer[pa.RecordBatch]:
    """A producer running every partition of `plan` concurrently, sending piece i of each
    batch (cut by `split`, on a worker thread when large) to output i."""
    return partial(_produce_split, plan, ctx, split)


async def _produce_split(
    plan: ExecutionPlan, ctx: TaskContext, split: Split, sender: FanoutSender[pa.RecordBatch]
) -> None:
    async with anyio.create_task_group() as tg:
        for partition in range(plan.output_partitions):
            tg.start_soon(_pump, plan, partition, ctx, split, sender)


async def _pump(
    plan: ExecutionPlan,
    partition: int,
    ctx: TaskContext,
    split: Split,
    sender: FanoutSender[pa.RecordBatch],
) -> None:
    async with closing(plan.execute(partition, ctx)) as stream:
        async for batch in stream:
            pieces = await run_compute(ctx, batch_nbytes(batch), partial(split, batch))
            shared = sum(piece is batch for piece in pieces)  # a broadcast sends one batch N times
            for output, piece in enumerate(pieces):
                if piece is not None:
                    nbytes = -(-batch_nbytes(piece) // shared) if piece is batch else piece.nbytes
                    await sender.send(output, piece, nbytes)
