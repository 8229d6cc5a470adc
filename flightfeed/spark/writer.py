"""`df.write` and `df.writeStream` into a durable table of a flightfeed worker, exactly once.

    (df.write.format("flightfeed")
        .mode("append")                     # or "overwrite": the job's rows replace the table's
        .option("uri", "grpc://worker:8816")  # the worker that holds the table
        .option("table", "metrics")         # TABLE or CATALOG.SCHEMA.TABLE; it must exist
        .save())

    (stream.writeStream.format("flightfeed")
        .option("uri", "grpc://worker:8816").option("table", "metrics")
        .option("checkpointLocation", "/checkpoints/metrics")
        .start())

Options: `uri`, `table`, `timeout` (seconds per call), `header.NAME`, and the token and TLS
options (`token`, `tokenFile`, `tlsRootCerts`, `tlsCertChain`, `tlsPrivateKey`), as for reads.

A write is a job of the worker's table store. Each Spark task streams its rows to the worker
with DoPut, staged as that task attempt (`TableCommand.staged`), and reports what it staged in
its commit message; the driver's `commit` publishes exactly the attempts Spark reports as
successful, atomically (`commit_staged`; with mode overwrite they replace every row of the
table), and `abort` discards everything the job staged (`abort_staged`). So a failed job
publishes nothing, and the rows of a failed or speculative task attempt never appear: a
retried task's rows appear once. The staged attempt is Spark's task attempt id
(`TaskContext.taskAttemptId()`), not its per-task `attemptNumber()`, which starts again at 0
when Spark re-runs a whole stage.

A batch job's id is made on the driver (a UUID) when Spark creates the writer. A streaming
micro-batch's job is `spark-stream-<query id>-<batch id>`, the query id being the one a query's
checkpoint keeps across restarts: a micro-batch that Spark replays after a restart commits the
same job again, which the store answers without publishing anything (a job commits once). Its
attempts carry a number drawn when the query (re)starts, so the staging of a run that died
before its commit never mixes with the replay's (whose commit discards it). With
`outputMode("complete")` each micro-batch replaces the table's rows.

The table must exist (`flightfeed tables create`, or the worker's `create_table` action), and
hold every column of the DataFrame by name; columns the DataFrame lacks must be nullable. Each
batch is cast to the table's column types, safely: Spark's timestamps (microseconds) are stored
as the table's milliseconds, and a value with sub-millisecond digits fails the write with an
error naming the column (truncate first: `F.date_trunc("millisecond", column)`). Values that
do not fit (a negative number into an unsigned column, an overflow, a double too large for a
float column) fail the same way, as do nulls in a column that is not nullable. Only numbers are
cast between kinds (an integer into a double column, say), as Spark's own inserts do: a boolean
into an integer column, a number into a string one or a string into a number one is refused,
and so is a TIMESTAMP_NTZ into a timestamp column (a wall-clock time: cast it to TIMESTAMP in
Spark, which applies the session time zone).

The driver learns the table's id when Spark creates the writer (GetSchema names it), each task
learns from the worker which table it staged into, and the commit names the table: a batch job
across a drop and re-creation of its table publishes nothing (`Conflict`), whenever its tasks
wrote, rather than whatever it staged into the new table. (A streaming query's micro-batches
each check only that their own tasks staged into one table: a query outlives its table.)

Every error names the table and the worker.
"""

from __future__ import annotations

import itertools
import secrets
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from .._generated.flightfeed.v1 import (
    AbortStaged,
    CommitStaged,
    RowCount,
    StagedAttempt,
    StagedWrite,
)
from ..errors import Conflict, FlightfeedError, InvalidArgument, RemoteError
from ..table_names import TABLE_ID_METADATA
from ..value_kinds import convert, converts
from . import client
from .python_worker import settle_python_worker
from .source import (
    SOURCE_QUERY,
    SOURCE_TABLE,
    TableOptions,
    redacted_repr,
    table_ref,
    worker_command,
)

COMMIT_STAGED: Final = "commit_staged"
ABORT_STAGED: Final = "abort_staged"
QUERY_ID_PROPERTY: Final = "sql.streaming.queryId"
"""The local property Spark sets on a streaming query's tasks: its id, kept by the checkpoint."""
BATCH_ID_PROPERTY: Final = "streaming.sql.batchId"
"""The local property Spark sets on a micro-batch's tasks: its batch id."""


class TableWriteRefused(InvalidArgument):
    """Rows the table cannot hold, refused before they are sent (the message names the table,
    the worker and the column)."""


def stream_job(query_id: str, batch_id: int) -> str:
    """The job of micro-batch `batch_id` of streaming query `query_id`: the same every time
    Spark runs that micro-batch, before a restart or after."""
    return f"spark-stream-{query_id}-{batch_id}"


@dataclass
class TableCommitMessage(WriterCommitMessage):
    """What one Spark task staged: the driver commits exactly these attempts."""

    job: str
    partition: int
    attempt: int
    """The staged attempt's id (module docstring)."""
    rows: int
    spark_attempt: int = 0
    """Spark's attemptNumber() of the task, for people reading the messages."""
    batch_id: int | None = None
    """The micro-batch (streaming writes)."""
    table_id: int | None = None
    """The worker's id of the table the rows were staged into (None: nothing was sent)."""
    query_id: str | None = None
    """The streaming query (streaming writes): its micro-batches are a series of jobs."""


@dataclass(frozen=True)
class Staged:
    """What a worker staged of one task attempt."""

    rows: int
    table_id: int | None
    """The table staged into: its commit names it, so rows staged into a table dropped and
    created again since are never published into the new one."""


@dataclass(frozen=True)
class TableTarget:
    """A worker's table as a write sees it: plain data, pickled to every task."""

    uri: str
    table: str
    schema: pa.Schema
    """What each batch becomes: the table's type (and nullability) for each DataFrame column."""
    headers: dict[str, str]
    timeout: float
    connection: client.Connection = client.PLAIN
    """The token and TLS files every call uses."""
    table_id: int | None = None
    """The table's id when the writer was made (None from a worker that does not say): a job
    publishes into that table or nothing."""

    def __repr__(self) -> str:
        return redacted_repr(self)  # without the token

    @classmethod
    def of(cls, options: Any, schema: StructType) -> TableTarget:
        """From the writer's options and the DataFrame's schema, checked against the table's
        (one GetSchema on the worker)."""
        found = {str(k).lower(): str(v) for k, v in dict(options).items()}
        if found.get("source", SOURCE_TABLE).strip().lower() == SOURCE_QUERY:
            raise InvalidArgument(
                "the flightfeed data source writes into a worker's durable table: a"
                " coordinator's catalog (source=query) is read-only"
            )
        for read_only in ("partitions", "columns"):  # a read's options: no meaning here
            found.pop(read_only, None)
        table = TableOptions.of({**found, "source": SOURCE_TABLE})
        target = cls(
            table.uri, table.table, pa.schema([]), table.headers, table.timeout, table.connection
        )
        try:
            arrow = client.get_schema(
                table.uri,
                worker_command(table_ref(table.table)),
                table.headers,
                table.timeout,
                peer=client.WORKER,
                connection=table.connection,
            )
        except FlightfeedError as exc:
            raise target.error(exc) from None
        return replace(target, schema=target.columns(arrow, schema), table_id=_id_of(arrow))

    @property
    def where(self) -> str:
        return f"table {self.table!r} on the flightfeed worker at {self.uri}"

    def error(self, exc: FlightfeedError) -> FlightfeedError:
        """`exc` again, naming the table and worker."""
        message = f"writing {self.where}: {exc.message}"
        if isinstance(exc, RemoteError):
            return RemoteError(message, grpc_status=exc.grpc_status)
        return type(exc)(message)

    def columns(self, table: pa.Schema, spark: StructType) -> pa.Schema:
        names = spark.fieldNames()
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise TableWriteRefused(f"writing {self.where}: the DataFrame repeats {repeated}")
        unknown = [n for n in names if table.get_field_index(n) < 0]
        if unknown:
            raise TableWriteRefused(
                f"writing {self.where}: the table has no column(s) {unknown} (its columns:"
                f" {table.names}; names match exactly)"
            )
        missing = [f.name for f in table if not f.nullable and f.name not in names]
        if missing:
            raise TableWriteRefused(
                f"writing {self.where}: the DataFrame lacks the table's non-null column(s)"
                f" {missing}"
            )
        return pa.schema([table.field(n) for n in names])

    def conform(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """`batch` with the table's column types, cast safely (module docstring)."""
        target = self.schema
        if batch.schema.names != target.names:
            raise TableWriteRefused(
                f"writing {self.where}: Spark sent columns {batch.schema.names}, the writer"
                f" expected {target.names}"
            )
        columns = []
        for column, declared in zip(batch.columns, target, strict=True):
            if column.type != declared.type:
                why = _uncastable(column.type, declared.type)
                if why:
                    raise TableWriteRefused(
                        f"writing {self.where}: column {declared.name!r} is {declared.type},"
                        f" Spark sent {column.type}: {why}"
                    )
                try:
                    column = convert(column, declared.type)
                except (pa.ArrowException, ValueError) as exc:
                    raise TableWriteRefused(
                        f"writing {self.where}: column {declared.name!r} is {declared.type}, it"
                        f" cannot store these {column.type} values ({exc}){_hint(declared)}"
                    ) from None
            if not declared.nullable and column.null_count:
                raise TableWriteRefused(
                    f"writing {self.where}: column {declared.name!r} is not nullable, got"
                    f" {column.null_count} null(s)"
                )
            columns.append(column)
        return pa.RecordBatch.from_arrays(columns, schema=target)

    def stage(
        self, job: str, partition: int, attempt: int, batches: Iterable[pa.RecordBatch]
    ) -> Staged:
        """DoPut `batches` staged as (job, partition, attempt). An empty partition sends
        nothing."""
        settle_python_worker()  # (this runs in Spark's Python worker)
        batches = iter(batches)
        first = next(batches, None)
        if first is None:
            return Staged(0, None)
        staged = StagedWrite(job=job, partition=partition, attempt=attempt)
        command = worker_command(table_ref(self.table), staged=staged)
        conformed = (self.conform(b) for b in itertools.chain([first], batches))
        try:
            sent, answer = client.put_batches(
                self.uri,
                command,
                self.schema,
                conformed,
                self.headers,
                self.timeout,
                connection=self.connection,
            )
        except TableWriteRefused:
            raise  # from conform: it names the table already
        except FlightfeedError as exc:
            raise self.error(exc) from None
        count = RowCount.parse(answer) if answer else RowCount(rows=sent)
        if count.rows != sent:
            raise FlightfeedError(
                f"writing {self.where}: the worker staged {count.rows} of the {sent} rows sent"
            )
        return Staged(sent, count.table_id)

    def commit(
        self,
        job: str,
        attempts: Sequence[tuple[int, int]],
        overwrite: bool,
        table_id: int | None = None,
        series: tuple[str, int] | None = None,
    ) -> int:
        """Publish exactly these (partition, attempt)s of `job`, staged into table `table_id`;
        the rows published (the first commit's, when `job` was committed before). `series`:
        a streaming query's id and the micro-batch's (the worker forgets earlier ones)."""
        request = CommitStaged(
            table=table_ref(self.table),
            job=job,
            attempts=[StagedAttempt(partition=p, attempt=a) for p, a in attempts],
            overwrite=overwrite,
            table_id=table_id,
            series=series[0] if series is not None else None,
            sequence=series[1] if series is not None else 0,
        )
        return self._action(COMMIT_STAGED, bytes(request))

    def abort(self, job: str) -> int:
        """Discard whatever `job` staged; the rows discarded."""
        request = AbortStaged(table=table_ref(self.table), job=job)
        return self._action(ABORT_STAGED, bytes(request))

    def _action(self, kind: str, body: bytes) -> int:
        settle_python_worker()  # (a commit or an abort runs in a Python worker of Spark's)
        try:
            answer = client.do_action(
                self.uri, kind, body, self.headers, self.timeout, connection=self.connection
            )
        except FlightfeedError as exc:
            raise self.error(exc) from None
        return int(RowCount.parse(answer).rows)


def _uncastable(sent: pa.DataType, declared: pa.DataType) -> str:
    """Why a write does not cast `sent` values into a `declared` column ("" if it does): the
    store's rule (`value_kinds`), and Spark's TIMESTAMP_NTZ refused, which the store would take
    as UTC though it names a wall-clock time in no zone."""
    if pa.types.is_timestamp(sent) and sent.tz is None and pa.types.is_timestamp(declared):
        return (
            "a TIMESTAMP_NTZ is a wall-clock time, the table keeps instants: cast it to"
            " TIMESTAMP in Spark first (which applies the session time zone)"
        )
    if converts(sent, declared):
        return ""
    return "cast it in Spark first (a write casts only between numbers, and within a kind)"


def _hint(field: pa.Field) -> str:
    if pa.types.is_timestamp(field.type):
        return (
            "; the table keeps milliseconds: truncate the column first, e.g."
            f" F.date_trunc('millisecond', '{field.name}')"
        )
    return ""


def _task() -> Any:
    context = TaskContext.get()
    if context is None:
        raise FlightfeedError("the flightfeed writer's write() runs in a Spark task")
    return context


def _ours(messages: Sequence[WriterCommitMessage | None]) -> list[TableCommitMessage | None]:
    found: list[TableCommitMessage | None] = []
    for message in messages:
        if message is not None and not isinstance(message, TableCommitMessage):
            raise FlightfeedError(f"not a flightfeed writer's commit message: {message!r}")
        found.append(message)
    return found


def _query_id(messages: Sequence[WriterCommitMessage | None], job: str) -> str:
    """The streaming query whose micro-batch `job` is: what every message of it says."""
    found = {m.query_id for m in _ours(messages) if m is not None and m.job == job}
    if len(found) != 1 or None in found:
        raise FlightfeedError(f"micro-batch {job}'s tasks name queries {sorted(map(str, found))}")
    (query_id,) = found
    assert query_id is not None
    return query_id


def _attempts(messages: Sequence[WriterCommitMessage | None], job: str) -> list[tuple[int, int]]:
    """The (partition, attempt) of each message: every message is job `job`'s, and one a
    partition."""
    attempts: dict[int, int] = {}
    for message in _ours(messages):
        if message is None:
            raise FlightfeedError(
                f"job {job}: a task reported no commit message; nothing to commit"
            )
        if message.job != job:
            raise FlightfeedError(f"job {job}: a task reports staging as job {message.job}")
        if attempts.setdefault(message.partition, message.attempt) != message.attempt:
            raise FlightfeedError(f"job {job}: two attempts of partition {message.partition}")
    return sorted(attempts.items())


def _id_of(table: pa.Schema) -> int | None:
    """The table id a worker's GetSchema names (TABLE_ID_METADATA), if it does."""
    found = (table.metadata or {}).get(TABLE_ID_METADATA)
    return int(found) if found is not None and found.isdigit() else None


def _table_id(
    messages: Sequence[WriterCommitMessage | None],
    job: str,
    where: str,
    planned: int | None = None,
) -> int | None:
    """The one table the tasks of `job` staged into, which must be the one the writer was
    made for (`planned`, if known); `planned` if no task sent rows."""
    ids = {m.table_id for m in _ours(messages) if m is not None and m.table_id is not None}
    if planned is not None:
        ids.add(planned)
    if len(ids) > 1:
        raise Conflict(
            f"writing {where}: the table was dropped and created again while job {job} wrote"
            " to it (its rows went into another table than the one it began with): nothing"
            " was published"
        )
    return next(iter(ids), None)


class FlightfeedTableWriter(DataSourceArrowWriter):
    """`df.write.format("flightfeed")`: see the module docstring."""

    def __init__(self, target: TableTarget, job: str, overwrite: bool) -> None:
        self.target = target
        self.job = job
        self.overwrite = overwrite

    @classmethod
    def create(cls, options: Any, schema: StructType, overwrite: bool) -> FlightfeedTableWriter:
        return cls(TableTarget.of(options, schema), f"spark-{uuid.uuid4().hex}", overwrite)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TableCommitMessage:
        context = _task()
        partition, attempt = context.partitionId(), context.taskAttemptId()
        staged = self.target.stage(self.job, partition, attempt, iterator)
        return TableCommitMessage(
            self.job,
            partition,
            attempt,
            staged.rows,
            context.attemptNumber(),
            table_id=staged.table_id,
        )

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        self.target.commit(
            self.job,
            _attempts(messages, self.job),
            self.overwrite,
            _table_id(messages, self.job, self.target.where, self.target.table_id),
        )

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        self.target.abort(self.job)


class FlightfeedStreamTableWriter(DataSourceStreamArrowWriter):
    """`df.writeStream.format("flightfeed")`: see the module docstring.

    Spark creates one of these when a query starts (its tasks' copies stage the rows) and
    another for each commit, which finds the micro-batch's job in the commit messages."""

    def __init__(self, target: TableTarget, overwrite: bool, run: int) -> None:
        self.target = target
        self.overwrite = overwrite
        self.run = run
        """Drawn when the query (re)starts: the high bits of this run's staged attempts."""

    @classmethod
    def create(
        cls, options: Any, schema: StructType, overwrite: bool
    ) -> FlightfeedStreamTableWriter:
        return cls(TableTarget.of(options, schema), overwrite, secrets.randbits(31))

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TableCommitMessage:
        context = _task()
        query_id = context.getLocalProperty(QUERY_ID_PROPERTY)
        batch = context.getLocalProperty(BATCH_ID_PROPERTY)
        if not query_id or batch is None:
            raise FlightfeedError(
                f"writing {self.target.where}: this task has no streaming query id or batch id"
                f" (Spark's local properties {QUERY_ID_PROPERTY}, {BATCH_ID_PROPERTY})"
            )
        batch_id = int(batch)
        job = stream_job(query_id, batch_id)
        partition = context.partitionId()
        attempt = (self.run << 32) | (context.taskAttemptId() & 0xFFFF_FFFF)
        staged = self.target.stage(job, partition, attempt, iterator)
        return TableCommitMessage(
            job,
            partition,
            attempt,
            staged.rows,
            context.attemptNumber(),
            batch_id=batch_id,
            table_id=staged.table_id,
            query_id=query_id,
        )

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        job = self._job(messages, batchId)
        if job is None:
            return  # no task ran: nothing staged, nothing to publish
        table_id = _table_id(messages, job, self.target.where)
        # A series: the worker forgets the commits of this query's earlier micro-batches, which
        # Spark never runs again (before, it kept a record of every one, for ever).
        series = (_query_id(messages, job), batchId)
        self.target.commit(job, _attempts(messages, job), self.overwrite, table_id, series)
        # A replayed micro-batch's commit publishes nothing (the job committed before), and
        # leaves what the replay staged: discard it.
        self.target.abort(job)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        job = self._job(messages, batchId)
        if job is not None:
            self.target.abort(job)
        # With no message, the job is unknown here: the staging of the failed tasks stays
        # until the micro-batch runs again and commits (which discards it).

    def _job(self, messages: Sequence[WriterCommitMessage | None], batch_id: int) -> str | None:
        found = [m for m in _ours(messages) if m is not None]
        jobs = {m.job for m in found}
        if not jobs:
            return None
        batches = {m.batch_id for m in found}
        if len(jobs) > 1 or batches != {batch_id}:
            raise FlightfeedError(
                f"writing {self.target.where}: micro-batch {batch_id}'s tasks report jobs"
                f" {sorted(jobs)} of batches {sorted(batches, key=str)}"
            )
        (job,) = jobs
        return job


__all__ = [
    "FlightfeedStreamTableWriter",
    "FlightfeedTableWriter",
    "Staged",
    "TableCommitMessage",
    "TableTarget",
    "TableWriteRefused",
    "stream_job",
]
