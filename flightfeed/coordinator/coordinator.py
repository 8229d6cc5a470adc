"""Coordinator: plans a query into stages, runs its tasks on workers, streams the result.

`async with Coordinator(resolver, ...) as c:` then `async for batch in c.execute(plan)`.
Each query runs as one task group inside the coordinator's own: one task runner per task
(CoordinatorChannel, feed dispatcher, metrics) and the coordinator's part of the plan, whose
NetworkCoalesce nodes read the tasks' outputs. The consumer reads batches through a bounded
stream, so the query never runs ahead of it by more than a few batches.

Leaving the `async for` early (or cancelling it) cancels the query's task group: every task
gets a CancelTask and its channel is reset, so workers drop all of the query's state. The
first failure anywhere stops the attempt; a lost worker costs a retry of the whole query on
the others, its feeds replayed, as long as no row reached the caller yet (retries.py). Any
other failure fails the query with its error; a provider's error reaches the caller as the
FeedError its partition's consumer raised.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncGenerator, Callable, Mapping
from contextlib import AsyncExitStack, suppress
from functools import partial
from types import TracebackType
from typing import Any, Final, TypeAlias

import anyio
import pyarrow as pa
from anyio.abc import ObjectSendStream, TaskGroup, TaskStatus

from ..concurrency import off_loop, require_asyncio
from ..errors import (
    Cancelled,
    FlightfeedError,
    InvalidArgument,
    NotFound,
    as_flightfeed_error,
)
from ..feeds import FeedRegistry, WorkUnitFeedProvider
from ..feeds.provider import provider_metrics
from ..feeds.replay import FeedReplay
from ..flight.idle_release import DEFAULT_QUIET_SECONDS, release_when_idle
from ..flight.request_headers import call_headers
from ..plan.base import ExecutionPlan, closing, embedded_bytes
from ..plan.codec import CodecRegistry, encode_plan
from ..plan.execution import open_task_context
from ..plan.metrics import MetricsRegistry, instrument
from ..plan.nodes import Coalesce, ParquetScan, ParquetScanCodec
from ..plan.stage_input import STAGE_READER_KEY
from ..protocol import TaskKey, WorkUnit
from ..protocol.resolver import ChannelResolver
from ..session import Session, SessionStateBuilder
from .admission import DEFAULT_MAX_CONCURRENT_QUERIES, Admission, AdmissionClosed
from .display import format_distributed_plan
from .display_analyze import format_analyzed
from .display_dot import format_distributed_plan_dot
from .estimator import EstimatorKey, TaskEstimator, TaskEstimators
from .health import WorkerHealth
from .held import DEFAULT_GRACE, DEFAULT_TTL, HeldQuery
from .metrics import MetricsStore, QueryMetrics, TaskRecord
from .parquet_estimator import ParquetScanEstimator
from .planner import (
    DEFAULT_BROADCAST_THRESHOLD_BYTES,
    DEFAULT_SHUFFLE_BYTES_PER_TASK,
    DistributedPlanner,
)
from .query import QueryRuntime, TaskRun, query_error
from .resolver import WorkerResolver
from .retries import DEFAULT_MAX_ATTEMPTS, AttemptFailure, final_error, why_final
from .stage import DistributedPlan, placed
from .streams import DEFAULT_MAX_BACKLOG, FeedStream, StreamRegistry
from .task_runner import DispatchOptions, attempt_task, run_task

log = logging.getLogger(__name__)

RELEASE_ON_CLOSE_SECONDS: Final = 5.0
"""How long a coordinator's normal exit waits for its held queries to end cleanly."""

RESULT_BUFFER_BATCHES: Final = 4
CLEANUP_TIMEOUT: Final = 10.0
"""How long leaving a query waits for its tasks' cancellation to go out."""

_Item: TypeAlias = "pa.RecordBatch | Exception"


class _Handle:
    """Shared by a QueryStream and its generator (never by the running query, so dropping
    the stream lets the generator be finalized, which cancels the query)."""

    attempts: _Attempts | None = None
    """The query's attempts, once it started (the running one's runtime among them)."""
    metrics: QueryMetrics | None = None
    """The query's metrics from the moment it asked for admission."""


class _Attempts:
    """One query's run over its attempts: what the caller's side stops and waits for, and
    the running attempt (the one place that says which)."""

    def __init__(self, runtime: QueryRuntime) -> None:
        self.runtime = runtime
        """The running attempt's."""
        self.scope: anyio.CancelScope | None = None
        self.finished = anyio.Event()
        self.completed = False

    def cancel(self) -> None:
        """The caller left: stop the running attempt (not a failure) and every other task."""
        self.runtime.cancel()
        if self.scope is not None:
            self.scope.cancel()


class QueryStream:
    """The result of `Coordinator.execute`: iterate it for record batches.

    `async with c.execute(plan) as stream:` closes it deterministically; a plain `async for`
    that is left early closes it when the stream is dropped. Either way the query stops.
    """

    def __init__(
        self, coordinator: Coordinator, plan: ExecutionPlan, headers: Mapping[str, str]
    ) -> None:
        self.query_id = uuid.uuid4().bytes
        self.headers = dict(headers)
        """The headers every task of this query sends its worker's session builder."""
        self._handle = _Handle()
        self._batches = coordinator._stream(plan, self.query_id, self._handle, self.headers)

    @property
    def metrics(self) -> QueryMetrics | None:
        """The query's metrics (live while it runs, status "queued" while it waits for
        admission); None before the first batch was asked for."""
        return self._handle.metrics

    def delivery_log(self, feed_id: bytes, partition: int) -> list[WorkUnit]:
        """Units sent so far for a global feed partition (see QueryRuntime.delivery_log)."""
        attempts = self._handle.attempts
        if attempts is None:
            raise NotFound("the query has not started")
        return attempts.runtime.delivery_log(feed_id, partition)

    def __aiter__(self) -> QueryStream:
        return self

    async def __anext__(self) -> pa.RecordBatch:
        return await anext(self._batches)

    async def aclose(self) -> None:
        """Stop the query (if still running) and wait until its tasks were told."""
        await self._batches.aclose()

    async def __aenter__(self) -> QueryStream:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


class Coordinator:
    """Runs plans on workers; an async context manager owning connections and queries."""

    def __init__(
        self,
        resolver: WorkerResolver,
        *,
        session: Session | None = None,
        codecs: CodecRegistry | None = None,
        feed_registry: FeedRegistry | None = None,
        task_estimators: Mapping[EstimatorKey, TaskEstimator] | None = None,
        headers: Mapping[str, str] | None = None,
        channels: ChannelResolver | None = None,
        feed_batch_units: int | None = None,
        feed_batch_bytes: int | None = None,
        feed_linger: float | None = None,
        keep_delivery_log: bool = True,
        delivery_log_limit: int | None = None,
        delivery_log_bytes: int | None = None,
        metrics: MetricsStore | None = None,
        max_concurrent_queries: int | None = DEFAULT_MAX_CONCURRENT_QUERIES,
        max_queued_queries: int | None = None,
        release_memory_after: float | None = DEFAULT_QUIET_SECONDS,
        max_tasks_per_stage: int | None = None,
        broadcast_threshold_bytes: int = DEFAULT_BROADCAST_THRESHOLD_BYTES,
        shuffle_bytes_per_task: int = DEFAULT_SHUFFLE_BYTES_PER_TASK,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    ) -> None:
        """`max_concurrent_queries` run at once (None: no limit), held ones included until
        every endpoint was read to its end; the
        others wait in a queue of at most `max_queued_queries` (None: unbounded), and a query
        arriving at a full queue fails with ResourceExhausted (see admission.py). After
        `release_memory_after` seconds without queries, freed memory goes back to the operating
        system (flight/idle_release.py; None: never). `max_tasks_per_stage` caps the tasks of
        every stage (None: as many as the leaves ask for, or the workers); a partitioned join
        whose build side is estimated at most `broadcast_threshold_bytes` is broadcast; a stage
        reading a shuffle of estimated size gets a task per `shuffle_bytes_per_task`. A query
        that loses a worker runs again on the others, up to `max_attempts` times in all
        (retries.py; 1: never retried)."""
        if max_attempts < 1:
            raise InvalidArgument(f"max_attempts must be at least 1, got {max_attempts}")
        self.max_attempts = max_attempts
        self.resolver = resolver
        self.session = session if session is not None else SessionStateBuilder().build()
        self.codecs = codecs if codecs is not None else self.session.codecs
        if ParquetScan.name not in self.codecs.kinds:  # encodes; decodes no file (no roots)
            self.codecs = self.codecs.with_codec(ParquetScanCodec())
        self.feed_registry = feed_registry
        estimators = {ParquetScan: ParquetScanEstimator(), **(task_estimators or {})}
        self.planner = DistributedPlanner(
            feed_registry=feed_registry,
            estimators=TaskEstimators(estimators),
            max_tasks_per_stage=max_tasks_per_stage,
            broadcast_threshold_bytes=broadcast_threshold_bytes,
            shuffle_bytes_per_task=shuffle_bytes_per_task,
        )
        self.headers = call_headers(headers or {})
        self._own_channels = channels is None
        self.channels = channels if channels is not None else ChannelResolver()
        self.health = WorkerHealth(self.channels)
        """Which workers new queries use: the reachable ones (health.py)."""
        defaults = DispatchOptions()
        self._dispatch = DispatchOptions(
            max_batch_units=feed_batch_units or defaults.max_batch_units,
            max_batch_bytes=feed_batch_bytes or defaults.max_batch_bytes,
            linger=defaults.linger if feed_linger is None else feed_linger,
            keep_delivery_log=keep_delivery_log,
            delivery_log_limit=delivery_log_limit or defaults.delivery_log_limit,
            delivery_log_bytes=delivery_log_bytes or defaults.delivery_log_bytes,
        )
        self.metrics = metrics if metrics is not None else MetricsStore()
        self.admission = Admission(max_concurrent_queries, max_queued_queries)
        """Running and queued queries (`admission.running`, `admission.queued`)."""
        self.streams = StreamRegistry(feed_registry, self.session)
        """Tables read as streams (streams.py): their providers run while they are open."""
        self._tg: TaskGroup | None = None
        self._stack: AsyncExitStack | None = None
        self._held: set[HeldQuery] = set()
        """Held queries not yet ended (released on a normal exit, see `__aexit__`)."""
        self._next_worker = 0
        self._release_memory_after = release_memory_after
        self._entered = False

    # -- lifecycle --------------------------------------------------------------------------------

    async def __aenter__(self) -> Coordinator:
        require_asyncio("a Coordinator")
        if self._entered:
            raise RuntimeError(
                "a Coordinator is entered once (its connections and queries end with its"
                " `async with`): make a new one"
            )
        self._entered = True
        async with AsyncExitStack() as stack:
            if self._own_channels:
                stack.push_async_callback(self.channels.aclose)
            self._tg = await stack.enter_async_context(anyio.create_task_group())
            stack.callback(self._tg.cancel_scope.cancel)  # leaving cancels running queries
            if self._release_memory_after is not None:
                admission = self.admission
                self._tg.start_soon(
                    partial(
                        release_when_idle,
                        lambda: admission.busy,
                        admission.changed,
                        delay=self._release_memory_after,
                    ),
                    name="idle memory release",
                )
            self._stack = stack.pop_all()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._stack is not None
        self.admission.close()  # queued queries end now, not when a running one gives way
        if exc_type is None:
            await self._release_held()
        stack, self._stack, self._tg = self._stack, None, None
        await stack.aclose()

    async def _release_held(self) -> None:
        """End the held queries as their grace would: every task's channel half-closed, so
        each worker reports its metrics and drops the task (a reset would lose the metrics,
        and every worker would log a cancelled call). What has not ended within
        `RELEASE_ON_CLOSE_SECONDS` is cancelled with the rest."""
        held = list(self._held)
        for query in held:
            query.release()
        with anyio.move_on_after(RELEASE_ON_CLOSE_SECONDS, shield=True):
            for query in held:
                await query.runtime.finished.wait()

    async def _usable_workers(self) -> list[str]:
        """The resolver's workers a query may use now (health.py; checks of workers left out
        run in the coordinator's task group, not in the query's path)."""
        return await self.health.usable(await self.resolver.workers(), background=self._tg)

    # -- queries ----------------------------------------------------------------------------------

    def execute(
        self, plan: ExecutionPlan, *, headers: Mapping[str, str] | None = None
    ) -> QueryStream:
        """Run `plan`; iterate the result for its record batches. `headers` go to the workers'
        session builders with this query's tasks (over the coordinator's own `headers`)."""
        return QueryStream(self, plan, {**self.headers, **call_headers(headers or {})})

    async def collect(
        self, plan: ExecutionPlan, *, headers: Mapping[str, str] | None = None
    ) -> pa.Table:
        """Run `plan` and return its whole result."""
        async with self.execute(plan, headers=headers) as stream:
            batches = [batch async for batch in stream]
        return pa.Table.from_batches(batches, schema=plan.schema)

    def plan(self, plan: ExecutionPlan, workers: int) -> DistributedPlan:
        """The distributed plan for a cluster of `workers` (planning only)."""
        return self.planner.plan(plan, workers)

    async def explain(
        self,
        plan: ExecutionPlan,
        *,
        on_workers: bool = False,
        dot: bool = False,
        analyze: bool = False,
        per_task: bool = False,
        headers: Mapping[str, str] | None = None,
    ) -> str:
        """The distributed plan with the workers its tasks would run on now (`on_workers`: as
        `hold` would run it, all of it on the workers), as text or (`dot`) Graphviz DOT.

        `analyze`: run the query (its rows are dropped) and show what each node did, summed
        over each stage's tasks (`per_task`: task by task), with the feeds' latency
        percentiles and their providers' own metrics (display_analyze.py)."""
        if analyze:
            if on_workers or dot:
                raise InvalidArgument("explain(analyze=True) shows a query run by execute, as text")
            return await self._analyze(plan, per_task, headers)
        workers = self.health.known_usable(await self.resolver.workers())
        if on_workers:
            distributed = self.planner.plan_on_workers(plan, len(workers))
        else:
            distributed = self.planner.plan(plan, len(workers))
        assignment = distributed.assign(workers, self._next_worker) if distributed.stages else {}
        if dot:
            return format_distributed_plan_dot(distributed, assignment)
        return format_distributed_plan(distributed, assignment, read_by_caller=on_workers)

    async def _analyze(
        self, plan: ExecutionPlan, per_task: bool, headers: Mapping[str, str] | None
    ) -> str:
        async with self.execute(plan, headers=headers) as stream:
            async for _ in stream:
                pass
        metrics = stream.metrics
        assert metrics is not None  # (set before the first batch)
        await metrics.wait_finished()
        distributed = self.planner.plan(plan, len(await self.resolver.workers()))
        providers = {
            feed.id: provider_metrics(provider)
            for feed in self.planner.feeds_in(plan)
            if (provider := feed.inner()) is not None
        }
        return format_analyzed(distributed, metrics, providers, per_task=per_task)

    async def _stream(
        self, plan: ExecutionPlan, query_id: bytes, handle: _Handle, headers: Mapping[str, str]
    ) -> AsyncGenerator[pa.RecordBatch, None]:
        self._entered_group()
        metrics = handle.metrics = self._queued(query_id)
        await self._admit(metrics)
        try:
            try:
                self._check_open(query_id)
                runtime, root = await self._prepare(plan, query_id, headers, metrics, attempt=0)
            except BaseException as exc:
                _finish_unstarted(metrics, exc)
                raise
            tg = self._tg
            if tg is None:
                raise Cancelled(f"query {query_id.hex()} was cancelled: the coordinator closed")
            attempts = handle.attempts = _Attempts(runtime)
            send, receive = anyio.create_memory_object_stream[_Item](RESULT_BUFFER_BATCHES)
            await tg.start(self._run_query, plan, runtime, root, attempts, send)
            try:
                async with receive:
                    async for item in receive:
                        if isinstance(item, Exception):
                            raise item
                        yield item
                if not attempts.completed:  # stopped from outside, not by the caller
                    raise Cancelled(f"query {query_id.hex()} was cancelled: the coordinator closed")
            finally:
                attempts.cancel()
                with anyio.CancelScope(shield=True), anyio.move_on_after(CLEANUP_TIMEOUT):
                    await attempts.finished.wait()
        finally:
            self.admission.release()

    def _entered_group(self) -> TaskGroup:
        """The task group queries run in; RuntimeError before `async with`, Cancelled once it
        closed (as for a query that was queued then)."""
        if self.admission.closed:
            raise Cancelled("the coordinator closed: it runs no more queries")
        if self._tg is None:
            raise RuntimeError("use the Coordinator as `async with Coordinator(...) as c`")
        return self._tg

    def _check_open(self, query_id: bytes) -> None:
        """Cancelled, for a query admitted as the coordinator closes (the running queries gave
        their slots back as they were cancelled)."""
        if self._tg is None:
            raise Cancelled(f"query {query_id.hex()} was cancelled: the coordinator closed")

    def _queued(self, query_id: bytes) -> QueryMetrics:
        """A new query's metrics, in the store from the start: "queued" until admitted."""
        metrics = QueryMetrics(query_id, status="queued")
        self.metrics.add(metrics)
        return metrics

    async def _admit(self, metrics: QueryMetrics) -> None:
        """Wait for an admission slot (the metrics say "queued" meanwhile)."""
        try:
            await self.admission.acquire()
        except AdmissionClosed:
            closed = Cancelled(
                f"query {metrics.query_id.hex()} was cancelled: the coordinator closed"
            )
            metrics.finish("cancelled", closed)
            raise closed from None
        except BaseException as exc:
            _finish_unstarted(metrics, exc)
            raise
        metrics.admitted()

    async def _prepare(
        self,
        plan: ExecutionPlan,
        query_id: bytes,
        headers: Mapping[str, str],
        metrics: QueryMetrics,
        *,
        attempt: int,
    ) -> tuple[QueryRuntime, ExecutionPlan]:
        """Plan over the usable workers, assign tasks round-robin and connect to them."""
        workers = await self._usable_workers()
        distributed = self.planner.plan(plan, len(workers))
        runtime = await self._runtime(
            distributed, workers, query_id, headers, metrics, attempt=attempt
        )
        return runtime, distributed.root

    async def _runtime(
        self,
        distributed: DistributedPlan,
        workers: list[str],
        query_id: bytes,
        headers: Mapping[str, str],
        metrics: QueryMetrics,
        *,
        replayable: bool = False,
        attempt: int = 0,
    ) -> QueryRuntime:
        """The runtime of one attempt of the query: its tasks assigned round-robin, with their
        workers' channels (version-checked) and their encoded plans."""
        runtime = QueryRuntime(
            query_id, metrics, headers=headers, replayable=replayable, attempt=attempt
        )
        metrics.tasks.clear()  # (a retry's tasks replace the failed attempt's)
        if distributed.stages:
            if not workers:
                raise NotFound("the worker resolver returned no workers for a distributed plan")
            assignment = distributed.assign(workers, self._next_worker)
            self._next_worker = (self._next_worker + len(assignment)) % len(workers)
            used = dict.fromkeys(assignment.values())
            channels = {url: await self.channels.channel(url) for url in used}
            for stage in distributed.stages:
                plan = placed(stage.plan, query_id, assignment, attempt)  # where inputs run
                # Off the loop when it carries in-memory tables worth a thread hop.
                encode = partial(encode_plan, registry=self.codecs)
                plan_proto = await off_loop(encode, plan, nbytes=embedded_bytes(plan))
                for task in stage.tasks:
                    url = assignment[(stage.stage_id, task.task_number)]
                    key = TaskKey(
                        query_id=query_id,
                        stage_id=stage.stage_id,
                        task_number=task.task_number,
                        attempt=attempt,
                    )
                    record = TaskRecord(
                        stage.stage_id,
                        task.task_number,
                        url,
                        feed_partitions={f: list(a.partitions) for f, a in task.feeds.items()},
                    )
                    window = self.channels.feed_window(url)
                    runtime.add(
                        TaskRun(stage, task, key, url, channels[url], plan_proto, record, window)
                    )
        return runtime

    async def hold(
        self,
        plan: ExecutionPlan,
        *,
        headers: Mapping[str, str] | None = None,
        ttl: float = DEFAULT_TTL,
        grace: float = DEFAULT_GRACE,
        providers: Mapping[bytes, WorkUnitFeedProvider[Any]] | None = None,
    ) -> HeldQuery:
        """Start `plan` on the workers, to be read there by any Flight client, one endpoint per
        output partition (see held.py). Returns once every task has its plan. `providers`
        serve some of the plan's feeds (by feed id) instead of their own (a stream's slice)."""
        self._entered_group()
        query_headers = {**self.headers, **call_headers(headers or {})}
        query_id = uuid.uuid4().bytes
        metrics = self._queued(query_id)
        await self._admit(metrics)  # held until every endpoint was read, or the release
        release = _Once(self.admission.release)
        try:
            self._check_open(query_id)
            runtime, distributed = await self._held_runtime(
                plan, query_id, query_headers, metrics, providers
            )
            tg = self._entered_group()  # (it may have closed meanwhile)
        except BaseException as exc:
            _finish_unstarted(metrics, exc)
            release()
            raise
        held = HeldQuery(runtime, distributed.stages[0], ttl=ttl, grace=grace)
        self._held.add(held)
        try:
            await tg.start(self._run_held, held, release)
        except RuntimeError:  # it ended before every task had its plan: say why
            if runtime.failure is not None:
                raise runtime.failure from None
            raise
        finally:
            if runtime.finished.is_set():
                release()  # (a held query that never ran has nothing else to release it)
                self._held.discard(held)
        return held

    async def _held_runtime(
        self,
        plan: ExecutionPlan,
        query_id: bytes,
        headers: Mapping[str, str],
        metrics: QueryMetrics,
        providers: Mapping[bytes, WorkUnitFeedProvider[Any]] | None,
    ) -> tuple[QueryRuntime, DistributedPlan]:
        """A held query's plan, all of it on the workers, and its runtime."""
        workers = await self._usable_workers()
        if not workers:
            raise NotFound("the worker resolver returned no workers to hold a query on")
        distributed = self.planner.plan_on_workers(plan, len(workers))
        if providers:
            distributed = distributed.with_providers(providers)
        runtime = await self._runtime(
            distributed, workers, query_id, headers, metrics, replayable=True
        )
        return runtime, distributed

    def open_stream(
        self, key: str, plan: ExecutionPlan, *, max_backlog: int = DEFAULT_MAX_BACKLOG
    ) -> FeedStream:
        """The stream `key` names (a table and its arguments), its providers started if new."""
        return self.streams.open(key, plan, self._entered_group(), max_backlog=max_backlog)

    async def _run_held(
        self,
        held: HeldQuery,
        release: Callable[[], None],
        *,
        task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """A held query's task group: its task runners and its release watch."""
        runtime = held.runtime
        try:
            with anyio.CancelScope() as scope:
                runtime.scope = scope
                async with anyio.create_task_group() as pumps:
                    runtime.replay = self._replay(pumps)
                    async with anyio.create_task_group() as tg:
                        for run in list(runtime.tasks.values()):
                            tg.start_soon(self._held_task, held, run)
                        tg.start_soon(held.watch)
                        tg.start_soon(_release_once_read, held, release)
                        for task in held.stage.tasks:
                            await held.ready(task.task_number)
                        task_status.started()
                    pumps.cancel_scope.cancel()  # (the providers' streams close)
                runtime.completed = runtime.failure is None
        finally:
            held.release()
            runtime.finish()
            release()
            self._held.discard(held)

    async def _held_task(self, held: HeldQuery, run: TaskRun) -> None:
        """One task of a held query, run again on another worker whenever its worker is lost
        (up to `max_attempts` in all); any other failure fails the held query."""
        runtime = held.runtime
        failures: list[AttemptFailure] = []
        while True:
            error = await attempt_task(runtime, run, self.session, self._dispatch, runtime.headers)
            if error is None:
                return
            failure = await self._task_failed(run, query_error(error, run.origin))
            failures.append(failure)
            why = why_final(
                failure,
                max_attempts=self.max_attempts,
                batches_delivered=0,  # its readers read it again (its partitions replay)
                unreplayable=_unreplayable(runtime, runtime.replay),
            )
            moved = None
            if why is None and held.read_whole(run.task.task_number):
                await held.until_asked(run.task.task_number)  # (or released)
            if why is None and not held.released:  # (released: nobody reads it any more)
                moved = await self._move(held, run, failure)
            if moved is None:
                if why is None and not held.released:
                    why = _unmovable(run)
                runtime.fail(final_error(runtime.query_id, failures, why or ""))
                return
            run = moved

    async def _task_failed(self, run: TaskRun, error: FlightfeedError) -> AttemptFailure:
        """A held task's attempt failed: was its worker lost?"""
        await self.health.failed(error)
        lost = await self.health.lost([run.worker_url])
        failure = AttemptFailure(run.key.attempt, (run.worker_url,), error, lost)
        log.info("held query %s task %d: %s", run.key.query_id.hex(), run.task.task_number, failure)
        return failure

    async def _move(self, held: HeldQuery, run: TaskRun, failure: AttemptFailure) -> TaskRun | None:
        """The task's next attempt, on another usable worker (None: there is none, or the task
        reads data that lives on its worker)."""
        if run.task.worker is not None:
            return None
        try:
            usable = await self._usable_workers()
        except FlightfeedError:
            return None
        others = [url for url in usable if url != run.worker_url]
        if not others:
            return None
        url = others[self._next_worker % len(others)]
        self._next_worker += 1
        key = TaskKey(
            query_id=run.key.query_id,
            stage_id=run.key.stage_id,
            task_number=run.key.task_number,
            attempt=run.key.attempt + 1,
        )
        record = TaskRecord(
            run.stage.stage_id, run.task.task_number, url, run.record.feed_partitions
        )
        channel = await self.channels.channel(url)
        # A held query is one stage: its plan reads no other task, so it runs anywhere as is.
        window = self.channels.feed_window(url)
        new = TaskRun(run.stage, run.task, key, url, channel, run.plan_proto, record, window)
        held.runtime.metrics.failed_attempts.append(
            f"task {run.task.task_number} {failure}; moved to {url}"
        )
        held.moved(run, new)
        return new

    def _start_tasks(self, tg: TaskGroup, runtime: QueryRuntime) -> None:
        """A runner for each of the query's tasks, in `tg`."""
        for run in runtime.tasks.values():
            tg.start_soon(run_task, runtime, run, self.session, self._dispatch, runtime.headers)

    async def _run_query(
        self,
        plan: ExecutionPlan,
        runtime: QueryRuntime,
        root: ExecutionPlan,
        attempts: _Attempts,
        send: ObjectSendStream[_Item],
        *,
        task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """The query's attempts, one after the other, until one completes, is cancelled or
        fails for good (retries.py). Feed partitions are pumped in a task group of their own
        that outlives the attempts, so a retry replays them."""
        failures: list[AttemptFailure] = []
        async with send:
            try:
                with anyio.CancelScope() as scope:
                    attempts.scope = scope
                    task_status.started()
                    async with anyio.create_task_group() as pumps:
                        replay = self._replay(pumps)
                        while True:
                            runtime.replay = replay
                            await self._run_attempt(runtime, root, send)
                            if runtime.failure is None:
                                break
                            try:
                                retry = await self._retry(plan, runtime, failures, replay)
                            except anyio.get_cancelled_exc_class():
                                _cancelled_while_retrying(runtime, failures)
                                raise
                            if retry is None:
                                break
                            runtime, root = retry
                            attempts.runtime = runtime
                        pumps.cancel_scope.cancel()  # (the providers' streams close)
                    attempts.completed = runtime.completed
                if runtime.failure is not None:
                    # (the caller may have left before it could hear about it)
                    with suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
                        await send.send(runtime.failure)
            finally:
                runtime.finish()
                attempts.finished.set()

    async def _retry(
        self,
        plan: ExecutionPlan,
        runtime: QueryRuntime,
        failures: list[AttemptFailure],
        replay: FeedReplay | None,
    ) -> tuple[QueryRuntime, ExecutionPlan] | None:
        """After a failed attempt: the next one, planned on the workers left; or None, the
        query's final error in `runtime.failure` (retries.py says which)."""
        failure = await self._attempt_failed(runtime, failures)
        why = why_final(
            failure,
            max_attempts=self.max_attempts,
            batches_delivered=runtime.delivered,
            unreplayable=_unreplayable(runtime, replay),
        )
        if why is not None:
            runtime.failure = final_error(runtime.query_id, failures, why)
            return None
        runtime.finish(record=False)
        try:
            return await self._prepare(
                plan, runtime.query_id, runtime.headers, runtime.metrics, attempt=len(failures)
            )
        except Exception as exc:  # (not an attempt: the error says so, and its metrics agree)
            error = as_flightfeed_error(exc)
            why = f"no retry could be planned: {type(error).__name__}: {error.message}"
            runtime.failure = final_error(runtime.query_id, failures, why)
            return None

    def _replay(self, tg: TaskGroup) -> FeedReplay | None:
        """Where a query's feed partitions are pumped if it may be retried (else its tasks'
        dispatchers pull their providers themselves)."""
        if self.max_attempts < 2 or not self._dispatch.keep_delivery_log:
            return None
        dispatch = self._dispatch
        return FeedReplay(
            tg, log_limit=dispatch.delivery_log_limit, log_bytes=dispatch.delivery_log_bytes
        )

    async def _run_attempt(
        self, runtime: QueryRuntime, root: ExecutionPlan, send: ObjectSendStream[_Item]
    ) -> None:
        """Every task runner of one attempt and the coordinator's part of the plan."""
        with anyio.CancelScope() as scope:
            runtime.scope = scope
            async with anyio.create_task_group() as tg:
                self._start_tasks(tg, runtime)
                tg.start_soon(self._run_root, runtime, root, send)
            runtime.completed = runtime.failure is None

    async def _attempt_failed(
        self, runtime: QueryRuntime, failures: list[AttemptFailure]
    ) -> AttemptFailure:
        """Note a failed attempt: which of its workers stopped answering (left out of new
        queries, this one's retry included) and its error."""
        assert runtime.failure is not None
        await self.health.failed(runtime.failure)
        lost = await self.health.lost(runtime.worker_urls)
        failure = AttemptFailure(runtime.attempt, runtime.worker_urls, runtime.failure, lost)
        failures.append(failure)
        runtime.metrics.failed_attempts.append(str(failure))
        log.info("query %s: %s", runtime.query_id.hex(), failure)
        return failure

    async def _run_root(
        self, runtime: QueryRuntime, root: ExecutionPlan, send: ObjectSendStream[_Item]
    ) -> None:
        """Run the plan's coordinator part and hand its batches to the caller."""
        registry = MetricsRegistry()
        if root.output_partitions != 1:
            root = Coalesce(root)  # read every partition, concurrently
        plan = instrument(root, registry)
        runtime.metrics.coordinator_nodes = registry.pre_order()
        try:
            async with open_task_context(self.session, metrics=registry) as ctx:
                ctx.extensions[STAGE_READER_KEY] = runtime
                async with closing(plan.execute(0, ctx)) as stream:
                    async for batch in stream:
                        runtime.delivered += 1  # (counted first: a retry must see it)
                        await send.send(batch)
            await runtime.release_tasks()
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            runtime.cancel()  # the caller is gone
        except Exception as exc:
            runtime.fail(exc)

    def __repr__(self) -> str:
        return f"Coordinator({self.resolver!r})"


def _cancelled_while_retrying(runtime: QueryRuntime, failures: list[AttemptFailure]) -> None:
    """The caller cancelled the query while its failed attempt was looked into (its workers
    asked whether they still answer) or its retry planned: the query ends cancelled, as the
    caller saw it, with that attempt among its failed ones."""
    assert runtime.failure is not None
    if not failures or failures[-1].attempt != runtime.attempt:
        failure = AttemptFailure(runtime.attempt, runtime.worker_urls, runtime.failure)
        runtime.metrics.failed_attempts.append(str(failure))
    runtime.failure = None


async def _release_once_read(held: HeldQuery, release: Callable[[], None]) -> None:
    """A held query read through waits only for re-reads: its admission slot goes back."""
    await held.read_through.wait()
    release()


class _Once:
    """A callable that calls `fn` the first time only (an admission slot is released once)."""

    def __init__(self, fn: Callable[[], None]) -> None:
        self._fn: Callable[[], None] | None = fn

    def __call__(self) -> None:
        fn, self._fn = self._fn, None
        if fn is not None:
            fn()


def _unreplayable(runtime: QueryRuntime, replay: FeedReplay | None) -> list[str]:
    """What keeps the query's feeds from being replayed to a new attempt."""
    if replay is not None:
        return replay.unreplayable()
    if any(run.task.feeds for run in runtime.tasks.values()):
        return ["the query reads feeds and retries are off (max_attempts 1, or no delivery log)"]
    return []


def _unmovable(run: TaskRun) -> str:
    """Why a held task whose worker was lost did not move (`Coordinator._move`)."""
    if run.task.worker is not None:
        return f"task {run.task.task_number} reads data that lives on that worker"
    return f"no other worker could take task {run.task.task_number}"


def _finish_unstarted(metrics: QueryMetrics, exc: BaseException) -> None:
    """The metrics of a query that ended before it ran (queue full, cancelled, no workers)."""
    if isinstance(exc, Exception):
        metrics.finish("failed", exc)
    else:
        metrics.finish("cancelled")
