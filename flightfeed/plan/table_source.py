"""Where a TableScan reads: the durable tables of the worker its task runs on.

The plan layer names a table read (`TableReadSpec`); the tables layer, which owns the storage,
serves it through the `TableSource` a task context carries under TABLE_SOURCE_KEY. A context
without one (the coordinator's, or a worker without `--data-dir`) cannot run a TableScan and
says so.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Final, Protocol

import pyarrow as pa

from ..errors import ExecutionError, InvalidArgument
from .base import TaskContext
from .expr import Expr

TABLE_SOURCE_KEY: Final = "flightfeed.plan.table_source"


@dataclass(frozen=True)
class TableReadSpec:
    """A table read: the table, the columns (empty: all), predicates, a [start, end) time range
    in milliseconds, and how many parallel row ranges to split it into."""

    catalog: str
    schema: str
    table: str
    columns: tuple[str, ...] = ()
    predicates: tuple[Expr, ...] = ()
    time_range: tuple[int, int] | None = None
    parallelism: int = 1

    @property
    def qualified(self) -> str:
        parts = [p for p in (self.catalog, self.schema) if p]
        return ".".join([*parts, self.table])


@dataclass(frozen=True)
class TablePartition:
    """The table is partition `index` of `count` of a table whose rows go to the partition of
    the hash of their `keys` (plan/hash_partition.py), modulo `count`."""

    keys: tuple[str, ...]
    index: int
    count: int

    def __post_init__(self) -> None:
        if not self.keys or not 0 <= self.index < self.count:
            raise InvalidArgument(f"bad table partition {self.index} of {self.count}")


class TableSource(Protocol):
    def read_table(self, spec: TableReadSpec) -> AsyncIterator[pa.RecordBatch]:
        """The rows of the table `spec` selects, batch by batch."""
        ...

    def table_schema(self, spec: TableReadSpec) -> pa.Schema:
        """What `read_table(spec)` returns (a clear error if the table or a column is missing)."""
        ...


def table_source(ctx: TaskContext, spec: TableReadSpec) -> TableSource:
    source = ctx.extensions.get(TABLE_SOURCE_KEY)
    if source is None:
        raise ExecutionError(
            f"TableScan of {spec.qualified} cannot run here: no tables where this task runs"
            " (a worker keeps them with --data-dir)"
        )
    return source  # type: ignore[return-value]


__all__ = ["TABLE_SOURCE_KEY", "TablePartition", "TableReadSpec", "TableSource", "table_source"]
