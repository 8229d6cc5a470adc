"""The task registry: plans arriving after their ExecuteTask, tombstones, capacity, waiters."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import pyarrow as pa
import pytest

from flightfeed.errors import NotFound, PlanDecodeError, ResourceExhausted, Unavailable
from flightfeed.plan import MemoryScan
from flightfeed.protocol import TaskId
from flightfeed.session import Session
from flightfeed.worker import WorkerConfig
from flightfeed.worker.registry import TaskRegistry
from flightfeed.worker.task import Task

pytestmark = pytest.mark.anyio

PLAN = MemoryScan.from_table(pa.table({"x": [1, 2, 3]}))


def key(number: int = 0) -> TaskId:
    return TaskId(b"\x01" * 16, 1, number, 0)


@asynccontextmanager
async def tasks() -> AsyncIterator[tuple[TaskRegistry, anyio.abc.TaskGroup]]:
    registry = TaskRegistry(WorkerConfig(plan_wait_timeout=30, max_concurrent_tasks=2))
    async with anyio.create_task_group() as tg:
        yield registry, tg
        tg.cancel_scope.cancel()


def new_task(tg: anyio.abc.TaskGroup, task_key: TaskId) -> Task:
    return Task(
        task_key,
        PLAN,
        Session(),
        tg,
        worker_url="grpc://w:1",
        task_count=1,
        query_start_ns=0,
        consumer_buffer=2,
    )


async def test_an_execute_task_waits_for_its_plan() -> None:
    async with tasks() as (registry, tg):
        found: list[Task] = []

        async def consumer() -> None:
            found.append(await registry.wait_for(key()))

        tg.start_soon(consumer)
        await anyio.wait_all_tasks_blocked()
        assert registry.waiting == 1
        task = new_task(tg, key())
        registry.add(task)
        await anyio.wait_all_tasks_blocked()  # the consumer has taken it
        assert found == [task]
        assert registry.waiting == 0


async def test_cancelled_waiters_leave_nothing_behind() -> None:
    async with tasks() as (registry, tg):
        for number in range(100):
            tg.start_soon(registry.wait_for, key(number))
        await anyio.wait_all_tasks_blocked()
        assert registry.waiting == 100
        tg.cancel_scope.cancel()  # as when their clients leave
    assert registry.waiting == 0


async def test_no_plan_in_time_is_not_found_and_forgotten() -> None:
    registry = TaskRegistry(WorkerConfig(plan_wait_timeout=0.01))
    with pytest.raises(NotFound, match=r"no plan for task .* arrived within 0\.01s"):
        await registry.wait_for(key())
    assert registry.waiting == 0


async def test_a_finished_task_leaves_a_tombstone() -> None:
    async with tasks() as (registry, tg):
        task = new_task(tg, key())
        registry.add(task)
        registry.remove(task, "finished")
        with pytest.raises(NotFound, match="is no longer on this worker: finished"):
            await registry.wait_for(key())


async def test_a_refused_plan_wakes_its_waiters_with_the_refusal() -> None:
    async with tasks() as (registry, tg):
        errors: list[Exception] = []

        async def reader() -> None:
            try:
                await registry.wait_for(key())
            except NotFound as exc:
                raise AssertionError("the refusal, not a missing plan") from exc
            except Exception as exc:
                errors.append(exc)

        tg.start_soon(reader)
        tg.start_soon(reader)
        await anyio.wait_all_tasks_blocked()
        refusal = PlanDecodeError("unknown plan node kind 'RemoteScan'", error_type="KeyError")
        registry.refused(key(), refusal)
        await anyio.wait_all_tasks_blocked()  # woken now, not after the 30 s plan wait
        assert [type(e) for e in errors] == [PlanDecodeError, PlanDecodeError]
        assert [(e.message, e.error_type) for e in errors if isinstance(e, PlanDecodeError)] == [
            (refusal.message, "KeyError")
        ] * 2  # the refusal itself, as the coordinator hears it
        assert errors[0] is not errors[1]
        assert registry.waiting == 0
        # A reader arriving later learns it at once too, with the refusal's status.
        registry.refused(key(1), Unavailable("the worker is shutting down"))
        with pytest.raises(Unavailable, match="the worker is shutting down"):
            await registry.wait_for(key(1))


async def test_refusing_a_duplicate_plan_leaves_the_running_task_be() -> None:
    async with tasks() as (registry, tg):
        task = new_task(tg, key())
        registry.add(task)
        registry.refused(key(), ResourceExhausted(f"task {key()} already has a plan"))
        assert await registry.wait_for(key()) is task
        registry.remove(task, "finished")
        with pytest.raises(NotFound, match="is no longer on this worker: finished"):
            await registry.wait_for(key())


async def test_tombstones_are_bounded_oldest_first() -> None:
    registry = TaskRegistry(WorkerConfig(max_tombstones=3, plan_wait_timeout=0.01))
    for number in range(5):
        registry.refused(key(number), Unavailable("shutting down"))
    for number in (0, 1):  # forgotten: a reader waits for a plan again
        with pytest.raises(NotFound, match="no plan for task"):
            await registry.wait_for(key(number))
    for number in (2, 3, 4):
        with pytest.raises(Unavailable):
            await registry.wait_for(key(number))


async def test_capacity_and_duplicate_plans_are_refused() -> None:
    async with tasks() as (registry, tg):
        registry.add(new_task(tg, key(0)))
        with pytest.raises(ResourceExhausted, match="already has a plan"):
            registry.add(new_task(tg, key(0)))
        registry.add(new_task(tg, key(1)))
        with pytest.raises(ResourceExhausted, match="runs 2 tasks, the limit is 2"):
            registry.check_capacity(key(2))
        assert sorted(registry.keys()) == [key(0), key(1)]


async def test_busy_edges_are_the_first_task_and_the_last() -> None:
    edges: list[int] = []
    registry = TaskRegistry(
        WorkerConfig(max_concurrent_tasks=4), on_edge=lambda: edges.append(len(registry))
    )
    async with anyio.create_task_group() as tg:
        first, second = new_task(tg, key(0)), new_task(tg, key(1))
        registry.add(first)
        registry.add(second)
        registry.remove(first, "finished")
        assert edges == [1]  # busy from the first task on; a second one is no edge
        registry.remove(second, "finished")
        registry.remove(second, "finished")  # already gone: no second edge
        assert edges == [1, 0]
        tg.cancel_scope.cancel()


async def test_the_idle_reaper_cancels_a_task_added_while_it_slept() -> None:
    registry = TaskRegistry(WorkerConfig(idle_ttl=0.2))
    async with anyio.create_task_group() as tg:
        tg.start_soon(registry.reap_idle)
        await anyio.wait_all_tasks_blocked()  # the reaper sleeps a whole TTL: no task yet
        task = new_task(tg, key())
        registry.add(task)
        with anyio.fail_after(5):
            await task.done.wait()
        assert task.cancel_reason is not None
        assert "idle TTL" in task.cancel_reason
        tg.cancel_scope.cancel()
