"""A live `flightfeed worker` process against clients that hold its connections: header blocks
too large to keep, requests that trickle in, connections that never make a call. Each gets a
clear end (a gRPC status, or GOAWAY saying why), the worker's memory stays flat, and it keeps
serving everyone else, pyarrow's Flight client included."""

from __future__ import annotations

import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field

import anyio
import pyarrow.flight as fl
import pytest
from anyio.abc import ByteReceiveStream, ByteSendStream, SocketAttribute, SocketStream
from grpclib.const import Status
from h2.errors import ErrorCodes
from h2.events import ConnectionTerminated
from helpers.raw_h2 import (
    CallAnswer,
    RawH2Client,
    continuation_frame,
    data_frame,
    grpc_message,
    headers_frame,
)
from helpers.worker_process import (
    peak_resident_bytes,
    resident_bytes,
    worker_log,
    worker_process,
)

from flightfeed.flight.client import parse_location
from flightfeed.flight.log_limit import DEFAULT_BURST
from flightfeed.protocol import WorkerClient
from flightfeed.tables.flight import ACTIONS as TABLE_ACTIONS

FLIGHT = "/arrow.flight.protocol.FlightService/"
INFO = "/flightfeed.v1.WorkerService/GetWorkerInfo"
MiB = 1 << 20
FAST_RATE_RULE = ("--min-receive-rate", "1000", "--receive-grace", "1")
"""1,000 bytes/s after 1 s: a trickle at a few bytes a second is ended within ~1 s."""


WORKER_ACTIONS = [action.type for action in TABLE_ACTIONS]
"""What a worker's ListActions answers: its tables' actions."""


def served_by_pyarrow(location: str) -> bool:
    """pyarrow's C++ Flight client gets an answer from the worker."""
    with fl.connect(location) as client:
        return [a.type for a in client.list_actions()] == WORKER_ACTIONS


async def connect(location: str) -> RawH2Client:
    client = await RawH2Client.connect(*parse_location(location))
    await client.settle()
    return client


async def end_of(client: RawH2Client) -> ConnectionTerminated | None:
    """The GOAWAY the worker ends `client`'s connection with (None: closed without one)."""
    with anyio.fail_after(10):
        return await client.goaway()


def test_a_header_block_is_measured_while_it_arrives() -> None:
    """A 240 MB header block in 4 MiB CONTINUATION frames grew a worker to 1.5 GB: h2 kept the
    whole block to measure it. Now the frame that takes a block past the 64 KiB limit closes
    the connection before its payload is kept."""

    async def flood(location: str) -> ConnectionTerminated | None:
        client = await connect(location)
        stream_id, block = client.header_block(INFO)
        payload = bytes(4 * MiB - 64)  # within the worker's 4 MiB frame size
        frames = 240 * MiB // len(payload)

        async def send() -> None:
            if not await client.send_raw(headers_frame(stream_id, block)):
                return
            for index in range(frames):
                last = index == frames - 1
                piece = continuation_frame(stream_id, payload, end_headers=last)
                if not await client.send_raw(piece):
                    return

        try:
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(send)
                goaway = await end_of(client)
                tasks.cancel_scope.cancel()
        finally:
            await client.aclose()
        return goaway

    with worker_process() as (proc, location):
        peak_before = max(peak_resident_bytes(proc.pid), resident_bytes(proc.pid))
        goaway = anyio.run(flood, location)
        grown = peak_resident_bytes(proc.pid) - peak_before
        assert served_by_pyarrow(location)
    assert goaway is not None
    assert goaway.error_code == ErrorCodes.ENHANCE_YOUR_CALM
    assert b"exceeds the limit of 65536 bytes" in (goaway.additional_data or b"")
    assert grown < 48 * MiB, f"the worker's peak grew by {grown / MiB:.0f} MiB"


def test_a_grpc_core_client_is_told_which_header_limit_it_crossed() -> None:
    """The limit is advertised (SETTINGS_MAX_HEADER_LIST_SIZE) and configurable; a client past
    it reads why in the GOAWAY, and its next call, within the limit, is served."""
    with (
        worker_process("--max-header-list-size", "16384") as (_, location),
        fl.connect(location) as client,
    ):
        fits = fl.FlightCallOptions(headers=[(b"x-token", b"t" * 8000)])
        assert [a.type for a in client.list_actions(fits)] == WORKER_ACTIONS
        too_large = fl.FlightCallOptions(headers=[(b"x-token", b"t" * 32000)])
        with pytest.raises(fl.FlightUnavailableError, match="exceeds the limit of 16384 bytes"):
            list(client.list_actions(too_large))
        assert [a.type for a in client.list_actions(fits)] == WORKER_ACTIONS


def test_a_request_trickled_in_ends_its_call_and_the_connection_goes_on() -> None:
    """A request sent a byte at a time held its call as long as the client kept trickling (150 s
    measured, and no end in sight)."""

    async def scenario(location: str) -> tuple[CallAnswer, CallAnswer]:
        client = await connect(location)
        try:
            message = grpc_message(bytes(100))
            pieces = [(0.2, message[index : index + 1]) for index in range(len(message))]
            with anyio.fail_after(10):
                slow = await client.paced_call(INFO, pieces)
                prompt = await client.call(INFO, [grpc_message(b"")])  # the same connection
        finally:
            await client.aclose()
        return slow, prompt

    with worker_process(*FAST_RATE_RULE) as (_, location):
        slow, prompt = anyio.run(scenario, location)
        assert served_by_pyarrow(location)
    assert slow.status == Status.RESOURCE_EXHAUSTED.value, slow
    assert "the request message arrived too slowly" in slow.message
    assert "slower than the minimum of 1000 bytes/s after 1 s" in slow.message
    assert prompt.status == Status.OK.value, prompt


@pytest.mark.parametrize("unfinished", ["a header block", "an HTTP/2 frame"])
def test_a_header_block_or_frame_trickled_in_closes_its_connection_only(unfinished: str) -> None:
    """A header block (one CONTINUATION a byte long at a time) or a frame (a byte at a time)
    stalls its whole connection and held it for as long as the client liked."""

    async def scenario(location: str) -> tuple[ConnectionTerminated | None, CallAnswer]:
        slow = await connect(location)
        stream_id, block = slow.header_block(INFO)
        if unfinished == "a header block":
            pieces = [headers_frame(stream_id, block[:1])] + [
                continuation_frame(stream_id, block[i : i + 1], end_headers=i == len(block) - 1)
                for i in range(1, len(block))
            ]
        else:
            whole = headers_frame(stream_id, block, end_headers=True) + data_frame(
                stream_id, grpc_message(b""), end_stream=True
            )
            pieces = [whole[i : i + 1] for i in range(len(whole))]

        async def trickle() -> None:
            for piece in pieces:
                if not await slow.send_raw(piece):
                    return
                await anyio.sleep(0.2)

        try:
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(trickle)
                other = await connect(location)  # meanwhile, others are served
                try:
                    answer = await other.call(INFO, [grpc_message(b"")])
                finally:
                    await other.aclose()
                goaway = await end_of(slow)
                tasks.cancel_scope.cancel()
        finally:
            await slow.aclose()
        return goaway, answer

    with worker_process(*FAST_RATE_RULE) as (_, location):
        goaway, answer = anyio.run(scenario, location)
        assert served_by_pyarrow(location)
    assert answer.status == Status.OK.value, answer
    assert goaway is not None
    assert goaway.error_code == ErrorCodes.ENHANCE_YOUR_CALM
    assert f"{unfinished} arrived too slowly" in (goaway.additional_data or b"").decode()


def test_a_call_quiet_before_its_message_is_neither_slow_nor_idle() -> None:
    """Only slowness within a message counts, not quiet between messages (a CoordinatorChannel
    waits minutes between two), and a connection with a call open is not idle."""

    async def scenario(location: str) -> CallAnswer:
        client = await connect(location)
        try:
            with anyio.fail_after(10):
                return await client.paced_call(INFO, [(2.5, grpc_message(b""))])
        finally:
            await client.aclose()

    with worker_process(*FAST_RATE_RULE, "--idle-timeout", "0.5") as (_, location):
        answer = anyio.run(scenario, location)
    assert answer.status == Status.OK.value, answer


@dataclass
class Forwarder:
    """A port forwarded to the worker, counting connections, and noting when a client closed
    one itself: a grpclib client does once it has read the server's GOAWAY."""

    location: str = ""
    opened: int = 0
    closed_by_client: anyio.Event = field(default_factory=anyio.Event)


async def _pump(source: ByteReceiveStream, sink: ByteSendStream) -> None:
    with suppress(anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
        async for chunk in source:
            await sink.send(chunk)


@asynccontextmanager
async def forwarder(target: str) -> AsyncIterator[Forwarder]:
    host, port = parse_location(target)
    forwarded = Forwarder()

    async def forward(client: SocketStream) -> None:
        forwarded.opened += 1
        async with (
            client,
            await anyio.connect_tcp(host, port) as upstream,
            anyio.create_task_group() as tasks,
        ):
            tasks.start_soon(_pump, upstream, client)
            await _pump(client, upstream)  # until the client closes its side
            forwarded.closed_by_client.set()
            tasks.cancel_scope.cancel()

    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    forwarded.location = f"grpc://127.0.0.1:{listener.extra(SocketAttribute.local_port)}"
    async with listener, anyio.create_task_group() as tasks:
        tasks.start_soon(listener.serve, forward)
        try:
            yield forwarded
        finally:
            tasks.cancel_scope.cancel()


def test_an_idle_connection_is_closed_and_a_flightfeed_client_reconnects() -> None:
    """A connection that made no call (or no more) was kept forever."""

    async def scenario(location: str) -> ConnectionTerminated | None:
        quiet = await connect(location)
        try:
            goaway = await end_of(quiet)
        finally:
            await quiet.aclose()
        async with forwarder(location) as forwarded, WorkerClient(forwarded.location) as client:
            assert (await client.worker_info()).version
            with anyio.fail_after(10):
                await forwarded.closed_by_client.wait()  # the worker's GOAWAY reached it
            assert (await client.worker_info()).version  # on a new connection
            assert forwarded.opened == 2
        return goaway

    with worker_process("--idle-timeout", "0.5") as (_, location):
        goaway = anyio.run(scenario, location)
        assert served_by_pyarrow(location)
    assert goaway is not None
    assert goaway.error_code == ErrorCodes.NO_ERROR
    assert goaway.additional_data == b"no calls for 0.5 s"


def _stop(proc: subprocess.Popen[str]) -> str:
    proc.terminate()
    proc.wait(timeout=30)
    return worker_log(proc)


def test_bad_calls_are_logged_a_line_each_at_a_bounded_rate() -> None:
    """A client error was logged nowhere below DEBUG, and there with a traceback: now one line
    each, without a traceback, and a flood of them is cut to a burst."""

    async def bad_calls(location: str) -> None:
        for _ in range(40):
            client = await RawH2Client.connect(*parse_location(location))
            try:
                answer = await client.call(FLIGHT + "DoGet", [grpc_message(b"\x08\x05")])
            finally:
                await client.aclose()
            assert answer.status == Status.INVALID_ARGUMENT.value, answer

    with worker_process() as (proc, location):
        anyio.run(bad_calls, location)
        log = _stop(proc)
    lines = [line for line in log.splitlines() if "DoGet from 127.0.0.1:" in line]
    assert lines, log
    assert lines[0].endswith(
        "failed: INVALID_ARGUMENT: malformed request message:"
        " Ticket.ticket should be bytes, got a varint"
    )
    assert DEFAULT_BURST <= len(lines) < 40, lines
    assert "Traceback" not in log, log
