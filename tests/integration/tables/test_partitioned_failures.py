"""A partitioned table's writes when partitions fail, on 3 real workers: the failing
partition's own error (never an exception group) naming the partition, its table and its
worker; nothing published when a partition cannot be staged; a failed commit saying what was
published and aborting the rest; aborts that cannot reach a worker noted, not raised over the
cause."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import pyarrow as pa
import pytest
from anyio.abc import TaskStatus

from flightfeed.errors import AlreadyExists, RemoteError
from flightfeed.tables.engine import TableEngine
from flightfeed.tables.partitioned import PartitionedTable, PartitionedTables
from flightfeed.tables.schema import TableSchema
from flightfeed.tables.store import TableName
from flightfeed.worker import Worker
from flightfeed.worker.config import WorkerConfig

SCHEMA = pa.schema([("ts", pa.timestamp("ms")), ("host", pa.string()), ("cpu", pa.float64())])
TABLE_SCHEMA = TableSchema.from_arrow(SCHEMA, timestamp="ts", tags=["host"])
ROWS = 300


def rows() -> pa.Table:
    """Enough hosts that every one of 3 partitions gets rows."""
    return pa.table(
        {
            "ts": pa.array(range(ROWS), pa.timestamp("ms")),
            "host": [f"host-{i % 30}" for i in range(ROWS)],
            "cpu": [float(i) for i in range(ROWS)],
        },
        schema=SCHEMA,
    )


@dataclass
class Running:
    """A worker in a task of its own (see _serve), so that a test can stop it alone."""

    worker: Worker
    stop: anyio.Event = field(default_factory=anyio.Event)
    stopped: anyio.Event = field(default_factory=anyio.Event)


async def _serve(config: WorkerConfig, *, task_status: TaskStatus[Running]) -> None:
    async with Worker(config=config) as worker:
        running = Running(worker)
        task_status.started(running)
        await running.stop.wait()
    running.stopped.set()


@dataclass
class Cluster:
    running: list[Running]
    table: PartitionedTable
    tables: PartitionedTables

    def location(self, index: int) -> str:
        return self.running[index].worker.location

    def engine(self, index: int) -> TableEngine:
        engine = self.running[index].worker.state.tables
        assert engine is not None
        return engine

    async def published(self, index: int) -> int:
        return await self.engine(index).row_count(self.table.partition_name(index))

    def staged(self, index: int) -> int:
        """Rows staged on partition `index` and neither committed nor aborted."""
        engine = self.engine(index)
        entry = engine.entry(self.table.partition_name(index))
        found = engine.store.connection.execute(f"SELECT count(*) FROM {entry.staging}").fetchone()
        assert found is not None
        return int(found[0])

    async def stop(self, index: int) -> None:
        """Stops worker `index`: its port refuses connections from then on."""
        self.running[index].stop.set()
        await self.running[index].stopped.wait()


@pytest.fixture
async def three(tmp_path: Path) -> AsyncIterator[Cluster]:
    async with anyio.create_task_group() as tg:
        running = [
            await tg.start(_serve, WorkerConfig(data_dir=str(tmp_path / f"worker{i}")))
            for i in range(3)
        ]
        urls = tuple(r.worker.location for r in running)
        table = PartitionedTable(TableName.of("cpu"), TABLE_SCHEMA, ("host",), urls)
        async with PartitionedTables(timeout=10) as tables:
            await tables.create(table)
            yield Cluster(running, table, tables)
        for one in running:
            one.stop.set()


@pytest.mark.anyio
async def test_creating_over_existing_tables_names_every_partition(three: Cluster) -> None:
    with pytest.raises(AlreadyExists) as info:
        await three.tables.create(three.table, if_not_exists=False)
    error = info.value
    assert str(error).startswith(
        f"creating partition 0 of flightfeed.public.cpu (flightfeed.public.__cpu_0 on"
        f" {three.location(0)}): "
    )
    assert str(error).endswith("(partitions 1, 2 failed too)")
    notes = error.__notes__
    assert [n.split(":")[0] for n in notes] == [
        "creating partition 1 of flightfeed.public.cpu (flightfeed.public.__cpu_1 on grpc",
        "creating partition 2 of flightfeed.public.cpu (flightfeed.public.__cpu_2 on grpc",
    ]


@pytest.mark.anyio
async def test_a_partition_that_cannot_be_staged_publishes_nothing(three: Cluster) -> None:
    parts = three.table.route(rows())
    assert all(p.num_rows for p in parts)
    down = three.location(2)
    await three.stop(2)

    with pytest.raises(RemoteError) as info:
        await three.tables.write(three.table, rows())
    error = info.value
    assert not isinstance(error, BaseExceptionGroup)
    assert str(error).startswith(
        f"staging partition 2 of flightfeed.public.cpu (flightfeed.public.__cpu_2 on {down}):"
    )
    assert "cannot reach" in str(error)
    (note,) = error.__notes__  # its abort could not reach the worker either
    assert note.startswith("the staged rows of partition 2 of flightfeed.public.cpu (")
    assert note.endswith("the worker drops them after its staging TTL")
    for index in (0, 1):  # staged, then aborted: nothing published, nothing left staged
        assert await three.published(index) == 0
        assert three.staged(index) == 0


@pytest.mark.anyio
async def test_a_failed_commit_says_what_was_published_and_aborts_the_rest(
    three: Cluster,
) -> None:
    parts = three.table.route(rows())
    job = "partitioned-test"
    for index in range(3):
        await three.tables._stage(three.table, index, job, parts[index])
    assert [three.staged(i) for i in range(3)] == [p.num_rows for p in parts]
    down = three.location(1)
    await three.stop(1)

    with pytest.raises(RemoteError) as info:
        await three.tables._commit(three.table, job, [0, 1, 2])
    message = str(info.value)
    assert message.startswith(
        f"committing partition 1 of flightfeed.public.cpu (flightfeed.public.__cpu_1 on {down}):"
    )
    assert message.endswith(
        f"; published before it: partitions 0 ({parts[0].num_rows} rows); not known whether"
        " partition 1 was; not published: partitions 2"
    )
    assert await three.published(0) == parts[0].num_rows
    assert (await three.published(2), three.staged(2)) == (0, 0)  # aborted


@pytest.mark.anyio
async def test_writes_publish_every_partition_when_all_are_up(three: Cluster) -> None:
    """The reference for the failures above: the same rows, all of them published."""
    parts = three.table.route(rows())
    assert await three.tables.write(three.table, rows()) == ROWS
    for index in range(3):
        assert (await three.published(index), three.staged(index)) == (parts[index].num_rows, 0)
