"""Load: 10,000 sequential small feed queries, then 1,000 concurrent ones, on 3 worker processes.

The coordinator runs in this process over 3 `flightfeed worker` processes. Each concurrent
query holds its feed open until all 1,000 have started (flightfeed.testing.load.burst), so
they are all in flight at once. Snapshots before and after each phase check that everything
completed and nothing leaked: no task state or plan waiters left on the workers, event-loop
tasks and open files back where they were (within a few, for connections still closing), and
resident memory grown by less than 10%. The warm-up ends with one burst of the same size
(`--warmup-burst`): the allocator keeps a burst's peak working set resident (flightfeed raises
glibc's trim threshold to 1 GiB), so growth is measured from there; the warm-up's own growth
is printed too.

Run: python benchmarks/load_test.py [--sequential 10000] [--concurrent 1000] [--workers 3]
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import anyio
from _common import result_line, worker_process_pid

from flightfeed.coordinator import Coordinator, StaticWorkerResolver
from flightfeed.flight.idle_release import DEFAULT_QUIET_SECONDS
from flightfeed.testing.feeds import unit_coordinator_options
from flightfeed.testing.load import Snapshot, burst, sequential, snapshot

SESSION_BUILDER = "flightfeed.testing.feeds:unit_session_builder"
RSS_GROWTH_LIMIT = 0.10
SETTLE_SECONDS = DEFAULT_QUIET_SECONDS + 1.0
"""Quiet time before the last snapshot: processes hand freed memory back after
DEFAULT_QUIET_SECONDS without queries (flight/idle_release.py)."""
SLACK = 8
"""Event-loop tasks and open files a snapshot may differ by without a leak (calls and
connections still closing); a leak grows with the queries, by hundreds here."""


def show(label: str, snap: Snapshot) -> None:
    print(
        f"{label}: coordinator rss={snap.resident_bytes / 1e6:.1f} MB fds={snap.open_files}"
        f" loop tasks={snap.event_loop_tasks} running={snap.running_queries}"
        f" queued={snap.queued_queries} connections={snap.connections}"
    )
    for w in snap.workers:
        print(
            f"    {w.url}: rss={w.resident_bytes / 1e6:.1f} MB fds={w.open_files}"
            f" loop tasks={w.event_loop_tasks} tasks={w.tasks} plan waiters={w.plan_waiters}"
        )


def check(before: Snapshot, after: Snapshot) -> list[str]:
    """What leaked between two snapshots (empty: nothing)."""
    problems = []
    if after.running_queries or after.queued_queries:
        problems.append(f"coordinator: {after.running_queries} running, {after.queued_queries}")
    if after.event_loop_tasks > before.event_loop_tasks + SLACK:
        problems.append(
            f"coordinator loop tasks {before.event_loop_tasks} → {after.event_loop_tasks}"
        )
    if after.open_files > before.open_files + SLACK:
        problems.append(f"coordinator fds {before.open_files} → {after.open_files}")
    if after.resident_bytes > before.resident_bytes * (1 + RSS_GROWTH_LIMIT):
        problems.append(f"coordinator rss {before.resident_bytes} → {after.resident_bytes}")
    for b, a in zip(before.workers, after.workers, strict=True):
        if a.tasks or a.plan_waiters:
            problems.append(f"{a.url}: {a.tasks} tasks, {a.plan_waiters} plan waiters left")
        if a.event_loop_tasks > b.event_loop_tasks + SLACK:
            problems.append(f"{a.url}: loop tasks {b.event_loop_tasks} → {a.event_loop_tasks}")
        if a.open_files > b.open_files + SLACK:
            problems.append(f"{a.url}: fds {b.open_files} → {a.open_files}")
        if a.resident_bytes > b.resident_bytes * (1 + RSS_GROWTH_LIMIT):
            problems.append(f"{a.url}: rss {b.resident_bytes} → {a.resident_bytes}")
    return problems


async def load(
    workers: dict[str, int], count: int, concurrent: int, warmup_burst: int
) -> list[str]:
    coordinator = Coordinator(
        StaticWorkerResolver(list(workers)),
        max_concurrent_queries=concurrent,
        **unit_coordinator_options(),
    )
    async with coordinator as c:
        await sequential(c, 200)  # warm up: connections, imports, allocator pools
        cold = await snapshot(c, workers)
        show("after 200 warm-up queries", cold)
        await burst(c, warmup_burst)  # the burst's working set: resident memory keeps its peak
        start = await snapshot(c, workers)
        show("start", start)
        started = time.perf_counter()
        await sequential(c, count)
        elapsed = time.perf_counter() - started
        print(f"{count:,} sequential queries in {elapsed:.1f} s ({count / elapsed:.0f}/s)")
        middle = await snapshot(c, workers)
        show("after the sequential queries", middle)
        started = time.perf_counter()
        await burst(c, concurrent)
        elapsed = time.perf_counter() - started
        print(f"{concurrent:,} concurrent queries in {elapsed:.1f} s")
        await sequential(c, 1)  # an ordinary query after the burst: extra connections close
        await anyio.sleep(SETTLE_SECONDS)  # quiet: coordinator and workers release freed memory
        end = await snapshot(c, workers)
        show("end", end)
    problems = check(start, middle) + check(start, end)
    for problem in problems:
        print(f"LEAK: {problem}")
    growth = [end.resident_bytes / start.resident_bytes]
    pairs = zip(start.workers, end.workers, strict=True)
    growth += [a.resident_bytes / b.resident_bytes for b, a in pairs]
    worst = max(growth)
    print(result_line("load_test_rss_growth", worst - 1, "fraction", 1 - (worst - 1), 0.9))
    return problems


def main() -> None:
    from flightfeed.flight.tuning import run

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sequential", type=int, default=10_000)
    parser.add_argument("--concurrent", type=int, default=1_000)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument(
        "--warmup-burst",
        type=int,
        default=None,
        help="queries in the warm-up burst (default: --concurrent): glibc keeps a burst's peak"
        " working set resident (trim threshold 1 GiB), so growth is measured after one",
    )
    args = parser.parse_args()
    warmup = args.concurrent if args.warmup_burst is None else args.warmup_burst
    with contextlib.ExitStack() as stack:
        workers = dict(
            stack.enter_context(worker_process_pid(SESSION_BUILDER)) for _ in range(args.workers)
        )
        problems = run(lambda: load(workers, args.sequential, args.concurrent, warmup))
    print("all queries completed;", "no leaks" if not problems else f"{len(problems)} leaks")
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
