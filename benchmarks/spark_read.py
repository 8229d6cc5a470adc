"""Spark reading a flightfeed table, against the ceiling of Spark's Python data source path.

One dataset (flightfeed.testing.rows: id, x, bucket, name), three ways into Spark, each
materialized in full with the `noop` sink (every column reaches the JVM, nothing is written):

- flightfeed: `spark.read.format("flightfeed")` from a coordinator whose table is a
  GeneratedRows leaf on two `flightfeed worker` processes (`--in-process`: two workers in the
  driver's process); each Spark task reads its endpoint from its worker over Flight;
- ceiling: a Python data source whose reader yields the same batches straight from memory
  (each Python worker generates the whole dataset once and keeps it). Spark's
  Python-worker→JVM path is the same for both, so this is the best any Python data source can
  do. It settles its Python workers as flightfeed's source does (spark/python_worker.py: the heap
  frozen out of the collection pyspark runs after every task or planning command, malloc
  tuned), in the workers that plan a read as in those that read, so that the two differ in
  what they read, not in how their workers are tuned;
- Parquet: `spark.read.parquet` over the same rows in files (the JVM's own vectorized reader).

Each round reads once with each reader, in an order that rotates from round to round, after
warm-up reads that fill every process's cache. Throughput is the dataset's Arrow size over the
median time of a read; the ratios are medians of per-round paired ratios, which keep a 2-core
machine's scheduling noise out of the comparison. The RESULT ratio is flightfeed / ceiling
(target ≥ 0.9); the ratio to Parquet is printed too.

Run: python benchmarks/spark_read.py [--rows 8000000] [--partitions 4] [--rounds 9]
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pyarrow as pa
import pyarrow.parquet as pq
from _common import median, result_line, worker_process
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from flightfeed.cluster import serve_in_background
from flightfeed.spark.python_worker import settle_python_worker
from flightfeed.testing.rows import ROWS_SCHEMA, catalog, generated_partition, generated_table

TARGET = 0.9


class MemoryRowsReader(DataSourceReader):
    """The ceiling: the same batches as the flightfeed table, from this Python worker's memory."""

    def __init__(self, rows: int, partitions: int) -> None:
        self.rows = rows
        self.partitions_count = partitions

    def partitions(self) -> Sequence[InputPartition]:
        return [InputPartition(index) for index in range(self.partitions_count)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        settle_python_worker()  # as flightfeed's reader does: the same worker, tuned alike
        for index in range(self.partitions_count):  # the whole dataset, once per process
            generated_partition(self.rows, self.partitions_count, index)
        yield from generated_partition(self.rows, self.partitions_count, partition.value)


class MemoryRows(DataSource):
    @classmethod
    def name(cls) -> str:
        return "generated_rows_in_memory"

    def schema(self) -> str:
        settle_python_worker()  # planning runs in reused Python workers too: tuned alike
        return "id bigint not null, x double not null, bucket bigint not null, name string not null"

    def reader(self, schema: Any) -> DataSourceReader:
        settle_python_worker()
        return MemoryRowsReader(int(self.options["rows"]), int(self.options["partitions"]))


def time_read(load: Callable[[], Any]) -> float:
    started = time.perf_counter()
    load().write.format("noop").mode("overwrite").save()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=8_000_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--workers", type=int, default=2, help="flightfeed worker processes")
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="run the workers in the driver's process, as serve_in_background(local_workers=)",
    )
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args()

    from flightfeed.spark import local_session

    size = generated_table(args.rows, args.partitions).nbytes
    print(f"{args.rows:,} rows, {size / 1e6:.0f} MB as Arrow, {args.partitions} partitions")
    with contextlib.ExitStack() as stack:
        if args.in_process:
            cluster = stack.enter_context(serve_in_background(catalog, local_workers=args.workers))
        else:
            workers = [
                stack.enter_context(worker_process("flightfeed.testing.rows:worker_session"))
                for _ in range(args.workers)
            ]
            cluster = stack.enter_context(serve_in_background(catalog, workers=workers))
        parquet_dir = stack.enter_context(tempfile.TemporaryDirectory())
        for index in range(args.partitions):
            batches = generated_partition(args.rows, args.partitions, index)
            pq.write_table(
                pa.Table.from_batches(batches, ROWS_SCHEMA), f"{parquet_dir}/{index}.parquet"
            )
        spark = local_session("spark_read", master=args.master)
        spark.dataSource.register(MemoryRows)
        readers: dict[str, Callable[[], Any]] = {
            "flightfeed": lambda: (
                spark.read.format("flightfeed")
                .option("uri", cluster.location)
                .option("table", "generated")
                .option("args", f"[{args.rows}, {args.partitions}]")
                .load()
            ),
            "ceiling": lambda: (
                spark.read.format(MemoryRows.name())
                .option("rows", args.rows)
                .option("partitions", args.partitions)
                .load()
            ),
            "parquet": lambda: spark.read.parquet(parquet_dir),
        }
        try:
            for name, load in readers.items():  # each reader returns every row, once
                assert load().count() == args.rows, name
            for _ in range(args.warmup):
                for load in readers.values():
                    time_read(load)
            times: dict[str, list[float]] = {name: [] for name in readers}
            names = list(readers)
            for round_index in range(args.rounds):
                shift = round_index % len(names)
                for name in names[shift:] + names[:shift]:
                    times[name].append(time_read(readers[name]))
        finally:
            spark.stop()

    rate = {name: size / median(values) / 1e6 for name, values in times.items()}
    for name, values in times.items():
        rounds = " ".join(f"{v:.2f}" for v in values)
        print(f"{name:>10}: {rate[name]:7.1f} MB/s  (median of {rounds} s)")
    ff = times["flightfeed"]
    to_ceiling = median([c / f for c, f in zip(times["ceiling"], ff, strict=True)])
    to_parquet = median([p / f for p, f in zip(times["parquet"], ff, strict=True)])
    print(f"flightfeed / ceiling: {to_ceiling:.3f}   flightfeed / parquet: {to_parquet:.3f}")
    print(
        result_line(
            "spark_read_ff_vs_python_source", rate["flightfeed"], "MB/s", to_ceiling, TARGET
        )
    )


if __name__ == "__main__":
    main()
