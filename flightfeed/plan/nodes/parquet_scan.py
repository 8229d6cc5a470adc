"""ParquetScan: local Parquet files read with pyarrow.dataset, split by row group into partitions,
with the projection and a filter pushed into the reader (row groups whose statistics rule the
filter out are never read).

The planner splits it across tasks (coordinator/parquet_estimator.py): every task holds the
whole layout and reads the partitions of its task number. Reading is file I/O and decoding in
Arrow C++, each batch pulled on a worker thread. A worker decodes the node only through a
ParquetScanCodec that names the directories it may read (`roots`): a plan from the network
must not read any file the worker's user can.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TypeVar

import anyio.to_thread
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as fs

from ..._generated.flightfeed.v1 import ParquetRowGroups, ParquetScanNode, ParquetScanPartition
from ...errors import InvalidArgument, PlanDecodeError
from ...protoencode import encode_message
from ..arrow_ipc import read_ipc_schema
from ..base import ExecutionPlan, PlanNodeBase, TaskContext, expect_children
from ..codec import DecodeContext, parse_payload
from ..expr import Expr, output_type, to_dataset_expression
from ..expr_proto import expr_from_proto, expr_to_proto
from ..functions import BUILTINS

DEFAULT_MAX_PARTITIONS = 12
"""Partitions by default: one per row group, at most this many (2, 3, 4 and 6 tasks divide it:
the planner splits a leaf into a task count that divides its partitions)."""
T = TypeVar("T")
BATCH_ROWS = 262_144
"""Rows per batch read: each batch costs a thread hop and a pass through the plan's nodes."""


@dataclass(frozen=True)
class RowGroups:
    """Row groups of one file, read in order."""

    path: str
    row_groups: tuple[int, ...]


class ParquetScan(PlanNodeBase):
    name = "ParquetScan"

    def __init__(
        self,
        schema: pa.Schema,
        partitions: Sequence[Sequence[RowGroups]],
        *,
        columns: Sequence[str] = (),
        filter: Expr | None = None,
        task_count: int = 1,
        file_schema: pa.Schema | None = None,
        roots: tuple[str, ...] | None = None,
        estimated_bytes: int | None = None,
        estimated_rows: int | None = None,
    ) -> None:
        """Low-level: `partitions` as laid out (see `from_paths`); `schema` is the output's,
        after projecting `columns` (all of the files' when empty). `file_schema`: what every
        file is read as, its columns matched by name (a column a file lacks reads as nulls, a
        type that differs is cast, safely); without it, the output schema when `columns` is
        empty, else each partition's first file's with the output's types. `roots`: the
        directories a decoded scan may read (checked again when the files are opened, links
        resolved).
        `estimated_bytes` and `estimated_rows`: what all partitions decode to, before the
        filter, if known (from the footers; for the planner's decisions: they are not sent to
        workers)."""
        if not partitions:
            raise InvalidArgument("ParquetScan needs at least one partition")
        if task_count < 1 or len(partitions) % task_count:
            raise InvalidArgument(
                f"ParquetScan: {len(partitions)} partitions cannot be split into {task_count} tasks"
            )
        if filter is not None:
            to_dataset_expression(filter)  # only pyarrow.compute functions: no UDF in a reader
        self._schema = schema
        self.file_schema = file_schema if file_schema is not None or columns else schema
        if self.file_schema is not None:
            _check_read_as(schema, self.file_schema)
        self.partitions = tuple(tuple(p) for p in partitions)
        self.columns = tuple(columns)
        self.filter = filter
        self.task_count = task_count
        self.roots = roots
        self.estimated_bytes = estimated_bytes
        self.estimated_rows = estimated_rows

    @classmethod
    def from_paths(
        cls,
        paths: str | Sequence[str],
        *,
        partitions: int | None = None,
        columns: Sequence[str] = (),
        filter: Expr | None = None,
    ) -> ParquetScan:
        """Files (or directories of them) split into `partitions` of contiguous row groups
        (default: one per row group, at most DEFAULT_MAX_PARTITIONS). Reads the files'
        footers: in async code, build it on a thread for large datasets.

        Every file is read as the first one's schema, columns matched by name (as
        `pyarrow.dataset` reads them): a column a file lacks reads as nulls, and a type that
        differs is cast, a value that does not fit failing the query with the file named.
        Relative paths are taken from the current directory: the plan holds absolute ones."""
        absolute = _absolute(paths) if isinstance(paths, str) else [_absolute(p) for p in paths]
        dataset = ds.dataset(absolute, format="parquet", filesystem=fs.LocalFileSystem())
        groups = [
            (fragment.path, group)
            for fragment in dataset.get_fragments()
            for group in fragment.row_groups
        ]
        units = [(path, group.id) for path, group in groups]
        wanted = partitions if partitions is not None else min(len(units), DEFAULT_MAX_PARTITIONS)
        if wanted < 1:
            if partitions is not None:
                raise InvalidArgument(f"partitions must be at least 1, got {partitions}")
            wanted = 1  # no row groups at all: one empty partition
        bounds = [len(units) * i // wanted for i in range(wanted + 1)]
        layout = [_by_file(units[lo:hi]) for lo, hi in itertools.pairwise(bounds)]
        schema = dataset.schema
        if columns:
            missing = [c for c in columns if c not in schema.names]
            if missing:
                raise InvalidArgument(f"ParquetScan: no column(s) {missing} in {schema.names}")
            schema = pa.schema([schema.field(c) for c in columns])
        if filter is not None:
            kind = output_type(filter, dataset.schema, BUILTINS)
            if not pa.types.is_boolean(kind):
                raise InvalidArgument(f"ParquetScan filter must be boolean, got {kind}")
        whole = sum(group.total_byte_size for _, group in groups)
        share = len(schema) / max(len(dataset.schema), 1)  # the projected columns' share, roughly
        estimate = int(whole * share)
        rows = sum(group.num_rows for _, group in groups)
        return cls(
            schema,
            layout,
            columns=columns,
            filter=filter,
            file_schema=dataset.schema,
            estimated_bytes=estimate,
            estimated_rows=rows,
        )

    @property
    def schema(self) -> pa.Schema:
        return self._schema

    @property
    def output_partitions(self) -> int:
        return len(self.partitions) // self.task_count

    def for_tasks(self, task_count: int) -> ParquetScan:
        """The same layout, read by `task_count` tasks."""
        return ParquetScan(
            self._schema,
            self.partitions,
            columns=self.columns,
            filter=self.filter,
            task_count=task_count,
            file_schema=self.file_schema,
            roots=self.roots,
            estimated_bytes=self.estimated_bytes,
            estimated_rows=self.estimated_rows,
        )

    async def _execute(self, partition: int, ctx: TaskContext) -> AsyncIterator[pa.RecordBatch]:
        if ctx.task_number >= self.task_count:
            raise InvalidArgument(
                f"ParquetScan of {self.task_count} tasks run as task {ctx.task_number}"
            )
        files = self.partitions[ctx.task_number * self.output_partitions + partition]
        batches = await _reading(files, self._open, files)
        while True:
            batch = await _reading(files, next, batches, None)
            if batch is None:
                return
            yield batch

    def _open(self, files: Sequence[RowGroups]) -> Iterator[pa.RecordBatch]:
        if self.roots is not None:
            _check_real_paths(files, self.roots)
        parquet, local = ds.ParquetFileFormat(), fs.LocalFileSystem()
        fragments = [
            parquet.make_fragment(f.path, local, row_groups=list(f.row_groups)) for f in files
        ]
        if not fragments:
            return iter(())
        dataset = ds.FileSystemDataset(fragments, self._read_as(fragments[0]), parquet, local)
        scanner = dataset.scanner(
            columns=list(self.columns) or None,
            filter=to_dataset_expression(self.filter) if self.filter is not None else None,
            batch_size=BATCH_ROWS,
            use_threads=False,  # tasks run in parallel already; keep one core per stream
        )
        schema = self._schema
        return (
            batch if batch.schema.equals(schema) else batch.cast(schema)
            for batch in scanner.to_batches()
            if batch.num_rows
        )

    def _read_as(self, first: ds.Fragment) -> pa.Schema:
        """The schema the files are read as: the plan's, whichever file a partition starts
        with (the first file's would make the answer depend on how the files were split)."""
        if self.file_schema is not None:
            return self.file_schema
        physical = first.physical_schema  # a low-level scan of some columns: see __init__
        fields = [
            self._schema.field(f.name) if f.name in self._schema.names else f for f in physical
        ]
        missing = [f for f in self._schema if f.name not in physical.names]
        return pa.schema(fields + missing)

    def __repr__(self) -> str:
        files = len({f.path for part in self.partitions for f in part})
        shown = f", columns={list(self.columns)}" if self.columns else ""
        shown += f", filter={self.filter}" if self.filter is not None else ""
        return (
            f"ParquetScan(files={files}, partitions={len(self.partitions)},"
            f" tasks={self.task_count}{shown})"
        )


async def _reading(files: Sequence[RowGroups], fn: Callable[..., T], *args: object) -> T:
    """`fn(*args)` on a worker thread; a file that is missing, unreadable or not as the plan
    says (a row group it does not have) is the plan's error, named, not the worker's."""
    try:
        return await anyio.to_thread.run_sync(fn, *args)
    except (OSError, IndexError, pa.ArrowException) as exc:
        paths = sorted({f.path for f in files})
        raise InvalidArgument(f"ParquetScan cannot read {paths}: {exc}") from exc


def _absolute(path: str) -> str:
    return path if os.path.isabs(path) else os.path.abspath(path)  # the latter asks the OS


def _check_read_as(output: pa.Schema, file_schema: pa.Schema) -> None:
    """Every output column is one of the file schema's, of the same type."""
    for field in output:
        index = file_schema.get_field_index(field.name)
        if index < 0 or file_schema.field(index).type != field.type:
            raise InvalidArgument(
                f"ParquetScan output column {field.name!r} ({field.type}) is not one column of"
                f" that type in the file schema {file_schema.names}"
            )


def _by_file(units: Sequence[tuple[str, int]]) -> list[RowGroups]:
    return [
        RowGroups(path, tuple(group for _, group in groups))
        for path, groups in itertools.groupby(units, key=lambda unit: unit[0])
    ]


def _under(path: str, roots: Sequence[str]) -> bool:
    return any(os.path.commonpath([path, root]) == root for root in roots)


def _check_real_paths(files: Sequence[RowGroups], roots: Sequence[str]) -> None:
    """Blocking (the file system resolves links): run on a worker thread."""
    real_roots = [os.path.realpath(root) for root in roots]
    for f in files:
        if not _under(os.path.realpath(f.path), real_roots):
            raise InvalidArgument(
                f"ParquetScan file {f.path!r} leads outside this worker's roots (a link)"
            )


class ParquetScanCodec:
    """Encodes any ParquetScan; decodes one only if every file's absolute path lies under one
    of `roots` (absolute directories), `..` resolved; the scan checks again, links resolved,
    when it opens the files (no file system access on the event loop). Without roots it
    decodes none."""

    kinds = (ParquetScan.name,)

    def __init__(self, roots: Sequence[str | os.PathLike[str]] = ()) -> None:
        paths = [os.fspath(root) for root in roots]
        relative = [path for path in paths if not os.path.isabs(path)]
        if relative:
            raise ValueError(f"ParquetScanCodec roots must be absolute, got {relative}")
        self.roots = tuple(os.path.normpath(path) for path in paths)

    def encode(self, node: ExecutionPlan, /) -> bytes:
        if not isinstance(node, ParquetScan):
            raise InvalidArgument(f"ParquetScanCodec cannot encode {node.name}")
        return encode_message(
            ParquetScanNode(
                schema=node.schema.serialize().to_pybytes(),
                partitions=[
                    ParquetScanPartition(
                        files=[ParquetRowGroups(f.path, list(f.row_groups)) for f in part]
                    )
                    for part in node.partitions
                ],
                columns=list(node.columns),
                filter=expr_to_proto(node.filter) if node.filter is not None else None,
                task_count=node.task_count,
                file_schema=(
                    node.file_schema.serialize().to_pybytes() if node.file_schema else b""
                ),
            )
        )

    def decode(
        self, kind: str, payload: bytes, children: Sequence[ExecutionPlan], ctx: DecodeContext, /
    ) -> ExecutionPlan:
        msg = parse_payload(ParquetScanNode, payload, kind)
        expect_children(kind, children, 0)
        layout = [
            [RowGroups(self._allowed(f.path), tuple(f.row_groups)) for f in part.files]
            for part in msg.partitions
        ]
        schema = read_ipc_schema(msg.schema, "ParquetScan schema")
        predicate = expr_from_proto(msg.filter) if msg.filter is not None else None
        file_schema = (
            read_ipc_schema(msg.file_schema, "ParquetScan file schema") if msg.file_schema else None
        )
        try:
            return ParquetScan(
                schema,
                layout,
                columns=msg.columns,
                filter=predicate,
                task_count=msg.task_count or 1,
                file_schema=file_schema,
                roots=self.roots,
            )
        except InvalidArgument as exc:
            raise PlanDecodeError(exc.message) from exc

    def _allowed(self, path: str) -> str:
        if not self.roots:
            raise PlanDecodeError(
                "this worker reads no Parquet files: start it with --parquet-root DIR"
            )
        if not os.path.isabs(path):
            raise PlanDecodeError(f"ParquetScan file {path!r} is not an absolute path")
        normal = os.path.normpath(path)
        if not _under(normal, self.roots):
            raise PlanDecodeError(f"ParquetScan file {path!r} is outside this worker's roots")
        return normal


__all__ = ["DEFAULT_MAX_PARTITIONS", "ParquetScan", "ParquetScanCodec", "RowGroups"]
