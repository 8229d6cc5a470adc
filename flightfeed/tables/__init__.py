"""Durable tables on workers: an embedded DuckDB store, HoraeDB's RemoteEngineService (seed 003)
and the Flight face over it, and tables partitioned over workers."""

from __future__ import annotations

from .engine import TableEngine, TableRead
from .options import TableOptions
from .partitioned import PartitionedTable, PartitionedTables
from .schema import Column, TableSchema
from .store import TableName, TableStore, TableWriteError

__all__ = [
    "Column",
    "PartitionedTable",
    "PartitionedTables",
    "TableEngine",
    "TableName",
    "TableOptions",
    "TableRead",
    "TableSchema",
    "TableStore",
    "TableWriteError",
]
