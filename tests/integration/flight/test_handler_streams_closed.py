"""A handler's DoAction, ListFlights and Handshake streams are closed by the call that ran
them when the client leaves midway, over real gRPC: their `finally` blocks (a lock released,
a cursor closed) run then, in the call's task. Before, FlightServer left them to the garbage
collector, which closed them whenever it collected them, from a task of its own (for a
worker's table reads, whose cancel scopes then exited in another task, that was a logged
RuntimeError). And the client leaves at once: under uvloop, flightfeed's client, cancelled
while a server streamed results fast, kept reading them for as long as the server sent (the
uvloop cases hung until the test timed out; flight.client.received)."""

from __future__ import annotations

import gc
from collections.abc import AsyncIterator
from typing import TypeVar

import anyio
import pytest
from anyio.lowlevel import checkpoint

from flightfeed._generated.arrow.flight.protocol import Action, FlightInfo
from flightfeed.flight import CallContext, FlightClient, FlightHandler, FlightServer

pytestmark = pytest.mark.anyio

T = TypeVar("T")

BODY = b"x" * (1 << 20)
"""A result of 1 MiB: a few fill the connection's 4 MiB window, and the call waits in its
send, with the handler's stream suspended, when the client leaves."""


class Endless(FlightHandler):
    """Streams results until the client leaves; records the task each stream ran and ended in."""

    def __init__(self) -> None:
        self.sent = 0
        self.window_full = anyio.Event()
        self.ran_in: list[int] = []
        self.closed_in: list[int] = []

    async def _endless(self, item: T) -> AsyncIterator[T]:
        self.ran_in.append(anyio.get_current_task().id)
        try:
            while True:
                self.sent += 1
                if self.sent == 8:
                    self.window_full.set()
                yield item
                await checkpoint()
        finally:
            self.closed_in.append(anyio.get_current_task().id)

    def do_action(self, ctx: CallContext, action: Action) -> AsyncIterator[bytes]:
        return self._endless(BODY)

    def list_flights(self, ctx: CallContext, criteria: bytes) -> AsyncIterator[FlightInfo]:
        return self._endless(FlightInfo(app_metadata=BODY))


@pytest.mark.parametrize("rpc", ["DoAction", "ListFlights"])
async def test_a_stream_the_client_leaves_is_closed_in_the_calls_task(rpc: str) -> None:
    handler = Endless()
    async with FlightServer(handler) as server, FlightClient(server.location) as client:
        async with anyio.create_task_group() as tg:
            if rpc == "DoAction":
                tg.start_soon(client.do_action, "endless")
            else:
                tg.start_soon(client.list_flights)
            with anyio.fail_after(10):
                await handler.window_full.wait()
            tg.cancel_scope.cancel()  # (the client leaves: RST_STREAM)
        with anyio.fail_after(10):
            while server.calls.running:
                await server.calls.changed()
        gc.collect()
        await anyio.wait_all_tasks_blocked()
    assert handler.ran_in
    assert handler.closed_in == handler.ran_in
