"""The async face of a worker's tables: every store call on a worker thread, reads streamed
batch by batch with their remaining predicates applied by Arrow, and reads split into parallel
row ranges when asked.

Everything the services (remote engine, Flight) and the plan's TableScan need goes through
`TableEngine`, so their behaviour cannot drift apart.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from functools import partial
from typing import Final, TypeVar

import anyio
import anyio.to_thread
import pyarrow as pa
import pyarrow.compute as pc

from ..concurrency import read_ahead
from ..errors import InvalidArgument, NotFound
from ..plan.base import closing
from ..plan.expr import Expr, evaluate
from ..plan.merge import merge
from .datafusion_floats import PredicateFunctions
from .options import TableOptions
from .predicate import split_predicates
from .schema import TableSchema
from .snapshots import (
    DEFAULT_SNAPSHOT_GRACE,
    DEFAULT_SNAPSHOT_TTL,
    RowIds,
    Snapshot,
    SnapshotRef,
    TableSnapshots,
)
from .store import Order, ScanSpec, TableEntry, TableName, TableStore

log = logging.getLogger("flightfeed.tables")

T = TypeVar("T")
MAX_BATCH_ROWS: Final = 1 << 20
PREDICATE_BUDGET_BYTES: Final = 256 << 20
"""What one read predicate may make of one batch through a function that can dwarf its input
(`binary_repeat`, padding, a large literal written into every row: plan/expansion.py): a read
runs in no task, so this is its memory budget. Over it the read is RESOURCE_EXHAUSTED."""


class _ReadFunctions(PredicateFunctions):
    """The functions a read's predicates call: Arrow's and a float's sign (HoraeDB's
    predicates compare NaN by it), within PREDICATE_BUDGET_BYTES."""

    memory_budget_bytes: int | None = PREDICATE_BUDGET_BYTES


_READ_FUNCTIONS: Final = _ReadFunctions()
DEFAULT_BATCH_ROWS: Final = 65_536
MAX_READ_PARALLELISM: Final = 16
SCAN_AHEAD: Final = 2
"""Batches a scan's thread reads before the reader takes them (concurrency.read_ahead)."""


@dataclass(frozen=True)
class TableRead:
    """What to read from a table: the columns (None: all), predicates every row must satisfy,
    a [start, end) time range in milliseconds, an order by timestamp, and how."""

    name: TableName
    columns: tuple[str, ...] | None = None
    predicates: tuple[Expr, ...] = ()
    time_range: tuple[int, int] | None = None
    order: Order = "none"
    batch_size: int = DEFAULT_BATCH_ROWS
    parallelism: int = 1
    rowid_range: tuple[int, int] | None = None
    """Only the rows whose DuckDB row id is in [lo, hi): one slice of a table read in parallel."""
    table_id: int | None = None
    """The table planned against (a ticket's): a table since dropped, and perhaps created again
    under its name, is NotFound, never the new table's rows."""

    def checked(self) -> TableRead:
        if self.time_range is not None and self.time_range[0] > self.time_range[1]:
            raise InvalidArgument(f"time range {list(self.time_range)} ends before it starts")
        if self.batch_size < 1:
            raise InvalidArgument(f"batch size must be at least 1, got {self.batch_size}")
        return self


class TableEngine:
    """`engine = await TableEngine.open(data_dir)`; `await engine.aclose()` when done."""

    def __init__(
        self,
        store: TableStore,
        *,
        snapshot_ttl: float = DEFAULT_SNAPSHOT_TTL,
        snapshot_grace: float = DEFAULT_SNAPSHOT_GRACE,
    ) -> None:
        self.store = store
        self.snapshots = TableSnapshots(store, ttl=snapshot_ttl, grace=snapshot_grace)
        """The snapshots of reads planned in slices (`plan_slices`); run its `expire_idle`."""

    @classmethod
    async def open(
        cls,
        data_dir: str | os.PathLike[str] | None,
        *,
        memory_limit: int | None = None,
        snapshot_ttl: float = DEFAULT_SNAPSHOT_TTL,
        snapshot_grace: float = DEFAULT_SNAPSHOT_GRACE,
    ) -> TableEngine:
        opening = partial(TableStore.open, data_dir, memory_limit=memory_limit)
        store = await anyio.to_thread.run_sync(opening)
        return cls(store, snapshot_ttl=snapshot_ttl, snapshot_grace=snapshot_grace)

    async def aclose(self) -> None:
        await self.snapshots.close()
        await anyio.to_thread.run_sync(self.store.close)

    async def _run(self, fn: Callable[..., T], *args: object) -> T:
        return await anyio.to_thread.run_sync(fn, *args)

    # --- metadata ----------------------------------------------------------------------

    def entry(self, name: TableName) -> TableEntry:
        """From memory: no thread hop."""
        return self.store.entry(name)

    def tables(self) -> list[TableEntry]:
        return self.store.tables()

    async def create(
        self,
        name: TableName,
        schema: TableSchema,
        options: Mapping[str, str] | None = None,
        *,
        partition_info: bytes = b"",
        if_not_exists: bool = False,
    ) -> TableEntry:
        parsed = TableOptions.parse(options or {})
        return await anyio.to_thread.run_sync(
            lambda: self.store.create(
                name, schema, parsed, partition_info=partition_info, if_not_exists=if_not_exists
            )
        )

    async def drop(self, name: TableName) -> None:
        await self._run(self.store.drop, name)

    async def alter_schema(
        self, name: TableName, schema: TableSchema, pre_schema_version: int
    ) -> TableEntry:
        return await self._run(self.store.alter_schema, name, schema, pre_schema_version)

    async def alter_options(self, name: TableName, options: Mapping[str, str]) -> TableEntry:
        return await self._run(self.store.alter_options, name, dict(options))

    async def purge_expired(self) -> int:
        return await self._run(self.store.purge_expired)

    async def plan_slices(self, read: TableRead, slices: int, *, holder: str = "") -> Snapshot:
        """A read of table `read.table_id` planned as `slices` row-id ranges (`.slices`, which
        cover every row of the snapshot) that are read later, each with
        `read(..., snapshot=snapshot.ref)`; `holder` planned it (TableSnapshots.open)."""
        if read.table_id is None:
            raise ValueError("a read planned in slices names its table id")
        return await self.snapshots.open(read.name, read.table_id, slices, holder=holder)

    async def row_count(self, name: TableName) -> int:
        return await self._run(self.store.row_count, name)

    # --- writes ------------------------------------------------------------------------

    async def write(self, requests: Sequence[tuple[TableName, pa.Table]]) -> int:
        """All rows of every request, or none (TableWriteError names the one that failed). A
        write that started finishes even if its caller is cancelled: it is atomic either way."""
        return await self._run(self.store.write, list(requests))

    async def stage(
        self,
        name: TableName,
        job: str,
        partition: int,
        attempt: int,
        data: pa.Table,
        *,
        table_id: int | None = None,
    ) -> int:
        stage = partial(self.store.stage, table_id=table_id)
        return await self._run(stage, name, job, partition, attempt, data)

    async def commit_staged(
        self,
        name: TableName,
        job: str,
        attempts: Sequence[tuple[int, int]],
        *,
        overwrite: bool = False,
        table_id: int | None = None,
        series: tuple[str, int] | None = None,
    ) -> int:
        return await anyio.to_thread.run_sync(
            lambda: self.store.commit_staged(
                name, job, attempts, overwrite=overwrite, table_id=table_id, series=series
            )
        )

    async def abort_staged(self, name: TableName, job: str) -> int:
        return await self._run(self.store.abort_staged, name, job)

    # --- reads -------------------------------------------------------------------------

    def read_schema(self, read: TableRead) -> pa.Schema:
        """The schema of what `read` returns."""
        schema = self._entry_of(read).schema
        if read.columns is None:
            return schema.arrow
        return pa.schema([schema.column(c).field for c in read.columns])

    async def read(
        self, read: TableRead, *, snapshot: SnapshotRef | None = None
    ) -> AsyncIterator[pa.RecordBatch]:
        """The rows, batch by batch (empty batches skipped); with `snapshot`, as the table was
        when `plan_slices` planned the read (once that snapshot is released, NotFound unless
        no write has committed since: tables/snapshots.py)."""
        read = read.checked()
        entry = self._entry_of(read)
        table_schema = entry.schema.arrow
        split = split_predicates(read.predicates, table_schema)
        wanted = list(read.columns) if read.columns is not None else entry.schema.names
        scanned = wanted + sorted(split.columns - set(wanted))
        batch_size = min(read.batch_size, MAX_BATCH_ROWS)
        spec = ScanSpec(
            columns=tuple(scanned),
            where=split.pushed,
            time_range=read.time_range,
            order=read.order,
            batch_size=batch_size,
            rowid_range=read.rowid_range,
        )
        out_schema = self.read_schema(read)

        def finish(batch: pa.RecordBatch) -> pa.RecordBatch:
            for expr in split.remaining:
                mask = evaluate(expr, batch, _READ_FUNCTIONS)
                batch = batch.filter(pc.fill_null(mask, False))
            if batch.schema.equals(out_schema):
                return batch
            if not out_schema:
                return batch.select([])  # no columns, the row count kept
            # The wanted columns come first, in order (a name may repeat): by position.
            columns = [
                column if column.type == field.type else column.cast(field.type)
                for column, field in zip(batch.columns, out_schema, strict=False)
            ]
            return pa.RecordBatch.from_arrays(columns, schema=out_schema)

        async with AsyncExitStack() as stack:
            parallelism = max(1, min(read.parallelism, MAX_READ_PARALLELISM))
            if snapshot is not None:
                rows = read.rowid_range
                if rows is None:
                    raise ValueError("a read of a snapshot is of one of its slices")
                if rows[0] >= rows[1]:
                    return  # (an empty slice: no row, in any version)
                readers = [await self._snapshot_scan(stack, snapshot, entry, spec, rows)]
            elif parallelism == 1 or read.order != "none" or read.rowid_range is not None:
                readers = [await self._run(self.store.scan, entry.name, spec, entry.id)]
            else:  # (every slice of the one snapshot: store.scan_slices)
                scan_slices = self.store.scan_slices
                readers = await self._run(scan_slices, entry.name, spec, parallelism, entry.id)
            try:
                sources = {i: self._stream(reader, finish) for i, reader in enumerate(readers)}
                async with closing(merge(sources)) as merged:  # (a merge of one: the scan)
                    async for _, batch in merged:
                        yield batch
            finally:
                for reader in readers:
                    reader.close()

    async def _snapshot_scan(
        self,
        stack: AsyncExitStack,
        snapshot: SnapshotRef,
        entry: TableEntry,
        spec: ScanSpec,
        rows: RowIds,
    ) -> pa.RecordBatchReader:
        """The scan of one slice of `snapshot`: in one of its transactions while it is held,
        else of the table as it is now if the store has not changed since (the same rows)."""
        try:
            lease = await stack.enter_async_context(
                self.snapshots.lease(snapshot.id, entry.id, rows)
            )
        except NotFound:
            if not snapshot.version:
                raise
            unchanged = self.store.scan_unchanged
            reader = await self._run(unchanged, entry.name, spec, entry.id, snapshot.version)
            if reader is None:
                raise self.snapshots.released(snapshot.id, changed=True) from None
            return reader
        return await self._run(self.store.scan_in, lease.cursor, entry.name, spec, entry.id)

    def _entry_of(self, read: TableRead) -> TableEntry:
        entry = self.entry(read.name)
        if read.table_id is not None and entry.id != read.table_id:
            raise NotFound(
                f"table {read.name} was dropped after this read was planned (and created"
                " again): plan it again (GetFlightInfo)"
            )
        return entry

    async def _stream(
        self, reader: pa.RecordBatchReader, finish: Callable[[pa.RecordBatch], pa.RecordBatch]
    ) -> AsyncIterator[pa.RecordBatch]:
        """A scan's batches, read ahead on a thread and finished there."""
        batches = read_ahead(partial(_next_finished, reader, finish), SCAN_AHEAD)
        async with closing(batches) as scanned:
            async for batch in scanned:
                yield batch


async def purge_expired_rows(engine: TableEngine, interval: float) -> None:
    """Every `interval` seconds, delete what the tables' TTLs have expired (until cancelled).
    A round that fails is logged and the next one tried: the worker serves on."""
    while True:
        await anyio.sleep(interval)
        try:
            await engine.purge_expired()
        except Exception:  # (a failed purge once ended the worker, at every restart)
            log.exception("purging expired rows failed; trying again in %gs", interval)


def _next_finished(
    reader: pa.RecordBatchReader, finish: Callable[[pa.RecordBatch], pa.RecordBatch]
) -> pa.RecordBatch | None:
    """The next batch with rows, filtered and projected, on the thread that read it."""
    while True:
        try:
            batch = finish(reader.read_next_batch())
        except StopIteration:
            return None
        if batch.num_rows:
            return batch


__all__ = [
    "DEFAULT_BATCH_ROWS",
    "MAX_READ_PARALLELISM",
    "TableEngine",
    "TableRead",
    "purge_expired_rows",
]
