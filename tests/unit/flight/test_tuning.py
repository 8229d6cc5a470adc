"""Connection and process tuning is in effect: frame size, windows, malloc, h2 repr, uvloop,
the garbage collector."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import pytest
from hyperframe.frame import DataFrame

from flightfeed.flight import FlightClient, FlightHandler, FlightServer
from flightfeed.flight.tuning import (
    GC_THRESHOLDS,
    MAX_FRAME_SIZE,
    WINDOW_SIZE,
    patch_h2_frame_repr,
    tune_malloc,
    use_uvloop_default,
)

pytestmark = pytest.mark.anyio


async def test_both_ends_advertise_4_mib_frames_and_windows() -> None:
    async with FlightServer(FlightHandler()) as server, FlightClient(server.location) as client:
        await client.list_actions()  # one round trip: settings exchanged and acknowledged
        (connection,) = client._channel.connections
        channel_h2 = connection.connection._connection
        assert channel_h2.max_outbound_frame_size == MAX_FRAME_SIZE  # what the server advertised
        assert channel_h2.max_inbound_frame_size == MAX_FRAME_SIZE  # what the client advertised
        assert channel_h2.local_settings.initial_window_size == WINDOW_SIZE
        assert channel_h2.remote_settings.initial_window_size == WINDOW_SIZE


def test_data_frame_repr_is_constant_size() -> None:
    patch_h2_frame_repr()
    frame = DataFrame(1)
    frame.data = bytes(4 * 1024 * 1024)
    assert len(repr(frame)) < 100  # h2 builds this repr for every received frame


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc mallopt")
def test_malloc_thresholds_are_applied() -> None:
    assert tune_malloc() is True


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc mallopt")
@pytest.mark.parametrize(("switch", "tuned"), [("0", True), ("1", False)])
def test_malloc_is_tuned_once_unless_switched_off(switch: str, tuned: bool) -> None:
    """`tune_malloc_once` is what a Spark Python worker gets when it reads (a fresh process:
    the result is cached for the process)."""
    code = (
        "from flightfeed.flight.tuning import tune_malloc_once as t;"
        "print(t(), t(), t.cache_info().misses)"
    )
    env = {**os.environ, "FLIGHTFEED_NO_MALLOC_TUNING": switch}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout
    assert out.split() == [str(tuned), str(tuned), "1"]


def test_uvloop_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLIGHTFEED_UVLOOP", "0")
    assert use_uvloop_default() is False
    monkeypatch.setenv("FLIGHTFEED_UVLOOP", "1")
    assert use_uvloop_default() is True


def test_run_uses_uvloop_by_default_and_asyncio_when_switched_off() -> None:
    from flightfeed.flight.tuning import run

    async def loop_module() -> str:
        return type(asyncio.get_running_loop()).__module__

    assert run(loop_module).startswith("uvloop")
    assert run(loop_module, use_uvloop=False).startswith("asyncio")


def _gc_after_tuning(env: dict[str, str]) -> tuple[list[int], int, bool]:
    """gc thresholds and frozen objects in a fresh interpreter after `tune_gc()` twice."""
    script = (
        "import gc, json; from flightfeed.flight.tuning import tune_gc;"
        "first = tune_gc(); second = tune_gc();"
        "print(json.dumps([list(gc.get_threshold()), gc.get_freeze_count(), first and not second]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", script],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    thresholds, frozen, once = json.loads(out)
    return thresholds, frozen, once


def test_tune_gc_raises_thresholds_and_freezes_the_start_up_heap_once() -> None:
    thresholds, frozen, once = _gc_after_tuning({"FLIGHTFEED_NO_GC_TUNING": "0"})
    assert thresholds == list(GC_THRESHOLDS)
    assert frozen > 10_000  # the imported modules' objects leave the collector's passes
    assert once


def test_tune_gc_can_be_turned_off() -> None:
    thresholds, frozen, _ = _gc_after_tuning({"FLIGHTFEED_NO_GC_TUNING": "1"})
    assert thresholds == [700, 10, 10]  # Python's defaults
    assert frozen == 0
