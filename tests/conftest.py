"""Test infrastructure: both event loops, real servers on port 0, pyarrow's reference server,
and two guards on every async test: no blocking call from flightfeed's code on the event loop
(blockbuster), and no stall of the loop longer than LOOP_STALL_SECONDS (LoopWatchdog).

`tests/` is on sys.path so tests import shared code as `helpers.*`.
"""

from __future__ import annotations

import inspect
import os
import socket
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from blockbuster import blockbuster_ctx
from hypothesis import settings

sys.path.insert(0, str(Path(__file__).parent))

from helpers.flight import StoreHandler, running_server
from helpers.pyarrow_server import ReferenceServer

from flightfeed.flight.tuning import apply_process_tuning
from flightfeed.testing import LoopWatchdog

apply_process_tuning()

pytest_plugins = ["helpers.spark_fixtures"]

# CI runs must be reproducible: the same examples every run (a failure locally still shrinks
# and reports its seed). Elsewhere hypothesis explores fresh examples each time.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


@pytest.fixture(
    scope="module",
    params=[
        pytest.param(("asyncio", {"use_uvloop": False}), id="asyncio"),
        pytest.param(("asyncio", {"use_uvloop": True}), id="uvloop"),
    ],
)
def anyio_backend(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    """Every async test runs on the stock asyncio loop and on uvloop."""
    backend: tuple[str, dict[str, Any]] = request.param
    return backend


@pytest.fixture
def store() -> StoreHandler:
    """A fresh StoreHandler: start it with `helpers.flight.running_server(store)`."""
    return StoreHandler()


@pytest.fixture
async def store_server(store: StoreHandler) -> AsyncIterator[str]:
    """A flightfeed FlightServer serving `store` on 127.0.0.1:0; yields its location."""
    async with running_server(store) as location:
        yield location


@pytest.fixture
def pyarrow_server() -> Iterator[ReferenceServer]:
    """pyarrow's own Flight server on port 0, serving in its own thread."""
    server = ReferenceServer()
    thread = threading.Thread(target=server.serve, name="pyarrow-flight-server", daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        thread.join(timeout=30)
        assert not thread.is_alive(), "pyarrow Flight server did not shut down"


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port of 127.0.0.1 that another socket listens on (a server there cannot have it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


LOOP_STALL_SECONDS = float(os.environ.get("FLIGHTFEED_TEST_LOOP_STALL", "0.5"))
"""How long any one callback may hold the event loop in a test (generous: a test fails on a
real stall, such as decoding a big plan on the loop, not on scheduler noise)."""


@pytest.fixture(autouse=True)
def loop_guard(request: pytest.FixtureRequest) -> None:
    """Every async test runs under `event_loop_guard`."""
    function = getattr(request, "function", None)
    if not (inspect.iscoroutinefunction(function) and request.node.get_closest_marker("anyio")):
        return
    if request.node.get_closest_marker("loop_stall_expected") is None:
        request.getfixturevalue("event_loop_guard")


@pytest.fixture
async def event_loop_guard(request: pytest.FixtureRequest) -> AsyncIterator[None]:
    """Fail the test if flightfeed blocks the event loop: a blocking call made from
    flightfeed's own modules (blockbuster raises it where it happens), or any stall longer
    than LOOP_STALL_SECONDS (reported with the stack that held the loop), or than the test's
    own `loop_stall_limit(seconds)` where the test itself makes one loop turn long."""
    marker = request.node.get_closest_marker("loop_stall_limit")
    limit = max(LOOP_STALL_SECONDS, float(marker.args[0])) if marker else LOOP_STALL_SECONDS
    with blockbuster_ctx("flightfeed"):
        async with LoopWatchdog(limit) as watchdog:
            yield
    if watchdog.stalls:
        pytest.fail(watchdog.report(), pytrace=False)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests under tests/spark/ are marked `spark` (select or skip them with -m)."""
    for item in items:
        if "tests/spark/" in str(item.path).replace(os.sep, "/"):
            item.add_marker(pytest.mark.spark)
