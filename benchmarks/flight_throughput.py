"""DoGet throughput: flightfeed's grpclib server against pyarrow's C++ Flight server.

One table of eight int64/float64 columns in 64k-row batches is served by both servers, each in
its own process. The same pyarrow C++ FlightClient reads it from each, and so does flightfeed's
async client from the flightfeed server. Ratios are medians of per-round ratios (the reads of a
round run back to back, in an order that rotates from round to round):

  flightfeed server / pyarrow server, both read by the C++ client        target ≥ 1.0
  flightfeed client←flightfeed server / C++ client←C++ server            target ≥ 0.7

The default table is 1.6 GB (the issue asks for at least 400 MB): a read then lasts about half a
second. A 420 MB read lasts 130 ms, and on a shared 2-core machine single rounds of it swing
between 1.4 and 3.4 GB/s for either server, which drowns a few-percent difference.

Run: python benchmarks/flight_throughput.py [--rounds 11] [--megabytes 1600]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ServerProcess, median, result_line

BATCH_ROWS = 65_536
COLUMNS = 8


def make_table(megabytes: int) -> pa.Table:
    rows = megabytes * 1_000_000 // (8 * COLUMNS)
    rows -= rows % BATCH_ROWS
    rng = np.random.default_rng(7)
    columns = {
        f"c{i}": (
            rng.integers(0, 1 << 40, rows, dtype=np.int64) if i % 2 == 0 else rng.random(rows)
        )
        for i in range(COLUMNS)
    }
    return pa.Table.from_batches(pa.table(columns).to_batches(BATCH_ROWS))


def serve_flightfeed(megabytes: int) -> None:
    from flightfeed.flight import FlightDataWriter, FlightHandler, FlightServer
    from flightfeed.flight.server import CallContext
    from flightfeed.flight.tuning import run

    table = make_table(megabytes)
    batches = table.to_batches()

    class Handler(FlightHandler):
        async def do_get(self, ctx: CallContext, ticket: bytes, writer: FlightDataWriter) -> None:
            await writer.begin(table.schema)
            for batch in batches:
                await writer.write(batch)

    async def main() -> None:
        async with FlightServer(Handler()) as server:
            print(server.port, flush=True)
            await server.serve_forever()

    run(main)


def serve_pyarrow(megabytes: int) -> None:
    import pyarrow.flight as flight

    from flightfeed.flight.tuning import tune_malloc

    tune_malloc()  # same process tuning as the flightfeed server gets
    table = make_table(megabytes)

    class Server(flight.FlightServerBase):  # type: ignore[misc]
        def do_get(self, context: object, ticket: object) -> flight.RecordBatchStream:
            return flight.RecordBatchStream(table)

    server = Server("grpc://127.0.0.1:0")
    print(server.port, flush=True)
    server.serve()


def time_cpp_client(location: str) -> tuple[float, int]:
    import pyarrow.flight as flight

    client = flight.connect(location)
    start = time.perf_counter()
    table = client.do_get(flight.Ticket(b"table")).read_all()
    elapsed = time.perf_counter() - start
    client.close()
    return elapsed, table.nbytes


def time_flightfeed_client(location: str) -> tuple[float, int]:
    from flightfeed.flight import FlightClient
    from flightfeed.flight.tuning import run

    async def fetch() -> tuple[float, int]:
        async with FlightClient(location) as client:
            start = time.perf_counter()
            table = await client.do_get(b"table").read_all()
            return time.perf_counter() - start, table.nbytes

    return run(fetch)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--megabytes", type=int, default=1600)
    parser.add_argument("--serve", choices=["flightfeed", "pyarrow"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve == "flightfeed":
        serve_flightfeed(args.megabytes)
        return
    if args.serve == "pyarrow":
        serve_pyarrow(args.megabytes)
        return

    from flightfeed.flight.tuning import tune_malloc

    tune_malloc()  # the reading process allocates a whole table per round; see DESIGN.md
    script = str(Path(__file__).resolve())
    with (
        ServerProcess([script, "--serve", "flightfeed", "--megabytes", str(args.megabytes)]) as ff,
        ServerProcess([script, "--serve", "pyarrow", "--megabytes", str(args.megabytes)]) as cpp,
    ):
        readers: dict[str, Callable[[], tuple[float, int]]] = {
            "ff": lambda: time_cpp_client(ff.location),
            "cpp": lambda: time_cpp_client(cpp.location),
            "ff_ff": lambda: time_flightfeed_client(ff.location),
        }
        speeds: dict[str, list[float]] = {key: [] for key in readers}
        nbytes = 0
        for round_number in range(args.warmup + args.rounds):
            # Rotate who reads first, so no side always follows the same neighbour.
            shift = round_number % len(readers)
            order = list(readers)[shift:] + list(readers)[:shift]
            measured = {key: readers[key]() for key in order}
            if round_number < args.warmup:
                continue
            for key, (elapsed, size) in measured.items():
                speeds[key].append(size / elapsed / 1e9)
                nbytes = size
    ff_speed, cpp_speed, ff_ff_speed = (median(speeds[k]) for k in ("ff", "cpp", "ff_ff"))
    # Ratios are paired per round (the three reads of a round run back to back), so a slow
    # stretch of the machine weighs on both sides of a ratio instead of skewing one median.
    server_ratio = median([f / c for f, c in zip(speeds["ff"], speeds["cpp"], strict=True)])
    client_ratio = median([f / c for f, c in zip(speeds["ff_ff"], speeds["cpp"], strict=True)])
    print(f"table: {nbytes / 1e6:.0f} MB in {BATCH_ROWS}-row batches, {args.rounds} rounds")
    print(f"C++ client <- flightfeed server:        {ff_speed:.2f} GB/s  {speeds['ff']}")
    print(f"C++ client <- pyarrow C++ server:       {cpp_speed:.2f} GB/s  {speeds['cpp']}")
    print(f"flightfeed client <- flightfeed server: {ff_ff_speed:.2f} GB/s  {speeds['ff_ff']}")
    print(f"paired ratios: server {server_ratio:.3f}, client {client_ratio:.3f}")
    print(result_line("flight_client_ff_vs_cpp", ff_ff_speed, "GB/s", client_ratio, 0.7))
    print(result_line("flight_doget_ff_vs_pyarrow", ff_speed, "GB/s", server_ratio, 1.0))


if __name__ == "__main__":
    main()
