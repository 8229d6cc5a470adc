"""Work-unit feed dispatch: units/s from providers on the coordinator to consumers on a worker.

The worker runs in its own process (`python -m flightfeed.cli worker --port 0`, its default
credits, uvloop); this process runs a Coordinator whose query is one task with PARTITIONS feed
partitions of raw 16-byte units. Each consumer on the worker only counts its units and emits one
row at the end, so the measurement is the feed path itself: provider pulls, credit accounting,
packing into WorkUnitBatches, the CoordinatorChannel over loopback gRPC, delivery into the
inbox, credit grants back. Time runs from the query's start to its last row.

The plan is the shared test node (flightfeed.testing.feeds: UnitProvider with one constant
body, UnitScan counting each partition), which the worker process decodes through
`--session-builder flightfeed.testing.feeds:unit_session_builder`; feed_isolation.py reuses it.

Run: python benchmarks/feed_dispatch.py [--units 1000000] [--rounds 3] [--partitions 4]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import median, result_line, worker_process

from flightfeed.coordinator import Coordinator, StaticWorkerResolver
from flightfeed.plan import Coalesce
from flightfeed.testing.feeds import COUNT_AT_END, UnitProvider, unit_coordinator_options, unit_scan

TARGET = 250_000
SESSION_BUILDER = "flightfeed.testing.feeds:unit_session_builder"  # decodes UnitScan
BODY = b"unit-0123456789a"  # 16 bytes: a small descriptor, such as an offset or a key


def coordinator(url: str) -> Coordinator:
    return Coordinator(StaticWorkerResolver([url]), **unit_coordinator_options())


def count_plan(counts: Sequence[int], stall: int | None = None) -> Coalesce:
    """One task, one feed partition per count; each partition reports its count at its end.
    The partition `stall` never reads its feed (it waits until the task is cancelled)."""
    provider = UnitProvider(counts, body=BODY)
    stalled = frozenset() if stall is None else frozenset({stall})
    return Coalesce(unit_scan(provider, every=COUNT_AT_END, stalled=stalled))


async def dispatch_rate(url: str, units: int, partitions: int, rounds: int) -> list[float]:
    """Units/s of each round (after a warm-up round)."""
    per = units // partitions
    rates = []
    async with coordinator(url) as c:
        await c.collect(count_plan([per // 20] * partitions))  # warm up: connection, imports
        for _ in range(rounds):
            started = time.perf_counter()
            table = await c.collect(count_plan([per] * partitions))
            elapsed = time.perf_counter() - started
            assert sum(table.column("units").to_pylist()) == per * partitions
            rates.append(per * partitions / elapsed)
    return rates


def main() -> None:
    from flightfeed.flight.tuning import run

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--units", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--partitions", type=int, default=4)
    args = parser.parse_args()
    with worker_process(SESSION_BUILDER) as url:
        rates = run(lambda: dispatch_rate(url, args.units, args.partitions, args.rounds))
    for i, rate in enumerate(rates):
        print(f"round {i}: {rate:,.0f} units/s")
    value = median(rates)
    print(
        f"feed dispatch: {value:,.0f} units/s (median of {args.rounds}; {args.units:,} units over"
        f" {args.partitions} partitions, one task, worker in its own process, default credits)"
    )
    print(result_line("feed_dispatch", value, "units/s", value / TARGET, 1))


if __name__ == "__main__":
    main()
