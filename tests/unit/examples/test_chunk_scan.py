"""The chunk scan example run in one process: its rows are the reference program's."""

from __future__ import annotations

import pyarrow as pa
import pytest

from flightfeed.examples.chunk_scan import scan, scan_rows
from flightfeed.plan import collect_partition, open_task_context
from flightfeed.session import Session

pytestmark = pytest.mark.anyio


async def test_chunks_of_one_size_share_a_batch_and_the_rows_are_the_references() -> None:
    """A feed delivers a unit per chunk, mostly of one size: building each chunk's two columns
    cost more than aggregating them. Batches are immutable, so one serves a run of sizes."""
    partitions = ["3,3,3,0,2,2,3", "1", "0,0,5,5"]
    plan = scan(1, *partitions)
    async with open_task_context(Session()) as ctx:
        batches = [await collect_partition(plan, p, ctx) for p in range(len(partitions))]
    first = batches[0]
    assert [b.num_rows for b in first] == [3, 3, 3, 0, 2, 2, 3]
    assert first[0] is first[1] is first[2]
    assert first[4] is first[5]
    assert first[6] is not first[0]  # a size met again after another is built anew
    got = pa.Table.from_batches([b for part in batches for b in part], schema=plan.schema)
    assert got.equals(scan_rows(1, *partitions))
