"""Table reads: a full Read of a table over gRPC from a `flightfeed worker`, against DuckDB
exporting the same table as Arrow in this process.

The data: `--rows` rows (10 million by default) of the metrics schema of table_write.py (`ts`
timestamp[ms], `host` string tag, `cpu` and `mem` float64, `bytes_in` and `requests` int64),
written once through `TableStore` into a data directory, which is then copied: the worker
serves one copy, the reference reads the other (DuckDB lets one process at a time open a
database file for writing), so both read the same bytes laid out the same way.

- flightfeed: the Read RPC (HoraeDB's remote engine) on flightfeed's tuned gRPC channel; the
  client turns every ArrowPayload element into pyarrow record batches. `--client raw` (the
  default) receives each ReadResponse as one buffer (flightfeed's own receive path) and reads
  the IPC streams in it in place; `--client stub` is the generated betterproto2 stub (grpclib's
  receive buffer, a parsed ReadResponse, a copy each) with `decode_payload`, which also
  validates every batch fully, as a worker does with what it is sent.
- reference: `con.execute("SELECT * FROM t").to_arrow_reader(batch_size)` consumed fully, in
  this process, on the same batch size.

The worker runs with `--table-compression never` unless told otherwise (`--compression`): on
loopback, zstd only costs CPU on both ends (the worker's default, `auto`, finds that zstd pays
on this data and halves the throughput). Rounds alternate the two sides; the RESULT ratio is
the median of per-round ratios. The machine's cores are shared by client and worker, as they
would be on one host; CPU seconds (client and worker together) are printed per round.

Measured on the 2-core development machine, sixteen runs as its speed varied: 0.65-0.85, median
0.77, fourteen at 0.7 or more (16-31M rows/s against DuckDB's 19-39M), where the code before
measured 0.57-0.66. The client reads each response from the socket straight into a buffer of
its own (flight/message_buffer.py: ~170 ms of client CPU per 10M rows where it was ~350), the
worker's scan reads ahead on a thread of its own (concurrency.read_ahead) and a response's IPC
framing is written on the loop, where each batch used to wait ~4 ms on thread hops. Per 10M
rows client and worker spend 0.58-1.09 CPU s (DuckDB alone 0.27-0.66), on the same 2 cores as
the reference's single in-process export: two kernel copies over loopback and DuckDB's export
are most of it.

Run: python benchmarks/table_read.py [--rows 10000000] [--rounds 9] [--batch-size 262144]
     [--parallelism 1] [--compression never] [--client raw] [--quick]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pyarrow as pa
from _common import median, process_cpu_seconds, result_line, worker_process_pid
from grpclib.const import Cardinality
from table_write import SCHEMA, make_groups

from flightfeed._generated.common import ResponseHeader
from flightfeed._generated.remote_engine import (
    GetTableInfoRequest,
    ReadOptions,
    ReadRequest,
    RemoteEngineServiceStub,
    TableIdentifier,
    TableReadRequest,
)
from flightfeed._generated.storage import ArrowPayload, ArrowPayloadCompression
from flightfeed.flight.grpc import GrpcChannel, RawBytes
from flightfeed.flight.internals import raw_stream
from flightfeed.flight.wire import recv_raw_view
from flightfeed.protowire import decode_varint
from flightfeed.tables.decode_budget import DecodeBudget
from flightfeed.tables.options import TableOptions
from flightfeed.tables.payload import decode_payload
from flightfeed.tables.schema import TableSchema
from flightfeed.tables.service import SERVICE
from flightfeed.tables.store import TableName, TableStore

TARGET = 0.7
TABLE = TableName.of("metrics")
FILL_GROUP = 1_000_000
MAX_DECODED = 1 << 31
MAX_MESSAGE = 1 << 31


def fill(data_dir: Path, rows: int) -> None:
    """The table, written through the store as a worker would write it."""
    store = TableStore.open(data_dir)
    try:
        schema = TableSchema.from_arrow(SCHEMA, timestamp="ts", tags=["host"])
        store.create(TABLE, schema, TableOptions(update_mode="APPEND"))
        for group in make_groups(rows, FILL_GROUP):
            store.write([(TABLE, pa.Table.from_batches([group]))])
        store.connection.execute("CHECKPOINT")
    finally:
        store.close()


def reference_read(store: TableStore, batch_size: int) -> tuple[float, int]:
    """DuckDB's own Arrow export of the whole table, consumed batch by batch."""
    physical = store.entry(TABLE).physical
    began = time.perf_counter()
    reader = store.connection.execute(f"SELECT * FROM {physical}").to_arrow_reader(batch_size)
    rows = sum(batch.num_rows for batch in reader)
    return time.perf_counter() - began, rows


def response_batches(data: bytes | memoryview) -> list[pa.RecordBatch]:
    """The record batches of one ReadResponse, read from its bytes in place: the header (an
    error raises), then each payload element's IPC stream as pyarrow batches."""
    buf = memoryview(data)
    batches: list[pa.RecordBatch] = []
    for number, value in _fields(buf):
        if number == 1 and isinstance(value, memoryview) and len(value):
            header = ResponseHeader.parse(bytes(value))
            if header.code != 0:
                raise RuntimeError(f"Read failed: {header.code} {header.error}")
        elif number == 2 and isinstance(value, memoryview):
            elements = [v for n, v in _fields(value) if n == 1 and isinstance(v, memoryview)]
            zstd = any(n == 2 and v == ArrowPayloadCompression.ZSTD for n, v in _fields(value))
            if zstd:
                payload = ArrowPayload(
                    record_batches=[bytes(e) for e in elements],
                    compression=ArrowPayloadCompression.ZSTD,
                )
                batches.extend(decode_payload(payload, budget=DecodeBudget(MAX_DECODED)))
            else:
                for element in elements:
                    batches.extend(pa.ipc.open_stream(pa.py_buffer(element)))
    return batches


def _fields(buf: memoryview) -> list[tuple[int, memoryview | int]]:
    """(field number, value) of a protobuf message: a view for length-delimited fields, the
    number for varints (the only wire types a ReadResponse uses)."""
    fields: list[tuple[int, memoryview | int]] = []
    pos = 0
    while pos < len(buf):
        key, pos = decode_varint(buf, pos)
        if key & 7 == 2:
            length, pos = decode_varint(buf, pos)
            fields.append((key >> 3, buf[pos : pos + length]))
            pos += length
        elif key & 7 == 0:
            value, pos = decode_varint(buf, pos)
            fields.append((key >> 3, value))
        else:
            raise ValueError(f"unexpected wire type {key & 7} in a ReadResponse")
    return fields


async def flightfeed_read(
    location: str, batch_size: int, parallelism: int, client: str
) -> tuple[float, int]:
    """The whole table through the Read RPC, every payload decoded into record batches.

    `raw`: each response message is received as one buffer (flightfeed's receive path) and its
    payload read in place; `stub`: the generated betterproto2 stub (grpclib's receive buffer,
    a parsed ReadResponse) and `decode_payload`, which validates every batch fully."""
    host, port = location.removeprefix("grpc://").rsplit(":", 1)
    channel = GrpcChannel(host, int(port))
    stub = RemoteEngineServiceStub(channel)
    options = ReadOptions(batch_size=batch_size, read_parallelism=parallelism)
    request = ReadRequest(
        table=TableIdentifier(table=TABLE.table),
        read_request=TableReadRequest(opts=options),
    )
    rows = 0
    try:
        await stub.get_table_info(GetTableInfoRequest(table=TableIdentifier(table=TABLE.table)))
        began = time.perf_counter()  # the connection is up: the clock starts
        if client == "stub":
            async for response in stub.read(request):
                header = response.header
                if header is not None and header.code != 0:
                    raise RuntimeError(f"Read failed: {header.code} {header.error}")
                if response.arrow is not None:
                    batches = decode_payload(response.arrow, budget=DecodeBudget(MAX_DECODED))
                    rows += sum(batch.num_rows for batch in batches)
        else:
            path = SERVICE + "Read"
            async with channel.request(
                path, Cardinality.UNARY_STREAM, ReadRequest, RawBytes
            ) as stream:
                await stream.send_message(request, end=True)
                await stream.recv_initial_metadata()
                while (data := await recv_raw_view(raw_stream(stream), MAX_MESSAGE)) is not None:
                    rows += sum(batch.num_rows for batch in response_batches(data))
                await stream.recv_trailing_metadata()
        elapsed = time.perf_counter() - began
    finally:
        channel.close()
    return elapsed, rows


def main() -> None:
    from flightfeed.flight.tuning import run

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--batch-size", type=int, default=262_144, help="the Read's batch_size")
    parser.add_argument("--parallelism", type=int, default=1, help="the Read's read_parallelism")
    parser.add_argument("--compression", choices=("auto", "always", "never"), default="never")
    parser.add_argument("--client", choices=("raw", "stub"), default="raw")
    parser.add_argument("--quick", action="store_true", help="2 million rows, 2 rounds")
    args = parser.parse_args()
    rows, rounds = (2_000_000, 2) if args.quick else (args.rows, args.rounds)

    from flightfeed.flight.tuning import tune_malloc

    tune_malloc()  # the worker's own tuning, for the reference's side too
    with tempfile.TemporaryDirectory() as tmp:
        ours_dir, theirs_dir = Path(tmp) / "worker", Path(tmp) / "reference"
        began = time.perf_counter()
        fill(ours_dir, rows)
        shutil.copytree(ours_dir, theirs_dir)
        size = sum(f.stat().st_size for f in ours_dir.iterdir())
        print(
            f"{rows:,} rows written in {time.perf_counter() - began:.1f} s"
            f" ({size / 1e6:.0f} MB of DuckDB file); batch size {args.batch_size},"
            f" parallelism {args.parallelism}, compression {args.compression},"
            f" client {args.client}"
        )
        reference = TableStore.open(theirs_dir)
        extra = ("--data-dir", str(ours_dir), "--table-compression", args.compression)
        speeds: dict[str, list[float]] = {"ours": [], "theirs": []}
        cpu: dict[str, list[float]] = {"ours": [], "theirs": []}
        worker_cpu: list[float] = []
        with worker_process_pid(None, *extra) as (url, pid):

            def ours_once() -> tuple[float, int]:
                return run(
                    lambda: flightfeed_read(url, args.batch_size, args.parallelism, args.client)
                )

            def theirs_once() -> tuple[float, int]:
                return reference_read(reference, args.batch_size)

            sides = {"ours": ours_once, "theirs": theirs_once}
            for side in sides.values():  # warm-up: caches, imports, connections
                assert side()[1] == rows
            for round_number in range(rounds):
                order = ["ours", "theirs"] if round_number % 2 == 0 else ["theirs", "ours"]
                for key in order:
                    client_before, worker_before = time.process_time(), process_cpu_seconds(pid)
                    elapsed, count = sides[key]()
                    worker = process_cpu_seconds(pid) - worker_before
                    cpu[key].append(time.process_time() - client_before + worker)
                    if key == "ours":
                        worker_cpu.append(worker)
                    assert count == rows, (key, count)
                    speeds[key].append(rows / elapsed)
                print(
                    f"round {round_number + 1}: flightfeed {speeds['ours'][-1] / 1e6:.2f}M"
                    f" rows/s ({cpu['ours'][-1]:.2f} CPU s, worker {worker_cpu[-1]:.2f}), DuckDB"
                    f" {speeds['theirs'][-1] / 1e6:.2f}M rows/s ({cpu['theirs'][-1]:.2f} CPU s)"
                )
        reference.close()
    ff, duck = median(speeds["ours"]), median(speeds["theirs"])
    ratio = median([o / t for o, t in zip(speeds["ours"], speeds["theirs"], strict=True)])
    print(
        f"flightfeed Read over gRPC {ff / 1e6:.2f}M rows/s ({median(cpu['ours']):.2f} CPU s,"
        f" client and worker), DuckDB Arrow export in process {duck / 1e6:.2f}M rows/s"
        f" ({median(cpu['theirs']):.2f} CPU s); paired ratio {ratio:.3f}"
    )
    print(result_line("table_read", ff, "rows/s", ratio, TARGET))


if __name__ == "__main__":
    main()
