"""Latency of the seeds' example query on 4 workers over loopback: p50 and p99.

The query is the seed's `SELECT count(*) AS cnt, task FROM scan(2, '3,1', '2', '4', '1,1')
GROUP BY task`: a work-unit feed (flightfeed.examples.chunk_scan) of 4 partitions over 2 tasks,
their rows coalesced and counted on the coordinator. The workers are 4 real `flightfeed worker`
processes on loopback; this process runs the Coordinator and sends one query at a time, so each
latency is one query's whole life: planning, SetPlan to its tasks, the feed's units streamed
under credits, ExecuteTask, the final aggregate, the tasks' metrics.

The reference is the same plan run in this process (`collect` in a task context, the provider
feeding the scan directly), timed the same way.

RESULT: the distributed p50 in ms, the ratio target/p50 (≥ 1 meets the 5 ms target); the p99
and the ratio to one-process execution are printed above it.

Run: python benchmarks/query_latency.py [--queries 500] [--workers 4] [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import result_line, worker_process_pid

from flightfeed.coordinator import Coordinator, StaticWorkerResolver
from flightfeed.examples.chunk_scan import (
    RemoteScan,
    RemoteScanEstimator,
    chunk_coordinator_session,
    chunk_feed_registry,
    scan,
)
from flightfeed.plan import (
    Coalesce,
    ExecutionPlan,
    HashAggregate,
    agg,
    col,
    collect,
    open_task_context,
)

SESSION_BUILDER = "flightfeed.examples.chunk_scan:chunk_session_builder"
TARGET_P50_MS = 5.0
EXPECTED = {0: 6, 1: 6}


def seed_query() -> ExecutionPlan:
    """SELECT count(*) AS cnt, task FROM scan(2, '3,1', '2', '4', '1,1') GROUP BY task."""
    source = scan(2, "3,1", "2", "4", "1,1")
    return HashAggregate(Coalesce(source), [(col("task"), "task")], [agg("count", name="cnt")])


def check(rows: dict[str, list[int]]) -> None:
    found = dict(zip(rows["task"], rows["cnt"], strict=True))
    if found != EXPECTED:
        raise AssertionError(f"wrong answer: {found}")


async def timed(run: Callable[[], Awaitable[None]], count: int) -> list[float]:
    """Milliseconds of `count` runs, one after the other (after 20 unmeasured ones)."""
    for _ in range(20):
        await run()
    out = []
    for _ in range(count):
        started = time.perf_counter()
        await run()
        out.append((time.perf_counter() - started) * 1e3)
    return out


async def measure(urls: list[str], count: int) -> tuple[list[float], list[float], str]:
    session = chunk_coordinator_session()

    async def local() -> None:
        async with open_task_context(session) as ctx:
            check((await collect(seed_query(), ctx)).to_pydict())

    async with Coordinator(
        StaticWorkerResolver(urls),
        session=session,
        feed_registry=chunk_feed_registry(),
        task_estimators={RemoteScan.name: RemoteScanEstimator()},
    ) as coordinator:

        async def distributed() -> None:
            check((await coordinator.collect(seed_query())).to_pydict())

        plan = await coordinator.explain(seed_query())
        # Alternate in blocks so both see the same machine state.
        on_workers: list[float] = []
        in_process: list[float] = []
        for _ in range(5):
            on_workers += await timed(distributed, count // 5)
            in_process += await timed(local, count // 5)
    return on_workers, in_process, plan


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


def main() -> None:
    from flightfeed.flight.tuning import run

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=500, help="measured queries per side")
    parser.add_argument("--workers", type=int, default=4, help="flightfeed worker processes")
    parser.add_argument("--quick", action="store_true", help="100 queries: a smoke run")
    args = parser.parse_args()
    count = 100 if args.quick else args.queries
    with contextlib.ExitStack() as stack:
        urls = [
            stack.enter_context(worker_process_pid(SESSION_BUILDER))[0] for _ in range(args.workers)
        ]
        on_workers, in_process, plan = run(lambda: measure(urls, count))
    print(plan)
    p50, p99 = statistics.median(on_workers), percentile(on_workers, 99)
    local_p50, local_p99 = statistics.median(in_process), percentile(in_process, 99)
    print(
        f"{len(on_workers)} queries on {args.workers} workers: p50 {p50:.2f} ms, p99 {p99:.2f} ms;"
        f" in one process: p50 {local_p50:.2f} ms, p99 {local_p99:.2f} ms"
        f" (distributed/one-process p50: {p50 / local_p50:.1f}x)"
    )
    print(result_line("query_latency_p50", p50, "ms", TARGET_P50_MS / p50, 1))


if __name__ == "__main__":
    main()
