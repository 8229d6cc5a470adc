"""LoopWatchdog reports a stall of the event loop with the stack that held it, and tells a
process that was only off the CPU from a loop that was held."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

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
    assert watchdog.pauses == []


def spin(seconds: float) -> None:
    """CPU work on the loop thread, with no blocking call in it."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        pass


@contextmanager
def gil_kept_by_this_thread() -> Iterator[None]:
    """Make the running thread keep the GIL for seconds at a time, as a long C call does:
    no other thread of the process runs meanwhile (the watchdog's sampler included)."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(30.0)
    try:
        yield
    finally:
        sys.setswitchinterval(interval)


@pytest.mark.loop_stall_expected
async def test_cpu_work_that_keeps_the_gil_is_a_stall_though_no_stack_could_be_taken() -> None:
    async with LoopWatchdog(threshold=0.05) as watchdog:
        with gil_kept_by_this_thread():
            spin(0.3)
        await anyio.lowlevel.checkpoint()
    assert len(watchdog.stalls) == 1, watchdog.report()
    assert watchdog.stalls[0].seconds >= 0.05
    assert "not sampled" in watchdog.stalls[0].stack
    assert watchdog.pauses == []


@pytest.mark.loop_stall_expected
async def test_a_process_stopped_from_outside_is_a_pause_not_a_stall() -> None:
    """SIGSTOP freezes every thread, as a machine too busy to run the process does: the loop
    was late, but nothing in it held the loop. (The watchdog's exit takes the last beat.)"""
    pid = os.getpid()
    # The stop (0.4 s) is well past the threshold; the threshold is past what a busy machine
    # takes to resume the process and reap the stopper (CI saw 0.0504 s, once, at 0.05).
    async with LoopWatchdog(threshold=0.2) as watchdog:
        stopper = await anyio.run_process(
            ["sh", "-c", f"kill -STOP {pid}; sleep 0.4; kill -CONT {pid}"]
        )
    assert stopper.returncode == 0
    assert watchdog.stalls == [], watchdog.report()
    # The stop is one pause; a machine busy enough (CI's) may add one of its own, which is
    # what pauses are for.
    assert any(pause >= 0.3 for pause in watchdog.pauses), watchdog.pauses


def test_the_threshold_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        LoopWatchdog(threshold=0)
