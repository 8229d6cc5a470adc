"""Planning a table read (GetFlightInfo in 8 partitions: a snapshot) while large writes stream
in, against planning it on the same worker with no write under way.

A write holds the table store's write lock while it stages its rows, seconds for a large one.
Planning a read takes a snapshot, a few DuckDB transactions that must see one state of the
tables; it used to take the write lock for that and so waited out whole writes. It now holds
off commits only (tables/store.py).

Measured on the 2-core development machine: 12-13 ms with no write under way; during the
DoPuts 490 ms before (ratio 0.027), 54-71 ms after (ratio 0.18-0.22, three runs), the rest
the two cores shared with the writes.

- the worker: a `flightfeed worker --data-dir` in its own process, its table (`--rows` rows
  to start with) created before it starts;
- reference: `--plans` GetFlightInfo calls from pyarrow's C++ Flight client, one at a time,
  20 ms apart, while nothing is written;
- measured: the same calls while another thread of this process sends DoPuts of `--put-rows`
  rows (one batch each) back to back.

On a 2-core machine client, writer and worker share the cores, so planning under writes is
slower for CPU alone; the target asks that it not wait for the writes themselves.
RESULT: the median planning time under writes, with the ratio idle/under writes.

Run: python benchmarks/table_plan_under_writes.py [--plans 60] [--put-rows 2000000] [--quick]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pyarrow as pa
import pyarrow.flight as fl
from _common import median, result_line, worker_process_pid

from flightfeed._generated.flightfeed.v1 import TableCommand, TableRef
from flightfeed.tables.schema import TableSchema
from flightfeed.tables.store import TableName, TableStore

TARGET = 0.1
TABLE = "planned"
PARTITIONS = 8
SCHEMA = pa.schema([("ts", pa.timestamp("ms")), ("k", pa.int64()), ("v", pa.float64())])


def rows(count: int, start: int = 0) -> pa.Table:
    return pa.table(
        {
            "ts": pa.array(range(start, start + count), pa.timestamp("ms")),
            "k": pa.array(range(start, start + count), pa.int64()),
            "v": pa.array([1.0] * count),
        }
    )


def plan_times(location: str, plans: int) -> list[float]:
    """Seconds each of `plans` GetFlightInfo calls took, 20 ms apart."""
    command = TableCommand(version=1, table=TableRef(table=TABLE), partitions=PARTITIONS)
    descriptor = fl.FlightDescriptor.for_command(bytes(command))
    times = []
    with fl.connect(location) as client:
        for _ in range(plans):
            start = time.perf_counter()
            info = client.get_flight_info(descriptor)
            times.append(time.perf_counter() - start)
            assert len(info.endpoints) == PARTITIONS
            time.sleep(0.02)
    return times


def put_until(
    location: str, put_rows: int, stop: threading.Event, landed: threading.Event, puts: list[int]
) -> None:
    """DoPuts of `put_rows` fresh rows, back to back, until `stop` (`landed` once one has)."""
    with fl.connect(location) as client:
        start = 1 << 40
        while not stop.is_set():
            batch = rows(put_rows, start)
            writer, reader = client.do_put(fl.FlightDescriptor.for_path(TABLE), SCHEMA)
            writer.write_table(batch)
            writer.done_writing()
            reader.read()
            writer.close()
            puts.append(put_rows)
            landed.set()
            start += put_rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--plans", type=int, default=60)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--put-rows", type=int, default=2_000_000)
    parser.add_argument("--quick", action="store_true", help="fewer, smaller: a smoke run")
    args = parser.parse_args()
    if args.quick:
        args.plans, args.put_rows = 15, 500_000
    with tempfile.TemporaryDirectory() as root:
        store = TableStore.open(root)
        name = TableName.of(TABLE)
        store.create(name, TableSchema.from_arrow(SCHEMA, timestamp="ts", tags=["k"]))
        store.write([(name, rows(args.rows))])
        store.close()
        with worker_process_pid(None, "--data-dir", root) as (location, _):
            plan_times(location, 5)  # (warm: connections, DuckDB's first scans)
            idle = median(plan_times(location, args.plans))
            stop, landed, puts = threading.Event(), threading.Event(), list[int]()
            put = (location, args.put_rows, stop, landed, puts)
            writer = threading.Thread(target=put_until, args=put)
            writer.start()
            try:
                landed.wait()  # (one write landed, the next under way: a steady state)
                writing = median(plan_times(location, args.plans))
            finally:
                stop.set()
                writer.join()
    print(f"table of {args.rows:,} rows, read planned in {PARTITIONS} partitions")
    print(f"  no write under way:    {idle * 1e3:7.1f} ms at the median")
    print(f"  DoPuts back to back:   {writing * 1e3:7.1f} ms ({len(puts)} puts)")
    print(result_line("table_plan_under_writes", writing * 1e3, "ms", idle / writing, TARGET))


if __name__ == "__main__":
    main()
