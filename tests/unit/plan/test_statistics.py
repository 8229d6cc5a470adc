"""Size estimates the planner's broadcast decision uses: leaves say, other nodes pass or sum."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from flightfeed.plan import Filter, HashJoin, MemoryScan, ParquetScan, Union, call, col, lit
from flightfeed.plan.statistics import estimated_bytes

from .helpers import sample_table


def test_memory_scans_pass_through_filters_and_sum_in_unions() -> None:
    scan = MemoryScan.from_table(sample_table(500), 2)
    size = estimated_bytes(scan)
    assert size == scan.embedded_bytes  # its batches' bytes
    assert size is not None
    assert size >= sample_table(500).nbytes
    assert estimated_bytes(Filter(scan, call("greater", col("n"), lit(3)))) == size
    assert estimated_bytes(Union([scan, scan])) == 2 * size


def test_a_join_is_unknown() -> None:
    left = MemoryScan.from_table(pa.table({"a": [1, 2]}))
    right = MemoryScan.from_table(pa.table({"b": [1, 2]}))
    assert estimated_bytes(HashJoin(left, right, [("a", "b")])) is None


def test_a_parquet_scan_estimates_from_its_footers_and_projection(tmp_path: Path) -> None:
    table = pa.table({f"c{i}": pa.array(range(10_000), pa.int64()) for i in range(4)})
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=2_500, compression="none")
    whole = estimated_bytes(ParquetScan.from_paths(str(tmp_path)))
    assert whole is not None
    assert 4 * 10_000 * 8 * 0.5 < whole < 4 * 10_000 * 8 * 2
    one_column = estimated_bytes(ParquetScan.from_paths(str(tmp_path), columns=["c1"]))
    assert one_column == whole // 4
