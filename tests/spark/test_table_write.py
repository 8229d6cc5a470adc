"""Spark writes into a worker's durable tables and reads them back (source=table): every row of
a job lands exactly once, or none does: a failed job publishes nothing and leaves no staging,
a retried task's rows appear once, overwrite replaces the table, and a streaming query's
micro-batches commit once each, a replayed one adding nothing."""

from __future__ import annotations

import datetime
import itertools
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.flight as fl
import pyarrow.parquet as pq
import pytest
from helpers.spark_fixtures import filters_pushed
from pyspark.sql import functions as F
from pyspark.sql.datasource import EqualTo, GreaterThanOrEqual, LessThan
from pyspark.sql.functions import udf
from pyspark.sql.pandas.types import from_arrow_schema

import flightfeed.spark.writer as writer_module
import flightfeed.tables.flight as table_flight
from flightfeed._generated.flightfeed.v1 import CreateTable, RowCount, TableRef
from flightfeed.errors import Conflict, InvalidArgument
from flightfeed.spark import (
    FlightfeedDataSource,
    FlightfeedPushdownSource,
    TableCommitMessage,
    stream_job,
)
from flightfeed.spark.pushdown import session_setting
from flightfeed.spark.writer import (
    FlightfeedStreamTableWriter,
    FlightfeedTableWriter,
    TableWriteRefused,
)
from flightfeed.tables.schema import TableSchema
from flightfeed.tables.store import TableName
from flightfeed.worker import Worker

ROWS = 3000
SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("ts", pa.timestamp("ms", tz="UTC")),
        ("host", pa.string()),
        ("value", pa.float64()),
        ("n", pa.int32()),
        ("flag", pa.bool_()),
        ("day", pa.date32()),
        ("payload", pa.binary()),
    ]
)
T0 = datetime.datetime(2024, 5, 1, tzinfo=datetime.UTC)


def rows(start: int, count: int) -> pa.Table:
    """Rows `start`..`start + count`: every column but the key and timestamp has nulls, and
    the timestamps have milliseconds (what a table keeps)."""
    ids = range(start, start + count)
    return pa.table(
        {
            "id": list(ids),
            "ts": [T0 + datetime.timedelta(seconds=i, milliseconds=i % 1000) for i in ids],
            "host": [None if i % 11 == 0 else f"h{i % 5}" for i in ids],
            "value": [None if i % 7 == 0 else i / 4 for i in ids],
            "n": [None if i % 5 == 0 else (i * 37) % 1000 - 500 for i in ids],
            "flag": [None if i % 3 == 0 else i % 2 == 0 for i in ids],
            "day": [
                None if i % 13 == 0 else datetime.date(2024, 1, 1) + datetime.timedelta(i % 300)
                for i in ids
            ],
            "payload": [None if i % 17 == 0 else f"p{i}".encode() for i in ids],
        },
        schema=SCHEMA,
    )


# --- the worker's side ---------------------------------------------------------------------


def create_table(worker: Worker, columns: pa.Schema = SCHEMA, name: str = "") -> str:
    """A new APPEND table (every row kept: a duplicate would show) of `columns` (keyed on id and
    ts), named `name` or a new name; its name."""
    name = name or f"t_{uuid.uuid4().hex[:12]}"
    schema = TableSchema.from_arrow(columns, timestamp="ts", primary_key=["id", "ts"])
    request = CreateTable(
        table=TableRef(table=name),
        table_schema=schema.to_proto(),
        options={"update_mode": "APPEND"},
    )
    action(worker, "create_table", bytes(request))
    return name


def action(worker: Worker, kind: str, body: bytes) -> bytes:
    with fl.connect(worker.location) as client:
        return b"".join(r.body.to_pybytes() for r in client.do_action(fl.Action(kind, body)))


def count_rows(worker: Worker, table: str) -> int:
    return int(RowCount.parse(action(worker, "count_rows", bytes(TableRef(table=table)))).rows)


def committed_jobs(worker: Worker, prefix: str) -> list[str]:
    """The commits of jobs named `prefix...` the worker's store remembers (to publish nothing
    when one comes again)."""
    assert worker.state.tables is not None
    cursor = worker.state.tables.store.connection.cursor()
    try:
        found = cursor.execute(
            "SELECT job FROM flightfeed_committed_jobs WHERE starts_with(job, ?) ORDER BY job",
            [prefix],
        )
        return [job for (job,) in found.fetchall()]
    finally:
        cursor.close()


def staged_rows(worker: Worker, table: str) -> int:
    """Rows staged and not yet committed or aborted, of any job (read in process: the worker's
    DuckDB file is locked to other connections)."""
    assert worker.state.tables is not None
    store = worker.state.tables.store
    cursor = store.connection.cursor()
    try:
        found = cursor.execute(f"SELECT count(*) FROM {store.entry(TableName.of(table)).staging}")
        (count,) = found.fetchone()  # type: ignore[misc]
        return int(count)
    finally:
        cursor.close()


@pytest.fixture
def aborts(table_worker: Worker, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """(job, rows discarded) of every abort_staged the worker runs during the test."""
    engine = table_worker.state.tables
    assert engine is not None
    calls: list[tuple[str, int]] = []
    original = engine.abort_staged

    async def spy(name: TableName, job: str) -> int:
        discarded = await original(name, job)
        calls.append((job, discarded))
        return discarded

    monkeypatch.setattr(engine, "abort_staged", spy)
    return calls


# --- Spark's side --------------------------------------------------------------------------


def frame(spark: Any, table: pa.Table, partitions: int = 4) -> Any:
    return spark.createDataFrame(table).repartition(partitions)


def write(df: Any, worker: Worker, table: str, mode: str = "append") -> None:
    df.write.format("flightfeed").mode(mode).option("uri", worker.location).option(
        "table", table
    ).save()


def read(spark: Any, worker: Worker, table: str, partitions: int = 3) -> Any:
    reader = spark.read.format("flightfeed").option("source", "table")
    reader = reader.option("uri", worker.location).option("table", table)
    return reader.option("partitions", str(partitions)).load()


def arrow_of(df: Any) -> pa.Table:
    """The DataFrame's rows by id, with SCHEMA's types (Spark's timestamps are microseconds)."""
    return df.toArrow().cast(SCHEMA).sort_by("id")


# --- batch writes --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def written(spark: Any, table_worker: Worker) -> tuple[str, pa.Table]:
    """A table Spark wrote ROWS rows into, in 4 partitions; (its name, the rows)."""
    table = create_table(table_worker)
    expected = rows(0, ROWS)
    assert all(expected[c].null_count for c in SCHEMA.names[2:])  # nulls in every nullable one
    write(frame(spark, expected), table_worker, table)
    return table, expected


def test_a_written_dataframe_reads_back_exactly(
    spark: Any, table_worker: Worker, written: tuple[str, pa.Table]
) -> None:
    table, expected = written
    assert count_rows(table_worker, table) == ROWS
    assert staged_rows(table_worker, table) == 0
    df = read(spark, table_worker, table, partitions=3)
    assert df.rdd.getNumPartitions() == 3
    assert df.schema.simpleString() == (
        "struct<id:bigint,ts:timestamp,host:string,value:double,n:int,flag:boolean,day:date,"
        "payload:binary>"
    )
    assert arrow_of(df).equals(expected)


def test_the_workers_that_plan_and_commit_a_write_are_settled_too(
    spark: Any, written: tuple[str, pa.Table], tmp_path: Path
) -> None:
    """Planning a write and committing it run in reused Python workers of their own kinds,
    which pyspark's daemons collect in full after every command: flightfeed's writer settles
    them as its reader settles the others. A probe write after a flightfeed write (`written`)
    finds both heaps frozen."""
    from pyspark.sql.datasource import DataSource, DataSourceWriter, WriterCommitMessage

    report = tmp_path / "frozen"

    class ProbeWriter(DataSourceWriter):
        def __init__(self, planned: bool) -> None:
            self.planned = planned

        def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
            for _ in iterator:
                pass
            return WriterCommitMessage()

        def commit(self, messages: list[WriterCommitMessage | None]) -> None:
            import gc

            report.write_text(f"{self.planned} {gc.get_freeze_count() > 0}")  # (committing)

    class HeapProbe(DataSource):
        @classmethod
        def name(cls) -> str:
            return "flightfeed_test_write_heap_probe"

        def writer(self, schema: Any, overwrite: bool) -> DataSourceWriter:
            import gc

            return ProbeWriter(gc.get_freeze_count() > 0)  # (in the worker planning the write)

    spark.dataSource.register(HeapProbe)
    spark.range(1).write.format(HeapProbe.name()).mode("append").save()
    assert report.read_text() == "True True"


SINCE = T0 + datetime.timedelta(seconds=1000, milliseconds=1)
WANTED = [i for i in range(ROWS) if i < 2500 and i % 11 and i % 5 == 1 and i > 1000]
"""The ids of id < 2500 AND host = 'h1' AND ts >= SINCE."""


def test_filters_and_columns_go_to_the_worker(
    spark: Any,
    table_worker: Worker,
    written: tuple[str, pa.Table],
    spark_keeps_pushed_reads_apart: bool,
) -> None:
    table, _ = written
    options = {"source": "table", "uri": table_worker.location, "table": table}
    source = FlightfeedPushdownSource({**options, "partitions": "2", "columns": "ts,id,host"})
    reader = source.reader(source.schema())
    filters = [
        LessThan(("id",), 2500),
        EqualTo(("host",), "h1"),
        GreaterThanOrEqual(("ts",), SINCE),
    ]
    assert list(reader.pushFilters(filters)) == []  # every one pushed: the worker runs them
    partitions = reader.partitions()
    assert len(partitions) == 2
    got = pa.Table.from_batches(itertools.chain.from_iterable(map(reader.read, partitions)))
    assert got.column_names == ["ts", "id", "host"]
    assert sorted(got["id"].to_pylist()) == WANTED
    # and in Spark:
    with filters_pushed(spark, spark_keeps_pushed_reads_apart):
        df = read(spark, table_worker, table).select("id", "host", "ts")
        df = df.filter((F.col("id") < 2500) & (F.col("host") == "h1") & (F.col("ts") >= SINCE))
        assert sorted(r.id for r in df.select("id").collect()) == WANTED


def test_overwrite_replaces_the_rows(spark: Any, table_worker: Worker) -> None:
    table = create_table(table_worker)
    write(frame(spark, rows(0, 1000)), table_worker, table)
    replacement = rows(5000, 700)
    write(frame(spark, replacement, 3), table_worker, table, mode="overwrite")
    assert count_rows(table_worker, table) == 700
    assert arrow_of(read(spark, table_worker, table)).equals(replacement)


def test_a_read_computed_again_reads_its_rows_until_the_table_is_written(
    spark: Any, table_worker: Worker
) -> None:
    """Spark computes a partition again with the ticket it planned: a task retried after its
    read, a stage recomputed after an executor was lost, a cached partition evicted. `df.rdd`
    keeps its partitions, so each action computes them again. Before, a second action failed:
    the snapshot, released once every endpoint was read, was NOT_FOUND. After a write, the
    rows are no longer those of the snapshot, and it fails with why."""
    table = create_table(table_worker)
    expected = rows(0, 900)
    write(frame(spark, expected), table_worker, table)
    planned = read(spark, table_worker, table, partitions=3).rdd
    for _ in range(2):
        assert sorted(r.id for r in planned.collect()) == expected["id"].to_pylist()
    write(frame(spark, rows(900, 10), 1), table_worker, table)
    with pytest.raises(Exception, match=r"no longer held, and the worker's tables have changed"):
        planned.count()
    assert read(spark, table_worker, table).count() == 910


def test_a_failed_job_publishes_nothing_and_leaves_no_staging(
    spark: Any, table_worker: Worker, aborts: list[tuple[str, int]]
) -> None:
    table = create_table(table_worker)
    write(frame(spark, rows(0, 100), 1), table_worker, table)
    # 4 partitions of about 500 rows on 2 cores: partition 0 or 1 finishes (and stages its
    # rows) before the last one starts; the last one's last row fails every attempt.
    failing = spark.createDataFrame(rows(1000, 2000)).repartitionByRange(4, "id")
    failing = failing.withColumn(
        "value", F.when(F.col("id") == 2999, F.raise_error(F.lit("boom"))).otherwise(F.col("value"))
    )
    with pytest.raises(Exception, match="boom"):
        write(failing, table_worker, table)
    assert count_rows(table_worker, table) == 100
    assert staged_rows(table_worker, table) == 0
    ((job, discarded),) = aborts
    assert job.startswith("spark-")
    assert discarded > 0  # the abort discarded what the other partitions had staged


def test_a_retried_task_lands_once(
    spark: Any, table_worker: Worker, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Partition 1's first attempt fails after the worker staged some of its rows (the UDF
    waits for that: the worker stages in chunks of 50 rows here); the retry's rows are
    published, the failed attempt's never."""
    monkeypatch.setattr(table_flight, "STAGE_ROWS", 50)
    table = create_table(table_worker)
    # 1 KB payloads: the UDF's output of a batch of 100 rows fills Python's 64 KB pipe buffer,
    # so each batch goes on to the writer at once (small ones would wait for the task's end).
    big = pa.array([bytes(1000) + f"p{i}".encode() for i in range(1200)], pa.binary())
    expected = rows(0, 1200).set_column(7, "payload", big)
    staged: list[tuple[int, int, int]] = []  # (partition, attempt, rows) as the worker stages
    marker = tmp_path / "partition-1-staged"
    engine = table_worker.state.tables
    assert engine is not None
    stage = engine.stage

    async def spy(
        name: TableName, job: str, partition: int, attempt: int, data: pa.Table, **options: Any
    ) -> int:  # (`options`: whatever else the engine's stage takes, passed on as it is)
        staged.append((partition, attempt, len(data)))
        if partition == 1:
            marker.touch()
        return await stage(name, job, partition, attempt, data, **options)

    monkeypatch.setattr(engine, "stage", spy)
    seen = [0]  # rows this task's copy of the UDF saw
    signal = str(marker)

    @udf("binary", useArrow=True)
    def flaky(payload: bytes | None) -> bytes | None:
        import os
        import time

        from pyspark import TaskContext

        context = TaskContext.get()
        assert context is not None  # (this runs in a Spark task)
        if context.partitionId() == 1 and context.attemptNumber() == 0:
            seen[0] += 1
            if seen[0] == 250:  # in its third batch of 100: wait until the first ones are staged
                deadline = time.monotonic() + 20
                while not os.path.exists(signal) and time.monotonic() < deadline:
                    time.sleep(0.05)
                raise RuntimeError("first attempt fails")
        return payload

    df = spark.createDataFrame(expected).repartitionByRange(4, "id")
    df = df.withColumn("payload", flaky(F.col("payload")))
    group = f"retry-{uuid.uuid4().hex}"
    spark.sparkContext.setJobGroup(group, "a write whose task is retried")
    try:
        with session_setting(spark, "spark.sql.execution.arrow.maxRecordsPerBatch", "100"):
            write(df, table_worker, table)
    finally:
        spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)
    assert failed_tasks(spark, group) == 1
    attempts = {attempt for partition, attempt, _ in staged if partition == 1}
    assert len(attempts) == 2  # the failed attempt had staged rows, and the retry
    assert count_rows(table_worker, table) == 1200
    assert staged_rows(table_worker, table) == 0
    assert arrow_of(read(spark, table_worker, table)).equals(expected)


def failed_tasks(spark: Any, group: str) -> int:
    tracker = spark.sparkContext.statusTracker()
    stages = [
        stage
        for job in tracker.getJobIdsForGroup(group)
        for stage in tracker.getJobInfo(job).stageIds
    ]
    return sum(tracker.getStageInfo(stage).numFailedTasks for stage in stages)


class FakeTask:
    """TaskContext.get() in a writer called outside Spark."""

    current: FakeTask | None = None

    def __init__(self, partition: int, attempt_id: int, attempt: int) -> None:
        self.partition, self.attempt_id, self.attempt = partition, attempt_id, attempt

    @classmethod
    def get(cls) -> FakeTask | None:
        return cls.current

    def partitionId(self) -> int:
        return self.partition

    def taskAttemptId(self) -> int:
        return self.attempt_id

    def attemptNumber(self) -> int:
        return self.attempt


def test_only_the_committed_attempt_of_a_partition_is_published(
    table_worker: Worker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer's own protocol, without Spark: two attempts of partition 0 (the first dies
    mid-stream, after its rows were staged), one of partition 1; the commit names the
    second attempt of 0."""
    monkeypatch.setattr(table_flight, "STAGE_ROWS", 10)
    monkeypatch.setattr(writer_module, "TaskContext", FakeTask)
    table = create_table(table_worker)
    options = {"uri": table_worker.location, "table": table}
    writer = FlightfeedTableWriter.create(options, from_arrow_schema(SCHEMA), overwrite=False)
    part0, part1 = rows(0, 300), rows(300, 200)

    def dying() -> Iterator[pa.RecordBatch]:
        yield from part0.to_batches(max_chunksize=40)[:5]
        raise RuntimeError("the executor died")

    FakeTask.current = FakeTask(0, 7, 0)
    with pytest.raises(RuntimeError, match="the executor died"):
        writer.write(dying())
    assert staged_rows(table_worker, table) >= 100  # the dead attempt's rows wait, staged
    FakeTask.current = FakeTask(0, 9, 1)
    first = writer.write(iter(part0.to_batches(max_chunksize=64)))
    FakeTask.current = FakeTask(1, 8, 0)
    second = writer.write(iter(part1.to_batches(max_chunksize=64)))
    assert (first.partition, first.attempt, first.rows, first.spark_attempt) == (0, 9, 300, 1)
    writer.commit([first, second])
    assert count_rows(table_worker, table) == 500
    assert staged_rows(table_worker, table) == 0
    writer.commit([first, second])  # a driver retrying its commit publishes nothing more
    assert count_rows(table_worker, table) == 500


def recreate_table(worker: Worker, name: str) -> None:
    """Drop table `name` and create it again, empty, under the same name (a new table)."""
    action(worker, "drop_table", bytes(TableRef(table=name)))
    create_table(worker, name=name)


def test_a_job_across_a_drop_and_create_of_its_table_publishes_nothing(
    table_worker: Worker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, a commit after the table was dropped and created again published into the new
    table whatever the job had staged there, and reported success: the rows staged into the
    dropped table were lost without a word."""
    monkeypatch.setattr(writer_module, "TaskContext", FakeTask)
    table = create_table(table_worker)
    options = {"uri": table_worker.location, "table": table}
    writer = FlightfeedTableWriter.create(options, from_arrow_schema(SCHEMA), overwrite=False)
    FakeTask.current = FakeTask(0, 1, 0)
    before = writer.write(iter(rows(0, 30).to_batches()))
    recreate_table(table_worker, table)
    FakeTask.current = FakeTask(1, 2, 0)
    after = writer.write(iter(rows(30, 20).to_batches()))
    assert before.table_id is not None
    assert after.table_id is not None
    assert before.table_id != after.table_id
    with pytest.raises(Conflict, match="dropped and created again while job spark-"):
        writer.commit([before, after])
    writer.abort([before, after])  # as Spark does when its commit fails
    assert (count_rows(table_worker, table), staged_rows(table_worker, table)) == (0, 0)

    # Every task staged into the dropped table: the worker refuses the commit.
    writer = FlightfeedTableWriter.create(options, from_arrow_schema(SCHEMA), overwrite=True)
    FakeTask.current = FakeTask(0, 3, 0)
    staged = writer.write(iter(rows(0, 10).to_batches()))
    recreate_table(table_worker, table)
    with pytest.raises(Conflict, match="dropped and created again while rows were written"):
        writer.commit([staged])
    assert count_rows(table_worker, table) == 0


def test_a_job_whose_table_is_created_again_before_its_tasks_write_publishes_nothing(
    table_worker: Worker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, only the tasks' own staging was compared: a job whose every task began after the
    re-creation wrote into the new table (and an empty overwrite emptied it), though the README
    said a job across a drop and re-creation publishes nothing (found by a probe)."""
    monkeypatch.setattr(writer_module, "TaskContext", FakeTask)
    table = create_table(table_worker)
    options = {"uri": table_worker.location, "table": table}
    writer = FlightfeedTableWriter.create(options, from_arrow_schema(SCHEMA), overwrite=False)
    assert writer.target.table_id is not None  # learned when Spark made the writer
    recreate_table(table_worker, table)
    FakeTask.current = FakeTask(0, 1, 0)
    staged = writer.write(iter(rows(0, 30).to_batches()))
    with pytest.raises(Conflict, match="dropped and created again while job spark-"):
        writer.commit([staged])
    writer.abort([staged])
    assert (count_rows(table_worker, table), staged_rows(table_worker, table)) == (0, 0)

    # An overwrite with no rows at all, across a re-creation: the new table keeps its rows.
    writer = FlightfeedTableWriter.create(options, from_arrow_schema(SCHEMA), overwrite=True)
    recreate_table(table_worker, table)
    kept = FlightfeedTableWriter.create(options, from_arrow_schema(SCHEMA), overwrite=False)
    kept.commit([kept.write(iter(rows(0, 5).to_batches()))])
    FakeTask.current = FakeTask(0, 2, 0)
    empty = writer.write(iter([]))
    with pytest.raises(Conflict, match="dropped and created again"):
        writer.commit([empty])
    assert count_rows(table_worker, table) == 5


def test_a_write_into_a_missing_table_names_it_and_the_worker(
    spark: Any, table_worker: Worker
) -> None:
    with pytest.raises(
        Exception,
        match=r"writing table 'nope' on the flightfeed worker at grpc://127\.0\.0\.1:\d+: .*"
        r"no table 'flightfeed\.public\.nope'",
    ):
        write(frame(spark, rows(0, 10), 1), table_worker, "nope")


def test_what_a_table_cannot_hold_is_refused_clearly(table_worker: Worker) -> None:
    table = create_table(table_worker)
    options = {"uri": table_worker.location, "table": table}

    def writer_for(schema: pa.Schema, **more: str) -> FlightfeedTableWriter:
        spark_schema = from_arrow_schema(schema)
        return FlightfeedTableWriter.create({**options, **more}, spark_schema, overwrite=False)

    with pytest.raises(TableWriteRefused, match=r"the table has no column\(s\) \['other'\]"):
        writer_for(SCHEMA.append(pa.field("other", pa.int64())))
    with pytest.raises(TableWriteRefused, match=r"lacks the table's non-null column\(s\) \['ts'\]"):
        writer_for(pa.schema([SCHEMA.field("id")]))
    with pytest.raises(InvalidArgument, match=r"source=query\) is read-only"):
        writer_for(SCHEMA, source="query")
    target = writer_for(SCHEMA).target
    sent = rows(0, 3).cast(SCHEMA.set(1, pa.field("ts", pa.timestamp("us", "Etc/UTC"))))
    (batch,) = sent.to_batches()  # as Spark sends it: microseconds
    assert target.conform(batch).schema.field("ts").type == pa.timestamp("ms")
    micros = batch.set_column(1, "ts", pc.add(batch["ts"], pa.scalar(1, pa.duration("us"))))
    with pytest.raises(
        TableWriteRefused,
        match=rf"writing table '{table}' on the flightfeed worker at grpc://\S+: column 'ts' is"
        r" timestamp\[ms\], it cannot store these timestamp\[us, tz=Etc/UTC\] values .*would"
        r" lose data.*date_trunc\('millisecond', 'ts'\)",
    ):
        target.conform(micros)
    no_id = batch.set_column(0, "id", pa.array([1, None, 3], pa.int64()))
    with pytest.raises(TableWriteRefused, match=r"column 'id' is not nullable, got 1 null\(s\)"):
        target.conform(no_id)
    assert count_rows(table_worker, table) == 0


def test_a_write_casts_only_between_numbers_and_refuses_what_would_change_values(
    table_worker: Worker,
) -> None:
    """A double past float's range was stored as infinity; a TIMESTAMP_NTZ was taken for UTC
    whatever the session's time zone; a boolean, a string or a number went into a column of
    another kind (Spark's own insert refuses those)."""
    columns = pa.schema(
        [
            ("id", pa.int64()),
            ("ts", pa.timestamp("ms", tz="UTC")),
            ("f", pa.float32()),
            ("n", pa.int32()),
            ("s", pa.string()),
        ]
    )
    name = create_table(table_worker, columns)
    sent_schema = pa.schema(
        [
            ("id", pa.int64()),
            ("ts", pa.timestamp("us", tz="Etc/UTC")),
            ("f", pa.float64()),
            ("n", pa.int64()),
            ("s", pa.string()),
        ]
    )
    spark_schema = from_arrow_schema(sent_schema)
    options = {"uri": table_worker.location, "table": name}
    target = FlightfeedTableWriter.create(options, spark_schema, overwrite=False).target
    base = pa.RecordBatch.from_pydict(
        {"id": [1], "ts": [T0], "f": [1.5], "n": [7], "s": ["x"]}, schema=sent_schema
    )
    conformed = target.conform(base)  # numbers into numbers, instants into the table's
    assert [f.type for f in conformed.schema] == [
        pa.int64(),
        pa.timestamp("ms"),  # (a table keeps UTC milliseconds)
        pa.float32(),
        pa.int32(),
        pa.string(),
    ]
    assert conformed.to_pylist()[0]["f"] == 1.5

    def refused(column: str, values: pa.Array, reason: str) -> None:
        batch = base.set_column(base.schema.get_field_index(column), column, values)
        with pytest.raises(TableWriteRefused, match=rf"column '{column}' .*{reason}"):
            target.conform(batch)

    refused("f", pa.array([1e300]), r"out of the column's range")
    refused("n", pa.array([True]), r"Spark sent bool: cast it in Spark first")
    refused("n", pa.array(["12"]), r"Spark sent string: cast it in Spark first")
    refused("s", pa.array([0.1]), r"Spark sent double: cast it in Spark first")
    wall_clock = pa.array([T0.replace(tzinfo=None)], pa.timestamp("us"))
    refused("ts", wall_clock, r"a TIMESTAMP_NTZ is a wall-clock time")


# --- streaming -----------------------------------------------------------------------------


def test_a_stream_lands_once_per_micro_batch_and_a_replay_adds_nothing(
    spark: Any, table_worker: Worker, tmp_path: Path
) -> None:
    table = create_table(table_worker)
    source = tmp_path / "source"
    source.mkdir()
    checkpoint = str(tmp_path / "checkpoint")
    files = [rows(i * 400, 400) for i in range(3)]

    def run(first: int, last: int) -> Any:
        for i in range(first, last):
            pq.write_table(files[i], source / f"{i}.parquet")
        stream = spark.readStream.schema(spark.createDataFrame(files[0]).schema)
        stream = stream.option("maxFilesPerTrigger", 1).parquet(str(source))
        query = (
            stream.writeStream.format("flightfeed")
            .option("uri", table_worker.location)
            .option("table", table)
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(60)
        assert query.exception() is None
        return query

    first = run(0, 2)
    assert count_rows(table_worker, table) == 800
    second = run(2, 3)  # restarted from the checkpoint: the same query id, the next batch
    assert second.id == first.id
    assert [p["batchId"] for p in second.recentProgress if p["numInputRows"]] == [2]
    expected = pa.concat_tables(files)
    assert count_rows(table_worker, table) == 1200
    assert staged_rows(table_worker, table) == 0
    assert arrow_of(read(spark, table_worker, table)).equals(expected)

    # Micro-batch 1 again, as after a crash between its commit and the checkpoint's: its
    # tasks stage the rows again and its commit publishes nothing.
    options = {"uri": table_worker.location, "table": table, "checkpointLocation": checkpoint}
    writer = FlightfeedDataSource(options).streamWriter(from_schema(spark, files[1]), False)
    assert isinstance(writer, FlightfeedStreamTableWriter)
    job = stream_job(first.id, 1)
    staged = writer.target.stage(job, 0, 12345, files[1].to_batches())
    assert staged.rows == 400
    assert staged_rows(table_worker, table) == 400
    message = TableCommitMessage(
        job, 0, 12345, staged.rows, batch_id=1, table_id=staged.table_id, query_id=first.id
    )
    writer.commit([message], 1)
    assert count_rows(table_worker, table) == 1200
    assert staged_rows(table_worker, table) == 0
    # The worker remembers the query's last two commits only: Spark runs no earlier one again
    # (it remembered every micro-batch's, for ever).
    remembered = committed_jobs(table_worker, stream_job(first.id, 0)[:-1])
    assert remembered == [stream_job(first.id, 1), stream_job(first.id, 2)]


def from_schema(spark: Any, table: pa.Table) -> Any:
    return spark.createDataFrame(table.slice(0, 1)).schema
