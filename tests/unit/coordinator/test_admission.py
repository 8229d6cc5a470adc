"""Admission: at most `limit` queries at once, the others served in arrival order."""

from __future__ import annotations

import anyio
import pytest

from flightfeed.coordinator.admission import Admission, AdmissionClosed
from flightfeed.errors import InvalidArgument, ResourceExhausted

pytestmark = pytest.mark.anyio


async def test_queries_beyond_the_limit_wait_their_turn_in_order() -> None:
    admission = Admission(2)
    order: list[int] = []
    await admission.acquire()
    await admission.acquire()

    async def query(n: int) -> None:
        await admission.acquire()
        order.append(n)

    async with anyio.create_task_group() as tg:
        for n in range(3):
            tg.start_soon(query, n)
            await anyio.wait_all_tasks_blocked()
        assert admission.queued == 3
        for _ in range(3):
            admission.release()
    assert order == [0, 1, 2]
    assert (admission.running, admission.queued) == (2, 0)


async def test_a_full_queue_refuses_at_once() -> None:
    admission = Admission(1, max_queued=0)
    await admission.acquire()
    with pytest.raises(ResourceExhausted, match="max_queued_queries=0"):
        await admission.acquire()
    admission.release()
    await admission.acquire()  # a free slot is taken without queueing


async def test_a_query_cancelled_while_queued_leaves_the_queue() -> None:
    admission = Admission(1)
    await admission.acquire()
    with anyio.CancelScope() as scope:
        async with anyio.create_task_group() as tg:
            tg.start_soon(admission.acquire)
            await anyio.wait_all_tasks_blocked()
            assert admission.queued == 1
            scope.cancel()
    assert admission.queued == 0
    admission.release()
    assert admission.running == 0


async def test_a_slot_handed_to_a_waiter_being_cancelled_is_not_lost() -> None:
    admission = Admission(1)
    await admission.acquire()
    admitted: list[str] = []
    scopes: dict[str, anyio.CancelScope] = {}

    async def waiter(name: str) -> None:
        with anyio.CancelScope() as scope:
            scopes[name] = scope
            await admission.acquire()
            admitted.append(name)

    async with anyio.create_task_group() as tg:
        tg.start_soon(waiter, "first")
        await anyio.wait_all_tasks_blocked()
        tg.start_soon(waiter, "second")
        await anyio.wait_all_tasks_blocked()
        admission.release()  # the slot goes to "first" ...
        scopes["first"].cancel()  # ... cancelled as it wakes: if it gives up, "second" runs
        await anyio.wait_all_tasks_blocked()
        assert len(admitted) == 1  # either way exactly one of them holds the slot
        assert admission.running == 1
        scopes["second"].cancel()  # (still queued if "first" kept the slot)
    assert admission.queued == 0


def test_limits_are_checked() -> None:
    with pytest.raises(InvalidArgument):
        Admission(0)
    with pytest.raises(InvalidArgument):
        Admission(1, max_queued=-1)


async def test_closing_ends_the_queue_and_refuses_later_queries() -> None:
    admission = Admission(1)
    await admission.acquire()
    ended: list[str] = []

    async def queued() -> None:
        with pytest.raises(AdmissionClosed):
            await admission.acquire()
        ended.append("queued")

    async with anyio.create_task_group() as tg:
        tg.start_soon(queued)
        await anyio.wait_all_tasks_blocked()
        admission.close()
    assert ended == ["queued"]
    assert (admission.running, admission.queued) == (1, 0)  # the running query keeps its slot
    with pytest.raises(AdmissionClosed):
        await admission.acquire()
    admission.release()
    assert admission.running == 0


async def test_a_slot_handed_on_before_the_close_is_kept() -> None:
    admission = Admission(1)
    await admission.acquire()
    admitted: list[str] = []

    async def queued() -> None:
        await admission.acquire()
        admitted.append("queued")

    async with anyio.create_task_group() as tg:
        tg.start_soon(queued)
        await anyio.wait_all_tasks_blocked()
        admission.release()  # handed to the queued query, which has not woken yet
        admission.close()
    assert admitted == ["queued"]
    assert admission.running == 1
