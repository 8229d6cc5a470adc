"""Held queries: a query whose tasks wait on the workers to be read, partition by partition,
by any Flight client (a Spark task, a C++ program), instead of by the coordinator.

The whole plan runs on the workers as one stage (`DistributedPlanner.plan_on_workers`). Each
output partition of each task is an `Endpoint`: the worker's location and a DoGet ticket
that runs it. Tasks are replayable, so a partition read again (a retried Spark task) yields
the same rows. The query is released once every endpoint was read to its end and no read came
for `grace` seconds (readers may read again: Spark samples a scan before sorting it; meanwhile
it no longer takes an admission slot), when it sat unread for `ttl`, on `release()`, or when
its coordinator is closed (which waits a few seconds for that); releasing half-closes every
task's channel, so each worker reports its metrics and drops the task. Those times run only
while nobody reads: a worker tells the coordinator how many of a task's partitions are being
read, and a read of a slow feed may take far longer than `ttl`.

A task whose worker is lost runs again on another worker, as a new attempt, its feed
partitions replayed (the coordinator's `_held_task`): it is independent of the others (a held
query is one stage), and its partitions give the same rows again. Its endpoints move with it;
a reader whose worker went away asks where they went (`relocate`, the coordinator service's
"relocate" action). A task whose partitions were all read already moves only when a reader asks
for one (`until_asked`): run again at once, nobody might ever read it, and the worker given it
would hold it (and wait for it when shutting down) until the query is released.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import anyio
import pyarrow as pa

from ..concurrency import Signal
from ..errors import NotFound
from ..protocol import execute_task_ticket
from .query import QueryRuntime, TaskRun
from .stage import Stage

DEFAULT_TTL: Final = 300.0
"""Seconds a held query may go without a read before it is released."""
DEFAULT_GRACE: Final = 60.0
"""Seconds a held query lives on after its last endpoint was read: Spark may read a scan more
than once (a range partitioner samples it first, a lost shuffle output is recomputed)."""


@dataclass(frozen=True)
class Endpoint:
    """One output partition of a held query: where to read it, and the ticket to read it with."""

    task_number: int
    partition: int
    location: str
    ticket: bytes


class HeldQuery:
    """A started query waiting to be read; see the module docstring."""

    def __init__(
        self,
        runtime: QueryRuntime,
        stage: Stage,
        *,
        ttl: float = DEFAULT_TTL,
        grace: float = DEFAULT_GRACE,
    ) -> None:
        if not ttl > 0 or grace < 0:
            raise ValueError(f"a held query needs ttl > 0 and grace >= 0, got {ttl} and {grace}")
        self.runtime = runtime
        self.stage = stage
        self.ttl = ttl
        self.grace = grace
        self._partitions = tuple(
            (task.task_number, partition)
            for task in stage.tasks
            for partition in range(stage.partitions_per_task)
        )
        self._unread = set(self._partitions)
        self._read_at = anyio.current_time()
        self._progress = anyio.Event()
        self._released = anyio.Event()
        self._moved = anyio.Event()
        self.read_through = anyio.Event()
        """Set once every endpoint was read to its end (or the query released): from then on
        the query only waits for re-reads, and no longer counts as running (admission)."""
        self.parked: set[int] = set()
        """Tasks whose worker was lost after they were read whole, waiting for a reader to ask
        for one of their partitions before they run again."""
        self._asked: set[int] = set()
        self._changed = Signal()
        self._reading: dict[int, int] = {}
        """Task number → partitions of its current attempt being read now (never released
        meanwhile: a slow feed may take longer than `ttl` to read)."""
        runtime.on_read = self._note_read

    @property
    def query_id(self) -> bytes:
        return self.runtime.query_id

    @property
    def schema(self) -> pa.Schema:
        return self.stage.schema

    @property
    def endpoints(self) -> tuple[Endpoint, ...]:
        """Where each partition is read now, task by task: a task moved off a lost worker
        before the query was handed out is read where it runs, not where it was placed."""
        return tuple(self.endpoint(task, partition) for task, partition in self._partitions)

    @property
    def unread(self) -> int:
        """Endpoints not read to their end yet."""
        return len(self._unread)

    @property
    def released(self) -> bool:
        return self._released.is_set()

    def release(self) -> None:
        """Release the query now (its readers are done, or gave up)."""
        self._released.set()
        self._progress.set()
        self._moved.set()
        self.read_through.set()
        self._changed.notify()

    def read_whole(self, task_number: int) -> bool:
        """Every partition of the task was read to its end at least once."""
        return not any(task == task_number for task, _ in self._unread)

    async def until_asked(self, task_number: int) -> None:
        """Until a reader asks where one of the task's partitions went (`relocate`), or the
        query is released; the task is `parked` meanwhile."""
        self.parked.add(task_number)
        self._changed.notify()
        try:
            while task_number not in self._asked and not self.released:
                await self._changed.wait()
        finally:
            self.parked.discard(task_number)
            self._asked.discard(task_number)

    async def parked_task(self, task_number: int) -> None:
        """Until the task is parked (for tests and tools that watch a held query)."""
        while task_number not in self.parked:
            await self._changed.wait()

    def run(self, task_number: int) -> TaskRun:
        """The task's current attempt (NotFound for a task the query does not have)."""
        found = self.runtime.tasks.get((self.stage.stage_id, task_number))
        if found is None:
            raise NotFound(f"query {self.query_id.hex()} has no task {task_number}")
        return found

    def endpoint(self, task_number: int, partition: int) -> Endpoint:
        """Where the partition is read now (its task's current attempt)."""
        if not 0 <= partition < self.stage.partitions_per_task:
            raise NotFound(
                f"query {self.query_id.hex()} has no partition {partition} in task {task_number}"
            )
        run = self.run(task_number)
        ticket = execute_task_ticket(run.key, partition, partition + 1)
        return Endpoint(task_number, partition, run.worker_url, ticket)

    def moved(self, old: TaskRun, new: TaskRun) -> None:
        """`old`'s worker was lost: `new` runs the task now (waiters on `old` move on)."""
        self.runtime.add(new)
        self._reading.pop(old.task.task_number, None)  # (its readers were cut off)
        self._progress.set()
        old.ready.set()  # (it never will be: whoever waits on it looks again)
        self._moved.set()
        self._moved = anyio.Event()

    async def ready(self, task_number: int) -> TaskRun:
        """The task's current attempt, once it has its plan."""
        while True:
            run = self.run(task_number)
            await run.ready.wait()
            if self.run(task_number) is run:
                return run

    async def relocate(
        self, task_number: int, partition: int, failed: str, attempt: int
    ) -> Endpoint:
        """Where to read a partition whose reader could not read `attempt` of its task at
        `failed`: once the task runs elsewhere, or again (a worker restarted at the same
        address), and has its plan there. Callers bound the wait and fall back to
        `endpoint`."""
        self._asked.add(task_number)  # (a task read whole moves once asked for)
        self._changed.notify()
        while not self.released:
            run = self.run(task_number)
            if run.worker_url != failed or run.key.attempt != attempt:
                break
            await self._moved.wait()
        await self.ready(task_number)
        return self.endpoint(task_number, partition)

    def _note_read(self, run: TaskRun, partitions: Sequence[int], reading: int) -> None:
        self._unread.difference_update((run.task.task_number, p) for p in partitions)
        if self.runtime.tasks.get((run.stage.stage_id, run.task.task_number)) is run:
            self._reading[run.task.task_number] = reading
        self._read_at = anyio.current_time()
        self._progress.set()
        if not self._unread:
            self.read_through.set()

    async def watch(self) -> None:
        """Until the query should be released; then half-close every task's channel."""
        while not self._released.is_set():
            self._progress = anyio.Event()
            if any(self._reading.values()):  # a reader reads it: its time starts once it ends
                await self._progress.wait()
                continue
            deadline = self._read_at + (self.ttl if self._unread else self.grace)
            if anyio.current_time() >= deadline:
                break
            with anyio.move_on_at(deadline):
                await self._progress.wait()
        self.release()
        for run in self.runtime.tasks.values():
            if run.channel_open is not None:  # (after the message being sent, if any: cut
                await run.channel_open.done_sending()  # short, it could not be half-closed)
            if run.dispatcher is not None:
                run.dispatcher.cancel()  # nobody reads what its feeds would send now
