"""Work-unit feed dispatch: units/s from providers on the coordinator to consumers on a worker.

The worker runs in its own process (`python -m flightfeed.cli worker --port 0`, its default
credits, uvloop); this process runs a Coordinator whose query is one task with PARTITIONS feed
partitions of raw 16-byte units. Each consumer on the worker only counts its units and emits one
row at the end, so the measurement is the feed path itself: provider pulls, credit accounting,
packing into WorkUnitBatches, the CoordinatorChannel over loopback gRPC, delivery into the
inbox, credit grants back. Time runs from the query's start to its last row.

The nodes, codec and session builder below are also what the worker process imports (via
`--session-builder feed_dispatch:worker_session`), and feed_isolation.py reuses them.

Run: python benchmarks/feed_dispatch.py [--units 1000000] [--rounds 3] [--partitions 4]
"""

from __future__ import annotations

import argparse
import os
import re
import struct
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import anyio
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import median, result_line

from flightfeed._generated.flightfeed.v1 import WorkUnitFeedProto
from flightfeed.coordinator import Coordinator, StaticWorkerResolver
from flightfeed.errors import InvalidArgument, PlanDecodeError
from flightfeed.feeds import FeedRegistry, WorkUnitFeed
from flightfeed.plan import Coalesce, DecodeContext, ExecutionPlan, PlanNodeBase, TaskContext
from flightfeed.session import Session, SessionStateBuilder, WorkerQueryContext

TARGET = 250_000
BODY = b"unit-0123456789a"  # 16 bytes: a small descriptor, such as an offset or a key
SCHEMA = pa.schema([("partition", pa.int64()), ("units", pa.int64())])
NO_STALL = 0xFFFFFFFF


@dataclass
class UnitsProvider:
    """Partition p yields `counts[p]` copies of BODY, as fast as a provider can."""

    counts: Sequence[int]
    unit_type: type[bytes] = bytes

    async def feed(self, partition: int, ctx: TaskContext) -> AsyncIterator[bytes]:
        body = BODY
        for _ in range(self.counts[partition]):
            yield body


class CountScan(PlanNodeBase):
    """Counts each partition's units and emits (partition, units) at its end. The partition
    `stall` never reads its feed (it waits until the task is cancelled)."""

    name = "BenchCountScan"

    def __init__(self, feed: WorkUnitFeed[bytes], partitions: int, stall: int = NO_STALL) -> None:
        self.feed = feed
        self.partitions = partitions
        self.stall = stall

    @property
    def schema(self) -> pa.Schema:
        return SCHEMA

    @property
    def output_partitions(self) -> int:
        return self.partitions

    async def _execute(self, partition: int, ctx: TaskContext) -> AsyncIterator[pa.RecordBatch]:
        if partition == self.stall:
            await anyio.sleep_forever()
        units = 0
        async for _ in self.feed.feed(partition, ctx):
            units += 1
        yield pa.record_batch([pa.array([partition]), pa.array([units])], schema=SCHEMA)


class CountScanCodec:
    kinds = (CountScan.name,)

    def encode(self, node: ExecutionPlan, /) -> bytes:
        if not isinstance(node, CountScan):
            raise InvalidArgument(f"CountScanCodec cannot encode {node.name}")
        return struct.pack("<II", node.partitions, node.stall) + bytes(node.feed.to_proto())

    def decode(
        self, kind: str, payload: bytes, children: Sequence[ExecutionPlan], ctx: DecodeContext, /
    ) -> ExecutionPlan:
        if len(payload) < 8 or children:
            raise PlanDecodeError("bad BenchCountScan payload")
        partitions, stall = struct.unpack_from("<II", payload)
        feed = WorkUnitFeed.from_proto(WorkUnitFeedProto.parse(payload[8:]), bytes)
        return CountScan(feed, partitions, stall)


async def worker_session(ctx: WorkerQueryContext) -> Session:
    """The worker process's session builder: it must decode CountScan."""
    return ctx.builder.with_codec(CountScanCodec()).build()


def coordinator(url: str) -> Coordinator:
    registry = FeedRegistry()
    registry.register(CountScan, lambda node: node.feed)
    session = SessionStateBuilder().with_codec(CountScanCodec()).build()
    return Coordinator(StaticWorkerResolver([url]), session=session, feed_registry=registry)


def count_plan(counts: Sequence[int], stall: int = NO_STALL) -> Coalesce:
    """One task (no estimator), one feed partition per count."""
    return Coalesce(CountScan(WorkUnitFeed.new(UnitsProvider(counts)), len(counts), stall))


@contextmanager
def worker_process() -> Iterator[str]:
    """A `flightfeed worker --port 0` in its own process that knows CountScan; yields its URL."""
    here = str(Path(__file__).resolve().parent)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([here, os.environ.get("PYTHONPATH", "")]))
    command = [sys.executable, "-m", "flightfeed.cli", "--log-level", "WARNING", "worker"]
    command += ["--port", "0", "--session-builder", "feed_dispatch:worker_session"]
    proc = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        found = re.search(r"listening on (\S+)", line)
        if found is None:
            raise RuntimeError(f"worker failed to start: {line!r}")
        yield found.group(1)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


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
    with worker_process() as url:
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
