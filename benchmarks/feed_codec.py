"""Work-unit batch codec: encode → serialize → parse → decode → take every body, in process.

Each round builds batches of 256 pre-encoded units spread over 4 partitions, wraps each in a
CoordinatorToWorkerMsg as the channel does, serializes it with betterproto2, parses it back,
decodes the packed columns and slices out every unit's body. The target is the feed path's
goal of 250,000 units/s; the reference per-unit form is printed for comparison.

Run: python benchmarks/feed_codec.py [--units 500000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import median, result_line

from flightfeed._generated.flightfeed.v1 import CoordinatorToWorkerMsg
from flightfeed.feeds.codec import UnitRun, decode_batch, encode_batch

TARGET = 250_000
BATCH = 256
PARTITIONS = 4


def make_runs(feed_id: bytes, start: int) -> list[UnitRun]:
    per = BATCH // PARTITIONS
    return [
        UnitRun(
            feed_id,
            p,
            [f"unit-{p}-{start + i:012d}".encode() for i in range(per)],
            [1_700_000_000_000_000_000 + start + i for i in range(per)],
        )
        for p in range(PARTITIONS)
    ]


def round_trip(units: int, *, packed: bool) -> float:
    """Units per second through the whole codec path."""
    feed_id = uuid.uuid4().bytes
    batches = [make_runs(feed_id, i) for i in range(0, units, BATCH)]
    taken = 0
    started = time.perf_counter()
    for runs in batches:
        batch = encode_batch(runs, time.time_ns(), packed=packed)
        wire = bytes(CoordinatorToWorkerMsg(work_unit_batch=batch))
        decoded = decode_batch(CoordinatorToWorkerMsg.parse(wire).work_unit_batch)
        for run in decoded.runs:
            bodies, begin = run.bodies, 0
            for end in run.ends:
                _ = bodies[begin:end]
                begin = end
                taken += 1
    elapsed = time.perf_counter() - started
    assert taken == len(batches) * BATCH
    return taken / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--units", type=int, default=500_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    round_trip(BATCH * 8, packed=True)  # warm up
    packed = [round_trip(args.units, packed=True) for _ in range(args.rounds)]
    reference = round_trip(max(BATCH, args.units // 20), packed=False)
    value = median(packed)
    print(f"packed batches:    {value:,.0f} units/s (median of {args.rounds})")
    print(f"reference batches: {reference:,.0f} units/s (one WorkUnit message per unit)")
    print(result_line("feed_codec", value, "units/s", value / TARGET, 1))


if __name__ == "__main__":
    main()
