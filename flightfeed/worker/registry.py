"""Tasks by key: plan arrival, waiting for a plan, tombstones and the idle TTL.

An ExecuteTask may arrive before its SetPlan; it waits on an event for a bounded time. A task
that ended leaves a tombstone for a while, so late requests learn what happened to it instead
of waiting in vain; so does a SetPlan this worker refused (a plan its session cannot decode, a
worker shutting down), and the readers already waiting for that plan learn it at once: the
refusal itself, not a "no plan arrived" after the whole plan wait. The wait is for a SetPlan
to come: once one has, its readers wait while it is opened (a session builder may take longer
than the plan wait), and learn how that ended.
"""

from __future__ import annotations

import copy
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import anyio

from ..concurrency import Signal
from ..errors import FlightfeedError, NotFound, ResourceExhausted, Unavailable
from ..protocol.keys import TaskId
from .config import WorkerConfig
from .task import Task


class _Waiter:
    """ExecuteTasks waiting for one task's plan."""

    __slots__ = ("arrived", "count")

    def __init__(self) -> None:
        self.arrived = anyio.Event()
        self.count = 0


class TaskRegistry:
    """Owns the live tasks of a worker. Single event loop; no locks needed."""

    def __init__(self, config: WorkerConfig, on_edge: Callable[[], None] | None = None) -> None:
        """`on_edge`: told when the worker gets its first task or loses its last one."""
        self.config = config
        self._on_edge = on_edge
        self._tasks: dict[TaskId, Task] = {}
        self._waiters: dict[TaskId, _Waiter] = {}
        self._opening: Counter[TaskId] = Counter()
        """SetPlans being opened (session built, plan decoded), by key."""
        self._tombstones: OrderedDict[TaskId, tuple[FlightfeedError, float]] = OrderedDict()
        """What a late reader of a task gets (a copy each time), until when."""
        self._changed = Signal()
        self.draining = False
        """Set when the worker shuts down gracefully: running tasks finish, new ones are
        refused."""

    def __len__(self) -> int:
        return len(self._tasks)

    def __contains__(self, key: TaskId) -> bool:
        return key in self._tasks

    def keys(self) -> list[TaskId]:
        return list(self._tasks)

    @property
    def waiting(self) -> int:
        """Tasks that ExecuteTasks are waiting for (their plans have not arrived)."""
        return len(self._waiters)

    @property
    def unsettled(self) -> int:
        """Tasks that still run or are being read (see `Task.settled` for the others)."""
        return sum(not task.settled for task in self._tasks.values())

    async def drained(self) -> None:
        """Until no task is left but settled ones: a shutdown need not wait for a task whose
        partitions were all read (its coordinator runs it again elsewhere if a reader comes
        back, as for a lost worker)."""
        while self.unsettled:
            await self._changed.wait()

    def released(self) -> None:
        """A reader of some task let go of its partitions (that task may be settled now)."""
        if self.draining:
            self._notify()

    async def changed(self) -> None:
        """Wait until a task is added or removed."""
        await self._changed.wait()

    def _notify(self) -> None:
        self._changed.notify()

    def check_capacity(self, key: TaskId) -> None:
        if self.draining:
            raise Unavailable("the worker is shutting down: it finishes its tasks, takes no new")
        if key in self._tasks:
            raise ResourceExhausted(f"task {key} already has a plan on this worker")
        if len(self._tasks) >= self.config.max_concurrent_tasks:
            raise ResourceExhausted(
                f"worker runs {len(self._tasks)} tasks, the limit is "
                f"{self.config.max_concurrent_tasks}"
            )

    def add(self, task: Task) -> None:
        self.check_capacity(task.key)
        self._tasks[task.key] = task
        self._tombstones.pop(task.key, None)
        waiter = self._waiters.pop(task.key, None)
        if waiter is not None:
            waiter.arrived.set()
        self._notify()
        if len(self._tasks) == 1 and self._on_edge is not None:
            self._on_edge()

    def remove(self, task: Task, outcome: str) -> None:
        if self._tasks.get(task.key) is task:
            del self._tasks[task.key]
            self._bury(
                task.key, NotFound(f"task {task.key} is no longer on this worker: {outcome}")
            )
            self._notify()
            if not self._tasks and self._on_edge is not None:
                self._on_edge()

    def refused(self, key: TaskId, error: FlightfeedError) -> None:
        """The SetPlan for `key` was refused with `error`: its readers (waiting, or within the
        tombstone TTL) get that error too, as the coordinator does (whichever it hears first,
        the query fails with the same error). A refusal of a key that has a task (a duplicate
        SetPlan) leaves that task be."""
        if key in self._tasks:
            return
        self._bury(key, copy.copy(error))  # (without its traceback: nothing else is kept)
        waiter = self._waiters.pop(key, None)
        if waiter is not None:
            waiter.arrived.set()

    @contextmanager
    def opening(self, key: TaskId) -> Iterator[None]:
        """A SetPlan for `key` is being opened: its readers wait past the plan wait timeout,
        and are woken when the last opening ends (the task is registered before they run, or
        refused)."""
        self._opening[key] += 1
        try:
            yield
        finally:
            self._opening[key] -= 1
            if not self._opening[key]:
                del self._opening[key]
                waiter = self._waiters.pop(key, None)
                if waiter is not None:
                    waiter.arrived.set()

    def _bury(self, key: TaskId, gone: FlightfeedError) -> None:
        self._tombstones.pop(key, None)  # (re-inserted last: the oldest go first)
        self._tombstones[key] = (gone, time.monotonic() + self.config.tombstone_ttl)
        while len(self._tombstones) > self.config.max_tombstones:
            self._tombstones.popitem(last=False)

    def _check_tombstone(self, key: TaskId) -> None:
        """Raise what the key's live tombstone says, if it has one."""
        entry = self._tombstones.get(key)
        if entry is None:
            return
        gone, expires = entry
        if time.monotonic() > expires:
            del self._tombstones[key]
            return
        raise copy.copy(gone)

    async def wait_for(self, key: TaskId) -> Task:
        """The task, once its plan has arrived; NotFound after the plan wait timeout."""
        task = self._tasks.get(key)
        if task is not None:
            return task
        self._check_tombstone(key)
        waiter = self._waiters.get(key)
        if waiter is None:
            waiter = self._waiters[key] = _Waiter()
        waiter.count += 1
        try:
            with anyio.move_on_after(self.config.plan_wait_timeout):
                await waiter.arrived.wait()
            if not waiter.arrived.is_set() and key in self._opening:
                await waiter.arrived.wait()  # its SetPlan came: set when the opening ends
        finally:  # timed out, arrived or cancelled: the last one out removes the entry
            waiter.count -= 1
            if not waiter.count and self._waiters.get(key) is waiter:
                del self._waiters[key]
        task = self._tasks.get(key)
        if task is not None:
            return task
        self._check_tombstone(key)  # (refused while we waited)
        raise NotFound(
            f"no plan for task {key} arrived within {self.config.plan_wait_timeout:g}s "
            "(unknown task, or its SetPlan never came)"
        )

    async def reap_idle(self) -> None:
        """Cancel tasks nobody consumed for `idle_ttl`. Runs for the worker's lifetime.

        It sleeps until the earliest moment a task it saw could be due, and is not woken by
        tasks coming or going: a new task is due no earlier than `idle_ttl` from now, which
        is never before that moment. (Waking on every change cost a scan of every task per
        change: quadratic in concurrent tasks.)"""
        ttl = self.config.idle_ttl
        while True:
            now = time.monotonic()
            next_check = ttl
            for task in list(self._tasks.values()):
                if task.active_consumers:
                    continue
                idle = now - task.last_activity
                if idle >= ttl:
                    task.cancel(f"no consumer activity for {ttl:g}s (idle TTL)")
                else:
                    next_check = min(next_check, ttl - idle)
            await anyio.sleep(next_check)
