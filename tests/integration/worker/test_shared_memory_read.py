"""A task's partitions read through shared memory by pyarrow's C++ client on the worker's host
(DoExchange, worker/rpc/shared_memory_read.py and spark/shared_read.py): the same rows as
DoGet, the segment's name gone once the reader mapped it, every batch placed in a slot while
slots come back, inline when they do not or the reader cannot map the segment; the segment kept
for the reader's next read (worker/shared_memory_pool.py) within the budget and the idle TTL;
a reader that breaks the protocol gets a precise error and the worker keeps serving."""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import anyio
import pyarrow as pa
import pyarrow.flight as fl
import pytest
from helpers.worker_plans import (
    TABLE,
    header_session_builder,
    new_key,
    none_request,
    scan,
    set_plan,
    sorted_by_k,
)

from flightfeed.flight.shared_memory import (
    DEFAULT_SLOT_BYTES,
    DEFAULT_SLOTS,
    HEADER_BYTES,
    Freed,
    Offer,
    Reply,
    Request,
    read_command,
)
from flightfeed.protocol import WorkerClient
from flightfeed.spark.shared_read import HeldMappings, read_ticket
from flightfeed.testing import start_workers
from flightfeed.worker import Worker, WorkerConfig
from flightfeed.worker.rpc.shared_memory_read import SLOT_WAIT
from flightfeed.worker.shared_memory_pool import SegmentPool

pytestmark = pytest.mark.anyio
BATCHES = TABLE.num_rows // 100  # scan(): batches of 100 rows
SEGMENT_BYTES = HEADER_BYTES + DEFAULT_SLOTS * DEFAULT_SLOT_BYTES


def segments_of(worker: Worker) -> SegmentPool:
    pool = worker.state.segments
    assert pool is not None
    return pool


@asynccontextmanager
async def worker_with_tasks(
    config: WorkerConfig, count: int, host: str = "127.0.0.1"
) -> AsyncIterator[tuple[Worker, list[bytes]]]:
    """A worker (gRPC on port 0 of `host`) holding `count` tasks over TABLE in 4 partitions;
    the ticket of all of each (a task is read once)."""
    workers = start_workers(1, session_builder=header_session_builder, config=config, host=host)
    async with (
        workers as (worker,),
        WorkerClient(worker.location) as client,
        AsyncExitStack() as stack,
    ):
        tickets = []
        for _ in range(count):
            key = new_key()
            await stack.enter_async_context(client.open_task(set_plan(scan(4), key)))
            tickets.append(bytes(none_request(key, 0, 4)))
        yield worker, tickets


@asynccontextmanager
async def worker_with_task(
    config: WorkerConfig, host: str = "127.0.0.1"
) -> AsyncIterator[tuple[Worker, bytes]]:
    async with worker_with_tasks(config, 1, host) as (worker, (ticket,)):
        yield worker, ticket


def ignore(batch: pa.RecordBatch) -> None:
    """What a test reader does with a batch: nothing."""


def shared_read(
    location: str,
    ticket: bytes,
    consume: Callable[[pa.RecordBatch], None] = ignore,
    held: HeldMappings | None = None,
) -> pa.Table:
    """A reader's read; `held`: the mappings it keeps between reads (by default, none)."""
    client = fl.connect(location)
    held = HeldMappings() if held is None else held
    try:
        batches = []
        for batch in read_ticket(client, location, ticket, fl.FlightCallOptions(), held):
            consume(batch)
            batches.append(batch.to_pydict())  # (a copy: the slot goes back)
            del batch
        return pa.Table.from_pylist([row for b in batches for row in _rows(b)], TABLE.schema)
    finally:
        client.close()


def _rows(columns: dict[str, list[object]]) -> list[dict[str, object]]:
    return [
        dict(zip(columns, values, strict=True)) for values in zip(*columns.values(), strict=True)
    ]


async def test_a_read_through_shared_memory_gives_the_rows_and_leaves_no_file(
    tmp_path: Path,
) -> None:
    config = WorkerConfig(shared_memory_dir=str(tmp_path))
    async with worker_with_task(config) as (worker, ticket):
        table = await anyio.to_thread.run_sync(shared_read, worker.location, ticket)
        stats = worker.state.shared_memory
        assert (stats.offered, stats.mapped, stats.streamed) == (1, 1, 0)
        assert stats.placed_batches == BATCHES
        assert stats.inline_batches == 0
        assert segments_of(worker).idle == 1  # kept for the reader's next read
    assert sorted_by_k(table).equals(TABLE)
    assert await anyio.to_thread.run_sync(os.listdir, tmp_path) == []


async def test_a_slow_reader_gets_every_batch(tmp_path: Path) -> None:
    config = WorkerConfig(shared_memory_dir=str(tmp_path))
    async with worker_with_task(config) as (worker, ticket):
        table = await anyio.to_thread.run_sync(
            shared_read, worker.location, ticket, lambda batch: time.sleep(0.01)
        )
        stats = worker.state.shared_memory
        assert stats.placed_batches + stats.inline_batches == BATCHES
    assert sorted_by_k(table).equals(TABLE)


def holding_read(location: str, ticket: bytes) -> tuple[pa.Table, list[pa.RecordBatch]]:
    """Keeps every batch it is given (in place: their slots never go back)."""
    client = fl.connect(location)
    try:
        held = list(read_ticket(client, location, ticket, fl.FlightCallOptions(), HeldMappings()))
        return pa.Table.from_batches(held), held
    finally:
        client.close()


async def test_a_reader_keeping_every_batch_gets_the_rest_inline(tmp_path: Path) -> None:
    config = WorkerConfig(shared_memory_dir=str(tmp_path))
    async with worker_with_task(config) as (worker, ticket):
        started = time.monotonic()
        table, held = await anyio.to_thread.run_sync(holding_read, worker.location, ticket)
        waited = time.monotonic() - started
        stats = worker.state.shared_memory
        assert stats.placed_batches == DEFAULT_SLOTS  # then no slot came back
        assert stats.inline_batches == BATCHES - DEFAULT_SLOTS
    assert sorted_by_k(table).equals(TABLE)  # the slots were never written again
    assert waited >= SLOT_WAIT  # (one wait, not one a batch: the rest streamed at once)
    del held


def raw_exchange(
    location: str,
    ticket: bytes,
    after_offer: Callable[[Offer], bytes | None],
    request: bytes = b"{}",
    offers: list[Offer] | None = None,
) -> pa.Table:
    """The protocol by hand: `request`, the offer (appended to `offers`), then `after_offer`'s
    answer (None: none, as for no offer), and done."""
    client = fl.connect(location)
    try:
        descriptor = fl.FlightDescriptor.for_command(read_command(ticket))
        writer, reader = client.do_exchange(descriptor)
        writer.write_metadata(pa.py_buffer(request))
        offer = Offer.decode(reader.read_chunk().app_metadata)
        if offers is not None:
            offers.append(offer)
        answer = after_offer(offer)
        if answer is not None:
            writer.write_metadata(pa.py_buffer(answer))
        writer.done_writing()
        batches = [chunk.data for chunk in reader if chunk.data is not None]
        return pa.Table.from_batches(batches, schema=reader.schema)
    finally:
        client.close()


def refuse(offer: Offer) -> bytes:
    """The answer of a reader that could not map the offered segment."""
    return Reply(False).encode()


def accept(offer: Offer) -> bytes | None:
    """The answer of a reader that mapped the segment (none when there was no offer)."""
    return Reply(True).encode() if offer.offered else None


async def test_a_reader_that_cannot_map_the_segment_gets_every_batch_inline(
    tmp_path: Path,
) -> None:
    config = WorkerConfig(shared_memory_dir=str(tmp_path))
    async with worker_with_task(config) as (worker, ticket):
        table = await anyio.to_thread.run_sync(raw_exchange, worker.location, ticket, refuse)
        stats = worker.state.shared_memory
        assert (stats.offered, stats.mapped, stats.streamed) == (1, 0, 1)
        assert stats.placed_batches == 0
    assert sorted_by_k(table).equals(TABLE)
    assert await anyio.to_thread.run_sync(os.listdir, tmp_path) == []


@pytest.mark.parametrize(
    "config",
    [
        WorkerConfig(shared_memory_dir=None),
        WorkerConfig(shared_memory_bytes=0),
        WorkerConfig(shared_memory_dir="/nonexistent/flightfeed-shm"),
    ],
    ids=["switched off", "no budget", "no such directory"],
)
async def test_without_shared_memory_the_read_streams(config: WorkerConfig) -> None:
    async with worker_with_task(config) as (worker, ticket):
        table = await anyio.to_thread.run_sync(shared_read, worker.location, ticket)
        stats = worker.state.shared_memory
        assert (stats.offered, stats.streamed) == (0, 1)
    assert sorted_by_k(table).equals(TABLE)


def lends_back_a_slot_it_was_not_lent(location: str, ticket: bytes) -> None:
    client = fl.connect(location)
    try:
        descriptor = fl.FlightDescriptor.for_command(read_command(ticket))
        writer, reader = client.do_exchange(descriptor)
        writer.write_metadata(pa.py_buffer(b"{}"))
        offer = Offer.decode(reader.read_chunk().app_metadata)
        writer.write_metadata(pa.py_buffer(Reply(True).encode()))
        writer.write_metadata(pa.py_buffer(Freed((offer.slots - 1,)).encode()))
        for _ in reader:  # until the worker's status
            continue
    finally:
        client.close()


async def test_a_reader_breaking_the_protocol_gets_invalid_argument_and_the_worker_serves(
    tmp_path: Path,
) -> None:
    config = WorkerConfig(shared_memory_dir=str(tmp_path))
    async with worker_with_task(config) as (worker, ticket):
        with pytest.raises(pa.ArrowInvalid, match="slot 7 was not lent to the reader"):
            await anyio.to_thread.run_sync(
                lends_back_a_slot_it_was_not_lent, worker.location, ticket
            )
        assert segments_of(worker).held_bytes == 0  # not kept for a reader that broke it
    async with worker_with_task(config) as (worker, ticket):  # the worker serves the next read
        table = await anyio.to_thread.run_sync(shared_read, worker.location, ticket)
    assert sorted_by_k(table).equals(TABLE)
    assert await anyio.to_thread.run_sync(os.listdir, tmp_path) == []


async def test_a_task_that_fails_after_the_segment_is_mapped_gives_its_own_status(
    tmp_path: Path,
) -> None:
    """The task's error (here: its plan never came) reaches the reader as the task's status,
    not as INTERNAL (found by the fuzzer: it came out wrapped in the read's task group)."""
    config = WorkerConfig(shared_memory_dir=str(tmp_path), plan_wait_timeout=0.2)
    async with start_workers(1, config=config) as (worker,):
        unknown = bytes(none_request(new_key(), 0, 1))
        with pytest.raises(pa.ArrowKeyError, match="not found error, with message: no plan for"):
            await anyio.to_thread.run_sync(raw_exchange, worker.location, unknown, accept)
        assert worker.state.shared_memory.mapped == 1  # (the reader did map it)
        assert segments_of(worker).held_bytes == 0  # not kept: the read failed
        async with worker_with_task(config) as (serving, ticket):  # and workers serve on
            table = await anyio.to_thread.run_sync(shared_read, serving.location, ticket)
    assert sorted_by_k(table).equals(TABLE)
    assert await anyio.to_thread.run_sync(os.listdir, tmp_path) == []


def exchange_of(location: str, command: bytes) -> None:
    client = fl.connect(location)
    try:
        writer, reader = client.do_exchange(fl.FlightDescriptor.for_command(command))
        writer.write_metadata(pa.py_buffer(b"{}"))
        reader.read_chunk()
    finally:
        client.close()


async def test_an_exchange_that_is_not_a_shared_memory_read_is_refused_by_name() -> None:
    async with start_workers(1) as (worker,):
        with pytest.raises(pa.ArrowInvalid, match="reads a ticket through shared memory"):
            await anyio.to_thread.run_sync(exchange_of, worker.location, b"SELECT 1")


async def test_the_next_read_of_the_same_reader_reuses_its_segment(tmp_path: Path) -> None:
    """Spark reuses its Python workers: their next read of the worker gets the segment they
    still map, its pages in place, and no new file is made."""
    config = WorkerConfig(shared_memory_dir=str(tmp_path))
    held = HeldMappings()
    async with worker_with_tasks(config, 2) as (worker, tickets):
        first, second = [
            await anyio.to_thread.run_sync(shared_read, worker.location, ticket, ignore, held)
            for ticket in tickets
        ]
        stats = worker.state.shared_memory
        assert (stats.offered, stats.mapped, stats.reused) == (2, 2, 1)
        assert stats.placed_batches == 2 * BATCHES
        assert (segments_of(worker).idle, segments_of(worker).held_bytes) == (1, SEGMENT_BYTES)
        assert len(held) == 1
    assert sorted_by_k(first).equals(TABLE)
    assert sorted_by_k(second).equals(TABLE)
    assert await anyio.to_thread.run_sync(os.listdir, tmp_path) == []


def read_while_holding(location: str, tickets: list[bytes], held: HeldMappings) -> list[pa.Table]:
    """Two reads by one reader, the first's batches still held (in place) during the second."""
    client = fl.connect(location)
    try:
        call = fl.FlightCallOptions()
        kept = list(read_ticket(client, location, tickets[0], call, held))
        again = list(read_ticket(client, location, tickets[1], call, held))
        return [pa.Table.from_batches(kept), pa.Table.from_batches(again)]
    finally:
        client.close()


async def test_a_segment_whose_batches_are_still_held_is_not_offered_again(
    tmp_path: Path,
) -> None:
    config = WorkerConfig(shared_memory_dir=str(tmp_path))
    async with worker_with_tasks(config, 2) as (worker, tickets):
        tables = await anyio.to_thread.run_sync(
            read_while_holding, worker.location, tickets, HeldMappings()
        )
        stats = worker.state.shared_memory
        assert (stats.mapped, stats.reused) == (2, 0)  # a second segment, the first untouched
    for table in tables:
        assert sorted_by_k(table).equals(TABLE)


async def test_a_request_naming_a_segment_the_worker_does_not_hold_gets_a_new_one(
    tmp_path: Path,
) -> None:
    config = WorkerConfig(shared_memory_dir=str(tmp_path))
    offers: list[Offer] = []
    request = Request(("ab" * 16,)).encode()
    async with worker_with_task(config) as (worker, ticket):
        table = await anyio.to_thread.run_sync(
            raw_exchange, worker.location, ticket, refuse, request, offers
        )
        assert worker.state.shared_memory.reused == 0
        assert segments_of(worker).held_bytes == 0  # refused: not kept
    assert offers[0].path is not None
    assert not offers[0].reused
    assert sorted_by_k(table).equals(TABLE)


async def test_an_idle_segment_goes_after_its_ttl(tmp_path: Path) -> None:
    config = WorkerConfig(shared_memory_dir=str(tmp_path), shared_memory_idle_ttl=0.05)
    async with worker_with_task(config) as (worker, ticket):
        table = await anyio.to_thread.run_sync(shared_read, worker.location, ticket)
        pool = segments_of(worker)
        with anyio.fail_after(10):
            while pool.held_bytes:
                await pool.changed()
        assert worker.state.shared_memory.mapped == 1
    assert sorted_by_k(table).equals(TABLE)


async def test_idle_segments_make_room_within_the_budget(tmp_path: Path) -> None:
    """Room for one segment: a second reader's read takes the first reader's idle segment's
    place (least recently used first), and the first reader then gets a new one."""
    config = WorkerConfig(shared_memory_dir=str(tmp_path), shared_memory_bytes=SEGMENT_BYTES)
    first, second = HeldMappings(), HeldMappings()
    async with worker_with_tasks(config, 3) as (worker, tickets):
        for held, ticket in zip((first, second, first), tickets, strict=True):
            table = await anyio.to_thread.run_sync(
                shared_read, worker.location, ticket, ignore, held
            )
            assert sorted_by_k(table).equals(TABLE)
            assert segments_of(worker).held_bytes == SEGMENT_BYTES
        stats = worker.state.shared_memory
        assert (stats.mapped, stats.reused, stats.streamed) == (3, 0, 0)


async def test_a_malformed_request_is_refused_by_name(tmp_path: Path) -> None:
    config = WorkerConfig(shared_memory_dir=str(tmp_path))
    async with worker_with_task(config) as (worker, ticket):
        with pytest.raises(pa.ArrowInvalid, match="held must list at most 16 segments"):
            await anyio.to_thread.run_sync(
                raw_exchange, worker.location, ticket, refuse, b'{"held":"x"}'
            )
        # Refused before the task ran: the same ticket reads all of it.
        table = await anyio.to_thread.run_sync(shared_read, worker.location, ticket)
    assert sorted_by_k(table).equals(TABLE)


def this_hosts_other_address() -> str | None:
    """An IPv4 address of this host beyond the loopback, if it has one (a UDP socket's
    route to a documentation address: nothing is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))
        except OSError:
            return None
        address: str = probe.getsockname()[0]
    return None if address.startswith("127.") or address == "0.0.0.0" else address


async def test_a_reader_beyond_the_loopback_is_offered_no_segment(tmp_path: Path) -> None:
    """It could not map one: the worker does not make one, and the read streams."""
    address = this_hosts_other_address()
    if address is None:
        pytest.skip("this host has no address beyond the loopback")
    config = WorkerConfig(shared_memory_dir=str(tmp_path))
    offers: list[Offer] = []
    async with worker_with_task(config, host=address) as (worker, ticket):
        table = await anyio.to_thread.run_sync(
            raw_exchange, worker.location, ticket, accept, b"{}", offers
        )
        stats = worker.state.shared_memory
        assert (stats.offered, stats.streamed) == (0, 1)
        assert segments_of(worker).held_bytes == 0
    assert offers == [Offer(None)]
    assert sorted_by_k(table).equals(TABLE)


async def test_a_directory_that_cannot_hold_a_segment_is_logged_once_and_reads_stream(
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = WorkerConfig(shared_memory_dir="/nonexistent/flightfeed-shm")
    async with worker_with_tasks(config, 2) as (worker, tickets):
        with caplog.at_level(logging.WARNING, logger="flightfeed.worker.shared_memory_pool"):
            tables = [
                await anyio.to_thread.run_sync(shared_read, worker.location, ticket)
                for ticket in tickets
            ]
        stats = worker.state.shared_memory
        assert (stats.offered, stats.streamed) == (0, 2)
    warnings = [r for r in caplog.records if r.name == "flightfeed.worker.shared_memory_pool"]
    assert len(warnings) == 1
    assert "/nonexistent/flightfeed-shm" in warnings[0].getMessage()
    for table in tables:
        assert sorted_by_k(table).equals(TABLE)
