"""Decoding HoraeDB's contiguous rows (what a HoraeDB node sends in every remote write) against
the DuckDB insert of the same rows that follows it on a worker.

The data: `--rows` rows (1 million by default) of table_write.py's metrics schema (`ts`
timestamp[ms], `host` string tag, `cpu` and `mem` float64, `bytes_in` and `requests` int64) in
row groups of `--row-group` rows (256k), encoded once as HoraeDB encodes them (every value
present: the layout without a null bit set; one row in 20 has a null `mem`, the other layout).

- decode: `flightfeed.tables.contiguous.decode_contiguous_rows` of each row group, then the
  conversion to the table's types (`conform_rows`), as a worker does before its insert.
- reference: `TableStore.write` of the decoded row group into an APPEND table (the DuckDB
  INSERT and commit a worker runs next), in a fresh database each round.
- also printed: the worker's strict parse of each row group's WriteRequest (the protobuf, one
  bytes element a row), which comes first, on a worker thread.

RESULT: decoded rows/s, with its ratio to the insert's rows/s (target ≥ 1: decoding is no
slower than the insert it feeds). Rounds alternate the two; ratios are medians of per-round
ratios.

Run: python benchmarks/contiguous_decode.py [--rows 1000000] [--rounds 5] [--quick]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import numpy as np
import pyarrow as pa
from _common import median, result_line
from table_write import HOSTS, SCHEMA, make_groups

from flightfeed._generated.remote_engine import (
    ColumnDesc,
    ContiguousRows,
    RowGroup,
    TableIdentifier,
    WriteRequest,
)
from flightfeed.flight.grpc import parse_message
from flightfeed.tables.contiguous import decode_contiguous_rows
from flightfeed.tables.decode_budget import DecodeBudget
from flightfeed.tables.options import TableOptions
from flightfeed.tables.schema import TableSchema
from flightfeed.tables.store import TableName, TableStore, conform_rows

TARGET = 1.0
TABLE = TableName.of("metrics")
TABLE_SCHEMA = TableSchema.from_arrow(SCHEMA, timestamp="ts", tags=["host"])
NULL_EVERY = 20
HOST_BYTES = len(f"host-{HOSTS - 1:04d}")
_FIXED = [("ts", "<i8"), ("host", "<u4"), ("cpu", "<f8"), ("mem", "<f8")]
_FIXED += [("bytes_in", "<i8"), ("requests", "<i8")]


def encode(group: pa.RecordBatch) -> ContiguousRows:
    """The group's rows as HoraeDB's ContiguousRowWriter lays them out, built with numpy (the
    hosts are all `HOST_BYTES` long, so every row of a layout has the same size)."""
    n = group.num_rows
    names = [name for name, _ in _FIXED]
    columns = {name: group.column(name).to_numpy(zero_copy_only=False) for name in names[2:]}
    ts = group.column("ts").cast(pa.int64()).to_numpy()
    hosts = np.frombuffer(group.column("host").buffers()[2], np.uint8)[: n * HOST_BYTES]
    tail = [("bytes", f"S{HOST_BYTES}")]
    full = np.dtype([("bits", "<u4"), *_FIXED, ("len", "u1"), *tail])
    rows = np.zeros(n, full)
    rows["ts"], rows["len"] = ts, HOST_BYTES
    rows["host"] = 4 + sum(np.dtype(t).itemsize for _, t in _FIXED)  # where `len` is
    rows["bytes"] = hosts.view(f"S{HOST_BYTES}")
    for name, values in columns.items():
        rows[name] = values
    encoded = [row.tobytes() for row in rows]
    # Every NULL_EVERY-th row without its `mem`: num_bits 6, the bit of `mem` (3) unset.
    kept = [f for f in _FIXED if f[0] != "mem"]
    sparse = np.dtype([("bits", "<u4"), ("set", "u1"), *kept, ("len", "u1"), *tail])
    nulls = np.zeros(len(range(0, n, NULL_EVERY)), sparse)
    picked = rows[::NULL_EVERY]
    for name, _ in [*kept, ("len", ""), ("bytes", "")]:
        nulls[name] = picked[name]
    nulls["bits"], nulls["set"] = len(_FIXED), 0b111111 & ~(1 << 3)
    nulls["host"] = 4 + 1 + sum(np.dtype(t).itemsize for _, t in kept)  # where `len` is
    for index, row in zip(range(0, n, NULL_EVERY), nulls, strict=True):
        encoded[index] = row.tobytes()
    descs = [ColumnDesc(id=c.id, typ=c.type.data_type) for c in TABLE_SCHEMA.columns]
    return ContiguousRows(schema_version=1, encoded_rows=encoded, column_descs=descs)


def decode(groups: list[ContiguousRows]) -> tuple[float, list[pa.Table]]:
    began = time.perf_counter()
    tables = [
        conform_rows(
            TABLE_SCHEMA, decode_contiguous_rows(g, TABLE_SCHEMA, budget=DecodeBudget(1 << 34))
        )
        for g in groups
    ]
    return time.perf_counter() - began, tables


def parse(requests: list[bytes]) -> float:
    began = time.perf_counter()
    for request in requests:
        parse_message(request, WriteRequest, len(request))
    return time.perf_counter() - began


def insert(tables: list[pa.Table]) -> float:
    with tempfile.TemporaryDirectory() as data_dir:
        store = TableStore.open(Path(data_dir))
        try:
            store.create(TABLE, TABLE_SCHEMA, TableOptions(update_mode="APPEND"))
            began = time.perf_counter()
            for table in tables:
                store.write([(TABLE, table)])
            return time.perf_counter() - began
        finally:
            store.close()


def check(got: pa.Table, expected: pa.Table) -> None:
    """A group's decoded rows are the rows encoded, `mem` null where it was left out."""
    expected = expected.cast(TABLE_SCHEMA.arrow)
    assert got.drop_columns(["mem"]).equals(expected.drop_columns(["mem"]))
    present = np.ones(got.num_rows, dtype=bool)
    present[::NULL_EVERY] = False
    mem = got.column("mem").to_numpy(zero_copy_only=False)
    assert np.isnan(mem[~present]).all()  # (nulls, as numpy shows them)
    assert got.column("mem").null_count == np.count_nonzero(~present)
    assert (mem[present] == expected.column("mem").to_numpy()[present]).all()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--row-group", type=int, default=262_144)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="100k rows, 2 rounds")
    args = parser.parse_args()
    rows, rounds = (100_000, 2) if args.quick else (args.rows, args.rounds)
    plain = make_groups(rows, args.row_group)
    groups = [encode(g) for g in plain]
    print(f"{rows:,} rows in {len(groups)} row groups, {NULL_EVERY - 1} in {NULL_EVERY} no null")

    requests = [
        bytes(
            WriteRequest(table=TableIdentifier(table=TABLE.table), row_group=RowGroup(contiguous=g))
        )
        for g in groups
    ]
    ratios, rates = [], []
    for round_ in range(rounds):
        parsed = parse(requests)
        seconds, tables = decode(groups)
        if round_ == 0:
            for got, expected in zip(tables, plain, strict=True):
                check(got, pa.Table.from_batches([expected]))
        inserted = insert(tables)
        rates.append(rows / seconds)
        ratios.append(inserted / seconds)
        print(
            f"round {round_ + 1}: decode {rows / seconds / 1e6:.2f}M rows/s,"
            f" insert {rows / inserted / 1e6:.2f}M rows/s, ratio {inserted / seconds:.2f};"
            f" parse {rows / parsed / 1e6:.2f}M rows/s"
        )
    print(result_line("contiguous_decode", median(rates), "rows/s", median(ratios), TARGET))


if __name__ == "__main__":
    main()
