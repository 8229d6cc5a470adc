"""The main job on an embedded default: what `flightfeed demo` runs after the Spark pipeline
(pipeline_demo.py), showing the layers under it.

2. A flightfeed Flight server publishes a generated table as a flight with one endpoint per
   partition; pyarrow's C++ Flight client reads every endpoint and checks it against the source.
3. Local workers each get a task (a filter plan over their slice, sent over CoordinatorChannel);
   pyarrow's C++ client redeems ExecuteTaskRequest tickets with DoGet, and the result is checked
   against the same plan run in one process.
4. The coordinator plans count(*) per task over a scan whose chunks are discovered at runtime
   (the seeds' work_unit_feed query), streams the work units to the workers under
   per-partition credits, aggregates their output, and checks it against a one-process run.
"""

from __future__ import annotations

import time
import uuid
from contextlib import AsyncExitStack

import anyio
import pyarrow as pa
import pyarrow.compute as pc

from .errors import NotFound
from .examples.chunk_scan import (
    RemoteScan,
    RemoteScanEstimator,
    chunk_coordinator_session,
    chunk_feed_registry,
    chunk_session_builder,
    scan,
)
from .flight import (
    FlightDataWriter,
    FlightDescriptor,
    FlightEndpoint,
    FlightHandler,
    FlightInfo,
    FlightServer,
    Location,
    Ticket,
)
from .flight.schema import schema_to_ipc
from .flight.server import CallContext
from .plan import (
    BUILTINS,
    Coalesce,
    CodecRegistry,
    ExecutionPlan,
    Filter,
    HashAggregate,
    MemoryScan,
    agg,
    call,
    col,
    collect,
    encode_plan,
    lit,
    open_task_context,
)
from .protocol import SetPlanRequest, TaskKey, WorkerClient, execute_task_ticket
from .testing import start_cluster, start_workers

DEMO_ROWS = 2_000_000
BATCH_ROWS = 65_536


def demo_table(rows: int = DEMO_ROWS) -> pa.Table:
    """A deterministic table with ints, floats, strings and a dictionary column."""
    ids = pa.array(range(rows), pa.int64())
    return pa.table(
        {
            "id": ids,
            "value": pc.multiply(pc.cast(ids, pa.float64()), 0.5),
            "bucket": pc.cast(pc.bit_wise_and(ids, 15), pa.int32()),
            "name": pc.binary_join_element_wise("row-", pc.cast(ids, pa.string()), ""),
            "kind": pa.DictionaryArray.from_arrays(
                pc.cast(pc.bit_wise_and(ids, 3), pa.int8()), ["a", "b", "c", "d"]
            ),
        }
    )


class TableHandler(FlightHandler):
    """Publishes named tables, each split into `partitions` endpoints."""

    def __init__(self, tables: dict[str, pa.Table], partitions: int, location: str = "") -> None:
        self.tables = tables
        self.partitions = partitions
        self.location = location

    def _slices(self, name: str) -> list[pa.Table]:
        table = self.tables.get(name)
        if table is None:
            raise NotFound(f"no flight named {name!r}")
        step = -(-table.num_rows // self.partitions)
        return [table.slice(i * step, step) for i in range(self.partitions)]

    async def get_flight_info(self, ctx: CallContext, descriptor: FlightDescriptor) -> FlightInfo:
        name = "/".join(descriptor.path)
        table = self.tables.get(name)
        if table is None:
            raise NotFound(f"no flight named {name!r}")
        endpoints = [
            FlightEndpoint(
                ticket=Ticket(ticket=f"{name}:{i}".encode()),
                location=[Location(uri=self.location)] if self.location else [],
            )
            for i in range(self.partitions)
        ]
        return FlightInfo(
            schema=schema_to_ipc(table.schema),
            flight_descriptor=descriptor,
            endpoint=endpoints,
            total_records=table.num_rows,
            total_bytes=table.nbytes,
        )

    async def do_get(self, ctx: CallContext, ticket: bytes, writer: FlightDataWriter) -> None:
        name, _, index = ticket.decode(errors="replace").rpartition(":")
        if not index.isdigit() or not 0 <= int(index) < self.partitions:
            raise NotFound(f"unknown ticket {ticket!r}")
        part = self._slices(name)[int(index)]
        await writer.begin(part.schema)
        for batch in part.to_batches(BATCH_ROWS):
            await writer.write(batch)


def _fetch_with_pyarrow(location: str, name: str) -> tuple[pa.Table, int]:
    import pyarrow.flight as flight

    client = flight.connect(location)
    try:
        info = client.get_flight_info(flight.FlightDescriptor.for_path(name))
        parts = [client.do_get(endpoint.ticket).read_all() for endpoint in info.endpoints]
        return pa.concat_tables(parts), len(info.endpoints)
    finally:
        client.close()


def _doget_tickets(tickets: list[tuple[str, bytes]]) -> list[pa.Table]:
    """pyarrow's C++ Flight client redeems ExecuteTaskRequest tickets on the workers."""
    import pyarrow.flight as flight

    tables = []
    for location, ticket in tickets:
        client = flight.connect(location)
        try:
            tables.append(client.do_get(flight.Ticket(ticket)).read_all())
        finally:
            client.close()
    return tables


def _demo_plan(table: pa.Table, partitions: int) -> ExecutionPlan:
    """Rows whose bucket is odd and whose value is above 1000: Arrow C++ does the filtering."""
    predicate = call(
        "and",
        call("equal", call("bit_wise_and", col("bucket"), lit(1, pa.int32())), lit(1, pa.int32())),
        call("greater", col("value"), lit(1000.0)),
    )
    return Filter(MemoryScan.from_table(table, partitions, batch_rows=BATCH_ROWS), predicate)


async def _run_on_workers(table: pa.Table, workers: int) -> tuple[pa.Table, int]:
    """One task per worker over its slice of the table; results read over Flight."""
    async with start_workers(workers) as running, AsyncExitStack() as stack:
        step = -(-table.num_rows // workers)
        tickets: list[tuple[str, bytes]] = []
        channels = []
        query_id = uuid.uuid4().bytes
        for number, worker in enumerate(running):
            client = await stack.enter_async_context(WorkerClient(worker.location))
            key = TaskKey(query_id=query_id, stage_id=1, task_number=number)
            plan = _demo_plan(table.slice(number * step, step), partitions=2)
            request = SetPlanRequest(
                task_key=key,
                task_count=workers,
                plan_proto=encode_plan(plan, CodecRegistry.builtin()),
                target_worker_url=worker.location,
                query_start_time_ns=time.time_ns(),
            )
            channels.append(await stack.enter_async_context(client.open_task(request)))
            tickets.append((worker.location, execute_task_ticket(key, 0, 2)))
        parts = await anyio.to_thread.run_sync(_doget_tickets, tickets)
        for channel in channels:
            await channel.wait_metrics()
        return pa.concat_tables(parts), len(running)


def _feed_plan(workers: int) -> ExecutionPlan:
    """count(*) per task over a scan whose chunks are discovered at runtime (the seeds' query,
    scaled up): 4 partitions per worker, each fed 40 chunks of 5,000 rows."""
    partitions = [",".join(["5000"] * 40) for _ in range(4 * workers)]
    scanned = scan(workers, *partitions, delay=0.0005)
    return HashAggregate(
        Coalesce(scanned),
        group_by=[(col("task"), "task")],
        aggregates=[agg("count", name="cnt")],
    )


async def _run_feed_query(workers: int) -> tuple[pa.Table, pa.Table, str, str]:
    """The coordinator plans the query, streams the feed to local workers, aggregates."""
    plan = _feed_plan(workers)
    async with start_cluster(
        workers,
        session_builder=chunk_session_builder,
        session=chunk_coordinator_session(),
        feed_registry=chunk_feed_registry(),
        task_estimators={RemoteScan.name: RemoteScanEstimator()},
    ) as (coordinator, _):
        explained = await coordinator.explain(plan)
        async with coordinator.execute(plan) as stream:
            batches = [batch async for batch in stream]
            metrics = stream.metrics
        distributed = pa.Table.from_batches(batches, schema=plan.schema)
        feeds = metrics.feed_partitions() if metrics is not None else {}
    units = sum(m.units_received for m in feeds.values())
    p50 = max((m.created_to_received.p50_ns for m in feeds.values()), default=0)
    summary = (
        f"{units} work units over {len(feeds)} feed partitions, p50 latency ≤ {p50 / 1e6:.2f} ms"
    )
    async with open_task_context(chunk_coordinator_session()) as ctx:
        reference = await collect(_feed_plan(workers), ctx)
    return distributed, reference, explained, summary


async def run_demo(workers: int = 2, *, first_section: int = 2) -> int:
    """The data plane, then a plan run on local workers; 0 when every result matches. Its
    sections are numbered from `first_section` (after the Spark pipeline's, or from 1)."""
    table = demo_table()
    section = iter(range(first_section, first_section + 3))
    print(f"{next(section)}. The Flight data plane")
    handler = TableHandler({"demo": table}, partitions=max(1, workers) * 2)
    async with FlightServer(handler) as server:
        handler.location = server.location
        print(f"flightfeed Flight server on {server.location}")
        start = time.perf_counter()
        fetched, endpoints = await anyio.to_thread.run_sync(
            _fetch_with_pyarrow, server.location, "demo"
        )
        elapsed = time.perf_counter() - start
    flight_ok = fetched.equals(table)
    print(
        f"pyarrow C++ client read {fetched.num_rows:,} rows ({fetched.nbytes / 1e6:.0f} MB) "
        f"from {endpoints} endpoints in {elapsed:.2f}s: {'identical' if flight_ok else 'MISMATCH'}"
    )

    print(f"{next(section)}. Tasks on workers, read with ExecuteTask tickets")
    start = time.perf_counter()
    distributed, count = await _run_on_workers(table, workers)
    elapsed = time.perf_counter() - start
    async with open_task_context(BUILTINS) as ctx:
        reference = await collect(_demo_plan(table, partitions=1), ctx)
    plan_ok = distributed.sort_by("id").equals(reference.sort_by("id"))
    print(
        f"{count} workers ran the filter plan; pyarrow C++ client read {distributed.num_rows:,} "
        f"rows via ExecuteTask tickets in {elapsed:.2f}s: "
        f"{'matches the one-process run' if plan_ok else 'MISMATCH'}"
    )
    # Only the aggregated columns go to Acero: pyarrow's C++ client may hand back small
    # dictionary batches at unaligned addresses (they share a gRPC slice with other messages).
    numbers = distributed.select(["bucket", "value", "id"])
    summary = numbers.group_by("bucket").aggregate([("value", "sum"), ("id", "count")])
    print(summary.sort_by("bucket"))

    print(f"{next(section)}. The coordinator streams runtime work to the workers")
    start = time.perf_counter()
    counted, reference_counts, explained, feed_summary = await _run_feed_query(workers)
    elapsed = time.perf_counter() - start
    feed_ok = counted.sort_by("task").equals(reference_counts.sort_by("task"))
    print(explained)
    print(
        f"coordinator + {workers} workers, work discovered at runtime: {feed_summary}; "
        f"{elapsed:.2f}s: {'matches the one-process run' if feed_ok else 'MISMATCH'}"
    )
    print(counted.sort_by("task"))
    return 0 if flight_ok and plan_ok and feed_ok else 1
