"""Latency of the seeds' example query on 4 workers over loopback: p50 and p99.

The query is the seed's `SELECT count(*) AS cnt, task FROM scan(2, '3,1', '2', '4', '1,1')
GROUP BY task`: a work-unit feed (flightfeed.examples.chunk_scan) of 4 partitions over 2 tasks,
their rows coalesced and counted on the coordinator. The workers are 4 real `flightfeed worker`
processes on loopback; this process runs the Coordinator and sends one query at a time, so each
latency is one query's whole life: planning, SetPlan to its tasks, the feed's units streamed
under credits, ExecuteTask, the final aggregate, the tasks' metrics.

The reference is the same plan run in this process (`collect` in a task context, the provider
feeding the scan directly), timed the same way. A third measurement splits the distributed cost:
the same coordinator and plan over 4 in-process workers (`start_cluster(in_process=True)`: the
same task machinery, channels of memory instead of gRPC), so what the network stack adds is
the difference between the two.

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
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import result_line, worker_process_pid

from flightfeed.coordinator import Coordinator, StaticWorkerResolver
from flightfeed.examples.chunk_scan import (
    RemoteScan,
    RemoteScanEstimator,
    chunk_coordinator_session,
    chunk_feed_registry,
    chunk_session_builder,
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
from flightfeed.testing import start_cluster

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


def coordinator_options() -> dict[str, Any]:
    return {
        "session": chunk_coordinator_session(),
        "feed_registry": chunk_feed_registry(),
        "task_estimators": {RemoteScan.name: RemoteScanEstimator()},
    }


async def measure(urls: list[str], count: int) -> tuple[dict[str, list[float]], str]:
    """Milliseconds per query of each way, alternated in blocks so that all see the same
    machine state; and the distributed plan as explained."""
    session = chunk_coordinator_session()

    async def local() -> None:
        async with open_task_context(session) as ctx:
            check((await collect(seed_query(), ctx)).to_pydict())

    async with (
        Coordinator(StaticWorkerResolver(urls), **coordinator_options()) as coordinator,
        start_cluster(
            len(urls),
            session_builder=chunk_session_builder,
            in_process=True,
            **coordinator_options(),
        ) as (in_memory, _),
    ):
        ways: dict[str, Callable[[], Awaitable[None]]] = {
            "on workers": partial(run_query, coordinator),
            "in-process workers": partial(run_query, in_memory),
            "one process": local,
        }
        plan = await coordinator.explain(seed_query())
        times: dict[str, list[float]] = {name: [] for name in ways}
        for _ in range(5):
            for name, way in ways.items():
                times[name] += await timed(way, count // 5)
    return times, plan


async def run_query(coordinator: Coordinator) -> None:
    check((await coordinator.collect(seed_query())).to_pydict())


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
        times, plan = run(lambda: measure(urls, count))
    print(plan)
    on_workers, one_process = times["on workers"], times["one process"]
    no_network = times["in-process workers"]
    p50, p99 = statistics.median(on_workers), percentile(on_workers, 99)
    local_p50, local_p99 = statistics.median(one_process), percentile(one_process, 99)
    print(
        f"{len(on_workers)} queries on {args.workers} workers: p50 {p50:.2f} ms, p99 {p99:.2f} ms;"
        f" in one process: p50 {local_p50:.2f} ms, p99 {local_p99:.2f} ms"
        f" (distributed/one-process p50: {p50 / local_p50:.1f}x)"
    )
    print(
        f"the same on {args.workers} in-process workers (no network): p50"
        f" {statistics.median(no_network):.2f} ms, p99 {percentile(no_network, 99):.2f} ms"
    )
    print(result_line("query_latency_p50", p50, "ms", TARGET_P50_MS / p50, 1))


if __name__ == "__main__":
    main()
