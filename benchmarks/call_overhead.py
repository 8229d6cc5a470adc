"""What one small call costs in CPU: flightfeed's gRPC stack against Arrow Flight's C++ one.

A small distributed query is a handful of calls and messages: query_latency.py finds the network
stack more than half of its latency. This measures the unit prices, each in the same run as its
reference:

- calls: a DoAction answered with one 4-byte result, one call at a time, on a flightfeed
  FlightServer and on a pyarrow (C++) FlightServerBase, each in its own process. pyarrow's C++
  client calls both; flightfeed's async client calls flightfeed's. CPU per call is that of the
  calling process and of the server process over the run (read from /proc in 10 ms clock
  ticks: a run of 3,000 calls keeps that error near 1%).
- frames: a server-streaming call whose handler sends 4 small messages, as 4 HTTP/2 DATA
  frames (one write each) or as one frame, client and server in this process: what a frame
  costs beyond its message.

RESULT: the flightfeed server's CPU per call in µs, with the ratio pyarrow server / flightfeed
server (1 would be parity with C++).

Run: python benchmarks/call_overhead.py [--calls 3000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ServerProcess, median, process_cpu_seconds, result_line

ACTION = "ping"
ANSWER = b"pong"
FRAME_MESSAGES = 4
FRAME_PAYLOAD = b"x" * 200


def serve_flightfeed() -> None:
    from flightfeed.flight import FlightHandler, FlightServer
    from flightfeed.flight.server import CallContext
    from flightfeed.flight.tuning import run

    class Handler(FlightHandler):
        async def do_action(self, ctx: CallContext, action: Any) -> AsyncIterator[bytes]:
            yield ANSWER

    async def main() -> None:
        async with FlightServer(Handler()) as server:
            print(server.port, flush=True)
            await server.serve_forever()

    run(main)


def serve_pyarrow() -> None:
    import pyarrow.flight as flight

    class Server(flight.FlightServerBase):  # type: ignore[misc]
        def do_action(self, context: object, action: flight.Action) -> list[bytes]:
            return [ANSWER]

    server = Server("grpc://127.0.0.1:0")
    print(server.port, flush=True)
    server.serve()


def cpp_calls(location: str, calls: int) -> float:
    """CPU seconds this process spent on `calls` DoActions through pyarrow's C++ client."""
    import pyarrow.flight as flight

    client = flight.connect(location)
    action = flight.Action(ACTION, b"")
    for _ in range(100):  # warm-up: the connection, gRPC's threads
        list(client.do_action(action))
    started = time.process_time()
    for _ in range(calls):
        results = list(client.do_action(action))
        assert results[0].body.to_pybytes() == ANSWER
    spent = time.process_time() - started
    client.close()
    return spent


def flightfeed_calls(location: str, calls: int) -> float:
    """CPU seconds this process spent on `calls` DoActions through flightfeed's client."""
    from flightfeed.flight import FlightClient
    from flightfeed.flight.tuning import run

    async def go() -> float:
        async with FlightClient(location) as client:

            async def call() -> None:
                results = await client.do_action(ACTION, b"")
                assert results == [ANSWER]

            for _ in range(100):
                await call()
            started = time.process_time()
            for _ in range(calls):
                await call()
            return time.process_time() - started

    return run(go)


def measured(call: Callable[[], float], server: ServerProcess, calls: int) -> tuple[float, float]:
    """(client, server) CPU µs per call."""
    before = process_cpu_seconds(server.pid)
    client = call()
    server_seconds = process_cpu_seconds(server.pid) - before
    return client / calls * 1e6, server_seconds / calls * 1e6


def frame_costs(calls: int, rounds: int) -> tuple[float, float]:
    """CPU µs per call (both sides, this process) of 4 messages as 4 frames and as one."""
    import grpclib.const
    from grpclib.const import Cardinality

    from flightfeed.flight import FlightHandler, FlightServer
    from flightfeed.flight.codec import EncodedMessage, grpc_message
    from flightfeed.flight.grpc import GrpcChannel, RawBytes
    from flightfeed.flight.internals import raw_stream
    from flightfeed.flight.tuning import run
    from flightfeed.flight.wire import send_encoded

    messages = [grpc_message([FRAME_PAYLOAD], len(FRAME_PAYLOAD)) for _ in range(FRAME_MESSAGES)]
    together = EncodedMessage(
        tuple(part for m in messages for part in m.parts), sum(m.nbytes for m in messages)
    )

    class Frames:
        async def separate(self, stream: Any) -> None:
            await stream.recv_message()
            await stream.send_initial_metadata()
            for message in messages:
                await send_encoded(raw_stream(stream), message)

        async def one(self, stream: Any) -> None:
            await stream.recv_message()
            await stream.send_initial_metadata()
            await send_encoded(raw_stream(stream), together)

        def __mapping__(self) -> dict[str, grpclib.const.Handler]:
            stream = Cardinality.UNARY_STREAM
            return {
                "/bench.Frames/Separate": grpclib.const.Handler(
                    self.separate, stream, RawBytes, RawBytes
                ),
                "/bench.Frames/One": grpclib.const.Handler(self.one, stream, RawBytes, RawBytes),
            }

    async def go() -> tuple[float, float]:
        async with FlightServer(FlightHandler(), services=[Frames()]) as server:
            return await alternate(GrpcChannel("127.0.0.1", server.port))

    async def alternate(channel: GrpcChannel) -> tuple[float, float]:
        async def call(path: str) -> None:
            async with channel.request(path, Cardinality.UNARY_STREAM, RawBytes, RawBytes) as st:
                await st.send_message(RawBytes(b"go"), end=True)
                received = [message async for message in st]
                assert received == [FRAME_PAYLOAD] * FRAME_MESSAGES

        cost: dict[str, list[float]] = {"/bench.Frames/Separate": [], "/bench.Frames/One": []}
        try:
            for _ in range(rounds):  # alternated: both see the same machine
                for path, spent in cost.items():
                    for _ in range(100):
                        await call(path)
                    started = time.process_time()
                    for _ in range(calls):
                        await call(path)
                    spent.append((time.process_time() - started) / calls * 1e6)
        finally:
            channel.close()
        return median(cost["/bench.Frames/Separate"]), median(cost["/bench.Frames/One"])

    return run(go)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--calls", type=int, default=3000, help="calls per measurement (fewer: coarser CPU)"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--serve", choices=["flightfeed", "pyarrow"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve == "flightfeed":
        serve_flightfeed()
        return
    if args.serve == "pyarrow":
        serve_pyarrow()
        return

    script = str(Path(__file__).resolve())
    rows: dict[str, list[tuple[float, float]]] = {"cpp": [], "cpp_ff": [], "ff_ff": []}
    with (
        ServerProcess([script, "--serve", "flightfeed"]) as ff,
        ServerProcess([script, "--serve", "pyarrow"]) as cpp,
    ):
        for _ in range(args.rounds):  # alternated: all three see the same machine
            rows["cpp"].append(
                measured(lambda: cpp_calls(cpp.location, args.calls), cpp, args.calls)
            )
            rows["cpp_ff"].append(
                measured(lambda: cpp_calls(ff.location, args.calls), ff, args.calls)
            )
            rows["ff_ff"].append(
                measured(lambda: flightfeed_calls(ff.location, args.calls), ff, args.calls)
            )
    names = {
        "cpp": "C++ client -> pyarrow C++ server",
        "cpp_ff": "C++ client -> flightfeed server",
        "ff_ff": "flightfeed client -> flightfeed server",
    }
    for key, label in names.items():
        client = median([c for c, _ in rows[key]])
        server = median([s for _, s in rows[key]])
        print(f"DoAction, {label:<40} client {client:6.0f} us, server {server:6.0f} us per call")
    separate, one = frame_costs(args.calls, args.rounds)
    extra = (separate - one) / (FRAME_MESSAGES - 1)
    print(
        f"{FRAME_MESSAGES} messages per call: {separate:.0f} us as {FRAME_MESSAGES} frames,"
        f" {one:.0f} us as one (client and server in one process): {extra:.0f} us per frame"
    )
    ff_server = median([s for _, s in rows["cpp_ff"]])
    ratio = median(
        [c[1] / f[1] for c, f in zip(rows["cpp"], rows["cpp_ff"], strict=True)]
    )  # paired per round
    print(result_line("flight_call_server_cpu", ff_server, "us", ratio, 1))


if __name__ == "__main__":
    main()
