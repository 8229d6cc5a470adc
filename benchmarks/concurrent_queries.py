"""Many small feed queries at once: queries/s and CPU per work unit at 1, 10, 100 and 1,000.

The query is the tracker's finding (issue 14): a feed-backed scan (flightfeed.examples.
chunk_scan) of 8 partitions x 20 work units of 100 rows over 2 tasks, a partial aggregation
on the workers and the final one on the coordinator (count and sum per task). The workers are
real `flightfeed worker` processes (2 by default); this process runs the Coordinator.

For each concurrency C, C clients each run queries back to back until the level's quota is
done. CPU per unit is the CPU seconds of this process and of every worker process over the
level, divided by the work units the queries read (160 each): what one 100-row unit costs
end to end, provider to aggregate. A level that does not finish within `--timeout` is
reported with the queries it completed (a hang, not a number).

The CPU per unit of a level is the query's whole cost divided by its 160 units, so it holds
what a query costs whatever its size (planning, four gRPC streams, a partial aggregate and its
metrics per partition). The cost split separates the two at one client: rounds of the query
alternate with the same query at LONG_UNITS_PER_PARTITION units a partition, and the
difference in CPU per query over the difference in units is what one more work unit costs
(marginal); the rest is the query's fixed cost.

RESULT lines: queries/s at the highest concurrency, with the ratio to the 1-query rate of the
same run (concurrency should add throughput, never lose it: target ≥ 1); the CPU per unit
at the highest concurrency, with the ratio target/value (≥ 1 meets the 100 µs target); and
the marginal CPU of a work unit, with the same ratio.

Run: python benchmarks/concurrent_queries.py [--quick] [--levels 1,10,100,1000] [--workers 2]
     [--split-rounds 6]
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import anyio
from _common import process_cpu_seconds, result_line, worker_process_pid

from flightfeed.coordinator import Coordinator, StaticWorkerResolver
from flightfeed.examples.chunk_scan import (
    RemoteScan,
    RemoteScanEstimator,
    chunk_coordinator_session,
    chunk_feed_registry,
    scan,
)
from flightfeed.plan import AggregateMode, Coalesce, ExecutionPlan, HashAggregate, agg, col

SESSION_BUILDER = "flightfeed.examples.chunk_scan:chunk_session_builder"
PARTITIONS = 8
UNITS_PER_PARTITION = 20
ROWS_PER_UNIT = 100
TASKS = 2
UNITS_PER_QUERY = PARTITIONS * UNITS_PER_PARTITION
CPU_TARGET_US = 100.0
QUOTA = {1: 200, 10: 400, 100: 500, 1000: 2000}
"""Queries per level: a few seconds each, so that one noisy second of a shared machine does not
decide a level (40 queries at 1 client took half a second and varied by a third)."""
QUICK_QUOTA = {1: 10, 10: 40, 100: 200, 1000: 1000}
LONG_UNITS_PER_PARTITION = 4 * UNITS_PER_PARTITION
SPLIT_QUERIES_PER_ROUND = 25
"""Queries of each size a round of the cost split: rounds alternate the sizes, so that a drift
in the machine's speed falls on both."""


def query(units_per_partition: int = UNITS_PER_PARTITION) -> ExecutionPlan:
    """count(*) and sum(partition) per task, partial on the workers, final here."""
    chunks = ",".join([str(ROWS_PER_UNIT)] * units_per_partition)
    source = scan(TASKS, *[chunks] * PARTITIONS)
    keys = [(col("task"), "task")]
    aggregates = [agg("count", name="cnt"), agg("sum", col("partition"), name="total")]
    partial = HashAggregate(source, keys, aggregates, mode=AggregateMode.PARTIAL)
    return HashAggregate(Coalesce(partial), keys, aggregates, mode=AggregateMode.FINAL)


@dataclass
class Level:
    concurrency: int
    queries: int
    completed: int
    seconds: float
    cpu_seconds: float
    coordinator_cpu: float
    timed_out: bool

    @property
    def rate(self) -> float:
        return self.completed / self.seconds if self.seconds else 0.0

    @property
    def cpu_per_unit_us(self) -> float:
        units = self.completed * UNITS_PER_QUERY
        return self.cpu_seconds / units * 1e6 if units else float("inf")

    @property
    def coordinator_cpu_per_unit_us(self) -> float:
        """This process's share of `cpu_per_unit_us` (the rest is the workers')."""
        units = self.completed * UNITS_PER_QUERY
        return self.coordinator_cpu / units * 1e6 if units else float("inf")


def coordinator(urls: list[str], max_concurrent: int | None) -> Coordinator:
    options: dict[str, Any] = {
        "session": chunk_coordinator_session(),
        "feed_registry": chunk_feed_registry(),
        "task_estimators": {RemoteScan.name: RemoteScanEstimator()},
    }
    if max_concurrent is not None:
        options["max_concurrent_queries"] = max_concurrent or None
    return Coordinator(StaticWorkerResolver(urls), **options)


async def run_one(c: Coordinator, units_per_partition: int = UNITS_PER_PARTITION) -> None:
    table = await c.collect(query(units_per_partition))
    counts = table.column("cnt").to_pylist()
    expected_rows = PARTITIONS * units_per_partition * ROWS_PER_UNIT // TASKS
    if len(counts) != TASKS or any(n != expected_rows for n in counts):
        raise AssertionError(f"wrong result: {table.to_pydict()}")


@dataclass
class CostSplit:
    fixed_us: float
    """CPU of a query apart from its work units, all processes."""
    marginal_us: float
    """CPU of one more 100-row work unit, end to end."""


async def cost_split(c: Coordinator, pids: list[int], rounds: int) -> CostSplit:
    """One client's CPU per query at two query sizes, in alternating rounds (module doc)."""
    sizes = (UNITS_PER_PARTITION, LONG_UNITS_PER_PARTITION)
    cpu = dict.fromkeys(sizes, 0.0)
    for _ in range(rounds):
        for units in sizes:
            before = time.process_time() + sum(process_cpu_seconds(p) for p in pids)
            for _ in range(SPLIT_QUERIES_PER_ROUND):
                await run_one(c, units)
            after = time.process_time() + sum(process_cpu_seconds(p) for p in pids)
            cpu[units] += after - before
    queries = rounds * SPLIT_QUERIES_PER_ROUND
    short, long = (cpu[units] / queries * 1e6 for units in sizes)
    marginal = (long - short) / ((sizes[1] - sizes[0]) * PARTITIONS)
    return CostSplit(fixed_us=short - marginal * UNITS_PER_QUERY, marginal_us=marginal)


async def run_level(
    c: Coordinator, pids: list[int], concurrency: int, total: int, limit_seconds: float
) -> Level:
    remaining = [total]
    done = [0]

    async def client() -> None:
        while remaining[0] > 0:
            remaining[0] -= 1
            await run_one(c)
            done[0] += 1

    cpu_before = time.process_time(), [process_cpu_seconds(pid) for pid in pids]
    started = time.perf_counter()
    with anyio.move_on_after(limit_seconds) as scope:
        async with anyio.create_task_group() as tg:
            for _ in range(min(concurrency, total)):
                tg.start_soon(client)
    elapsed = time.perf_counter() - started
    own = time.process_time() - cpu_before[0]
    workers = sum(process_cpu_seconds(p) - b for p, b in zip(pids, cpu_before[1], strict=True))
    return Level(concurrency, total, done[0], elapsed, own + workers, own, scope.cancel_called)


async def measure(
    urls: list[str],
    pids: list[int],
    levels: list[int],
    quota: dict[int, int],
    limit_seconds: float,
    max_concurrent: int | None,
    split_rounds: int,
) -> tuple[list[Level], CostSplit | None]:
    out = []
    async with coordinator(urls, max_concurrent) as c:
        for _ in range(5):  # warm up: connections, imports, caches
            await run_one(c)
        split = await cost_split(c, pids, split_rounds) if split_rounds else None
        for level in levels:
            result = await run_level(c, pids, level, quota.get(level, level), limit_seconds)
            out.append(result)
            note = " TIMED OUT" if result.timed_out else ""
            print(
                f"  {level:>5} concurrent: {result.completed}/{result.queries} queries in"
                f" {result.seconds:.2f} s{note}",
                flush=True,
            )
            if result.timed_out:
                break  # the coordinator may hold stuck queries: later levels would mislead
    return out, split


def main() -> None:
    from flightfeed.flight.tuning import run

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller quotas: a smoke run")
    parser.add_argument("--levels", default="1,10,100,1000", help="concurrencies to measure")
    parser.add_argument("--workers", type=int, default=2, help="flightfeed worker processes")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per level")
    parser.add_argument(
        "--max-concurrent-queries",
        type=int,
        default=None,
        help="the coordinator's admission limit (default: the Coordinator's own; 0: none)",
    )
    parser.add_argument(
        "--split-rounds",
        type=int,
        default=6,
        help="rounds of the one-client cost split (0: skip it; --quick: 2)",
    )
    args = parser.parse_args()
    split_rounds = min(args.split_rounds, 2) if args.quick else args.split_rounds
    levels = [int(level) for level in args.levels.split(",")]
    quota = QUICK_QUOTA if args.quick else QUOTA
    print(
        f"query: {PARTITIONS} partitions x {UNITS_PER_PARTITION} units of {ROWS_PER_UNIT} rows,"
        f" {TASKS} tasks, partial + final aggregate; {args.workers} worker processes"
    )
    with contextlib.ExitStack() as stack:
        workers = [
            stack.enter_context(worker_process_pid(SESSION_BUILDER)) for _ in range(args.workers)
        ]
        urls, pids = [url for url, _ in workers], [pid for _, pid in workers]
        results, split = run(
            lambda: measure(
                urls, pids, levels, quota, args.timeout, args.max_concurrent_queries, split_rounds
            )
        )
    print(
        f"{'concurrent':>10} {'queries':>9} {'seconds':>8} {'queries/s':>10} {'CPU µs/unit':>12}"
        f" {'coordinator':>12}"
    )
    for r in results:
        done = f"{r.completed}/{r.queries}"
        cpu = f"{r.cpu_per_unit_us:.0f}"
        own = f"{r.coordinator_cpu_per_unit_us:.0f}"
        print(
            f"{r.concurrency:>10} {done:>9} {r.seconds:>8.2f} {r.rate:>10.1f} {cpu:>12} {own:>12}"
        )
    base = results[0].rate
    top = results[-1]
    finished = not top.timed_out and top.concurrency == levels[-1]
    rate = top.rate if finished else 0.0
    print(
        result_line(f"concurrent_queries_rate_at_{levels[-1]}", rate, "queries/s", rate / base, 1)
    )
    cpu_us = top.cpu_per_unit_us if finished else float("inf")
    print(
        result_line(
            f"concurrent_queries_cpu_per_unit_at_{levels[-1]}",
            cpu_us,
            "us/unit",
            CPU_TARGET_US / cpu_us,
            1,
        )
    )
    if split is not None:
        print(
            f"cost split at 1 client ({UNITS_PER_QUERY} and {LONG_UNITS_PER_PARTITION * PARTITIONS}"
            f" units a query): {split.fixed_us / 1e3:.2f} ms of CPU a query apart from its"
            f" units, {split.marginal_us:.1f} µs a unit"
        )
        print(
            result_line(
                "concurrent_queries_marginal_cpu_per_unit",
                split.marginal_us,
                "us/unit",
                CPU_TARGET_US / split.marginal_us if split.marginal_us > 0 else float("inf"),
                1,
            )
        )


if __name__ == "__main__":
    main()
