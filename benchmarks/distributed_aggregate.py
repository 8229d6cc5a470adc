"""A group-by over Parquet on two flightfeed workers, against Acero in one process.

The data: `--rows` rows (50 million by default) of `k` (int64, 1,000 groups) and `v` (double)
in 8 Parquet files of 1M-row row groups, written once into a temporary directory.

- flightfeed: `plan_from(ParquetScan).aggregate(["k"], [sum(v), count()])` through an embedded
  Coordinator over `--workers` `flightfeed worker` processes (each with `--parquet-root` on the
  data): each task scans its row groups and aggregates them partially, the states are shuffled
  by key to a final aggregate's tasks on the same workers, and the coordinator gathers the groups;
- reference: the same aggregate with pyarrow.acero in this process (a dataset scan, then
  `Table.group_by`), using every core as Acero does.

Rounds alternate the two; the RESULT ratio is the median reference time over the median
flightfeed time (a throughput ratio, target ≥ 0.8). Both answers are checked equal.

Run: python benchmarks/distributed_aggregate.py [--rows 50000000] [--rounds 7] [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
from _common import median, parquet_worker_urls, result_line, write_key_value_parquet

from flightfeed.coordinator import Coordinator, StaticWorkerResolver
from flightfeed.plan import ExecutionPlan, ParquetScan, agg, col, plan_from

TARGET = 0.8
FILES = 8
GROUPS = 1000
ROW_GROUP = 1_000_000


def write_data(root: Path, rows: int) -> None:
    write_key_value_parquet(root, rows, files=FILES, keys=GROUPS, row_group=ROW_GROUP, seed=11)


def reference(root: Path) -> pa.Table:
    table = ds.dataset(str(root), format="parquet").to_table(columns=["k", "v"])
    grouped = table.group_by("k").aggregate([("v", "sum"), ("v", "count")])
    return grouped.rename_columns(["k", "total", "n"]).sort_by("k")


def query(root: Path) -> ExecutionPlan:
    scan = ParquetScan.from_paths(str(root), partitions=FILES)
    aggregates = [agg("sum", col("v"), name="total"), agg("count", name="n")]
    return plan_from(scan).aggregate(["k"], aggregates).plan


async def flightfeed_run(coordinator: Coordinator, root: Path) -> pa.Table:
    result = await coordinator.collect(query(root))
    return result.select(["k", "total", "n"]).sort_by("k")


def same(a: pa.Table, b: pa.Table) -> bool:
    return (
        a.column("k").to_pylist() == b.column("k").to_pylist()
        and a.column("n").to_pylist() == b.column("n").to_pylist()
        and bool(np.allclose(a.column("total").to_numpy(), b.column("total").to_numpy()))
    )


def main() -> None:
    from flightfeed.flight.tuning import run

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=50_000_000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="5 million rows, 2 rounds")
    args = parser.parse_args()
    rows, rounds = (5_000_000, 2) if args.quick else (args.rows, args.rounds)
    with contextlib.ExitStack() as stack:
        root = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        started = time.perf_counter()
        write_data(root, rows)
        print(f"{rows:,} rows in {FILES} files written in {time.perf_counter() - started:.1f} s")
        urls = parquet_worker_urls(stack, root, args.workers)

        async def measure() -> tuple[list[float], list[float]]:
            ours: list[float] = []
            theirs: list[float] = []
            async with Coordinator(StaticWorkerResolver(urls)) as coordinator:
                explained = await coordinator.explain(query(root))
                print(next(line for line in explained.splitlines() if line.startswith("Stage")))
                expected = reference(root)
                if not same(await flightfeed_run(coordinator, root), expected):  # warm-up
                    raise AssertionError("flightfeed and Acero disagree")
                for _ in range(rounds):
                    began = time.perf_counter()
                    await flightfeed_run(coordinator, root)
                    ours.append(time.perf_counter() - began)
                    began = time.perf_counter()
                    reference(root)
                    theirs.append(time.perf_counter() - began)
            return ours, theirs

        ours, theirs = run(measure)
    ff, acero = median(ours), median(theirs)
    print(f"flightfeed on {args.workers} workers: {ff:.2f} s   Acero in process: {acero:.2f} s")
    print(result_line("distributed_aggregate", rows / ff, "rows/s", acero / ff, TARGET))


if __name__ == "__main__":
    main()
