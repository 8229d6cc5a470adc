"""One query's state on the coordinator: its tasks and workers, readiness, the first failure.

The runtime is what the coordinator's NetworkCoalesce reads task outputs through (a
StageReader) and what every task runner reports to. `fail` keeps the first error and cancels
the query's task group, so one failure stops everything the query started; later errors are
consequences and dropped.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from typing import Final

import anyio
import pyarrow as pa
from grpclib.const import Status
from grpclib.exceptions import ProtocolError as GrpclibProtocolError
from grpclib.exceptions import StreamTerminatedError
from h2.exceptions import H2Error

from ..errors import ErrorOrigin, ExecutionError, FeedError, FlightfeedError, RemoteError
from ..feeds import FeedDispatcher
from ..feeds.replay import FeedReplay
from ..plan.stage_input import OwnPartitions, ReadHead, StageInput
from ..protocol import (
    TaskChannel,
    TaskId,
    TaskKey,
    WorkerChannel,
    WorkUnit,
    execute_task_request,
)
from .metrics import QueryMetrics, TaskRecord
from .stage import Stage, StageTask

log = logging.getLogger(__name__)


@dataclass(eq=False)
class TaskRun:
    """One task of the query as it runs: where, with which plan bytes, and its dispatcher."""

    stage: Stage
    task: StageTask
    key: TaskKey
    worker_url: str
    channel: WorkerChannel
    plan_proto: bytes
    record: TaskRecord
    feed_window: int = 0
    """Units per feed partition the worker takes before its first grant (GetWorkerInfo)."""
    ready: anyio.Event = field(default_factory=anyio.Event)
    """Set once the task's SetPlan went out: its outputs may be read."""
    dispatcher: FeedDispatcher | None = None
    channel_open: TaskChannel | None = None
    """The task's control channel while it is open."""
    read_here: int = 0
    """Output partitions the coordinator's part of the plan asked for (a task it read whole
    needs no ReleaseTask: it ends as its reads do)."""

    @property
    def origin(self) -> ErrorOrigin:
        return TaskId.of(self.key).origin(self.worker_url)


CONNECTION_ERRORS: Final = (
    OSError,  # refused, reset, broken pipe; TimeoutError too
    EOFError,  # asyncio's IncompleteReadError
    H2Error,
    StreamTerminatedError,
    GrpclibProtocolError,
    anyio.BrokenResourceError,  # an in-process channel whose other end is gone
    anyio.ClosedResourceError,
    anyio.EndOfStream,
)
"""What a call to a worker raises when the connection, not the query, failed: the attempt may
be retried, and the worker is checked (WorkerHealth)."""


def query_error(exc: Exception, origin: ErrorOrigin | None) -> FlightfeedError:
    """A failure as the caller sees it: flightfeed errors as they are (located); a connection
    failure as an UNAVAILABLE RemoteError naming the worker; anything else as what it is, an
    error on the coordinator (its part of the plan, or its side of a task), never taken for a
    lost worker: that would retry a deterministic failure and leave a healthy worker out."""
    if isinstance(exc, FlightfeedError):
        return exc.locate(origin) if origin is not None else exc
    if isinstance(exc, CONNECTION_ERRORS):
        where = f"worker {origin.worker_url}" if origin is not None else "a worker"
        error: FlightfeedError = RemoteError(
            f"connection to {where} failed: {exc or type(exc).__name__}",
            grpc_status=Status.UNAVAILABLE,
            origin=origin,
            error_type=type(exc).__name__,
        )
    else:
        if origin is None:
            where, located = "the coordinator's part of the plan", ErrorOrigin()
        else:
            where = f"the coordinator, running task {origin.task} on {origin.worker_url}"
            located = replace(origin, worker_url="")  # (an empty URL is the coordinator)
        log.error("query failed on %s", where, exc_info=exc)
        said = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        error = ExecutionError(
            f"{where} failed: {said}", origin=located, error_type=type(exc).__name__
        )
    error.__cause__ = exc
    return error


class QueryRuntime:
    """The running query: implements StageReader for its NetworkCoalesce nodes."""

    def __init__(
        self,
        query_id: bytes,
        metrics: QueryMetrics,
        *,
        headers: Mapping[str, str] | None = None,
        replayable: bool = False,
        on_read: Callable[[TaskRun, Sequence[int], int], None] | None = None,
        attempt: int = 0,
    ) -> None:
        self.query_id = query_id
        self.attempt = attempt
        """Which run of the query this is (0 first; in every TaskKey of its tasks)."""
        self.replay: FeedReplay | None = None
        """Where the tasks' feed partitions come from when the query may be retried."""
        self.delivered = 0
        """Result batches handed to the caller's stream (an attempt that delivered any is not
        retried: retries.py)."""
        self.replayable = replayable
        """The tasks serve their partitions as often as asked, until released (held queries)."""
        self.on_read = on_read
        """Told of each replayable task's partitions read to their end, and how many of its
        partitions are being read, as they change."""
        self.start_ns = time.time_ns()
        self.metrics = metrics
        self.headers = dict(headers or {})
        self.tasks: dict[tuple[int, int], TaskRun] = {}
        self.failure: FlightfeedError | None = None
        self.scope: anyio.CancelScope | None = None
        self.finished = anyio.Event()
        self.completed = False
        """Every task and the coordinator's part ran to their end."""
        self.output_complete = False
        """The coordinator's part of the plan ran to its end: no task output is wanted now."""
        self._cancelled = False

    def add(self, run: TaskRun) -> None:
        self.tasks[(run.stage.stage_id, run.task.task_number)] = run
        self.metrics.tasks[(run.stage.stage_id, run.task.task_number)] = run.record

    # -- lifecycle ------------------------------------------------------------------------------

    def fail(self, exc: Exception, origin: ErrorOrigin | None = None) -> None:
        """Keep the first failure and stop the query."""
        if self.failure is None and not self._cancelled:
            self.failure = query_error(exc, origin)
        self._stop()

    async def release_tasks(self) -> None:
        """The coordinator's part of the plan ran to its end: tell every task still running
        that no reader will come for the partitions nobody asked for (a fetch of 0 reads
        nothing below it). A task whose channel opens later is told by its runner."""
        self.output_complete = True
        async with anyio.create_task_group() as tg:
            for run in self.tasks.values():
                channel, read_whole = (
                    run.channel_open,
                    run.read_here >= run.stage.partitions_per_task,
                )
                if channel is not None and run.record.status == "running" and not read_whole:
                    tg.start_soon(channel.release)

    def cancel(self) -> None:
        """The caller left: stop the query (not a failure)."""
        if self.failure is None:
            self._cancelled = True
        self._stop()

    def _stop(self) -> None:
        if self.scope is not None:
            self.scope.cancel()

    @property
    def worker_urls(self) -> tuple[str, ...]:
        """The workers its tasks run on, each once, in task order."""
        return tuple(dict.fromkeys(run.worker_url for run in self.tasks.values()))

    def finish(self, *, record: bool = True) -> None:
        """The attempt is over; `record`: it is the query's last, its outcome goes to the
        query's metrics."""
        if record:
            if self.failure is not None:
                self.metrics.finish("failed", self.failure)
            elif self.completed:
                self.metrics.finish("finished")
            else:
                self.metrics.finish("cancelled")
        for run in self.tasks.values():
            run.dispatcher = None  # its delivery log goes with it
        self.finished.set()

    # -- StageReader ----------------------------------------------------------------------------

    @asynccontextmanager
    async def read(
        self, source: StageInput, task_number: int, head: ReadHead, partitions: range
    ) -> AsyncIterator[AsyncIterator[pa.RecordBatch]]:
        """Partitions of one task's output (its own: the coordinator's nodes only coalesce),
        read with one ExecuteTask from its worker once the task has its plan."""
        if not isinstance(head, OwnPartitions):
            raise ExecutionError(f"the coordinator reads tasks' own partitions, not {head}")
        run = self.tasks[(source.stage_id, task_number)]
        await run.ready.wait()
        run.read_here += len(partitions)
        request = execute_task_request(run.key, partitions.start, partitions.stop)
        try:
            async with run.channel.execute_task(request, headers=self.headers) as batches:
                yield aiter(batches)
        except FlightfeedError as error:
            raise query_error(error, run.origin) from None
        except CONNECTION_ERRORS as error:  # (a foreign one: the worker's, named)
            raise query_error(error, run.origin) from error

    # -- delivery log -----------------------------------------------------------------------------

    def delivery_log(self, feed_id: bytes, partition: int) -> list[WorkUnit]:
        """The units sent so far for a global feed partition, as sent (for a replay).

        Kept by the partition's dispatcher until the worker reports the partition finished;
        FeedError once it is gone, or when no running task of this query owns the partition.
        """
        for run in self.tasks.values():
            assignment = run.task.feeds.get(feed_id)
            if assignment is None or partition not in assignment.partitions:
                continue
            if run.dispatcher is None:
                break
            local = list(assignment.partitions).index(partition)
            return run.dispatcher.replay(feed_id, local)
        raise FeedError(
            f"no delivery log for feed {feed_id.hex()} partition {partition} in query"
            f" {self.query_id.hex()} (not a feed partition of a running task)"
        )
