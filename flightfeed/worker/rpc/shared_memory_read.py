"""DoExchange: a ticket read through shared memory, by a reader on the worker's host.

The reader's first message names the ticket (flight/shared_memory.py: a command of a prefix,
then the ticket) and the segments of this worker it still maps. The worker offers one of those
if it is idle (worker/shared_memory_pool.py), else a new segment, or none (a reader beyond the
loopback, no shared-memory directory, its budget spent, a table ticket), and the reader says
whether it mapped it. Then the ticket is served as DoGet serves it, each batch either written
into a free slot (the stream carries only a Placed message) or, too large for a slot or with
none free, sent inline exactly as DoGet sends it. The reader lends slots back (Freed) as it
releases their batches. A batch waits at most
SLOT_WAIT for a slot; after that the read streams until slots come back, so a reader that keeps
every batch it was given is slowed, never stuck.
"""

from __future__ import annotations

from typing import Final

import anyio
import anyio.to_thread
import pyarrow as pa

from ..._generated.flightfeed.v1 import ExecuteTaskRequest
from ...errors import FlightfeedError, InvalidArgument
from ...flight.shared_memory import (
    END,
    Freed,
    Offer,
    Placed,
    Reply,
    Request,
    Segment,
    parse_read_command,
)
from ...flight.streams import FlightDataReader, FlightDataWriter
from ...protocol.tickets import batch_app_metadata, parse_ticket
from ...tables.flight import TableFlight, is_table_ticket
from ..state import SharedMemoryStats, WorkerState
from .execute_task import execute_task
from .flight_sink import FlightSink

SLOT_WAIT: Final = 1.0
"""Seconds a batch waits for a slot to come back before it is sent inline."""
CLOSE_WAIT: Final = 10.0
"""Seconds the worker waits, after its last message, for the reader to finish sending: ending
the call while the reader still sends would reset the stream, and gRPC drops the messages the
reader has not read yet with it."""


class SlotLender:
    """The segment's slots: which are free, which the reader holds. Taking one waits, bounded,
    for the reader to lend one back; the reader may only return slots it was lent."""

    def __init__(self, slots: int) -> None:
        self._free = list(range(slots - 1, -1, -1))
        self._lent: set[int] = set()
        self._returned = anyio.Event()
        self._starved = False

    async def take(self, wait: float) -> int | None:
        """A free slot, or None: none came back within `wait` (or since the last such
        timeout: the read streams until the reader lends slots back)."""
        if not self._free and not self._starved:
            with anyio.move_on_after(wait):
                while not self._free:
                    await self._returned.wait()
            self._starved = not self._free
        if not self._free:
            return None
        slot = self._free.pop()
        self._lent.add(slot)
        return slot

    def give_back(self, slots: tuple[int, ...]) -> None:
        for slot in slots:
            if slot not in self._lent:
                raise InvalidArgument(f"shared-memory read: slot {slot} was not lent to the reader")
            self._lent.remove(slot)
            self._free.append(slot)
        if slots:
            self._starved = False
            self._returned.set()
            self._returned = anyio.Event()


class SharedMemorySink:
    """A PartitionSink writing batches into the segment's slots, or inline when they do not
    fit or no slot comes back in time."""

    def __init__(
        self,
        writer: FlightDataWriter,
        segment: Segment,
        lender: SlotLender,
        stats: SharedMemoryStats,
    ) -> None:
        self._writer = writer
        self._segment = segment
        self._lender = lender
        self._stats = stats

    async def begin(self, schema: pa.Schema) -> None:
        await self._writer.begin(schema)

    async def write(self, partition: int, batch: pa.RecordBatch) -> None:
        slot = await self._lender.take(SLOT_WAIT) if self._segment.fits(batch) else None
        if slot is None:
            self._stats.inline_batches += 1
            await self._writer.write(batch, app_metadata=batch_app_metadata(partition))
            return
        # On the loop: a slot holds a few MiB at most, and DoGet's socket write copies as
        # much on the loop (into the kernel); a thread hop a batch cost more than the copy
        # (~10% of a worker's CPU for a 247 MB read).
        nbytes = self._segment.write(slot, batch)
        self._stats.placed_batches += 1
        self._stats.placed_bytes += nbytes
        await self._writer.write_metadata(Placed(slot, nbytes, partition).encode())


async def shared_memory_read(
    state: WorkerState,
    tables: TableFlight,
    reader: FlightDataReader,
    writer: FlightDataWriter,
    *,
    local: bool = True,
) -> None:
    """Serve one DoExchange: the reader's request, the offer, then the ticket's batches. A
    reader that is not `local` (a peer beyond this host's loopback) is offered no segment."""
    first = await reader.next()
    descriptor = reader.descriptor
    ticket = parse_read_command(descriptor.cmd) if descriptor is not None else None
    if first is None or ticket is None:
        raise InvalidArgument(
            "DoExchange on a flightfeed worker reads a ticket through shared memory: its first"
            " message's descriptor is a command of flight.shared_memory.read_command(ticket)"
        )
    if first[0] is not None:
        raise InvalidArgument("shared-memory read: the request carries a batch")
    held = Request.decode(first[1]).held
    stats, pool = state.shared_memory, state.segments if local else None
    if is_table_ticket(ticket):
        with state.call_under_way():
            stats.streamed += 1
            await writer.write_metadata(Offer(None).encode())
            await tables.do_get(ticket, writer)
            await _reader_finished(reader)
        return
    request = parse_ticket(ticket)  # (a bad ticket fails before any file is made)
    segment = pool.take_idle(held) if pool is not None else None
    reused = segment is not None
    if segment is None and pool is not None:
        segment = await pool.make()
    if segment is None or pool is None:
        stats.streamed += 1
        await writer.write_metadata(Offer(None).encode())
        await execute_task(state, request, FlightSink(writer))
        await _reader_finished(reader)
        return
    mapped = False
    try:
        with state.call_under_way():  # (its task is read whole before the reader took it all)
            mapped = await _serve(state, request, segment, reused, reader, writer)
    finally:
        await pool.give_back(segment, keep=mapped)


async def _serve(
    state: WorkerState,
    request: ExecuteTaskRequest,
    segment: Segment,
    reused: bool,
    reader: FlightDataReader,
    writer: FlightDataWriter,
) -> bool:
    """The read with `segment` offered; whether the reader mapped it (then it may be kept)."""
    stats = state.shared_memory
    stats.offered += 1
    offer = segment.offer()
    await writer.write_metadata((offer.reuse() if reused else offer).encode())
    answer = await reader.next()
    if not reused:
        await anyio.to_thread.run_sync(segment.unlink)  # mapped or not, its name is done
    if answer is None:
        return False  # the reader left
    if answer[0] is not None or not Reply.decode(answer[1]).opened:
        stats.streamed += 1
        await execute_task(state, request, FlightSink(writer))
        await _reader_finished(reader)
        return False
    stats.mapped += 1
    stats.reused += reused
    lender = SlotLender(segment.slots)
    failure: list[FlightfeedError] = []
    finished = anyio.Event()

    async def receive_freed(serving: anyio.CancelScope) -> None:
        """The reader's Freed messages, until it finishes sending; a bad one ends the read."""
        try:
            while (item := await reader.next()) is not None:
                if item[0] is not None:
                    raise InvalidArgument("shared-memory read: the reader sent a batch")
                lender.give_back(Freed.decode(item[1], segment.slots).slots)
            finished.set()
        except FlightfeedError as error:
            failure.append(error)
            serving.cancel()

    serving_failed: Exception | None = None
    async with anyio.create_task_group() as tg:
        tg.start_soon(receive_freed, tg.cancel_scope, name="shared-memory slots lent back")
        try:
            await execute_task(state, request, SharedMemorySink(writer, segment, lender, stats))
            await writer.write_metadata(END)
            with anyio.move_on_after(CLOSE_WAIT):
                await finished.wait()
        except Exception as exc:  # re-raised as is below, not in the group's ExceptionGroup
            serving_failed = exc
        finally:
            tg.cancel_scope.cancel()
    if failure:
        raise failure[0]
    if serving_failed is not None:
        raise serving_failed
    return True


async def _reader_finished(reader: FlightDataReader) -> None:
    """Wait (at most CLOSE_WAIT) for a reader that was sent everything inline to finish
    sending (it does once it has its answer): see CLOSE_WAIT."""
    with anyio.move_on_after(CLOSE_WAIT):
        while await reader.next() is not None:
            raise InvalidArgument("shared-memory read: the reader sent more than its reply")


__all__ = ["SLOT_WAIT", "SharedMemorySink", "SlotLender", "shared_memory_read"]
