"""One task on a worker: its plan, session, outputs, consumers and lifecycle.

A task exists from its SetPlan until every output partition has been read or dropped, or it is
cancelled (CancelTask, its coordinator channel closed, the idle TTL). A replayable task serves
each partition as often as it is asked (a retried reader gets the same rows), and lives until
the coordinator releases it. State changes happen in plain methods; the RPC handlers do the
awaiting.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import anyio
from anyio.abc import TaskGroup

from .._generated.flightfeed.v1 import ExecuteTaskRequest, Metric, MetricsSet, NamedTime
from ..errors import Cancelled, Conflict, ErrorOrigin, FlightfeedError, InvalidArgument
from ..plan.base import ExecutionPlan, TaskContext, embedded_bytes
from ..plan.memory import TaskMemory
from ..plan.metrics import MetricsRegistry, instrument
from ..protocol.keys import TaskId
from ..session import Session
from .heads import Outputs, build_outputs


class Task:
    """Runtime state of one task."""

    def __init__(
        self,
        key: TaskId,
        plan: ExecutionPlan,
        session: Session,
        background: TaskGroup,
        *,
        worker_url: str,
        task_count: int,
        query_start_ns: int,
        consumer_buffer: int,
        max_fanout_outputs: int = 4096,
        fanout_claim_timeout: float | None = None,
        replayable: bool = False,
        memory: TaskMemory | None = None,
    ) -> None:
        self.key = key
        self.session = session
        self.worker_url = worker_url
        self.metrics = MetricsRegistry()
        self._embedded_bytes = embedded_bytes(plan)
        self.plan = instrument(plan, self.metrics)
        self.ctx = TaskContext(
            session=session,
            task_number=key.task_number,
            task_count=max(task_count, 1),
            metrics=self.metrics,
            background=background,
        )
        if memory is not None:
            self.ctx.memory = memory
        self.plan_arrived_ns = time.time_ns()
        self.query_start_ns = query_start_ns
        self._background = background
        self._consumer_buffer = consumer_buffer
        self._max_fanout_outputs = max_fanout_outputs
        self._fanout_claim_timeout = fanout_claim_timeout
        self.outputs: Outputs | None = None
        self.replayable = replayable
        self._claimed: set[int] = set()
        self._finished_outputs: set[int] = set()
        self.reads_done: set[int] = set()
        """Replayable: partitions read to their end, not yet reported to the coordinator."""
        self._read_once: set[int] = set()
        """Replayable: partitions read to their end at least once."""
        self.reads_changed = anyio.Event()
        self._consumer_scopes: set[anyio.CancelScope] = set()
        self.last_activity = time.monotonic()
        self.done = anyio.Event()
        self.cancel_reason: str | None = None
        self.failure: FlightfeedError | None = None
        """Why the task failed, when it was not cancelled from outside (the budget ran out)."""

    def reserve_plan_data(self) -> None:
        """Reserve the data the plan carries (decoded MemoryScans): held as long as the task."""
        if self._embedded_bytes:
            self.ctx.memory.reservation("MemoryScan").grow(self._embedded_bytes)

    @property
    def origin(self) -> ErrorOrigin:
        return self.key.origin(self.worker_url)

    @property
    def active_consumers(self) -> int:
        return len(self._consumer_scopes)

    @property
    def settled(self) -> bool:
        """Replayable, every partition read to its end and nobody reading: the task is kept
        only in case a reader comes back (a retried Spark task)."""
        return (
            self.replayable
            and self.outputs is not None
            and not self._consumer_scopes
            and len(self._read_once) >= self.outputs.partitions
        )

    # --- decisions (no awaiting) ---------------------------------------------------------

    def claim(self, request: ExecuteTaskRequest) -> tuple[Outputs, range]:
        """Validate a consumer's request and reserve its partitions."""
        if self.cancel_reason is not None:
            raise Cancelled(f"task {self.key} was cancelled: {self.cancel_reason}")
        if self.outputs is None:
            self.outputs = build_outputs(
                request,
                self.plan,
                self.ctx,
                self._background,
                self._consumer_buffer,
                self._max_fanout_outputs,
                self._fanout_claim_timeout,
            )
        head = _head_name(request)
        if head != self.outputs.head:
            raise InvalidArgument(
                f"task {self.key} is read with a {self.outputs.head} head; "
                f"this request asks for {head}"
            )
        start, end = request.target_partition_start, request.target_partition_end
        if not start < end <= self.outputs.partitions:
            raise InvalidArgument(
                f"partition range [{start}, {end}) is out of bounds for task {self.key} "
                f"with {self.outputs.partitions} output partitions"
            )
        taken = self._claimed.intersection(range(start, end))
        # A valid request the task's state refuses (FAILED_PRECONDITION), not a malformed one.
        if taken and self.replayable:
            raise Conflict(
                f"partitions {sorted(taken)} of task {self.key} are being read: a concurrent"
                " second read is not supported (read them again once the first read ended)"
            )
        if taken:
            raise Conflict(f"partitions {sorted(taken)} of task {self.key} were already requested")
        self._claimed.update(range(start, end))
        self.last_activity = time.monotonic()
        if self.replayable:
            self.reads_changed.set()  # (`reading` changed)
        return self.outputs, range(start, end)

    def release(self, partitions: range, *, read_to_end: bool = False) -> None:
        """The consumer of these partitions is gone (finished, failed or disconnected)."""
        self.last_activity = time.monotonic()
        if self.replayable:  # they may be read again; the coordinator releases the task
            self._claimed.difference_update(partitions)
            if read_to_end:
                self.reads_done.update(partitions)
                self._read_once.update(partitions)
            self.reads_changed.set()  # (`reading` changed)
            return
        self._finished_outputs.update(partitions)
        if self.outputs is not None and len(self._finished_outputs) >= self.outputs.partitions:
            self.done.set()

    def unneeded(self) -> None:
        """The query needs nothing more from this task (its coordinator's part of the plan
        ended): a partition nobody asked for will never be, so the task ends once the readers
        it has leave (a node with a fetch of 0 reads nothing below it: the task waited for its
        idle TTL). A replayable task is released."""
        if self.replayable:
            self.finish()
            return
        if self.outputs is None:  # never read at all
            self.done.set()
            return
        self._finished_outputs.update(set(range(self.outputs.partitions)) - self._claimed)
        if len(self._finished_outputs) >= self.outputs.partitions:
            self.done.set()

    @property
    def reading(self) -> int:
        """Replayable: how many partitions are being read now."""
        return len(self._claimed)

    def take_reads(self) -> list[int]:
        """Replayable: the partitions read to their end since the last call."""
        reads, self.reads_done = sorted(self.reads_done), set()
        self.reads_changed = anyio.Event()
        return reads

    def finish(self) -> None:
        """Replayable: the coordinator released the task; it reports its metrics and ends."""
        self.done.set()

    def cancel(self, reason: str, failure: FlightfeedError | None = None) -> None:
        """Stop everything this task runs; consumers fail with Cancelled, and the task's
        channel with `failure` if given."""
        if self.cancel_reason is not None or self.done.is_set():
            return
        self.cancel_reason = reason
        self.failure = failure
        for scope in self._consumer_scopes:
            scope.cancel()
        self.done.set()

    @contextmanager
    def consumer(self) -> Iterator[anyio.CancelScope]:
        """Register a consumer so cancellation reaches it."""
        scope = anyio.CancelScope()
        self._consumer_scopes.add(scope)
        try:
            with scope:
                yield scope
        finally:
            self._consumer_scopes.discard(scope)
            self.last_activity = time.monotonic()

    def task_metrics(self) -> MetricsSet:
        """Task-wide metrics: when the plan arrived, relative to the query's start."""
        arrived_after = max(0, self.plan_arrived_ns - self.query_start_ns)
        if not self.query_start_ns:
            arrived_after = 0
        return MetricsSet(
            metrics=[
                Metric(time=NamedTime(name="plan_arrival_after_query_start", value=arrived_after))
            ]
        )


def _head_name(request: ExecuteTaskRequest) -> str:
    if request.repartition is not None:
        return "repartition"
    if request.broadcast is not None:
        return "broadcast"
    return "none"
