"""HoraeDB's RemoteEngineService on a real worker, through a client that shares no code with it:
standard protobuf/grpc stubs generated from the seed protos (helpers.seed_protos) over a
`grpc.aio` channel. Every RPC, ExecutePhysicalPlan with its ExecContext (timeout, priority,
explain analyze) included: errors in the response header with HoraeDB's codes, protocol errors
as gRPC statuses.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Final

import anyio
import grpc  # type: ignore[import-untyped]
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from datafusion import SessionContext
from helpers.contiguous_rows import contiguous_rows
from helpers.seed_protos import SERVICE, SeedProtos, seed_protos

from flightfeed._generated.flightfeed.v1 import TaskMetrics
from flightfeed._generated.schema import TableSchema as SchemaProto
from flightfeed.plan.aggregate import agg
from flightfeed.plan.base import ExecutionPlan
from flightfeed.plan.builder import plan_from
from flightfeed.plan.expr import Call, Expr, Literal, call, col, lit
from flightfeed.plan.expr_proto import encode_expr
from flightfeed.plan.functions import ScalarUdf
from flightfeed.plan.nodes import Filter, TableScan
from flightfeed.plan.table_source import TableReadSpec
from flightfeed.session import Session, SessionStateBuilder, WorkerQueryContext
from flightfeed.tables.rpc.execute_plan import METRICS_TRAILER
from flightfeed.tables.schema import TableSchema
from flightfeed.tables.store import TableName
from flightfeed.worker import Worker, WorkerConfig

pytestmark = pytest.mark.anyio

OK: Final = 0
BAD_REQUEST: Final = 401
NOT_FOUND: Final = 404

CPU: Final = pa.schema(
    [
        pa.field("ts", pa.timestamp("ms"), nullable=False),
        pa.field("host", pa.string(), nullable=False),
        pa.field("v", pa.float64()),
        pa.field("n", pa.int64()),
    ]
)
"""Table `cpu`: timestamp ts, tag host, primary key (host, ts)."""
MEM: Final = pa.schema(
    [pa.field("ts", pa.timestamp("ms"), nullable=False), pa.field("used", pa.int64())]
)
"""Table `mem`: timestamp ts, no tags, primary key (ts)."""
DAY_MS: Final = 86_400_000


@pytest.fixture(scope="session")
def seed() -> SeedProtos:
    return seed_protos()


@pytest.fixture(scope="module", autouse=True)
async def grpc_aio() -> AsyncIterator[None]:
    """grpc.aio held initialised by the module, on its event loop: otherwise each test's last
    channel shuts grpc.aio down whenever the channel happens to be collected, joining its poller
    thread on the event loop in whatever code runs then."""
    grpc.aio.init_grpc_aio()
    try:
        yield
    finally:
        gc.collect()  # the tests' channels, so that this is grpc.aio's last reference
        grpc.aio.shutdown_grpc_aio()


def cpu_rows(
    ts: Sequence[int],
    host: Sequence[str | None],
    v: Sequence[float | None],
    n: Sequence[int | None] | None = None,
) -> pa.Table:
    """Rows as the table stores them (ts in milliseconds)."""
    return pa.table(
        {
            "ts": pa.array(ts, pa.timestamp("ms")),
            "host": pa.array(host, pa.string()),
            "v": pa.array(v, pa.float64()),
            "n": pa.array(n if n is not None else [None] * len(ts), pa.int64()),
        },
        schema=CPU if None not in host else None,
    )


def mem_rows(ts: Sequence[int], used: Sequence[int | None]) -> pa.Table:
    return pa.table(
        {"ts": pa.array(ts, pa.timestamp("ms")), "used": pa.array(used, pa.int64())}, schema=MEM
    )


def ipc_stream(batch: pa.RecordBatch) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return bytes(sink.getvalue().to_pybytes())


def unzstd(frame: bytes) -> bytes:
    """One zstd frame, decompressed as HoraeDB's client does (no reliance on a declared size)
    with `zstandard`, else with pyarrow and the size the frame header declares."""
    try:
        import zstandard
    except ImportError:
        return bytes(pa.Codec("zstd").decompress(frame, decompressed_size=frame_size(frame)))
    return bytes(zstandard.ZstdDecompressor().decompressobj().decompress(frame))


def frame_size(frame: bytes) -> int:
    """The content size a zstd frame header declares (RFC 8878, 3.1.1.1)."""
    assert int.from_bytes(frame[:4], "little") == 0xFD2FB528, "not a zstd frame"
    descriptor = frame[4]
    size_flag, single_segment, dict_flag = descriptor >> 6, (descriptor >> 5) & 1, descriptor & 3
    start = 5 + (0 if single_segment else 1) + (0, 1, 2, 4)[dict_flag]
    width = (1 if single_segment else 0, 2, 4, 8)[size_flag]
    assert width, "the frame declares no content size"
    size = int.from_bytes(frame[start : start + width], "little")
    return size + 256 if width == 2 else size


def sorted_rows(table: pa.Table) -> pa.Table:
    keys = [(name, "ascending") for name in table.column_names if name in ("host", "ts")]
    return table.sort_by(keys)


def assert_tables_equal(got: pa.Table, expected: pa.Table) -> None:
    assert got.schema == expected.schema, f"{got.schema}\n!=\n{expected.schema}"
    assert got.equals(expected), f"{got.to_pylist()}\n!=\n{expected.to_pylist()}"


@dataclass
class Client:
    """The seed stubs over a grpc.aio channel, with the few helpers the tests share."""

    seed: SeedProtos
    channel: grpc.aio.Channel
    stub: Any

    @property
    def pb(self) -> Any:
        return self.seed.remote_engine_pb2

    def table(self, name: str) -> Any:
        return self.pb.TableIdentifier(table=name)

    def payload(self, rows: pa.Table) -> Any:
        """Each batch its own IPC stream, as HoraeDB sends them."""
        return self.seed.storage_pb2.ArrowPayload(
            record_batches=[ipc_stream(b) for b in rows.to_batches()]
        )

    def write_request(self, table: str, rows: pa.Table) -> Any:
        ts = pc.cast(rows.column("ts"), pa.int64())
        group = self.pb.RowGroup(
            min_timestamp=pc.min(ts).as_py(),
            max_timestamp=pc.max(ts).as_py(),
            arrow=self.payload(rows),
        )
        return self.pb.WriteRequest(table=self.table(table), row_group=group)

    async def write(self, table: str, rows: pa.Table) -> Any:
        return await self.stub.Write(self.write_request(table, rows))

    async def write_ok(self, table: str, rows: pa.Table) -> None:
        response = await self.write(table, rows)
        assert (response.header.code, response.header.error) == (OK, "")
        assert response.affected_rows == rows.num_rows

    async def write_batch(self, *requests: tuple[str, pa.Table]) -> Any:
        batch = [self.write_request(table, rows) for table, rows in requests]
        return await self.stub.WriteBatch(self.pb.WriteBatchRequest(batch=batch))

    def read_request(
        self,
        table: str,
        *,
        projection: Sequence[int] | None = None,
        table_schema: Any = None,
        predicates: Sequence[Expr | bytes] = (),
        time_range: tuple[int, int] | None = None,
        order: str = "None",
        batch_size: int = 0,
        read_parallelism: int = 0,
        timeout_ms: int = -1,
    ) -> Any:
        pb, schema_pb2 = self.pb, self.seed.schema_pb2
        exprs = [e if isinstance(e, bytes) else encode_expr(e) for e in predicates]
        predicate = pb.Predicate(exprs=exprs)
        if time_range is not None:
            start, end = time_range
            predicate.time_range.CopyFrom(self.seed.time_range_pb2.TimeRange(start=start, end=end))
        read = pb.TableReadRequest(
            request_id="wire-test",
            opts=pb.ReadOptions(
                batch_size=batch_size, read_parallelism=read_parallelism, timeout_ms=timeout_ms
            ),
            predicate=predicate,
            order=pb.ReadOrder.Value(order),
        )
        if projection is not None:
            read.projected_schema.CopyFrom(
                schema_pb2.ProjectedSchema(
                    table_schema=table_schema, projection=schema_pb2.Projection(idx=projection)
                )
            )
        return pb.ReadRequest(table=self.table(table), read_request=read)

    async def read_responses(self, table: str, **options: Any) -> list[Any]:
        return [r async for r in self.stub.Read(self.read_request(table, **options))]

    async def read(self, table: str, **options: Any) -> tuple[list[Any], pa.Table]:
        """The responses of a Read (every one ok, with an ArrowPayload) and the rows in them."""
        responses = await self.read_responses(table, **options)
        batches: list[pa.RecordBatch] = []
        for response in responses:
            assert (response.header.code, response.header.error) == (OK, "")
            assert response.WhichOneof("output") == "arrow"
            batches.extend(self.decode(response.arrow))
        assert batches, "the read returned no rows"
        return responses, pa.Table.from_batches(batches)

    def decode(self, payload: Any) -> list[pa.RecordBatch]:
        zstd = payload.compression == self.seed.storage_pb2.ArrowPayload.ZSTD
        batches: list[pa.RecordBatch] = []
        for element in payload.record_batches:
            data = unzstd(element) if zstd else element
            with pa.ipc.open_stream(data) as reader:  # a standalone stream: schema, batches, end
                batches.extend(reader)
        return batches

    async def table_info(self, table: str) -> Any:
        return await self.stub.GetTableInfo(self.pb.GetTableInfoRequest(table=self.table(table)))


@asynccontextmanager
async def serving(
    seed: SeedProtos, config: WorkerConfig, **options: Any
) -> AsyncIterator[tuple[Worker, Client]]:
    """A worker on port 0 (`options`: more of its own) and a client connected to it."""
    async with Worker(port=0, config=config, **options) as worker:
        target = worker.location.removeprefix("grpc://")
        async with grpc.aio.insecure_channel(target) as channel:
            stub = seed.remote_engine_pb2_grpc.RemoteEngineServiceStub(channel)
            yield worker, Client(seed, channel, stub)


async def create(
    worker: Worker, name: str, schema: pa.Schema, tags: Sequence[str] = (), **options: str
) -> None:
    assert worker.state.tables is not None
    table_schema = TableSchema.from_arrow(schema, timestamp="ts", tags=tags)
    await worker.state.tables.create(TableName.of(name), table_schema, options)


@pytest.fixture
async def cpu(seed: SeedProtos, tmp_path: Path) -> AsyncIterator[tuple[Worker, Client]]:
    """A worker with durable tables in tmp_path and an empty table `cpu`."""
    async with serving(seed, WorkerConfig(data_dir=str(tmp_path))) as (worker, client):
        await create(worker, "cpu", CPU, tags=["host"])
        yield worker, client


SAMPLE: Final = cpu_rows(
    ts=[1000, 1999, 2000, 3000, 3999, 4000, 5000],
    host=["a", "b", "a", "b", "a", "b", "a"],
    v=[1.0, 2.0, None, 3.5, 1.5, 0.5, 4.0],
    n=[1, 2, 3, 4, 5, 6, 7],
)
"""Every ts distinct, so an order by ts is one order of rows."""


# --- Write and WriteBatch ----------------------------------------------------------------


async def test_write_one_row_group(cpu: tuple[Worker, Client]) -> None:
    _, client = cpu
    response = await client.write("cpu", SAMPLE)
    assert response.header.code == OK
    assert response.header.error == ""
    assert response.affected_rows == SAMPLE.num_rows
    _, got = await client.read("cpu")
    assert_tables_equal(sorted_rows(got), sorted_rows(SAMPLE))


async def test_an_overwrite_counts_the_rows_written_as_horaedb_does(
    cpu: tuple[Worker, Client],
) -> None:
    """A key written twice in OVERWRITE mode is one row stored, two written: HoraeDB's
    affected_rows is the rows the request carried (the code before said 7)."""
    _, client = cpu
    twice = pa.concat_tables([SAMPLE, SAMPLE])
    response = await client.write("cpu", twice)
    assert (response.header.code, response.affected_rows) == (OK, 2 * SAMPLE.num_rows)
    _, got = await client.read("cpu")
    assert_tables_equal(sorted_rows(got), sorted_rows(SAMPLE))


async def test_a_row_group_of_several_ipc_streams(cpu: tuple[Worker, Client]) -> None:
    _, client = cpu
    rows = pa.Table.from_batches(SAMPLE.to_batches(max_chunksize=2))
    request = client.write_request("cpu", rows)
    assert len(request.row_group.arrow.record_batches) == 4
    response = await client.stub.Write(request)
    assert (response.header.code, response.affected_rows) == (OK, SAMPLE.num_rows)
    _, got = await client.read("cpu")
    assert_tables_equal(sorted_rows(got), sorted_rows(SAMPLE))


async def test_a_zstd_row_group(cpu: tuple[Worker, Client]) -> None:
    """As HoraeDB compresses: each element one zstd frame (zstd::bulk, level 3)."""
    _, client = cpu
    request = client.write_request("cpu", pa.Table.from_batches(SAMPLE.to_batches(max_chunksize=4)))
    payload = request.row_group.arrow
    codec = pa.Codec("zstd", compression_level=3)
    packed = [codec.compress(e, asbytes=True) for e in payload.record_batches]
    del payload.record_batches[:]
    payload.record_batches.extend(packed)
    payload.compression = client.seed.storage_pb2.ArrowPayload.ZSTD
    response = await client.stub.Write(request)
    assert (response.header.code, response.header.error) == (OK, "")
    assert response.affected_rows == SAMPLE.num_rows
    _, got = await client.read("cpu", order="Asc")
    assert_tables_equal(got, SAMPLE)


async def test_a_zstd_row_group_that_is_not_zstd_is_a_bad_request(
    cpu: tuple[Worker, Client],
) -> None:
    _, client = cpu
    request = client.write_request("cpu", SAMPLE)
    request.row_group.arrow.compression = client.seed.storage_pb2.ArrowPayload.ZSTD
    response = await client.stub.Write(request)
    assert response.header.code == BAD_REQUEST
    assert "not a zstd frame" in response.header.error
    assert await client.read_responses("cpu") == []


def declaring(size: int) -> bytes:
    """A zstd frame header declaring `size` bytes, with no real content behind it (decoding it
    would fail: the limit must refuse it first)."""
    return (0xFD2FB528).to_bytes(4, "little") + bytes([0b1110_0000]) + size.to_bytes(8, "little")


async def test_zstd_elements_are_limited_together_before_any_is_decompressed(
    seed: SeedProtos, tmp_path: Path
) -> None:
    """The limit was per element: a 100 KB Write of twelve zstd frames of 256 MiB each (each
    under it) took a worker to 3.2 GB. Now every element of every request of a call spends
    from one budget (a worker of 1 MiB messages: 4 MiB per write), checked on the sizes the
    frames declare before any is decompressed."""
    config = WorkerConfig(data_dir=str(tmp_path))
    async with serving(seed, config, max_message_size=1 << 20) as (worker, client):
        await create(worker, "cpu", CPU, tags=["host"])
        request = client.write_request("cpu", SAMPLE)
        payload = request.row_group.arrow
        del payload.record_batches[:]
        payload.record_batches.extend([declaring(1 << 20)] * 5)  # 1 MiB each, 5 MiB in all
        payload.compression = client.seed.storage_pb2.ArrowPayload.ZSTD
        response = await client.stub.Write(request)
        assert response.header.code == BAD_REQUEST
        assert "declare 5242880 bytes in all, over the worker's limit of 4194304" in (
            response.header.error
        )
        del payload.record_batches[1:]  # one, 1 MiB: within the limit, and not valid zstd
        response = await client.stub.Write(request)
        assert "is not valid zstd" in response.header.error
        batch = client.pb.WriteBatchRequest(batch=[request] * 5)  # 5 requests of 1 MiB each
        response = await client.stub.WriteBatch(batch)
        assert "declare 5242880 bytes in all" in response.header.error
        await client.write_ok("cpu", SAMPLE)  # and the worker writes on


async def test_dictionaries_are_counted_as_the_values_a_write_stores(
    seed: SeedProtos, tmp_path: Path
) -> None:
    """A 1 MB Write of one 1 MiB dictionary value and 3,000 indices took a worker to 3 GB
    before Arrow refused it: the budget counted the bytes sent, and storing a dictionary
    decodes it (found by a probe). Here a worker of 1 MiB messages (4 MiB a write), and 100 KB
    sent that decode to 6.4 MB."""
    config = WorkerConfig(data_dir=str(tmp_path))
    async with serving(seed, config, max_message_size=1 << 20) as (worker, client):
        await create(worker, "cpu", CPU, tags=["host"])
        rows = 100
        host = pa.DictionaryArray.from_arrays(
            pa.array([0] * rows, pa.int8()), pa.array(["h" * 64_000])
        )
        bomb = cpu_rows(ts=list(range(rows)), host=["x"] * rows, v=[1.0] * rows, n=[1] * rows)
        bomb = bomb.set_column(1, pa.field("host", host.type, nullable=False), host)
        response = await client.write("cpu", bomb)
        assert response.header.code == BAD_REQUEST
        assert "ArrowPayload element 0 (its dictionaries as values) decodes to 6400" in (
            response.header.error
        )
        assert "over the worker's limit of 4194304 bytes for one write" in response.header.error
        few = bomb.slice(0, 10)  # 640 KB as values: within the limit, and written
        await client.write_ok("cpu", few)
        _, got = await client.read("cpu")
        assert got.num_rows == 10
        assert set(got.column("host").to_pylist()) == {"h" * 64_000}


async def test_write_batch_commits_every_table(cpu: tuple[Worker, Client]) -> None:
    worker, client = cpu
    await create(worker, "mem", MEM)
    mem = mem_rows([1000, 2000], [10, None])
    response = await client.write_batch(("cpu", SAMPLE), ("mem", mem))
    assert (response.header.code, response.header.error) == (OK, "")
    assert response.affected_rows == SAMPLE.num_rows + mem.num_rows
    _, got_cpu = await client.read("cpu")
    _, got_mem = await client.read("mem")
    assert_tables_equal(sorted_rows(got_cpu), sorted_rows(SAMPLE))
    assert_tables_equal(sorted_rows(got_mem), mem)


async def test_write_batch_naming_a_missing_table_writes_nothing(
    cpu: tuple[Worker, Client],
) -> None:
    _, client = cpu
    before = cpu_rows([1000], ["a"], [1.0])
    await client.write_ok("cpu", before)
    response = await client.write_batch(
        ("cpu", cpu_rows([2000, 3000], ["b", "c"], [2.0, 3.0])),
        ("missing", mem_rows([1000], [1])),
    )
    assert response.header.code == NOT_FOUND
    assert response.affected_rows == 0
    assert "request 1" in response.header.error
    assert "flightfeed.public.missing" in response.header.error
    assert "WriteBatch" in response.header.error
    _, got = await client.read("cpu")
    assert_tables_equal(got, before)


async def test_write_batch_with_a_null_in_a_non_null_column_writes_nothing(
    cpu: tuple[Worker, Client],
) -> None:
    _, client = cpu
    response = await client.write_batch(
        ("cpu", cpu_rows([1000], ["a"], [1.0])),
        ("cpu", cpu_rows([2000, 3000], ["b", None], [2.0, 3.0])),
    )
    assert response.header.code == BAD_REQUEST
    assert response.affected_rows == 0
    assert "request 1" in response.header.error
    assert "'host'" in response.header.error
    assert "not nullable" in response.header.error
    assert await client.read_responses("cpu") == []  # nothing written, no batch to send


async def test_write_to_a_missing_table_is_not_found(cpu: tuple[Worker, Client]) -> None:
    _, client = cpu
    response = await client.write("nope", SAMPLE)
    assert response.header.code == NOT_FOUND
    assert "flightfeed.public.nope" in response.header.error


def contiguous_request(
    client: Client, worker: Worker, table: str, rows: pa.Table, schema: TableSchema | None = None
) -> Any:
    """A WriteRequest as a HoraeDB node sends every remote write: contiguous rows encoded for
    `schema`, by default the table's, as GetTableInfo gave it (tests/helpers/contiguous_rows.py)."""
    assert worker.state.tables is not None
    if schema is None:
        schema = worker.state.tables.entry(TableName.of(table)).schema
    rows_pb = contiguous_rows(schema, rows)
    contiguous = client.pb.ContiguousRows(
        schema_version=rows_pb.schema_version,
        encoded_rows=rows_pb.encoded_rows,
        column_descs=[client.pb.ColumnDesc(id=d.id, typ=d.typ) for d in rows_pb.column_descs],
    )
    group = client.pb.RowGroup(contiguous=contiguous)  # (HoraeDB leaves the timestamps 0)
    return client.pb.WriteRequest(table=client.table(table), row_group=group)


async def test_contiguous_rows_as_a_horaedb_node_writes_them(cpu: tuple[Worker, Client]) -> None:
    """Rows with and without nulls (HoraeDB's two layouts), read back as they were."""
    worker, client = cpu
    response = await client.stub.Write(contiguous_request(client, worker, "cpu", SAMPLE))
    assert (response.header.code, response.header.error) == (OK, "")
    assert response.affected_rows == SAMPLE.num_rows
    _, got = await client.read("cpu", order="Asc")
    assert_tables_equal(got, SAMPLE)


async def test_a_large_contiguous_write_keeps_the_loop_free(cpu: tuple[Worker, Client]) -> None:
    """A million rows (a 22 MB request) take about a second to parse and as much to decode:
    both run off the event loop, which the loop guard around every test checks (it fails a
    test whose loop is held for half a second)."""
    worker, client = cpu
    await create(worker, "log", MEM, update_mode="APPEND")
    request = contiguous_request(client, worker, "log", mem_rows([1000], [7]))
    (row,) = request.row_group.contiguous.encoded_rows
    request.row_group.contiguous.encoded_rows.extend([row] * 999_999)
    response = await client.stub.Write(request)
    assert (response.header.code, response.header.error) == (OK, "")
    assert response.affected_rows == 1_000_000
    assert worker.state.tables is not None
    assert await worker.state.tables.row_count(TableName.of("log")) == 1_000_000


async def test_a_write_batch_of_contiguous_and_arrow_rows(cpu: tuple[Worker, Client]) -> None:
    worker, client = cpu
    await create(worker, "mem", MEM)
    mem = mem_rows([1000, 2000], [10, None])
    batch = [
        contiguous_request(client, worker, "cpu", SAMPLE),
        client.write_request("mem", mem),
    ]
    response = await client.stub.WriteBatch(client.pb.WriteBatchRequest(batch=batch))
    assert (response.header.code, response.header.error) == (OK, "")
    assert response.affected_rows == SAMPLE.num_rows + mem.num_rows
    _, got_cpu = await client.read("cpu", order="Asc")
    _, got_mem = await client.read("mem")
    assert_tables_equal(got_cpu, SAMPLE)
    assert_tables_equal(sorted_rows(got_mem), mem)


async def test_contiguous_rows_for_another_schema_write_nothing(
    cpu: tuple[Worker, Client],
) -> None:
    """Rows encoded before a column was added (or by a node with another table of that name)
    would be misread: refused, naming the column, and nothing of the batch is written."""
    worker, client = cpu
    stale = contiguous_request(client, worker, "cpu", SAMPLE)
    del stale.row_group.contiguous.column_descs[-1]
    batch = [client.write_request("cpu", SAMPLE), stale]
    response = await client.stub.WriteBatch(client.pb.WriteBatchRequest(batch=batch))
    assert (response.header.code, response.affected_rows) == (BAD_REQUEST, 0)
    assert response.header.error.endswith(
        "request 1 (table flightfeed.public.cpu) failed: contiguous rows: the request describes"
        " 3 columns, the table has 4 (schema version 1): read the table info again"
    ), response.header.error
    broken = contiguous_request(client, worker, "cpu", SAMPLE)
    broken.row_group.contiguous.encoded_rows[2] = b"\x00\x00"
    response = await client.stub.Write(broken)
    assert response.header.code == BAD_REQUEST
    assert "contiguous rows: row 2: shorter than its 4-byte header" in response.header.error
    assert await client.read_responses("cpu") == []


# --- Read ------------------------------------------------------------------------------


async def test_a_read_with_projection_predicates_time_range_and_order(
    cpu: tuple[Worker, Client],
) -> None:
    _, client = cpu
    await client.write_ok("cpu", SAMPLE)
    info = await client.table_info("cpu")
    predicates = [
        call("greater", col("v"), lit(1.5)),  # pushed into the scan
        call("less", call("multiply", col("n"), lit(2)), lit(100)),  # evaluated by Arrow
    ]
    options: dict[str, Any] = {
        "projection": [2, 0],  # v, ts: the order asked for
        "table_schema": info.table_info.table_schema,
        "predicates": predicates,
        "time_range": (1999, 5000),
        "timeout_ms": 30_000,
    }
    schema = pa.schema([CPU.field("v"), CPU.field("ts")])
    # v > 1.5 in [1999, 5000): 1999 (2.0) and 3000 (3.5); 5000 (4.0) is past the end
    expected = pa.table(
        {"v": [2.0, 3.5], "ts": pa.array([1999, 3000], pa.timestamp("ms"))}, schema=schema
    )
    _, asc = await client.read("cpu", order="Asc", **options)
    assert_tables_equal(asc, expected)
    _, desc = await client.read("cpu", order="Desc", **options)
    assert_tables_equal(desc, expected.take([1, 0]))


async def test_a_time_range_is_start_inclusive_and_end_exclusive(
    cpu: tuple[Worker, Client],
) -> None:
    _, client = cpu
    await client.write_ok("cpu", SAMPLE)
    _, got = await client.read("cpu", time_range=(2000, 4000), order="Asc")
    assert_tables_equal(got, SAMPLE.slice(2, 3))  # 2000, 3000, 3999: not 1999, not 4000
    _, got = await client.read("cpu", time_range=(1999, 4001), order="Asc")
    assert_tables_equal(got, SAMPLE.slice(1, 5))  # 1999 … 4000
    assert await client.read_responses("cpu", time_range=(4001, 5000)) == []
    _, got = await client.read("cpu", time_range=(5000, 5001))
    assert_tables_equal(got, SAMPLE.slice(6, 1))


async def test_read_orders(cpu: tuple[Worker, Client]) -> None:
    _, client = cpu
    shuffled = SAMPLE.take([4, 0, 6, 2, 5, 1, 3])
    await client.write_ok("cpu", shuffled)
    _, asc = await client.read("cpu", order="Asc")
    assert_tables_equal(asc, SAMPLE)
    _, desc = await client.read("cpu", order="Desc")
    assert_tables_equal(desc, SAMPLE.take(list(range(SAMPLE.num_rows))[::-1]))
    _, unordered = await client.read("cpu", order="None")
    assert_tables_equal(sorted_rows(unordered), sorted_rows(SAMPLE))


async def test_a_small_batch_size_streams_several_responses(cpu: tuple[Worker, Client]) -> None:
    _, client = cpu
    await client.write_ok("cpu", SAMPLE)
    responses, got = await client.read("cpu", batch_size=3, order="Asc")
    sizes = [sum(b.num_rows for b in client.decode(r.arrow)) for r in responses]
    assert len(responses) >= 3
    assert all(0 < size <= 3 for size in sizes), sizes
    assert sum(sizes) == SAMPLE.num_rows
    assert_tables_equal(got, SAMPLE)


async def test_read_parallelism_returns_the_same_rows(cpu: tuple[Worker, Client]) -> None:
    _, client = cpu
    count = 200
    rows = cpu_rows(
        ts=[1000 + i for i in range(count)],
        host=[f"h{i % 7}" for i in range(count)],
        v=[i / 4 for i in range(count)],
        n=list(range(count)),
    )
    for start in range(0, count, 50):  # several writes: row ids spread over the table
        await client.write_ok("cpu", rows.slice(start, 50))
    _, serial = await client.read("cpu")
    responses, parallel = await client.read("cpu", read_parallelism=4, batch_size=16)
    assert len(responses) >= count // 16
    assert_tables_equal(sorted_rows(parallel), sorted_rows(rows))
    assert_tables_equal(sorted_rows(parallel), sorted_rows(serial))
    predicate = [call("greater", col("v"), lit(10.0))]
    _, filtered = await client.read("cpu", read_parallelism=4, predicates=predicate)
    expected = rows.filter(pc.greater(rows.column("v"), 10.0))
    assert_tables_equal(sorted_rows(filtered), sorted_rows(expected))


async def test_zstd_read_responses_decode(seed: SeedProtos) -> None:
    config = WorkerConfig(data_dir=":memory:", table_compression="always")
    async with serving(seed, config) as (worker, client):
        await create(worker, "cpu", CPU, tags=["host"])
        count = 3000
        rows = cpu_rows(
            ts=list(range(count)),
            host=[f"host-{i % 5}" for i in range(count)],
            v=[i * 0.5 for i in range(count)],
            n=list(range(count)),
        )
        await client.write_ok("cpu", rows)
        responses, got = await client.read("cpu", order="Asc", batch_size=1000)
    zstd = seed.storage_pb2.ArrowPayload.ZSTD
    assert len(responses) >= 3
    assert all(r.arrow.compression == zstd for r in responses)
    for response in responses:
        (element,) = response.arrow.record_batches
        data = unzstd(element)
        assert len(data) == frame_size(element)  # the frame declares its size
        assert pa.Codec("zstd").decompress(element, len(data), asbytes=True) == data
    assert_tables_equal(got, rows)


@pytest.mark.parametrize(
    ("predicate", "hosts"),
    [
        (call("greater", col("v"), lit(1.5)), ["b"]),
        (call("greater_equal", col("v"), lit(1.5)), ["b"]),
        (call("not_equal", col("v"), lit(float("nan"))), ["a", "b"]),
        (call("equal", col("v"), lit(float("nan"))), []),
    ],
    ids=["greater", "greater_equal", "not_equal_nan", "equal_nan"],
)
async def test_a_predicate_treats_nan_as_arrow_does(
    cpu: tuple[Worker, Client], predicate: Expr, hosts: list[str]
) -> None:
    """pyarrow.compute: NaN compares false with everything, itself included (not_equal true)."""
    _, client = cpu
    rows = cpu_rows([1000, 2000, 3000], ["a", "b", "c"], [float("nan"), 2.0, None])
    await client.write_ok("cpu", rows)
    column = pa.chunked_array(rows.column("v"))
    assert pc.filter(rows.column("host"), predicate_mask(predicate, column)).to_pylist() == hosts
    responses = await client.read_responses("cpu", predicates=[predicate], order="Asc")
    got = [
        host for r in responses for b in client.decode(r.arrow) for host in b["host"].to_pylist()
    ]
    assert got == hosts


def predicate_mask(predicate: Expr, v: pa.ChunkedArray) -> pa.ChunkedArray:
    """What pyarrow.compute makes of one of the comparisons above on column v."""
    assert isinstance(predicate, Call)
    literal = predicate.args[1]
    assert isinstance(literal, Literal)
    mask: pa.ChunkedArray = pc.call_function(predicate.function, [v, literal.value])
    return pc.fill_null(mask, False)


def datafusion_filter(rows: pa.Table, where: str) -> tuple[list[bytes], pa.Table]:
    """The predicates a HoraeDB node sends for `where` on table cpu (DataFusion's plan of it,
    each filter as DataFusion encodes it) and the rows DataFusion itself returns, by ts."""
    ctx = SessionContext()
    ctx.register_record_batches("cpu", [rows.to_batches()])
    frame = ctx.sql(f"SELECT * FROM cpu WHERE {where} ORDER BY ts")
    plan = frame.optimized_logical_plan()
    predicates = []
    while plan.inputs():
        variant = plan.to_variant()
        if type(variant).__name__ == "Filter":
            predicates.append(variant.predicate().to_bytes())
        (plan,) = plan.inputs()
    return predicates, frame.to_arrow_table()


async def test_a_read_filtered_as_a_horaedb_node_filters_it(cpu: tuple[Worker, Client]) -> None:
    """HoraeDB sends its pushed-down filters as DataFusion expressions and does not filter the
    rows again: the worker returns exactly what DataFusion would."""
    _, client = cpu
    await client.write_ok("cpu", SAMPLE)
    where = (
        "host = 'a' AND (v > 1.0 OR n IN (3, 5, 8, 9, NULL))"
        " AND ts >= TIMESTAMP '1970-01-01 00:00:01.500'"
    )
    predicates, expected = datafusion_filter(SAMPLE, where)
    assert predicates
    assert expected.num_rows == 3  # 2000 (n 3), 3999 (1.5), 5000 (4.0)
    _, got = await client.read("cpu", predicates=predicates, order="Asc")
    assert_tables_equal(got, expected.cast(CPU))


async def test_a_horaedb_filter_orders_nan_as_datafusion_does(cpu: tuple[Worker, Client]) -> None:
    """In HoraeDB `v > 0.5` keeps a NaN row (arrow-rs orders NaN above every number), and a
    flightfeed expression's Arrow comparison does not (test_a_predicate_treats_nan_as_arrow_does):
    each predicate keeps the meaning of the engine it comes from."""
    _, client = cpu
    rows = cpu_rows([1000, 2000, 3000, 4000], ["a", "b", "c", "d"], [float("nan"), 2.0, None, 0.1])
    await client.write_ok("cpu", rows)
    for where, hosts in [("v > 0.5", ["a", "b"]), ("v = 'NaN'::double", ["a"]), ("v < 1", ["d"])]:
        predicates, expected = datafusion_filter(rows, where)
        assert expected.column("host").to_pylist() == hosts
        _, got = await client.read("cpu", predicates=predicates, order="Asc")
        assert got.column("host").to_pylist() == hosts, where


def datafusion_refusal(rows: pa.Table, where: str) -> tuple[list[bytes], str]:
    """The predicates a HoraeDB node sends for `where` (DataFusion's plan of it, as in
    datafusion_filter) and the first line of the error DataFusion fails with running it."""
    ctx = SessionContext()
    ctx.register_record_batches("cpu", [rows.to_batches()])
    frame = ctx.sql(f"SELECT * FROM cpu WHERE {where}")
    plan = frame.optimized_logical_plan()
    while type(plan.to_variant()).__name__ != "Filter":
        (plan,) = plan.inputs()
    with pytest.raises(Exception, match="DataFusion error") as refused:
        frame.to_arrow_table()
    return [plan.to_variant().predicate().to_bytes()], str(refused.value).splitlines()[0]


async def test_a_horaedb_cast_of_a_float_to_an_integer_truncates_as_datafusion_does(
    cpu: tuple[Worker, Client],
) -> None:
    """Toward zero, 0.5 to 0 and -2.5 to -2, as arrow-rs does."""
    _, client = cpu
    v = [0.5, -0.5, -2.5, 2.9, 9.2e18, None]
    rows = cpu_rows([1000, 2000, 3000, 4000, 5000, 6000], ["a", "b", "c", "d", "e", "f"], v)
    await client.write_ok("cpu", rows)
    cases = [
        ("CAST(v AS BIGINT) = 0", ["a", "b"]),
        ("CAST(v AS BIGINT) < -1", ["c"]),
        ("CAST(v AS BIGINT) >= 2", ["d", "e"]),
    ]
    for where, hosts in cases:
        predicates, expected = datafusion_filter(rows, where)
        assert expected.column("host").to_pylist() == hosts
        _, got = await client.read("cpu", predicates=predicates, order="Asc")
        assert got.column("host").to_pylist() == hosts, where


@pytest.mark.parametrize(
    ("where", "value"),
    [
        ("CAST(v AS BIGINT) < -1000", float("nan")),
        ("CAST(v AS BIGINT) < -1000", float("inf")),
        ("CAST(v AS BIGINT) < -1000", float("-inf")),
        ("CAST(v AS BIGINT) < -1000", 1e30),
        ("CAST(v AS BIGINT) < -1000", 2.0**63),
        ("CAST(v AS INT) = 0", 3e9),
        ("CAST(v AS INT UNSIGNED) = 0", -1.0),
    ],
)
async def test_a_horaedb_cast_of_a_float_an_integer_cannot_hold_fails_the_read(
    cpu: tuple[Worker, Client], where: str, value: float
) -> None:
    """DataFusion fails the query ("Can't cast value NaN to type Int64"); Arrow's truncating
    cast made such a value INT64_MIN, so `CAST(v AS BIGINT) < -1000` kept NaN and 1e30 and
    HoraeDB returned them as filtered."""
    _, client = cpu
    rows = cpu_rows([1000, 2000], ["a", "b"], [0.5, value])
    await client.write_ok("cpu", rows)
    predicates, refused = datafusion_refusal(rows, where)
    assert "Can't cast value" in refused
    (response,) = await client.read_responses("cpu", predicates=predicates)
    assert response.header.code == BAD_REQUEST, response.header.error
    assert "can't cast value" in response.header.error
    assert response.WhichOneof("output") is None


@pytest.mark.parametrize("value", [-1.0, float("-inf"), -1e-300])
async def test_a_horaedb_sqrt_of_a_negative_number_fails_the_read(
    cpu: tuple[Worker, Client], value: float
) -> None:
    """As in DataFusion 55. Arrow's sqrt made it a NaN with its sign bit clear, which sorts
    above every number, so `sqrt(v) > 0.5` kept v = -1 (DataFusion 33's x86 NaN sorts below)."""
    _, client = cpu
    rows = cpu_rows([1000, 2000], ["a", "b"], [4.0, value])
    await client.write_ok("cpu", rows)
    predicates, refused = datafusion_refusal(rows, "sqrt(v) > 0.5")
    assert "cannot take square root of a negative number" in refused
    (response,) = await client.read_responses("cpu", predicates=predicates)
    assert response.header.code == BAD_REQUEST, response.header.error
    assert "square root of negative number" in response.header.error


async def test_a_horaedb_sqrt_keeps_the_sign_of_a_nan_and_a_zero(
    cpu: tuple[Worker, Client],
) -> None:
    _, client = cpu
    negative_nan = -float("nan")  # (its sign bit set: below every number in DataFusion)
    v = [4.0, 0.0, -0.0, float("nan"), negative_nan, None]
    rows = cpu_rows([1000, 2000, 3000, 4000, 5000, 6000], ["a", "b", "c", "d", "e", "f"], v)
    await client.write_ok("cpu", rows)
    for where, hosts in [("sqrt(v) > 0.5", ["a", "d"]), ("sqrt(v) < 0.5", ["b", "c", "e"])]:
        predicates, expected = datafusion_filter(rows, where)
        assert expected.column("host").to_pylist() == hosts, where
        _, got = await client.read("cpu", predicates=predicates, order="Asc")
        assert got.column("host").to_pylist() == hosts, where


async def test_a_long_horaedb_in_list_keeps_the_loop_free(cpu: tuple[Worker, Client]) -> None:
    """A filter `n IN (...)` of 100,000 values (780 KB) took 2.4 s to decode on the event loop;
    it decodes off it now, under the loop guard around every test."""
    _, client = cpu
    await client.write_ok("cpu", SAMPLE)
    values = ", ".join(str(v) for v in range(3, 200_003, 2))  # 3, 5, 7: rows 2000, 3999, 5000
    # (DataFusion's own planning of it takes a second: not on this loop either)
    plan = partial(datafusion_filter, SAMPLE, f"n IN ({values})")
    predicates, expected = await anyio.to_thread.run_sync(plan)
    assert len(predicates[0]) > 700_000
    _, got = await client.read("cpu", predicates=predicates, order="Asc")
    assert_tables_equal(got, expected.cast(CPU))
    assert got.column("n").to_pylist() == [3, 5, 7]


async def test_a_horaedb_filter_the_worker_cannot_evaluate_is_a_bad_request(
    cpu: tuple[Worker, Client],
) -> None:
    """Never skipped: HoraeDB would return every row as if it had been filtered."""
    _, client = cpu
    await client.write_ok("cpu", SAMPLE)
    predicates, _ = datafusion_filter(SAMPLE, "strpos(host, 'b') = 1")
    (response,) = await client.read_responses("cpu", predicates=predicates)
    assert response.header.code == BAD_REQUEST
    assert response.header.error == (
        "Read failed: predicate 0:"
        " DataFusion function 'strpos' is not supported in a predicate here"
    )


async def test_a_read_of_a_missing_table_is_one_not_found_response(
    cpu: tuple[Worker, Client],
) -> None:
    _, client = cpu
    (response,) = await client.read_responses("missing", order="Asc")
    assert response.header.code == NOT_FOUND
    assert "flightfeed.public.missing" in response.header.error
    assert response.WhichOneof("output") is None


async def test_a_read_of_an_unknown_column_is_a_bad_request(cpu: tuple[Worker, Client]) -> None:
    _, client = cpu
    await client.write_ok("cpu", SAMPLE)
    (response,) = await client.read_responses(
        "cpu", predicates=[call("greater", col("nope"), lit(1))]
    )
    assert response.header.code == BAD_REQUEST
    assert "nope" in response.header.error
    (response,) = await client.read_responses("cpu", projection=[9])
    assert response.header.code == BAD_REQUEST
    assert "projection index 9" in response.header.error


async def test_a_predicate_setting_two_members_of_a_oneof_is_a_bad_request(
    cpu: tuple[Worker, Client],
) -> None:
    """An expression that is both a column and a literal (what another engine's expression
    encoding can look like to ours) was answered with header 500 and a traceback in the log:
    betterproto2 kept both members and raised when the predicate was read."""
    _, client = cpu
    request = client.read_request("cpu")
    request.read_request.predicate.exprs.append(encode_expr(col("host")) + encode_expr(lit(1)))
    (response,) = [r async for r in client.stub.Read(request)]
    assert response.header.code == BAD_REQUEST
    error = response.header.error
    assert error.startswith("Read failed: predicate 0: neither a flightfeed.v1.Expr")
    assert "Expr sets both column and literal of a oneof" in error


# --- GetTableInfo ------------------------------------------------------------------------


async def test_get_table_info(cpu: tuple[Worker, Client]) -> None:
    _, client = cpu
    schema_pb2 = client.seed.schema_pb2
    response = await client.table_info("cpu")
    assert (response.header.code, response.header.error) == (OK, "")
    info = response.table_info
    assert (info.catalog_name, info.schema_name, info.table_name) == ("flightfeed", "public", "cpu")
    assert info.table_id > 0
    assert info.engine == "DuckDB"
    assert dict(info.options) == {"update_mode": "OVERWRITE", "enable_ttl": "false"}
    assert not info.HasField("partition_info")
    column = schema_pb2.ColumnSchema
    expected = schema_pb2.TableSchema(
        columns=[
            column(name="ts", data_type=schema_pb2.TIMESTAMP, is_nullable=False, id=1),
            column(name="host", data_type=schema_pb2.STRING, is_nullable=False, id=2, is_tag=True),
            column(name="v", data_type=schema_pb2.DOUBLE, is_nullable=True, id=3),
            column(name="n", data_type=schema_pb2.INT64, is_nullable=True, id=4),
        ],
        version=1,
        timestamp_id=1,
        primary_key_ids=[2, 1],
    )
    assert info.table_schema == expected, info.table_schema
    named = client.pb.TableIdentifier(catalog="flightfeed", schema="public", table="cpu")
    again = await client.stub.GetTableInfo(client.pb.GetTableInfoRequest(table=named))
    assert again == response


async def test_get_table_info_of_a_missing_table(cpu: tuple[Worker, Client]) -> None:
    _, client = cpu
    response = await client.table_info("missing")
    assert response.header.code == NOT_FOUND
    assert "flightfeed.public.missing" in response.header.error
    assert not response.HasField("table_info")


# --- AlterTableSchema and AlterTableOptions -----------------------------------------------


async def test_alter_table_schema_adds_a_column(cpu: tuple[Worker, Client]) -> None:
    _, client = cpu
    pb, schema_pb2 = client.pb, client.seed.schema_pb2
    old = cpu_rows([1000, 2000], ["a", "b"], [1.0, 2.0])
    await client.write_ok("cpu", old)
    current = (await client.table_info("cpu")).table_info.table_schema
    wanted = schema_pb2.TableSchema()
    wanted.CopyFrom(current)
    wanted.columns.add(name="load", data_type=schema_pb2.INT32, is_nullable=True, id=5)
    response = await client.stub.AlterTableSchema(
        pb.AlterTableSchemaRequest(
            table=client.table("cpu"), table_schema=wanted, pre_schema_version=current.version
        )
    )
    assert (response.header.code, response.header.error) == (OK, "")

    altered = (await client.table_info("cpu")).table_info.table_schema
    assert altered.version == current.version + 1
    assert [(c.name, c.id, c.data_type, c.is_nullable) for c in altered.columns][-1] == (
        "load",
        5,
        schema_pb2.INT32,
        True,
    )
    assert list(altered.columns)[:4] == list(current.columns)

    new = cpu_rows([3000], ["c"], [3.0]).append_column("load", pa.array([7], pa.int32()))
    await client.write_ok("cpu", new)
    _, got = await client.read("cpu", order="Asc")
    load = pa.field("load", pa.int32())
    expected = pa.concat_tables(
        [old.append_column(load, pa.nulls(2, pa.int32())), new.cast(CPU.append(load))]
    )
    assert_tables_equal(got, expected)
    _, projected = await client.read("cpu", projection=[4, 1], table_schema=altered, order="Asc")
    assert projected.to_pydict() == {"load": [None, None, 7], "host": ["a", "b", "c"]}

    stale = await client.stub.AlterTableSchema(
        pb.AlterTableSchemaRequest(
            table=client.table("cpu"), table_schema=wanted, pre_schema_version=current.version
        )
    )
    assert stale.header.code == BAD_REQUEST
    assert f"schema version {altered.version}" in stale.header.error
    assert f"against version {current.version}" in stale.header.error
    after = (await client.table_info("cpu")).table_info.table_schema
    assert after == altered


async def test_alter_table_options_ttl_hides_old_rows(cpu: tuple[Worker, Client]) -> None:
    _, client = cpu
    pb = client.pb
    now = time.time_ns() // 1_000_000
    old = cpu_rows([now - 3 * DAY_MS, now - 2 * DAY_MS], ["a", "b"], [1.0, 2.0])
    fresh = cpu_rows([now - 60_000, now], ["a", "b"], [3.0, 4.0])
    await client.write_ok("cpu", pa.concat_tables([old, fresh]))
    _, got = await client.read("cpu", order="Asc")
    assert got.num_rows == 4

    response = await client.stub.AlterTableOptions(
        pb.AlterTableOptionsRequest(table=client.table("cpu"), options={"ttl": "1d"})
    )
    assert (response.header.code, response.header.error) == (OK, "")
    info = (await client.table_info("cpu")).table_info
    assert dict(info.options) == {"update_mode": "OVERWRITE", "enable_ttl": "true", "ttl": "1d"}
    _, got = await client.read("cpu", order="Asc")
    assert_tables_equal(got, fresh)
    _, got = await client.read("cpu", time_range=(now - 4 * DAY_MS, now + 1), order="Asc")
    assert_tables_equal(got, fresh)


async def test_alter_table_options_refuses_an_unknown_option(cpu: tuple[Worker, Client]) -> None:
    _, client = cpu
    response = await client.stub.AlterTableOptions(
        client.pb.AlterTableOptionsRequest(
            table=client.table("cpu"), options={"ttl": "1d", "compaction": "fast"}
        )
    )
    assert response.header.code == BAD_REQUEST
    assert "compaction" in response.header.error
    info = (await client.table_info("cpu")).table_info
    assert dict(info.options) == {"update_mode": "OVERWRITE", "enable_ttl": "false"}
    missing = await client.stub.AlterTableOptions(
        client.pb.AlterTableOptionsRequest(table=client.table("missing"), options={"ttl": "1d"})
    )
    assert missing.header.code == NOT_FOUND


async def test_alter_table_schema_stores_the_ids_and_tags_it_is_sent(
    cpu: tuple[Worker, Client],
) -> None:
    """A HoraeDB node sends the altered schema whole (ids assigned, tags flagged) and encodes
    its next writes by it. A new column sent as id 7, a tag, was answered OK and stored as id
    5, not a tag: the node's next write was refused."""
    worker, client = cpu
    pb, schema_pb2 = client.pb, client.seed.schema_pb2
    current = (await client.table_info("cpu")).table_info.table_schema
    wanted = schema_pb2.TableSchema()
    wanted.CopyFrom(current)
    wanted.version = current.version + 1
    wanted.columns.add(name="dc", data_type=schema_pb2.STRING, is_nullable=True, id=7, is_tag=True)
    response = await client.stub.AlterTableSchema(
        pb.AlterTableSchemaRequest(
            table=client.table("cpu"), table_schema=wanted, pre_schema_version=current.version
        )
    )
    assert (response.header.code, response.header.error) == (OK, "")
    altered = (await client.table_info("cpu")).table_info.table_schema
    assert altered == wanted, altered

    rows = cpu_rows([1000], ["a"], [1.0], [1]).append_column("dc", pa.array(["east"]))
    sent = TableSchema.from_proto(SchemaProto.parse(wanted.SerializeToString()))
    response = await client.stub.Write(contiguous_request(client, worker, "cpu", rows, sent))
    assert (response.header.code, response.header.error) == (OK, "")
    _, got = await client.read("cpu")
    assert got.column("dc").to_pylist() == ["east"]


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ("id of an existing column", "distinct: 'v' and 'dc' are both id 3"),
        ("existing column's id", "column 'n' would change"),
        ("floating point tag", "tag 'dc' cannot be floating point"),
    ],
)
async def test_alter_table_schema_refuses_what_it_cannot_store(
    cpu: tuple[Worker, Client], change: str, error: str
) -> None:
    """Refused, naming the column, and nothing changes: never answered OK while storing
    another schema."""
    _, client = cpu
    pb, schema_pb2 = client.pb, client.seed.schema_pb2
    current = (await client.table_info("cpu")).table_info.table_schema
    wanted = schema_pb2.TableSchema()
    wanted.CopyFrom(current)
    dc = wanted.columns.add(name="dc", data_type=schema_pb2.STRING, is_nullable=True, id=5)
    if change == "id of an existing column":
        dc.id = 3
    elif change == "existing column's id":
        wanted.columns[3].id = 9
    else:
        dc.data_type, dc.is_tag = schema_pb2.DOUBLE, True
    response = await client.stub.AlterTableSchema(
        pb.AlterTableSchemaRequest(
            table=client.table("cpu"), table_schema=wanted, pre_schema_version=current.version
        )
    )
    assert response.header.code == BAD_REQUEST
    assert error in response.header.error, response.header.error
    assert (await client.table_info("cpu")).table_info.table_schema == current


async def test_alter_table_options_keeps_the_ttl_while_it_is_disabled(
    cpu: tuple[Worker, Client],
) -> None:
    """HoraeDB's ttl and enable_ttl are independent: enable_ttl=false threw the ttl away here
    (enable_ttl=true alone was then refused), and a ttl sent with enable_ttl=false was
    answered OK and dropped."""
    _, client = cpu
    now = time.time_ns() // 1_000_000
    old, fresh = cpu_rows([now - 3 * DAY_MS], ["a"], [1.0]), cpu_rows([now], ["b"], [2.0])
    await client.write_ok("cpu", pa.concat_tables([old, fresh]))

    async def alter(options: dict[str, str]) -> dict[str, str]:
        response = await client.stub.AlterTableOptions(
            client.pb.AlterTableOptionsRequest(table=client.table("cpu"), options=options)
        )
        assert (response.header.code, response.header.error) == (OK, "")
        return dict((await client.table_info("cpu")).table_info.options)

    mode = {"update_mode": "OVERWRITE"}
    assert await alter({"enable_ttl": "false", "ttl": "4d"}) == {
        **mode,
        "enable_ttl": "false",
        "ttl": "4d",
    }
    assert await alter({"ttl": "2d"}) == {**mode, "enable_ttl": "false", "ttl": "2d"}
    _, got = await client.read("cpu", order="Asc")
    assert got.num_rows == 2  # disabled: every row read
    assert await alter({"enable_ttl": "true"}) == {**mode, "enable_ttl": "true", "ttl": "2d"}
    _, got = await client.read("cpu", order="Asc")
    assert_tables_equal(got, fresh)
    assert await alter({"enable_ttl": "false"}) == {**mode, "enable_ttl": "false", "ttl": "2d"}
    assert await alter({"enable_ttl": "true"}) == {**mode, "enable_ttl": "true", "ttl": "2d"}


# --- Protocol errors ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "method",
    ["Read", "Write", "WriteBatch", "GetTableInfo", "AlterTableSchema", "AlterTableOptions"],
)
async def test_a_malformed_request_is_invalid_argument_and_the_worker_serves_on(
    cpu: tuple[Worker, Client], method: str
) -> None:
    _, client = cpu
    path = SERVICE + method

    async def send_malformed() -> None:
        if method == "Read":
            _ = [r async for r in client.channel.unary_stream(path)(b"\xff\xff")]
        else:
            await client.channel.unary_unary(path)(b"\xff\xff")

    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await send_malformed()
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "malformed request message" in (caught.value.details() or "")
    response = await client.table_info("cpu")
    assert response.header.code == OK
    await client.write_ok("cpu", SAMPLE)


async def test_a_worker_without_a_data_dir_is_unimplemented(seed: SeedProtos) -> None:
    async with serving(seed, WorkerConfig()) as (_, client):
        pb = client.pb
        rows = cpu_rows([1000], ["a"], [1.0])
        calls: dict[str, Callable[[], Awaitable[Any]]] = {
            "Read": lambda: client.read_responses("cpu"),
            "Write": lambda: client.write("cpu", rows),
            "WriteBatch": lambda: client.write_batch(("cpu", rows)),
            "GetTableInfo": lambda: client.table_info("cpu"),
            "AlterTableSchema": lambda: client.stub.AlterTableSchema(
                pb.AlterTableSchemaRequest(table=client.table("cpu"), pre_schema_version=1)
            ),
            "AlterTableOptions": lambda: client.stub.AlterTableOptions(
                pb.AlterTableOptionsRequest(table=client.table("cpu"), options={"ttl": "1d"})
            ),
        }
        for method, send in calls.items():
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await send()
            assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED, method
            assert "--data-dir" in (caught.value.details() or ""), method


# --- ExecutePhysicalPlan -------------------------------------------------------------------

RELEASE_SLOW: Final = threading.Event()
"""Set to let `slow_filter` calls return (they wait at most 20 s)."""


def _slow_filter(values: pa.Array) -> pa.Array:
    RELEASE_SLOW.wait(20)
    return pc.is_valid(values)


async def slow_session(ctx: WorkerQueryContext) -> Session:
    """The default session plus `slow_filter`, a UDF that holds its thread until released."""
    udf = ScalarUdf("slow_filter", _slow_filter, pa.bool_())
    return ctx.builder.with_scalar_udf(udf).build()


def plan_request(
    client: Client, plan: ExecutionPlan, *, session: Session | None = None, **context: Any
) -> Any:
    """An ExecutePlanRequest with the plan's bytes in flightfeed's field 100 of the oneof."""
    options = {"request_id": "wire-plan", "timeout_ms": -1, **context}
    data = (session or Session()).encode_plan(plan)
    request = client.pb.ExecutePlanRequest(context=client.pb.ExecContext(**options))
    return with_flightfeed_plan(client, request, data)


def with_flightfeed_plan(client: Client, request: Any, data: bytes) -> Any:
    """`request` with `data` in field 100 (`bytes flightfeed`): flightfeed's addition to the
    oneof, which the seed's protos do not have. Protobuf keeps unknown fields, so the seed's
    message carries it: appended to its bytes, as a field 100 of wire type 2."""
    key = _varint((100 << 3) | 2)
    return client.pb.ExecutePlanRequest.FromString(
        request.SerializeToString() + key + _varint(len(data)) + data
    )


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def cpu_scan(*columns: str, catalog: str = "", schema: str = "") -> TableScan:
    fields = [CPU.field(c) for c in columns] if columns else list(CPU)
    spec = TableReadSpec(catalog, schema, "cpu", columns=tuple(columns))
    return TableScan(spec, pa.schema(fields))


async def execute(client: Client, request: Any) -> tuple[list[Any], Any]:
    """The responses of an ExecutePhysicalPlan call, and its trailing metadata."""
    call = client.stub.ExecutePhysicalPlan(request)
    responses = [r async for r in call]
    return responses, await call.trailing_metadata()


def rows_of(client: Client, responses: Sequence[Any]) -> pa.Table:
    batches = []
    for response in responses:
        assert (response.header.code, response.header.error) == (OK, "")
        if response.WhichOneof("output") == "arrow":
            batches.extend(client.decode(response.arrow))
    return pa.Table.from_batches(batches)


async def test_a_plan_runs_over_the_tables(cpu: tuple[Worker, Client]) -> None:
    _, client = cpu
    await client.write_ok("cpu", SAMPLE)
    plan = (
        plan_from(cpu_scan())
        .filter(call("greater", col("n"), lit(1)))
        .aggregate([(col("host"), "host")], [agg("sum", col("n"), name="total")])
        .sort("host")
        .plan
    )
    responses, _ = await execute(client, plan_request(client, plan))
    got = rows_of(client, responses)
    kept = SAMPLE.filter(pc.greater(SAMPLE["n"], 1))
    expected = kept.group_by("host").aggregate([("n", "sum")]).sort_by("host")
    assert got.column("host").to_pylist() == expected.column("host").to_pylist()
    assert got.column("total").to_pylist() == expected.column("n_sum").to_pylist()


async def test_explain_analyze_sends_metrics_as_text_and_typed(cpu: tuple[Worker, Client]) -> None:
    _, client = cpu
    await client.write_ok("cpu", SAMPLE)
    plan = plan_from(cpu_scan("host", "n")).filter(call("less", col("n"), lit(4))).plan
    request = plan_request(client, plan, explain=client.pb.Explain.Value("Analyze"))
    responses, trailers = await execute(client, request)
    assert rows_of(client, responses).num_rows == 3
    *data, last = responses
    assert all(r.WhichOneof("output") == "arrow" for r in data)
    assert last.WhichOneof("output") == "metric"
    text = last.metric.metric
    assert "Filter(less(n, 4" in text
    assert "TableScan(cpu" in text
    assert [w for w in text.split() if w.startswith("rows=")] == ["rows=3", "rows=7"]
    typed = dict(trailers)[METRICS_TRAILER]
    metrics = TaskMetrics.parse(typed)
    rows = [
        sum(m.output_rows.value for m in node.metrics if m.output_rows is not None)
        for node in metrics.pre_order_plan_metrics
    ]
    assert rows == [3, 7]  # Filter, then the TableScan under it: pre-order


async def test_without_explain_there_are_no_metrics(cpu: tuple[Worker, Client]) -> None:
    _, client = cpu
    await client.write_ok("cpu", SAMPLE)
    responses, trailers = await execute(client, plan_request(client, cpu_scan("n")))
    assert all(r.WhichOneof("output") == "arrow" for r in responses)
    assert METRICS_TRAILER not in dict(trailers or ())


async def test_default_catalog_and_schema_name_the_table(cpu: tuple[Worker, Client]) -> None:
    worker, client = cpu
    assert worker.state.tables is not None
    other = TableName.of("cpu", "lab", "metrics")
    await worker.state.tables.create(other, TableSchema.from_arrow(CPU, timestamp="ts"))
    await worker.state.tables.write([(other, SAMPLE.slice(0, 2))])
    await client.write_ok("cpu", SAMPLE)
    request = plan_request(client, cpu_scan("n"), default_catalog="lab", default_schema="metrics")
    responses, _ = await execute(client, request)
    assert sorted(rows_of(client, responses).column("n").to_pylist()) == [1, 2]


async def test_bad_plans_are_named_in_the_header(cpu: tuple[Worker, Client]) -> None:
    _, client = cpu
    pb = client.pb
    missing = TableScan(TableReadSpec("", "", "nope"), CPU)
    cases = [
        (plan_request(client, missing), NOT_FOUND, "no table 'flightfeed.public.nope'"),
        (pb.ExecutePlanRequest(context=pb.ExecContext()), BAD_REQUEST, "carries no plan"),
        (
            pb.ExecutePlanRequest(context=pb.ExecContext(), datafusion=b"\x0a\x03abc"),
            BAD_REQUEST,
            "DataFusion plans are not run here",
        ),
        (
            with_flightfeed_plan(
                client, pb.ExecutePlanRequest(context=pb.ExecContext()), b"\x0a\x03abc\x12"
            ),
            BAD_REQUEST,
            "not a valid PlanNode",
        ),
        (
            with_flightfeed_plan(
                client,
                pb.ExecutePlanRequest(
                    context=pb.ExecContext(), table=pb.TableIdentifier(table="gone")
                ),
                Session().encode_plan(cpu_scan()),
            ),
            NOT_FOUND,
            "no table 'flightfeed.public.gone'",
        ),
    ]
    for request, code, message in cases:
        (response,) = [r async for r in client.stub.ExecutePhysicalPlan(request)]
        assert response.header.code == code, response.header.error
        assert message in response.header.error


@pytest.fixture
async def slow(seed: SeedProtos, tmp_path: Path) -> AsyncIterator[tuple[Worker, Client]]:
    """A worker with one plan slot and the slow_filter UDF, table `cpu` holding SAMPLE."""
    RELEASE_SLOW.clear()
    config = WorkerConfig(data_dir=str(tmp_path), table_plan_slots=1)
    async with Worker(port=0, config=config, session_builder=slow_session) as worker:
        target = worker.location.removeprefix("grpc://")
        async with grpc.aio.insecure_channel(target) as channel:
            client = Client(
                seed, channel, seed.remote_engine_pb2_grpc.RemoteEngineServiceStub(channel)
            )
            await create(worker, "cpu", CPU, tags=["host"])
            await client.write_ok("cpu", SAMPLE)
            try:
                yield worker, client
            finally:
                RELEASE_SLOW.set()


def slow_plan() -> ExecutionPlan:
    return Filter(cpu_scan("n"), call("slow_filter", col("n")), functions=SLOW_FUNCTIONS)


SLOW_FUNCTIONS: Final = (
    SessionStateBuilder()
    .with_scalar_udf(ScalarUdf("slow_filter", _slow_filter, pa.bool_()))
    .build()
)


async def test_timeout_ms_is_enforced(slow: tuple[Worker, Client]) -> None:
    _, client = slow
    request = plan_request(client, slow_plan(), session=SLOW_FUNCTIONS, timeout_ms=300)
    started = time.monotonic()
    (response,) = [r async for r in client.stub.ExecutePhysicalPlan(request)]
    assert response.header.code == 500
    assert "wire-plan timed out after 300 ms" in response.header.error
    assert time.monotonic() - started < 15  # well before the UDF would return by itself
    RELEASE_SLOW.set()


async def test_low_priority_plans_wait_behind_high_ones(
    slow: tuple[Worker, Client], monkeypatch: pytest.MonkeyPatch
) -> None:
    worker, client = slow
    priority = client.pb.QueryPriority
    gate = worker.state.plan_gate
    admitted: list[str] = []  # the order the gate hands out its one slot
    grant = gate.slot

    @asynccontextmanager
    async def recording_slot(*, low: bool = False) -> AsyncIterator[None]:
        async with grant(low=low):
            admitted.append("low" if low else "high")
            yield

    monkeypatch.setattr(gate, "slot", recording_slot)

    async def run(plan: ExecutionPlan, level: str) -> None:
        request = plan_request(client, plan, session=SLOW_FUNCTIONS, priority=priority.Value(level))
        responses, _ = await execute(client, request)
        rows_of(client, responses)  # every response ok

    async with anyio.create_task_group() as tg:
        tg.start_soon(run, slow_plan(), "High")
        with anyio.fail_after(10):
            await gate.wait_until(lambda g: g.running == 1)
            tg.start_soon(run, cpu_scan("n"), "Low")
            await gate.wait_until(lambda g: g.waiting == (0, 1))
            tg.start_soon(run, cpu_scan("n"), "High")
            await gate.wait_until(lambda g: g.waiting == (1, 1))
        RELEASE_SLOW.set()
    # The holder, then the high plan that arrived last, then the low one. Admission order, not
    # the order the client finishes reading: a freed slot can let the low plan's short stream
    # overtake the high one's on the client side.
    assert admitted == ["high", "high", "low"]
