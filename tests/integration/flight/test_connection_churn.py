"""A server under connection churn collects the cycles its closed connections leave: with the
collector's thresholds out of reach, the 256th closed connection still brings a full pass
(churn_collect.py), so dead connections never pile up in the old generation."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
from grpclib.const import Status
from helpers.flight import running_server
from helpers.raw_h2 import RawH2Client, grpc_message

from flightfeed.flight import FlightHandler
from flightfeed.flight.churn_collect import DEFAULT_EVERY
from flightfeed.flight.client import parse_location

pytestmark = pytest.mark.anyio


@pytest.fixture
def full_passes() -> Iterator[anyio.Event]:
    """Set at the first full collection; none happens on its own meanwhile."""
    thresholds = gc.get_threshold()
    passed = anyio.Event()

    def on_pass(phase: str, info: dict[str, Any]) -> None:
        if phase == "start" and info["generation"] == 2:
            passed.set()

    gc.collect()
    gc.set_threshold(10**9, 10**9, 10**9)
    gc.callbacks.append(on_pass)
    try:
        yield passed
    finally:
        gc.callbacks.remove(on_pass)
        gc.set_threshold(*thresholds)


async def test_closed_connections_are_collected_while_they_churn(
    full_passes: anyio.Event,
) -> None:
    async with running_server(FlightHandler()) as location:
        host, port = parse_location(location)
        for _ in range(DEFAULT_EVERY):
            client = await RawH2Client.connect(host, port)
            try:
                answer = await client.call(
                    "/arrow.flight.protocol.FlightService/ListActions",
                    [grpc_message(b"")],
                    end=True,
                    headers=[],
                )
                assert answer.status == Status.OK.value
            finally:
                await client.aclose()
        with anyio.fail_after(10):
            await full_passes.wait()
