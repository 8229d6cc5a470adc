"""Per-partition isolation: a stalled partition must not slow the others down.

One task on a worker in its own process, FAST partitions that each get `--units` units plus
one more partition. In the stalled run that partition has ten million units but its consumer
never reads: after its credits its provider stops, and the rest must run as if it were not
there. In the baseline it has no units. The throughput of the fast partitions is their units
divided by the time until the last of them finished; the result is stalled / baseline
(medians over alternating rounds). Target ≥ 0.9; the RESULT value is the stalled run's
throughput and its ratio the stalled / baseline ratio.

Run: python benchmarks/feed_isolation.py [--units 250000] [--rounds 3] [--fast 4]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import median, result_line, worker_process
from feed_dispatch import SESSION_BUILDER, coordinator, count_plan

from flightfeed.coordinator import Coordinator

TARGET = 0.9


async def fast_rate(c: Coordinator, fast: int, units: int, *, stalled: bool) -> float:
    """Units/s of the fast partitions, until the last one reported its count."""
    counts = [units] * fast + [10_000_000 if stalled else 0]
    plan = count_plan(counts, stall=fast if stalled else None)
    done: set[int] = set()
    started = time.perf_counter()
    async with c.execute(plan) as stream:
        async for batch in stream:
            rows = batch.to_pydict()
            for partition, got in zip(rows["partition"], rows["units"], strict=True):
                if partition < fast:
                    assert got == units
                    done.add(partition)
            if len(done) == fast:
                break  # the stalled partition never ends: leave (cancels the query)
    return fast * units / (time.perf_counter() - started)


async def measure(url: str, fast: int, units: int, rounds: int) -> tuple[list[float], list[float]]:
    baseline, stalled = [], []
    async with coordinator(url) as c:
        await fast_rate(c, fast, units // 20, stalled=False)  # warm up
        for _ in range(rounds):
            baseline.append(await fast_rate(c, fast, units, stalled=False))
            stalled.append(await fast_rate(c, fast, units, stalled=True))
    return baseline, stalled


def main() -> None:
    from flightfeed.flight.tuning import run

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--units", type=int, default=250_000, help="units per fast partition")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--fast", type=int, default=4, help="fast partitions")
    args = parser.parse_args()
    with worker_process(SESSION_BUILDER) as url:
        baseline, stalled = run(lambda: measure(url, args.fast, args.units, args.rounds))
    for i, (b, s) in enumerate(zip(baseline, stalled, strict=True)):
        print(f"round {i}: none stalled {b:,.0f} units/s, one stalled {s:,.0f} units/s")
    ratio = median(stalled) / median(baseline)
    print(
        f"fast partitions: {median(baseline):,.0f} units/s with none stalled,"
        f" {median(stalled):,.0f} units/s with one stalled"
    )
    print(result_line("feed_isolation", median(stalled), "units/s", ratio, TARGET))


if __name__ == "__main__":
    main()
