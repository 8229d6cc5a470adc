"""PriorityGate: high-priority callers go first under load, slots are never lost, and a
cancelled waiter leaves nothing behind."""

from __future__ import annotations

import anyio
import pytest

from flightfeed.tables.priority import PriorityGate


async def _hold(
    gate: PriorityGate,
    low: bool,
    order: list[str],
    name: str,
    go: anyio.Event,
    entered: dict[str, anyio.Event],
) -> None:
    async with gate.slot(low=low):
        order.append(name)
        entered[name].set()
        await go.wait()


@pytest.mark.anyio
async def test_under_load_high_priority_waiters_go_first() -> None:
    gate = PriorityGate(1)
    order: list[str] = []
    release = [anyio.Event() for _ in range(4)]
    entered = {name: anyio.Event() for name in ("first", "low-1", "low-2", "high")}
    async with anyio.create_task_group() as tg:
        tg.start_soon(_hold, gate, False, order, "first", release[0], entered)
        await entered["first"].wait()
        tg.start_soon(_hold, gate, True, order, "low-1", release[1], entered)
        await gate.wait_until(lambda g: g.waiting == (0, 1))
        tg.start_soon(_hold, gate, True, order, "low-2", release[2], entered)
        await gate.wait_until(lambda g: g.waiting == (0, 2))
        tg.start_soon(_hold, gate, False, order, "high", release[3], entered)
        await gate.wait_until(lambda g: g.waiting == (1, 2))
        # each holder lets go in turn; the next in line is the high one, then the lows in order
        for holder, following in ((0, "high"), (3, "low-1"), (1, "low-2")):
            release[holder].set()
            with anyio.fail_after(5):  # another order would have let another one in
                await entered[following].wait()
            assert order[-1] == following
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
