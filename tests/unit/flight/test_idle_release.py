"""Freed memory goes back to the operating system once per quiet spell, never while busy."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio
import pytest

from flightfeed.concurrency import Signal
from flightfeed.flight.call_count import CallCount
from flightfeed.flight.idle_release import release_when_idle
from flightfeed.flight.tuning import release_free_memory

pytestmark = pytest.mark.anyio


class Load:
    """A busy flag with change notification, as the worker registry and admission have."""

    def __init__(self) -> None:
        self.count = 0
        self._changed = anyio.Event()

    def set(self, count: int) -> None:
        self.count = count
        self._changed.set()
        self._changed = anyio.Event()

    async def changed(self) -> None:
        await self._changed.wait()


async def test_released_once_per_quiet_spell_and_not_while_busy() -> None:
    load = Load()
    load.set(1)
    releases: list[int] = []
    released = anyio.Event()

    def release() -> None:
        releases.append(load.count)
        released.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(
            lambda: release_when_idle(
                lambda: load.count > 0, load.changed, delay=0.05, release=release
            )
        )
        await anyio.wait_all_tasks_blocked()
        assert releases == []  # busy: nothing released
        load.set(0)
        with anyio.fail_after(5):
            await released.wait()
        assert releases == [0]
        await anyio.sleep(0.2)  # still quiet: once per spell, not again
        assert releases == [0]
        released = anyio.Event()
        load.set(2)
        load.set(0)  # a new quiet spell
        with anyio.fail_after(5):
            await released.wait()
        assert releases == [0, 0]
        tg.cancel_scope.cancel()


async def test_a_spell_cut_short_by_new_work_releases_nothing() -> None:
    load = Load()
    releases: list[int] = []
    async with anyio.create_task_group() as tg:
        load.set(1)
        tg.start_soon(
            lambda: release_when_idle(
                lambda: load.count > 0, load.changed, delay=30, release=lambda: releases.append(1)
            )
        )
        await anyio.wait_all_tasks_blocked()
        load.set(0)
        await anyio.wait_all_tasks_blocked()
        load.set(1)  # busy again long before the delay is up
        await anyio.wait_all_tasks_blocked()
        assert releases == []
        tg.cancel_scope.cancel()


def test_release_free_memory_runs_here() -> None:
    release_free_memory()  # glibc's malloc_trim and Arrow's pool; a no-op where absent


async def test_a_call_count_wakes_its_waiters_and_shared_edges_on_its_edges_only() -> None:
    edges = Signal()  # shared with another source: the worker's tasks
    calls = CallCount(on_edge=edges.notify)
    woken: dict[str, list[int]] = {"calls": [], "edges": []}

    async def watch(name: str, changed: Callable[[], Awaitable[None]]) -> None:
        while True:
            await changed()
            woken[name].append(calls.running)

    async with anyio.create_task_group() as tg:
        tg.start_soon(watch, "calls", calls.changed)
        tg.start_soon(watch, "edges", edges.wait)
        await anyio.wait_all_tasks_blocked()
        calls.started()  # 0 → 1: an edge
        await anyio.wait_all_tasks_blocked()
        calls.started()
        calls.ended()  # 2 → 1 → … busy throughout: no wake-up
        await anyio.wait_all_tasks_blocked()
        edges.notify()  # the other source's edge
        await anyio.wait_all_tasks_blocked()
        calls.ended()  # 1 → 0: an edge
        await anyio.wait_all_tasks_blocked()
        assert woken == {"calls": [1, 0], "edges": [1, 1, 0]}
        assert not calls.busy()
        tg.cancel_scope.cancel()
    with pytest.raises(RuntimeError, match="without a call started"):
        calls.ended()
