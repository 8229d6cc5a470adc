"""LoopWatchdog reports a stall of the event loop with the stack that held it."""

from __future__ import annotations

import time

import anyio
import anyio.lowlevel
import pytest

from flightfeed.testing import LoopWatchdog

pytestmark = pytest.mark.anyio


def hold_the_loop(seconds: float) -> None:
    time.sleep(seconds)  # what a blocking call in a callback does to every other stream


@pytest.mark.loop_stall_expected
async def test_a_stall_is_reported_with_the_code_that_held_the_loop() -> None:
    async with LoopWatchdog(threshold=0.05) as watchdog:
        hold_the_loop(0.3)
        await anyio.lowlevel.checkpoint()
    assert len(watchdog.stalls) == 1
    (stall,) = watchdog.stalls
    assert stall.seconds >= 0.05  # it held the loop at least the threshold (really ~0.3 s)
    assert "hold_the_loop" in stall.stack
    assert "held at" in watchdog.report()


def test_the_threshold_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        LoopWatchdog(threshold=0)
