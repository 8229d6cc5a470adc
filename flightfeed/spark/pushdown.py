"""Whether Spark may push filters into flightfeed's reads: only where it keeps a pushed read to
the query that pushed it.

Spark 4.x, up to 4.3.0 at least, stores the read that a filter pushdown planned (the reader with
its filters, and its partitions) on the DataFrame's data source object, which every query of
that DataFrame shares. A later query of the same DataFrame without a filter does not push, and
reuses that read: `df.filter("n = 3").count()` then `df.count()` counts 1 row, not 10. It does
so for any Python data source, and Python has no hook to notice. Newer Spark keeps the read in
the scan that planned it.

So `register` decides by running that pair of queries once, on a data source of ten rows
(`filters_stay_with_their_query`), whatever Spark's version says: where Spark keeps reads
apart, it registers `FlightfeedPushdownSource` and turns pushdown on; where it reuses them, the
plain `FlightfeedDataSource`, whose reads carry no filter (Spark runs them all), and the
answers are right either way.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any, Final

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSource, DataSourceReader, EqualTo, Filter, InputPartition

FILTER_PUSHDOWN: Final = "spark.sql.python.filterPushdown.enabled"
PROBE_SOURCE: Final = "flightfeed_pushdown_probe"
PROBE_ROWS: Final = 10
PROBE_VALUE: Final = 3


class PushdownProbe(DataSource):
    """Ten rows, `n` from 0 to 9; its reader pushes `n = value`. Spark's Python workers unpickle
    it from this module."""

    @classmethod
    def name(cls) -> str:
        return PROBE_SOURCE

    def schema(self) -> str:
        return "n bigint"

    def reader(self, schema: Any) -> DataSourceReader:
        return _ProbeReader()


class _ProbeReader(DataSourceReader):
    def __init__(self) -> None:
        self.wanted: int | None = None

    def pushFilters(self, filters: list[Filter]) -> Iterator[Filter]:
        self.wanted = None
        for f in filters:
            if isinstance(f, EqualTo) and f.attribute == ("n",) and isinstance(f.value, int):
                self.wanted = f.value
            else:
                yield f

    def partitions(self) -> Sequence[InputPartition]:
        return [InputPartition(self.wanted)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        batch = pa.record_batch({"n": pa.array(range(PROBE_ROWS), pa.int64())})
        if partition.value is not None:
            batch = batch.filter(pc.equal(batch.column("n"), partition.value))
        yield batch


def filters_stay_with_their_query(spark: Any) -> bool:
    """Run a filtered query, then the same DataFrame unfiltered, with pushdown on: True if the
    second gets every row (this Spark keeps a pushed read to its query)."""
    spark.dataSource.register(PushdownProbe)
    with session_setting(spark, FILTER_PUSHDOWN, "true"):
        df = spark.read.format(PROBE_SOURCE).load()
        filtered = [row.n for row in df.filter(f"n = {PROBE_VALUE}").collect()]
        everything = sorted(row.n for row in df.collect())
    return filtered == [PROBE_VALUE] and everything == list(range(PROBE_ROWS))


def pushdown_enabled(spark: Any) -> bool:
    return str(spark.conf.get(FILTER_PUSHDOWN, "false")).lower() == "true"


def turn_pushdown_on(spark: Any) -> None:
    """Written only when it is off: a Declarative Pipeline forbids session changes in its
    transformation files. Never turned off here: the session's other Python data sources may
    push filters, and pyspark refuses their readers while it is off."""
    if not pushdown_enabled(spark):
        spark.conf.set(FILTER_PUSHDOWN, "true")


@contextlib.contextmanager
def session_setting(spark: Any, key: str, value: str) -> Iterator[None]:
    """`key` set to `value` for the block, then as it was (unset if it was)."""
    before = spark.conf.get(key, None)
    spark.conf.set(key, value)
    try:
        yield
    finally:
        if before is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, before)
