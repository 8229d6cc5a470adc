"""Partitioned tables: one logical table over several workers, a partition per worker, each
row in the partition of the hash of its partition key (HoraeDB's key partitioning).

`PartitionedTable` is the definition and what follows from it without I/O: each partition's
table on its worker (with its `cluster.PartitionInfo`), how rows are routed, and the plan that
reads it: a Union of TableScans, each pinned to the worker holding its partition, so the
distributed planner runs filters, projections and partial aggregations there and prunes the
partitions a `key = value` or `key IN (...)` predicate rules out (plan/table_pushdown.py).

`PartitionedTables` does the I/O over Flight: creating the partitions, and writing rows routed
by key in two phases (every partition's rows staged, then each committed; any failure while
staging aborts them all). Within one worker a write is atomic; across workers the commits
follow each other, so a worker that dies between two commits leaves the others' rows: the
error says which partitions were published, and the ones after it are aborted.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

import anyio
import pyarrow as pa

from .._generated.cluster import KeyPartitionInfo, PartitionDefinition, PartitionInfo
from .._generated.flightfeed.v1 import (
    AbortStaged,
    CommitStaged,
    CreateTable,
    RowCount,
    StagedAttempt,
    StagedWrite,
    TableCommand,
)
from ..errors import FlightfeedError, InvalidArgument, as_flightfeed_error
from ..flight.client import FlightClient, command_descriptor
from ..plan.base import ExecutionPlan
from ..plan.expr import Expr, col
from ..plan.functions import BUILTINS
from ..plan.hash_partition import hash_partition
from ..plan.nodes import TableScan, Union
from ..plan.table_source import TablePartition, TableReadSpec
from ..protocol.errors import TYPED_ERRORS
from .flight import ABORT_STAGED, COMMIT_STAGED, CREATE_TABLE, TABLE_COMMAND_VERSION, table_ref
from .schema import TableSchema
from .store import TableName, conform_rows

MAX_PARTITIONS: Final = 1024


@dataclass(frozen=True)
class PartitionedTable:
    """`name` spread over `workers` (partition i lives on workers[i]) by the hash of `keys`."""

    name: TableName
    schema: TableSchema
    keys: tuple[str, ...]
    workers: tuple[str, ...]
    options: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.keys:
            raise InvalidArgument("a partitioned table needs at least one partition key")
        for key in self.keys:
            self.schema.column(key)
        if not 1 <= len(self.workers) <= MAX_PARTITIONS:
            raise InvalidArgument(f"a partitioned table has 1 to {MAX_PARTITIONS} partitions")

    @property
    def count(self) -> int:
        return len(self.workers)

    def partition_name(self, index: int) -> TableName:
        """Partition `index`'s table on its worker (HoraeDB names sub-tables alike)."""
        return TableName(f"__{self.name.table}_{index}", self.name.catalog, self.name.schema)

    def partition_info(self) -> PartitionInfo:
        definitions = [
            PartitionDefinition(name=self.partition_name(i).table) for i in range(self.count)
        ]
        return PartitionInfo(
            key=KeyPartitionInfo(version=1, definitions=definitions, partition_key=list(self.keys))
        )

    def route(self, data: pa.Table) -> list[pa.Table]:
        """`data` split by partition (rows in their order; conformed to the table's types
        first, so a row hashes as it is stored and as pruning hashes a literal)."""
        rows = conform_rows(self.schema, data)
        keys: list[Expr] = [col(k) for k in self.keys]
        parts: list[list[pa.RecordBatch]] = [[] for _ in range(self.count)]
        for batch in rows.to_batches():
            for index, piece in enumerate(hash_partition(batch, keys, self.count, BUILTINS)):
                if piece.num_rows:
                    parts[index].append(piece)
        return [pa.Table.from_batches(p, schema=rows.schema) for p in parts]

    def scan(
        self,
        columns: Sequence[str] | None = None,
        predicates: Sequence[Expr] = (),
        time_range: tuple[int, int] | None = None,
        *,
        parallelism: int = 1,
    ) -> ExecutionPlan:
        """The plan reading the table: one TableScan per partition, on its worker."""
        names = tuple(columns) if columns else ()
        fields = [self.schema.column(c).field for c in names] if names else None
        schema = pa.schema(fields) if fields is not None else self.schema.arrow
        scans: list[ExecutionPlan] = []
        for index, worker in enumerate(self.workers):
            part = self.partition_name(index)
            spec = TableReadSpec(
                part.catalog,
                part.schema,
                part.table,
                columns=names,
                predicates=tuple(predicates),
                time_range=time_range,
                parallelism=parallelism,
            )
            partition = TablePartition(self.keys, index, self.count)
            scans.append(TableScan(spec, schema, worker=worker, partition=partition))
        return scans[0] if len(scans) == 1 else Union(scans)


class PartitionedTables:
    """Creates and writes partitioned tables through their workers' Flight services.
    `async with PartitionedTables() as tables:` closes its clients on exit.

    A failure is raised as the failing partition's own error (the class its worker answered,
    `AlreadyExists`, `RemoteError` for a worker that cannot be reached, ...), its message
    naming the partition, its table and its worker, and the other partitions that failed; never
    as an exception group."""

    def __init__(self, *, timeout: float | None = 60.0) -> None:
        self._clients: dict[str, FlightClient] = {}
        self._timeout = timeout

    async def __aenter__(self) -> PartitionedTables:
        return self

    async def __aexit__(self, *exc: object) -> None:
        clients, self._clients = self._clients, {}
        for client in clients.values():
            await client.close()

    def _client(self, worker: str) -> FlightClient:
        found = self._clients.get(worker)
        if found is None:
            found = FlightClient(worker, timeout=self._timeout, errors=TYPED_ERRORS)
            self._clients[worker] = found
        return found

    async def create(self, table: PartitionedTable, *, if_not_exists: bool = True) -> None:
        """Each partition's table on its worker, with the partition info."""
        info = table.partition_info()

        async def create_one(index: int) -> None:
            request = CreateTable(
                table=table_ref(table.partition_name(index)),
                table_schema=table.schema.to_proto(),
                options=dict(table.options),
                partition_info=info,
                if_not_exists=if_not_exists,
            )
            await self._client(table.workers[index]).do_action(CREATE_TABLE, bytes(request))

        failed = await _on_each(range(table.count), create_one)
        if failed:
            raise _partition_error(table, "creating", failed)

    async def write(self, table: PartitionedTable, data: pa.Table) -> int:
        """Routes `data` by key; returns the rows written. Nothing is published unless every
        partition's rows were staged: a failure (or a cancel) while staging aborts them all.
        Commits follow one another; one that fails stops the rest and aborts their staging,
        and its error says which partitions were published."""
        parts = await anyio.to_thread.run_sync(table.route, data)
        job = f"partitioned-{uuid.uuid4().hex}"
        written = [i for i, part in enumerate(parts) if part.num_rows]

        async def stage_one(index: int) -> None:
            await self._stage(table, index, job, parts[index])

        try:
            failed = await _on_each(written, stage_one)
        except BaseException:  # cancelled: nothing of it may be published
            await self._abort(table, job, written)
            raise
        if failed:
            error = _partition_error(table, "staging", failed)
            _note_unaborted(error, table, await self._abort(table, job, written))
            raise error
        return await self._commit(table, job, written)

    async def _stage(self, table: PartitionedTable, index: int, job: str, rows: pa.Table) -> None:
        command = TableCommand(
            version=TABLE_COMMAND_VERSION,
            table=table_ref(table.partition_name(index)),
            staged=StagedWrite(job=job, partition=0, attempt=0),
        )

        async def batches() -> AsyncIterator[pa.RecordBatch]:
            for batch in rows.to_batches():
                yield batch

        client = self._client(table.workers[index])
        await client.do_put(command_descriptor(bytes(command)), rows.schema, batches())

    async def _commit(self, table: PartitionedTable, job: str, indices: Sequence[int]) -> int:
        """Publishes each partition's staged rows in turn; returns the rows published."""
        total = 0
        for position, index in enumerate(indices):
            commit = CommitStaged(
                table=table_ref(table.partition_name(index)),
                job=job,
                attempts=[StagedAttempt(partition=0, attempt=0)],
            )
            rest = indices[position + 1 :]
            try:
                (answer,) = await self._client(table.workers[index]).do_action(
                    COMMIT_STAGED, bytes(commit)
                )
            except Exception as exc:
                error = _partition_error(table, "committing", {index: exc})
                published = ", ".join(map(str, indices[:position])) or "none"
                error.message += (
                    f"; published before it: partitions {published} ({total} rows); not"
                    f" known whether partition {index} was; not published: partitions"
                    f" {', '.join(map(str, rest)) or 'none'}"
                )
                error.args = (error.message,)
                _note_unaborted(error, table, await self._abort(table, job, rest))
                raise error from exc
            except BaseException:  # cancelled: publish no more
                await self._abort(table, job, rest)
                raise
            total += RowCount.parse(answer).rows
        return total

    async def _abort(
        self, table: PartitionedTable, job: str, indices: Sequence[int]
    ) -> dict[int, Exception]:
        """Discards the job's staged rows on each partition, all at once and shielded from
        cancellation; returns the aborts that failed (their workers drop the rows after
        their staging TTL) rather than raising them over the error that called for it."""

        async def abort_one(index: int) -> None:
            abort = AbortStaged(table=table_ref(table.partition_name(index)), job=job)
            await self._client(table.workers[index]).do_action(ABORT_STAGED, bytes(abort))

        with anyio.CancelScope(shield=True):
            failed = await _on_each(indices, abort_one)
        return failed


async def _on_each(
    indices: Sequence[int], call: Callable[[int], Awaitable[None]]
) -> dict[int, Exception]:
    """`call(i)` for every index at once; the errors by index (a cancel still propagates)."""
    failed: dict[int, Exception] = {}

    async def one(index: int) -> None:
        try:
            await call(index)
        except Exception as exc:
            failed[index] = exc

    async with anyio.create_task_group() as tg:
        for index in indices:
            tg.start_soon(one, index)
    return dict(sorted(failed.items()))


def _where(table: PartitionedTable, index: int) -> str:
    place = f"{table.partition_name(index)} on {table.workers[index]}"
    return f"partition {index} of {table.name} ({place})"


def _partition_error(
    table: PartitionedTable, doing: str, failed: Mapping[int, Exception]
) -> FlightfeedError:
    """The first failed partition's error (its class kept), its message saying where, and which
    other partitions failed."""
    (first, cause), *others = failed.items()
    error = as_flightfeed_error(cause)
    error.message = f"{doing} {_where(table, first)}: {error.message}"
    if others:
        error.message += f" (partitions {', '.join(str(i) for i, _ in others)} failed too)"
    error.args = (error.message,)
    if error is not cause:
        error.__cause__ = cause
    for index, other in others:
        error.add_note(f"{doing} {_where(table, index)}: {other}")
    return error


def _note_unaborted(
    error: FlightfeedError, table: PartitionedTable, failed: Mapping[int, Exception]
) -> None:
    for index, cause in failed.items():
        error.add_note(
            f"the staged rows of {_where(table, index)} could not be aborted ({cause}): the"
            " worker drops them after its staging TTL"
        )


__all__ = ["PartitionedTable", "PartitionedTables"]
