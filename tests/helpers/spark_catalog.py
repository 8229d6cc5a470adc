"""The tables the Spark tests read: the seed's `scan`, and two for particular behaviours."""

from __future__ import annotations

import datetime
import threading
from collections.abc import AsyncIterator, Sequence
from typing import ClassVar

import pyarrow as pa

from flightfeed.coordinator import Catalog
from flightfeed.errors import InvalidArgument
from flightfeed.examples.chunk_scan import catalog as seed_catalog
from flightfeed.plan import (
    DecodeContext,
    ExecutionPlan,
    MemoryScan,
    Projection,
    ScalarUdf,
    TaskContext,
    UnaryNode,
    call,
    col,
)
from flightfeed.plan.base import expect_children
from flightfeed.session import Session, SessionStateBuilder, WorkerQueryContext
from flightfeed.testing.feeds import (
    live_provider,
    unit_scan,
    with_unit_scans,
)

NUMBERS = pa.table(
    {"n": pa.array(range(100), pa.int64()), "word": [f"w{i % 7}" for i in range(100)]}
)
ODD_TYPES = pa.table(
    {
        "u8": pa.array([255, 0, None], pa.uint8()),
        "u64": pa.array([2**64 - 1, 0, 7], pa.uint64()),
        "half": pa.array([1.5, -2.0, None], pa.float32()).cast(pa.float16()),
        "text": pa.array(["a", "b", "a"], pa.string_view()),
        "at": pa.array([1_000_000_001_999, -1, 0], pa.timestamp("ns", tz="UTC")),
        "inner": pa.array(
            [{"u": 1, "l": [2**32 - 1]}, None, {"u": 65535, "l": []}],
            pa.struct([("u", pa.uint16()), ("l", pa.list_(pa.uint32()))]),
        ),
    }
)
"""Columns Spark cannot hold as they are (flightfeed.spark.arrow_types widens them)."""


class FailOnce(UnaryNode):
    """Fails the first read of partition 0 after a few rows (a crashing Spark task), then
    passes: the retried read must give the same rows. State is per process (the workers run in
    the test's process)."""

    name = "FailOnce"
    failed: ClassVar[set[str]] = set()
    lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, child: ExecutionPlan, token: str) -> None:
        self.child = child
        self.token = token

    def with_children(self, children: Sequence[ExecutionPlan], /) -> ExecutionPlan:
        return FailOnce(children[0], self.token)

    async def _execute(self, partition: int, ctx: TaskContext) -> AsyncIterator[pa.RecordBatch]:
        seen = 0
        async for batch in self.child.execute(partition, ctx):
            yield batch
            seen += batch.num_rows
            with self.lock:
                first = partition == 0 and self.token not in self.failed
                if first and seen >= 2:
                    self.failed.add(self.token)
                    raise RuntimeError("the first read of partition 0 fails (on purpose)")


class FailOnceCodec:
    kinds = (FailOnce.name,)

    def encode(self, node: ExecutionPlan, /) -> bytes:
        assert isinstance(node, FailOnce)
        return node.token.encode()

    def decode(
        self, kind: str, payload: bytes, children: Sequence[ExecutionPlan], ctx: DecodeContext, /
    ) -> ExecutionPlan:
        expect_children(kind, children, 1)
        return FailOnce(children[0], payload.decode())


def tag_udf(tag: str) -> ScalarUdf:
    """`tag(x)`: the tag of the session that runs it, on every row."""
    return ScalarUdf("tag", lambda values: pa.repeat(pa.scalar(tag), len(values)), pa.string())


async def tagging_session(ctx: WorkerQueryContext) -> Session:
    """Workers decode every test node, and `tag(x)` says this query's `x-tag` header."""
    builder = ctx.builder
    for codec in spark_test_catalog().codecs:
        builder = builder.with_codec(codec, replace_existing=True)
    return builder.with_scalar_udf(tag_udf(ctx.headers.get("x-tag", "none"))).build()


def spark_test_catalog() -> Catalog:
    found = seed_catalog(delay=0.0)
    found.with_codec(FailOnceCodec())

    @found.table("numbers")
    def numbers(partitions: int = 2) -> ExecutionPlan:
        """n in 0..99 and a word, in `partitions` partitions."""
        if partitions < 1:
            raise InvalidArgument(f"partitions must be at least 1, got {partitions}")
        return MemoryScan.from_table(NUMBERS, partitions)

    @found.table("flaky")
    def flaky(token: str) -> ExecutionPlan:
        """scan(2, '3,1', '2', '4', '1,1'), whose partition 0 fails on its first read."""
        return FailOnce(found.plan("scan", (2, "3,1", "2", "4", "1,1")), token)

    with_unit_scans(found)

    @found.table("odd_types")
    def odd_types() -> ExecutionPlan:
        """ODD_TYPES, in one partition."""
        return MemoryScan.from_table(ODD_TYPES, 1)

    @found.table("calendar_switch")
    def calendar_switch() -> ExecutionPlan:
        """Days around Spark's switch to the Gregorian calendar (1582-10-15), as dates and as
        timestamps at midnight UTC."""
        days = [datetime.date(1582, 10, day) for day in (4, 10, 15)]
        at = [datetime.datetime.combine(d, datetime.time(), datetime.UTC) for d in days]
        table = pa.table(
            {
                "id": pa.array(range(3), pa.int64()),
                "d": pa.array(days, pa.date32()),
                "t": pa.array(at, pa.timestamp("us", tz="UTC")),
            }
        )
        return MemoryScan.from_table(table, 1)

    @found.table("intervals")
    def intervals() -> ExecutionPlan:
        """n, and a column Spark cannot read at all."""
        spans = pa.array([pa.MonthDayNano([1, 2, 3])], pa.month_day_nano_interval())
        return MemoryScan.from_table(pa.table({"n": [1], "span": spans}), 1)

    @found.table("live")
    def live(name: str, partitions: int) -> ExecutionPlan:
        """Units pushed while it is read (flightfeed.testing.feeds.live_provider)."""
        return unit_scan(live_provider(name, partitions))

    @found.table("queue")
    def queue(name: str, partitions: int) -> ExecutionPlan:
        """Units pushed while it is read, each handed out once (not deterministic)."""
        return unit_scan(live_provider(name, partitions, queue=True))

    @found.table("tagged")
    def tagged() -> ExecutionPlan:
        """numbers, with the query's x-tag header in column `tag`."""
        typing = SessionStateBuilder().with_scalar_udf(tag_udf("")).build()
        scan = MemoryScan.from_table(NUMBERS, 2)
        return Projection(scan, [col("n"), call("tag", col("n"))], ["n", "tag"], functions=typing)

    return found
