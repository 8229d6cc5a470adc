"""Spark reads flightfeed tables as DataFrames, in parallel, straight from the workers: the
seed's query in SQL (checked against DuckDB on the same rows), views, pushed filters, task
retries, per-query headers, and clear errors."""

from __future__ import annotations

import datetime
import json
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from typing import Any

import duckdb
import pyarrow as pa
import pytest
from helpers.spark_catalog import NUMBERS
from helpers.spark_fixtures import filters_pushed

from flightfeed.cluster import CoordinatorCluster
from flightfeed.coordinator import QueryMetrics
from flightfeed.examples.chunk_scan import scan_rows
from flightfeed.protocol import MetricsSet
from flightfeed.spark import sql

SEED = (2, "3,1", "2", "4", "1,1")
SEED_SQL = (
    "SELECT count(*) AS cnt, task FROM scan(2, '3,1', '2', '4', '1,1') GROUP BY task ORDER BY task"
)


def duck(query: str, **tables: pa.Table) -> list[tuple[Any, ...]]:
    """`query` run by DuckDB, an independent engine, over the given Arrow tables."""
    with duckdb.connect() as connection:
        for name, table in tables.items():
            connection.register(name, table)
        return [tuple(row) for row in connection.execute(query).fetchall()]


def reference(query: str) -> list[tuple[Any, ...]]:
    """The same SQL run by DuckDB over the rows the seed's scan yields."""
    rewritten = query.replace("scan(2, '3,1', '2', '4', '1,1')", "scan")
    return duck(rewritten, scan=scan_rows(*SEED))


def rows(df: Any) -> list[tuple[Any, ...]]:
    return [tuple(row) for row in df.collect()]


def read(spark: Any, service: CoordinatorCluster, table: str, *args: Any, **options: str) -> Any:
    reader = spark.read.format("flightfeed").option("uri", service.location)
    reader = reader.option("table", table).option("args", json.dumps(list(args)))
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def test_the_seed_query_runs_in_spark_sql(spark: Any, service: CoordinatorCluster) -> None:
    result = rows(sql(spark, service.location, SEED_SQL))
    assert result == reference(SEED_SQL) == [(6, 0), (6, 1)]


def test_sql_reaches_spark_as_written_around_the_calls(
    spark: Any, service: CoordinatorCluster
) -> None:
    """Spark ran sqlglot's rendering of the query: percentile_cont as percentile_approx (49,
    a bigint, for 49.5), to_char as a cast without its format, and 'it''s' as CONCAT('it', 's')
    (found by a probe). Reference: Spark's own answer over a view of the same table."""
    query = (
        "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY n) AS median,"
        " to_char(12.5, '99.00') AS text, max(length('it''s')) AS quoted,"
        " count_if(word = 'w1') AS w1 FROM {table}"
    )
    read(spark, service, "numbers", 3).createOrReplaceTempView("numbers_as_read")
    expected = rows(spark.sql(query.format(table="numbers_as_read")))
    assert expected == [(49.5, "12.50", 4, 15)]
    assert rows(sql(spark, service.location, query.format(table="numbers(3)"))) == expected


def test_every_row_of_the_seed_scan_in_order(spark: Any, service: CoordinatorCluster) -> None:
    query = "SELECT * FROM scan(2, '3,1', '2', '4', '1,1') ORDER BY task, partition"
    assert rows(sql(spark, service.location, query)) == reference(query)


def test_one_spark_partition_per_flightfeed_partition(
    spark: Any, service: CoordinatorCluster
) -> None:
    df = read(spark, service, "scan", *SEED)
    assert df.rdd.getNumPartitions() == 4
    assert df.schema.simpleString() == "struct<task:bigint,partition:bigint>"
    assert [f.nullable for f in df.schema.fields] == [False, False]


def test_a_view_over_the_data_source(spark: Any, service: CoordinatorCluster) -> None:
    spark.sql(
        "CREATE OR REPLACE TEMPORARY VIEW numbers_view USING flightfeed "
        f"OPTIONS (uri '{service.location}', table 'numbers', args '[3]')"
    )
    result = rows(spark.sql("SELECT count(*), sum(n) FROM numbers_view WHERE word = 'w3'"))
    assert result == duck("SELECT count(*), sum(n) FROM numbers WHERE word = 'w3'", numbers=NUMBERS)


def release_all(service: CoordinatorCluster) -> QueryMetrics:
    """Release the held queries now (Spark never says it is done reading) and wait for the
    latest query's metrics."""
    assert service.portal is not None
    for held in service.service.held.values():
        service.portal.call(held.release)
    metrics = service.coordinator.metrics.latest
    assert metrics is not None
    service.portal.call(metrics.wait_finished)
    return metrics


def output_rows(node: MetricsSet) -> int:
    return sum(m.output_rows.value for m in node.metrics if m.output_rows is not None)


def test_pushed_filters_run_on_the_workers(
    spark: Any, service: CoordinatorCluster, spark_keeps_pushed_reads_apart: bool
) -> None:
    # (no ORDER BY: Spark would read the scan twice, sampling it for its range partitioner)
    with filters_pushed(spark, spark_keeps_pushed_reads_apart):
        df = read(spark, service, "numbers", 2)  # (the source registered at load is read's)
        result = sorted(rows(df.filter("n >= 90 AND word IN ('w1', 'w2')").select("n")))
    assert result == [(n,) for n in range(90, 100) if n % 7 in (1, 2)]
    metrics = release_all(service)
    (task,) = metrics.tasks.values()  # numbers is not split: one task
    filtered, scanned = (output_rows(node) for node in task.plan_metrics)
    assert (filtered, scanned) == (len(result), 100)  # the worker dropped the other rows


def test_a_dataframe_queried_again_without_its_filter_reads_every_row(
    spark: Any, service: CoordinatorCluster
) -> None:
    """As `register` left the session: Spark 4.3.0 reuses a pushed read in a later unfiltered
    query of the same DataFrame (this counted 1, then 1), so there it pushes nothing."""
    df = read(spark, service, "numbers", 2)
    assert df.filter("n = 3").count() == 1
    assert df.count() == 100
    assert df.filter("n < 10").count() == 10
    assert df.count() == 100


def test_what_the_probe_finds_is_what_a_flightfeed_dataframe_does_with_pushdown(
    spark: Any, service: CoordinatorCluster, spark_keeps_pushed_reads_apart: bool
) -> None:
    with filters_pushed(spark, spark_keeps_pushed_reads_apart):
        df = read(spark, service, "numbers", 2)
        assert df.filter("n = 3").count() == 1
        assert (df.count() == 100) == spark_keeps_pushed_reads_apart


def test_columns_spark_cannot_hold_are_read_widened(
    spark: Any, service: CoordinatorCluster, spark_keeps_pushed_reads_apart: bool
) -> None:
    """Unsigned integers, a half float, a string view and nanoseconds (also nested) made the
    DataFrame's definition fail without naming the column, or its read a 'schema mismatch'."""
    df = read(spark, service, "odd_types")
    assert df.schema.simpleString() == (
        "struct<u8:smallint,u64:decimal(20,0),half:float,text:string,at:timestamp,"
        "inner:struct<u:int,l:array<bigint>>>"
    )
    got = df.toArrow().to_pylist()  # (collect's datetimes would be in this machine's zone)
    assert got == [
        {
            "u8": 255,
            "u64": Decimal(2**64 - 1),
            "half": 1.5,
            "text": "a",
            "at": datetime.datetime(1970, 1, 1, 0, 16, 40, 1, tzinfo=datetime.UTC),
            "inner": {"u": 1, "l": [2**32 - 1]},
        },
        {
            "u8": 0,
            "u64": Decimal(0),
            "half": -2.0,
            "text": "b",
            "at": datetime.datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=datetime.UTC),
            "inner": None,
        },
        {
            "u8": None,
            "u64": Decimal(7),
            "half": None,
            "text": "a",
            "at": datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC),
            "inner": {"u": 65535, "l": []},
        },
    ]
    with filters_pushed(spark, spark_keeps_pushed_reads_apart):
        df = read(spark, service, "odd_types")
        assert [r.u8 for r in df.filter("u8 > 100 AND text = 'a'").collect()] == [255]
        assert [r.text for r in df.filter(f"u64 = {2**64 - 1}").collect()] == ["a"]


def test_a_pushed_filter_on_a_day_spark_moves_at_its_calendar_switch_stays_with_spark(
    spark: Any, service: CoordinatorCluster, spark_keeps_pushed_reads_apart: bool
) -> None:
    """PySpark hands the literal 1582-10-10 to the source as 1582-10-15: pushed, `d = DATE
    '1582-10-10'` kept 10-15's row and `d < DATE '1582-10-10'` kept 10-10's (found by a
    probe against DuckDB and the same read without pushdown)."""
    with filters_pushed(spark, spark_keeps_pushed_reads_apart):
        df = read(spark, service, "calendar_switch")
        assert rows(df.filter("d = DATE '1582-10-10'").select("id")) == [(1,)]
        assert rows(df.filter("d < DATE '1582-10-10'").select("id")) == [(0,)]
        assert rows(df.filter("t = TIMESTAMP '1582-10-10 00:00:00Z'").select("id")) == [(1,)]
        assert rows(df.filter("d >= DATE '1582-10-15'").select("id")) == [(2,)]


def test_a_column_spark_cannot_read_is_named_when_the_dataframe_is_defined(
    spark: Any, service: CoordinatorCluster
) -> None:
    with pytest.raises(Exception, match="column 'span' has type month_day_nano_interval"):
        read(spark, service, "intervals")
    df = read(spark, service, "intervals", columns="n")  # the way out the message gives
    assert rows(df) == [(1,)]


def test_a_dataframe_queried_after_its_query_was_released_reads_a_new_run_of_it(
    spark: Any, service: CoordinatorCluster
) -> None:
    """Spark reads a DataFrame's planned read again in its later queries: once the query was
    released (a minute after it was read), they failed with 'run it again', which only a new
    DataFrame can do (found by a probe). Now each later query reads a new run of it."""
    df = read(spark, service, "numbers", 2)
    assert df.count() == 100
    first = release_all(service)  # as a minute without reads does
    for _ in range(2):
        assert sorted(df.select("n").collect()) == [(n,) for n in range(100)]
        rerun = release_all(service)
        assert rerun.query_id != first.query_id  # (a run of its own)
        assert rerun.status == "finished"
        first = rerun


def test_filters_spark_cannot_push_are_still_applied(
    spark: Any, service: CoordinatorCluster
) -> None:
    df = read(spark, service, "numbers", 2)
    result = rows(df.filter("n % 10 = 3 OR upper(word) = 'W6'").select("n").orderBy("n"))
    assert result == [(n,) for n in range(100) if n % 10 == 3 or n % 7 == 6]


def test_a_retried_spark_task_gets_exactly_the_same_rows(
    spark: Any, service: CoordinatorCluster
) -> None:
    df = read(spark, service, "flaky", "retry-test")  # partition 0 fails once, mid-read
    got = pa.Table.from_pylist([r.asDict() for r in df.collect()])
    want = scan_rows(*SEED)
    key = [("task", "ascending"), ("partition", "ascending")]
    assert got.sort_by(key).to_pylist() == want.sort_by(key).to_pylist()


def test_concurrent_queries_each_get_their_own_session(
    spark: Any, service: CoordinatorCluster
) -> None:
    def tags(tag: str) -> set[str]:
        df = read(spark, service, "tagged", **{"header.x-tag": tag})
        return {row.tag for row in df.select("tag").collect()}

    with ThreadPoolExecutor(3) as pool:
        found = dict(zip("abc", pool.map(tags, "abc"), strict=True))
    assert found == {"a": {"a"}, "b": {"b"}, "c": {"c"}}


@pytest.mark.parametrize(
    ("table", "args", "message"),
    [
        ("scan", [2, "3,1", "2", "4"], r"partition count \(3\) must be a non-zero multiple of"),
        ("scan", [2, "3,x"], "invalid chunk size 'x': not an integer"),
        ("nope", [], "no table 'nope' in this coordinator's catalog"),
    ],
)
def test_bad_reads_fail_clearly(
    spark: Any, service: CoordinatorCluster, table: str, args: list[Any], message: str
) -> None:
    with pytest.raises(Exception, match=message):
        read(spark, service, table, *args).collect()


def test_an_unreachable_coordinator_is_named(spark: Any) -> None:
    reader = spark.read.format("flightfeed").option("uri", "grpc://127.0.0.1:9")
    with pytest.raises(
        Exception, match=r"cannot reach the flightfeed coordinator at grpc://127\.0\.0\.1:9"
    ):
        reader.option("table", "scan").load()


def test_a_spark_python_worker_is_settled_for_reading(spark: Any) -> None:
    """In Spark's own Python workers (reused, as by default) the reader's settling freezes the
    heap, so that the collection pyspark runs after every task skips the modules."""

    def settle(batches: Any) -> Any:
        import gc

        from flightfeed.spark.python_worker import settle_python_worker

        settle_python_worker()
        for _ in batches:
            yield pa.record_batch({"frozen": [gc.get_freeze_count() > 0]})

    rows = spark.range(2, numPartitions=2).mapInArrow(settle, "frozen boolean").collect()
    assert [row.frozen for row in rows] == [True, True]


def test_the_workers_that_create_and_plan_a_read_are_settled_too(
    spark: Any, service: CoordinatorCluster
) -> None:
    """Creating the source and planning a read run in Python workers of other kinds, which
    pyspark's daemons also collect in full after every command: flightfeed's source settles
    them too. A probe source read after a flightfeed read finds both heaps frozen."""
    from pyspark.sql.datasource import DataSource, DataSourceReader

    class ProbeReader(DataSourceReader):
        def __init__(self, created: bool) -> None:
            import gc

            self.created = created
            self.planned = gc.get_freeze_count() > 0  # (in the worker that plans the read)

        def read(self, partition: Any) -> Any:
            yield (self.created, self.planned)

    class HeapProbe(DataSource):
        @classmethod
        def name(cls) -> str:
            return "flightfeed_test_heap_probe"

        def schema(self) -> str:
            import gc

            self.created = gc.get_freeze_count() > 0  # (in the worker that creates the source)
            return "created boolean, planned boolean"

        def reader(self, schema: Any) -> DataSourceReader:
            return ProbeReader(self.created)

    spark.dataSource.register(HeapProbe)
    assert len(rows(read(spark, service, "numbers"))) == NUMBERS.num_rows
    assert rows(spark.read.format(HeapProbe.name()).load()) == [(True, True)]


def mapped_reads(service: CoordinatorCluster) -> int:
    return sum(worker.state.shared_memory.mapped for worker in service.workers)


def test_the_python_workers_later_reads_reuse_their_segments(
    spark: Any, service: CoordinatorCluster
) -> None:
    """Spark reuses its Python workers, and each keeps the segments it mapped: its later reads
    of the same worker get the same segment again, no new file or page."""

    def reused() -> int:
        return sum(worker.state.shared_memory.reused for worker in service.workers)

    before, mapped_before = reused(), mapped_reads(service)
    for _ in range(4):
        assert len(read(spark, service, "scan", *SEED).collect()) == len(scan_rows(*SEED))
    assert mapped_reads(service) > mapped_before
    assert reused() > before


def test_workers_on_the_readers_host_hand_batches_over_in_shared_memory(
    spark: Any, service: CoordinatorCluster
) -> None:
    """The workers are on loopback: every partition's batches come through shared memory (the
    Python workers map each read's segment), the same rows as through the socket."""
    expected = scan_rows(*SEED).sort_by([("task", "ascending"), ("partition", "ascending")])
    before = mapped_reads(service)
    shared = read(spark, service, "scan", *SEED).toArrow()
    partitions = read(spark, service, "scan", *SEED).rdd.getNumPartitions()
    assert mapped_reads(service) - before == partitions
    streamed = read(spark, service, "scan", *SEED, sharedMemory="false").toArrow()
    assert mapped_reads(service) - before == partitions  # through the socket: none mapped
    for table in (shared, streamed):
        got = table.select(expected.column_names)
        assert got.sort_by([("task", "ascending"), ("partition", "ascending")]).to_pylist() == (
            expected.to_pylist()
        )
