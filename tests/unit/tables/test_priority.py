"""PriorityGate: high-priority callers go first under load, slots are never lost, and a
cancelled waiter leaves nothing behind."""

from __future__ import annotations

import anyio
import pytest

from flightfeed.tables.priority import PriorityGate


async def _hold(
    gate: PriorityGate, low: bool, order: list[str], name: str, go: anyio.Event
) -> None:
    async with gate.slot(low=low):
        order.append(name)
        await go.wait()


@pytest.mark.anyio
async def test_under_load_high_priority_waiters_go_first() -> None:
    gate = PriorityGate(1)
    order: list[str] = []
    release = [anyio.Event() for _ in range(5)]
    async with anyio.create_task_group() as tg:
        tg.start_soon(_hold, gate, False, order, "first", release[0])
        await _until(lambda: gate.running == 1)
        tg.start_soon(_hold, gate, True, order, "low-1", release[1])
        await _until(lambda: gate.waiting == (0, 1))
        tg.start_soon(_hold, gate, True, order, "low-2", release[2])
        await _until(lambda: gate.waiting == (0, 2))
        tg.start_soon(_hold, gate, False, order, "high", release[3])
        await _until(lambda: gate.waiting == (1, 2))
        # each holder lets go in turn; the next in line is the high one, then the lows in order
        for holder, expected in ((0, "high"), (3, "low-1"), (1, "low-2")):
            release[holder].set()
            await _until(lambda expected=expected: order[-1] == expected)
        release[2].set()
    assert order == ["first", "high", "low-1", "low-2"]
    assert gate.running == 0
    assert gate.waiting == (0, 0)


@pytest.mark.anyio
async def test_without_load_both_priorities_run_at_once() -> None:
    gate = PriorityGate(2)
    async with gate.slot(low=True), gate.slot(low=False):
        assert gate.running == 2
    assert gate.running == 0


@pytest.mark.anyio
async def test_a_cancelled_waiter_gives_its_place_back() -> None:
    gate = PriorityGate(1)
    async with gate.slot():
        with anyio.move_on_after(0.01):
            async with gate.slot(low=True):
                pytest.fail("got a slot that was taken")
        assert gate.waiting == (0, 0)
    assert gate.running == 0
    async with gate.slot(low=True):  # the slot is free again
        assert gate.running == 1


def test_a_gate_needs_a_slot() -> None:
    with pytest.raises(ValueError, match="at least one slot"):
        PriorityGate(0)


async def _until(condition: object) -> None:
    """Let the other tasks run until `condition()` holds (each check yields to them)."""
    for _ in range(1000):
        if condition():  # type: ignore[operator]
            return
        await anyio.lowlevel.checkpoint()
    raise AssertionError("the condition never held")
