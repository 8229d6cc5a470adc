"""Built-in plan nodes, one per module, each a thin streaming wrapper over Arrow C++."""

from __future__ import annotations

from .coalesce import Coalesce, CoalesceCodec
from .filter import Filter, FilterCodec
from .hash_aggregate import AggregateMode, HashAggregate, HashAggregateCodec
from .hash_join import HashJoin, HashJoinCodec
from .isolated_union import IsolatedUnion, IsolatedUnionCodec, TaskSpan
from .limit import Limit, LimitCodec
from .memory_scan import MemoryScan, MemoryScanCodec
from .network_broadcast import NetworkBroadcast, NetworkBroadcastCodec
from .network_coalesce import NetworkCoalesce, NetworkCoalesceCodec
from .network_shuffle import NetworkShuffle, NetworkShuffleCodec
from .parquet_scan import ParquetScan, ParquetScanCodec
from .projection import Projection, ProjectionCodec
from .repartition import Repartition, RepartitionCodec
from .sort import Sort, SortCodec, SortKey
from .table_scan import TableScan, TableScanCodec
from .union import Union, UnionCodec

BUILTIN_CODECS = (
    MemoryScanCodec(),
    FilterCodec(),
    ProjectionCodec(),
    HashAggregateCodec(),
    SortCodec(),
    LimitCodec(),
    UnionCodec(),
    CoalesceCodec(),
    RepartitionCodec(),
    HashJoinCodec(),
    NetworkCoalesceCodec(),
    NetworkShuffleCodec(),
    NetworkBroadcastCodec(),
    IsolatedUnionCodec(),
    TableScanCodec(),
)
"""Codecs every session has. ParquetScanCodec is not one: a worker reads files only under the
roots its operator names (see parquet_scan.py)."""

__all__ = [
    "BUILTIN_CODECS",
    "AggregateMode",
    "Coalesce",
    "Filter",
    "HashAggregate",
    "HashJoin",
    "IsolatedUnion",
    "Limit",
    "MemoryScan",
    "NetworkBroadcast",
    "NetworkCoalesce",
    "NetworkShuffle",
    "ParquetScan",
    "ParquetScanCodec",
    "Projection",
    "Repartition",
    "Sort",
    "SortKey",
    "TableScan",
    "TaskSpan",
    "Union",
]
